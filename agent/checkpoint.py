"""What an agent writes down so that, killed and restarted, it can take back its
running executors instead of killing them.

The checkpoint is one JSON document, ``WORK_DIR/meta/agent.json``: the agent id
and the machine it described (hostname, resources, attributes, ports), whether it
is draining, the dynamic reservations and persistent volumes the master made, every live framework, executor run (with its pid and process start
time) and task, and every status update the master has not acknowledged. The core
(`AgentState`) builds a `SavedAgent` whenever any of that changes and emits a
`Checkpoint` effect *before* the effects that depend on it (an ack to an
executor, a message to the master); the shell writes it (`agent.checkpoint_file`).

This module is the pure half: what is kept, how it is encoded and decoded, and
whether a checkpoint may be taken over. It touches no file, so `agent.state` can
import it and stay pure.

A restarted agent refuses the checkpoint when the machine it describes is not the
one it is told to be (`incompatibility`): the master keeps its books by what the
agent registered with, so a changed agent must start afresh (remove ``meta``).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, TypeVar

import attrs

from agent.model import (
    AgentConfig, AgentExecutor, AgentTask, ExecutorProcessExited, RunKey, TaskEnd,
)
from dyad.codec import CodecError, dumps, from_json, to_json
from dyad.messages import (
    ExecutorExited, ExecutorInfo, FrameworkInfo, StatusUpdate, TaskInfo, TaskState,
)
from dyad.resources import Resources
from dyad.volumes import DynamicResources

FORMAT = 1
META_DIR = "meta"
FILE = "agent.json"


class CheckpointError(Exception):
    """The checkpoint cannot be read, or describes another machine."""


@attrs.frozen(kw_only=True)
class SavedTask:
    info: TaskInfo
    state: TaskState
    status_uuid: str = ""
    seen_uuids: list[str] = attrs.field(factory=list)
    queued: bool = False  # never sent to the executor
    kill_as: TaskEnd | None = None


@attrs.frozen(kw_only=True)
class SavedExecutor:
    framework_id: str
    info: ExecutorInfo
    run_id: str
    directory: str
    is_command: bool
    phase: str
    pid: int | None = None
    started: float | None = None
    tasks: list[SavedTask] = attrs.field(factory=list)
    pending_kills: dict[str, float | None] = attrs.field(factory=dict)
    container_id: str | None = None
    log_since_nanos: int = 0
    host_direct: bool = False  # the agent runs the command itself (agent.host_runs)


@attrs.frozen(kw_only=True)
class SavedAgent:
    agent_id: str | None
    hostname: str
    resources: Resources
    attributes: dict[str, str]
    port: int
    executor_port: int
    draining: bool = False
    frameworks: list[FrameworkInfo] = attrs.field(factory=list)
    executors: list[SavedExecutor] = attrs.field(factory=list)
    updates: list[StatusUpdate] = attrs.field(factory=list)  # oldest first per task
    exits: list[ExecutorExited] = attrs.field(factory=list)  # not yet told the master
    # The master's reservations and volumes on this agent (agent.persistent).
    dynamic: DynamicResources = attrs.field(factory=DynamicResources)


def save_executor(executor: AgentExecutor) -> SavedExecutor:
    """What a restart needs of one run: no peer, timers or samples (all of this
    process's making), the tasks it has not seen acknowledged to the end."""
    tasks = [SavedTask(info=t.info, state=t.state, status_uuid=t.status_uuid,
                       seen_uuids=sorted(t.seen_uuids), queued=t.task_id in executor.queued,
                       kill_as=t.kill_as)
             for t in (*executor.live_tasks(), *executor.terminated.values())]
    return SavedExecutor(
        framework_id=executor.framework_id, info=executor.info, run_id=executor.run_id,
        directory=executor.directory, is_command=executor.is_command, phase=executor.phase,
        pid=executor.pid, started=executor.started, tasks=tasks,
        pending_kills=dict(executor.pending_kills), container_id=executor.container_id,
        log_since_nanos=executor.log_since_nanos, host_direct=executor.host_direct)


class SavedRuns:
    """The saved form of every live run, rebuilt at a checkpoint only for the runs
    marked changed since the last one: with 500 runs live, an event that touched
    one pays for one (the `Encoder` then reuses the JSON of every other)."""

    def __init__(self) -> None:
        self._saved: dict[RunKey, SavedExecutor] = {}
        self._stale: set[RunKey] = set()
        self._all_stale = True

    def changed(self, executors: Iterable[AgentExecutor] | None = None) -> None:
        """`executors` changed (None: any run may have)."""
        if executors is None:
            self._all_stale = True
        else:
            self._stale.update(e.key for e in executors)

    def save(self, executors: Iterable[AgentExecutor]) -> list[SavedExecutor]:
        saved: dict[RunKey, SavedExecutor] = {}
        for executor in executors:
            key = executor.key
            kept = None if self._all_stale or key in self._stale else self._saved.get(key)
            saved[key] = kept if kept is not None else save_executor(executor)
        self._saved, self._stale, self._all_stale = saved, set(), False
        return list(saved.values())

    def validate(self, executors: Iterable[AgentExecutor]) -> None:
        """What is kept for a run not marked changed is what it would save now."""
        if self._all_stale:
            return
        for executor in executors:
            kept = self._saved.get(executor.key)
            if kept is not None and executor.key not in self._stale:
                assert kept == save_executor(executor), f"run {executor.key} changed unmarked"


def load_executor(saved: SavedExecutor, phase: str) -> AgentExecutor:
    """The run's record again, in `phase` (the caller decides what it is now)."""
    executor = AgentExecutor(saved.framework_id, saved.info, saved.run_id, saved.directory,
                              saved.is_command, phase=phase, pid=saved.pid,
                              started=saved.started, pending_kills=dict(saved.pending_kills),
                              container_id=saved.container_id,
                              log_since_nanos=saved.log_since_nanos,
                              host_direct=saved.host_direct)
    for task in saved.tasks:
        record = AgentTask(task.info, saved.framework_id, saved.info.executor_id, task.state,
                            task.status_uuid, set(task.seen_uuids), task.kill_as)
        group = (executor.terminated if task.state.is_terminal
                 else executor.queued if task.queued else executor.launched)
        group[record.task_id] = record
    return executor


@attrs.frozen
class Recover:
    """Event for `AgentState`: take over `saved`; `alive` holds the runs
    ``(framework_id, executor_id, run_id)`` whose process (or container) survived;
    `containers` the container of each such run from an image; `exits` how each
    direct run that ended while the agent was away ended, as its holder told it
    (a direct run neither alive nor here left no status: `agent.host_runs`)."""

    saved: SavedAgent
    alive: frozenset[tuple[str, str, str]] = frozenset()
    containers: dict[tuple[str, str, str], str] = attrs.field(factory=dict)
    exits: dict[tuple[str, str, str], ExecutorProcessExited] = attrs.field(factory=dict)


def meta_dir(work_dir: str) -> str:
    """The directory under `work_dir` that holds the checkpoint."""
    return f"{work_dir.rstrip('/')}/{META_DIR}"


def decode(data: bytes) -> SavedAgent:
    """Parse a checkpoint; raises `CheckpointError` saying what is wrong."""
    try:
        document = json.loads(data)
    except (RecursionError, ValueError) as exc:  # ValueError: bad UTF-8 or JSON
        raise CheckpointError(f"checkpoint is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint format is not {FORMAT}")
    try:
        saved: SavedAgent = from_json(SavedAgent, document.get("agent"), "agent")
    except CodecError as exc:
        raise CheckpointError(f"checkpoint is damaged: {exc}") from None
    return saved


def encode(saved: SavedAgent) -> bytes:
    return Encoder().encode(saved)


class Encoder:
    """Encodes the checkpoints of one agent. The JSON form of each executor and
    update is kept from the last call and reused while unchanged, so an event that
    touched one task does not pay for encoding every other one (encoding dominates
    the cost of a checkpoint: docs/agent.md has the figures)."""

    def __init__(self) -> None:
        self._executors: dict[tuple[str, str, str], tuple[SavedExecutor, str]] = {}
        self._updates: dict[str, tuple[StatusUpdate, str]] = {}

    def encode(self, saved: SavedAgent) -> bytes:
        executors: dict[tuple[str, str, str], tuple[SavedExecutor, str]] = {}
        for executor in saved.executors:
            key = (executor.framework_id, executor.info.executor_id, executor.run_id)
            executors[key] = _reuse(self._executors.get(key), executor)
        updates = {u.status.uuid: _reuse(self._updates.get(u.status.uuid), u)
                   for u in saved.updates}
        self._executors, self._updates = executors, updates
        rest = to_json(attrs.evolve(saved, executors=[], updates=[]))
        del rest["executors"], rest["updates"]
        # The cached pieces are spliced into the rest's JSON object, whose text ends
        # with its closing brace: the same document json.dumps would write.
        head = _dumps(rest)[:-1]
        lists = (f'"executors":[{",".join(text for _, text in executors.values())}],'
                 f'"updates":[{",".join(text for _, text in updates.values())}]')
        return f'{{"format":{FORMAT},"agent":{head},{lists}}}}}'.encode()


_T = TypeVar("_T")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _reuse(cached: tuple[_T, str] | None, value: _T) -> tuple[_T, str]:
    """`cached` if it holds an equal value, else `value` with its JSON text."""
    if cached is not None and (cached[0] is value or cached[0] == value):
        return cached
    return value, dumps(value).decode()


def with_detected(saved: SavedAgent, config: AgentConfig,
                  detected: Iterable[str]) -> AgentConfig:
    """`config` with the resource kinds the agent detected itself (rather than was
    told) taken from the checkpoint: free disk moves between two starts, the
    machine the executors run on does not. Detection is fresh only on a new start."""
    kinds = set(detected)
    if not kinds:
        return config

    def kept(resources: Resources, from_checkpoint: bool) -> list[str]:
        pieces = [p for p in str(resources).split(";") if p]
        return [p for p in pieces if (p.split(":")[0].split("(")[0] in kinds) == from_checkpoint]

    text = ";".join(kept(config.resources, False) + kept(saved.resources, True))
    return attrs.evolve(config, resources=Resources.parse(text) if text else Resources())


def incompatibility(saved: SavedAgent, config: AgentConfig) -> str:
    """Why `config` cannot take over `saved` ('' if it can)."""
    problems = []
    if saved.hostname != config.hostname:
        problems.append(f"hostname was {saved.hostname!r}, is now {config.hostname!r}")
    if saved.resources != config.resources:
        problems.append(f"resources were {saved.resources}, are now {config.resources}")
    if saved.attributes != config.attributes:
        problems.append(f"attributes were {saved.attributes}, are now {config.attributes}")
    if not problems:
        return ""
    return (f"agent {saved.agent_id} cannot recover: {'; '.join(problems)}. Restore the "
            f"old settings, or remove {meta_dir(config.work_dir)} to start "
            "as a new agent (executors still running from before are then told to stop "
            "when they reconnect)")
