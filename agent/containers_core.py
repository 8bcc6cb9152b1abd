"""The container half of `AgentState`: runs from Docker images -- pure.

A run whose `ExecutorInfo` has a `container` is started by the Docker shell
(`agent.docker_runner`) instead of as a host process:

- a **command task** with a container (`AgentExecutor.direct`) has no executor
  process at all: the agent plays its executor. LAUNCHING (URIs fetched, image
  pulled -- each `ImagePullProgress` is a `TASK_STARTING` whose message says how
  far the pull got) -> `ContainerStarted` (the container id is checkpointed
  before `TASK_RUNNING` goes out; health checks start) -> RUNNING -> a kill stops
  it (SIGTERM, SIGKILL after the task's kill grace) -> `ContainerExited`, whose
  engine state becomes the task's end (`agent.container_runs.ending`: an OOM kill
  is `TASK_FAILED`/`REASON_CONTAINER_LIMITATION_MEMORY`);
- a **custom executor** in an image registers over the executor socket like any
  executor; only its start and end come from the engine. Its registration
  timeout is armed when its container starts, so a long pull is never taken for
  an executor that failed to register.

No registration timeout covers a pull: the shell's own pull timeout does.
`AgentState` inherits these methods and dispatches to them with a few lines.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from agent import launch, persistent
from agent.container_runs import ending
from agent.container_spec import ContainerRun, check_container
from agent.docker_wire import ContainerState
from agent.model import (
    LAUNCHING,
    RUNNING,
    TERMINATING,
    AgentExecutor,
    RegistrationTimeout,
    TaskEnd,
)
from agent.runs import ExecutorRuns
from dyad.containers import SANDBOX_MOUNT, Network
from dyad.volumes import DynamicResources
from dyad.messages import (
    URI,
    ExecutorInfo,
    Reason,
    Source,
    TaskInfo,
    TaskState,
)

if TYPE_CHECKING:
    from agent.state import Effect

log = logging.getLogger(__name__)

DOCKER = "docker"

# ------------------------------------------------------------------------- events


@attrs.frozen
class ContainerStarted:
    framework_id: str
    executor_id: str
    run_id: str
    container_id: str


@attrs.frozen
class ContainerExited:
    """The run's container stopped; `state` is the engine's last word on it."""

    framework_id: str
    executor_id: str
    run_id: str
    state: ContainerState


@attrs.frozen
class ContainerLaunchFailed:
    """No container runs: a pull, create or start failed, or a fetch did."""

    framework_id: str
    executor_id: str
    run_id: str
    message: str
    reason: str = Reason.CONTAINER_LAUNCH_FAILED


@attrs.frozen
class ImagePullProgress:
    """How far the pull of the run's image got (the shell sends one every ~2 s)."""

    framework_id: str
    executor_id: str
    run_id: str
    summary: str


@attrs.frozen
class ContainerLogPosition:
    """The engine time of the last log frame copied into the sandbox: where a
    restarted agent resumes copying."""

    framework_id: str
    executor_id: str
    run_id: str
    nanos: int


ContainerEvent = (ContainerStarted | ContainerExited | ContainerLaunchFailed
                  | ImagePullProgress | ContainerLogPosition)

# ------------------------------------------------------------------------ effects


@attrs.frozen
class LaunchContainer:
    """Fetch `uris` into the sandbox, pull the image if it is missing (or
    `force_pull`), create and start the container of `run`; report
    `ContainerStarted` then `ContainerExited`, or `ContainerLaunchFailed`, once."""

    run: ContainerRun
    uris: tuple[URI, ...] = ()


@attrs.frozen
class RemoveContainer:
    """The run is over and written down: remove its container from the engine."""

    framework_id: str
    executor_id: str
    run_id: str


# -------------------------------------------------------------------------- rules


