"""What a container's end means for its task, and what a restarted agent does
with the containers it finds -- pure, for the agent core.

`ending` turns the engine's final state of a container into the task's terminal
state, reason and message, by the same rules as a process task: exit 0 finishes,
other exits fail, a kill the agent asked for is `TASK_KILLED`, and the kernel's
OOM kill is `TASK_FAILED` with `REASON_CONTAINER_LIMITATION_MEMORY`.

`recover` matches the runs an agent checkpointed against the containers the
engine lists with the agent's `dyad.agent_id` label: each known run is adopted
(running), ended (stopped while the agent was away: its exit is in the engine),
or vanished (its container is gone); each listed container no known run claims
is an orphan to remove. A run is matched by its checkpointed container id, or by
its labels when the agent died between creating the container and writing the
id down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from agent.container_spec import ContainerLabels
from agent.docker_wire import ContainerState
from dyad.messages import Reason, TaskState

RunKey = tuple[str, str, str]  # (framework_id, executor_id, run_id), as agent.model's
MIB = 1024 * 1024
SIGNAL_BASE = 128  # the engine reports death by signal n as exit status 128 + n


@attrs.frozen
class Ending:
    state: TaskState
    reason: str
    message: str


def ending(container: ContainerState, killed: bool, mem_limit_bytes: int = 0) -> Ending:
    """The task's end once its container stopped. `killed`: the agent stopped it
    (a kill, a shutdown); a memory kill counts as the kernel's even then."""
    if container.oom_killed:
        limit = f" of {mem_limit_bytes / MIB:.1f} MiB" if mem_limit_bytes else ""
        return Ending(TaskState.TASK_FAILED, Reason.CONTAINER_LIMITATION_MEMORY,
                      f"Memory limit exceeded: the kernel killed container "
                      f"{container.id[:12]} at its limit{limit}")
    described = describe(container)
    if killed:
        return Ending(TaskState.TASK_KILLED, "", f"Killed: {described}")
    if container.error:
        return Ending(TaskState.TASK_FAILED, Reason.CONTAINER_LAUNCH_FAILED,
                      f"Container failed: {container.error}")
    if container.exit_code == 0:
        return Ending(TaskState.TASK_FINISHED, "", described)
    return Ending(TaskState.TASK_FAILED, "", described)


def describe(container: ContainerState) -> str:
    code = container.exit_code
    if SIGNAL_BASE < code <= SIGNAL_BASE + 64:
        return (f"Container exited with status {code} "
                f"(signal {code - SIGNAL_BASE}, or an exit with that status)")
    return f"Container exited with status {code}"


@attrs.frozen
class Listed:
    """One container the engine lists for this agent."""

    container_id: str
    labels: dict[str, str]
    running: bool


@attrs.frozen
class Recovery:
    adopt: tuple[tuple[RunKey, str], ...] = ()    # running: wait on it, follow its logs
    ended: tuple[tuple[RunKey, str], ...] = ()    # stopped: inspect it for the exit
    vanished: tuple[RunKey, ...] = ()             # gone: its tasks end TASK_FAILED/LOST
    orphans: tuple[str, ...] = ()                 # no known run: remove


def recover(agent_id: str, known: Mapping[RunKey, str | None],
            listed: Iterable[Listed]) -> Recovery:
    """`known`: each checkpointed container run and its container id (None if it
    was never written down). Containers labelled for another agent are left
    alone: on a shared engine they are that agent's to judge."""
    by_id: dict[str, Listed] = {}
    by_run: dict[RunKey, Listed] = {}
    for item in listed:
        labels = ContainerLabels.parse(item.labels)
        if labels is None or labels.agent_id != agent_id:
            continue
        by_id[item.container_id] = item
        by_run.setdefault((labels.framework_id, labels.executor_id, labels.run_id), item)
    adopt, ended, vanished = [], [], []
    claimed: set[str] = set()
    for key in sorted(known):
        container_id = known[key]
        item = by_id.get(container_id) if container_id else None
        if item is None and container_id is None:
            item = by_run.get(key)
        if item is None or item.container_id in claimed:
            vanished.append(key)
            continue
        claimed.add(item.container_id)
        (adopt if item.running else ended).append((key, item.container_id))
    orphans = sorted(set(by_id) - claimed)
    return Recovery(tuple(adopt), tuple(ended), tuple(vanished), tuple(orphans))