class ContainerRuns(ExecutorRuns):
    """Container runs' launch, start, progress, kill, end and recovery."""

    dynamic: DynamicResources  # the volumes a container may bind (AgentState's)

    def _container_problem(self, task: TaskInfo, info: ExecutorInfo, new: bool) -> str:
        """Why the task's (or its new executor's) container cannot run on this agent."""
        container = task.container if task.executor is None else info.container
        if container is None or (task.executor is not None and not new):
            return ""
        if DOCKER not in self.config.containerizers:
            return ("this agent runs no containers (containerizers: "
                    f"{','.join(self.config.containerizers)}): start it with "
                    "--containerizers process,docker and a Docker Engine")
        resources = task.resources if task.executor is None else info.resources
        found = check_container(container, resources, self.config.docker)
        docker = container.docker
        if task.executor is not None and docker is not None and docker.network != Network.HOST:
            found.append("executor.container.docker.network must be HOST: a custom executor "
                         "in a container reaches the agent over the host's network")
        return "; ".join(found)

    def _launch_container(self, executor: AgentExecutor, task: TaskInfo) -> list[Effect]:
        info = executor.info
        assert info.container is not None
        if executor.direct:
            record = executor.queued[task.task_id]
            env = launch.task_env(self.config, self.agent_id, executor, record)
            command, uris, resources = task.command, task.command, task.resources
        else:
            env = dict(info.command.environment)
            env.update(launch.executor_env(self.config, self.agent_id, executor))
            command, uris, resources = info.command, info.command, info.resources
        assert command is not None and uris is not None
        # Inside, the sandbox is at its mount point, whatever the host calls it; where
        # the host has it is said too, for paths handed to others (the agent's /files).
        env.update({"MESOS_SANDBOX": SANDBOX_MOUNT, "MESOS_DIRECTORY": SANDBOX_MOUNT,
                    "DYAD_SANDBOX_DIRECTORY": SANDBOX_MOUNT,
                    "DYAD_HOST_SANDBOX_DIRECTORY": executor.directory,
                    "DYAD_CONTAINER": "docker"})
        run = ContainerRun(
            agent_id=self.agent_id or "", framework_id=executor.framework_id,
            executor_id=executor.executor_id, run_id=executor.run_id, container=info.container,
            sandbox_dir=executor.directory, resources=resources,
            cpus=executor.limits.cpus, mem_bytes=executor.limits.mem_bytes, command=command,
            env=env, task_id=task.task_id if executor.direct else "",
            persistent=tuple(m for mounts in persistent.mounts(
                self.config.work_dir, self.dynamic, executor.directory,
                [task.resources, info.resources]) for m in mounts.mounts))
        return [LaunchContainer(run, tuple(uris.uris))]

    # ---------------------------------------------------------------- events

    def _on_container(self, event: ContainerEvent, now: float) -> list[Effect]:
        executor = self.records.executor(event.framework_id, event.executor_id)
        if executor is None or executor.run_id != event.run_id:
            # The run is gone (killed while launching): its container is nobody's.
            gone = [RemoveContainer(event.framework_id, event.executor_id, event.run_id)]
            return gone if isinstance(event, ContainerStarted | ContainerExited) else []
        match event:
            case ContainerStarted():
                return self._container_started(executor, event.container_id, now)
            case ContainerExited():
                return self._container_exited(executor, event.state, now)
            case ContainerLaunchFailed():
                return self._container_failed(executor, event, now)
            case ImagePullProgress():
                return self._pull_progress(executor, event.summary, now)
            case ContainerLogPosition():
                if event.nanos > executor.log_since_nanos:
                    executor.log_since_nanos = event.nanos
                    self._changed()
                return []
        raise TypeError(f"not a container event: {event!r}")

    def _container_started(self, executor: AgentExecutor, container_id: str,
                           now: float) -> list[Effect]:
        executor.container_id = container_id
        self._changed()  # written down before TASK_RUNNING goes out
        if executor.phase != LAUNCHING:
            return []  # being killed: its exit follows
        if not executor.direct:  # a custom executor: now it must register
            return self._arm_executor_timer(executor, RegistrationTimeout,
                                            now + self.config.executor_registration_timeout)
        log.info("task %s runs in container %s", executor.executor_id, container_id[:12])
        return self._direct_running(executor, f"container {container_id[:12]} started", now)

    def _container_exited(self, executor: AgentExecutor, state: ContainerState,
                          now: float) -> list[Effect]:
        end = ending(state, executor.phase == TERMINATING, executor.limits.mem_bytes)
        effects: list[Effect] = []
        key = executor.key
        if executor.direct:
            # The engine's word on what the command did, unless it never ran or the
            # kernel killed it: then the agent's.
            told = Source.AGENT if state.oom_killed or state.error else Source.EXECUTOR
            effects += self._end_direct(executor, TaskEnd(end.state, end.reason, end.message),
                                        state.oom_killed, now, told)
            effects += self._on_executor_gone(*key, state.exit_code, now)
        else:
            effects += self._on_executor_gone(*key, state.exit_code, now,
                                              reason=end.reason or None, message=end.message)
        return effects + [RemoveContainer(*key)]

    def _container_failed(self, executor: AgentExecutor, event: ContainerLaunchFailed,
                          now: float) -> list[Effect]:
        log.warning("container of %s did not start: %s", executor.executor_id, event.message)
        state = TaskState.TASK_ERROR if event.reason == Reason.TASK_INVALID else \
            TaskState.TASK_FAILED
        effects: list[Effect] = []
        for task in list(executor.live_tasks()):
            end = task.kill_as or TaskEnd(state, event.reason, event.message)
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, end.state, end.reason,
                end.message, now), now)
        return effects + self._on_executor_gone(*executor.key, 127, now, reason=event.reason,
                                                message=event.message)

    def _pull_progress(self, executor: AgentExecutor, summary: str,
                       now: float) -> list[Effect]:
        """TASK_STARTING with the summary; while the last one is unacknowledged
        newer ones are dropped (they would only queue up behind it)."""
        if executor.phase != LAUNCHING:
            return []
        effects: list[Effect] = []
        for task in list(executor.queued.values()):
            if self.updates.queued(task.framework_id, task.task_id):
                continue
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_STARTING,
                "", summary, now), now)
        return effects

    # -------------------------------------------------------------- recovery

    def _container_recovered(self, executor: AgentExecutor, container_id: str | None,
                             now: float) -> list[Effect]:
        """A direct run whose container the shell found again after a restart
        (running, or stopped: then its exit follows)."""
        if container_id is not None and executor.container_id is None:
            executor.container_id = container_id  # died between start and checkpoint
        if executor.queued:  # it started, but its TASK_RUNNING never went out
            executor.phase = LAUNCHING
            return self._container_started(executor, executor.container_id or "", now)
        executor.phase = RUNNING
        effects: list[Effect] = []
        for task in executor.launched.values():
            effects += self._start_direct_check(executor, task, now)
        return effects

