"""The executor-run half of `AgentState`: a run's life from launch to exit.

LAUNCHING (fetching and starting; tasks queued) -> RUNNING (registered: queued
tasks sent as LaunchTask) -> TERMINATING (asked to stop; SIGTERM after the grace
period, SIGKILL later) -> gone (process exit: its unfinished tasks fail, the
master hears ExecutorExited). After an agent restart, runs whose process survived
are RECOVERING until they re-register (-> RUNNING) or the re-registration timeout
kills them. A direct run (a command task with no executor process, in a container
or on the host) never registers: it is RUNNING once its process or container
started, and its end is its task's (the shared steps are below).

`AgentState` inherits these methods; they are kept apart so that the state
machine reads in one sitting. They use the parts of `AgentState` declared at the
top of the class, and nothing else.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable

from agent import launch, limits
from agent.health import HealthChecker
from agent.model import (
    LAUNCHING, RECOVERING, REGISTERED, RUNNING, TERMINATED, TERMINATING, AgentConfig,
    AgentExecutor, AgentFramework, AgentTask, ExecutorStarted, ExecutorTimer, KillDue,
    KillExecutor, RegistrationTimeout, ReregistrationTimeout, TaskEnd, TermDue, UpdateLimits,
)
from agent.records import LIVE_PHASES, Records
from agent.sandbox import run_directory
from agent.status_updates import SendMaster
from dyad.effects import ArmTimer, CancelTimer, Send, TimerKey, UnknownTimer
from dyad.messages import (
    AgentInfo, ExecutorExited, ExecutorInfo, ExecutorRegistered, KillTask, LaunchTask, Reason,
    RegisterExecutor, ReregisterExecutor, ShutdownExecutor, Source, StatusUpdate, TaskInfo,
    TaskState,
)
from dyad.resources import Resources

if TYPE_CHECKING:
    from agent.state import Effect

log = logging.getLogger(__name__)


class ExecutorRuns:
    """Launch, register, reconcile, time out, stop and bury executor runs."""

    config: AgentConfig
    records: Records
    health: HealthChecker
    counters: Counter[str]
    used: Resources
    agent_id: str | None
    draining: bool
    shutting_down: bool
    _exits: list[ExecutorExited]
    _new_id: Callable[[], str]
    _seq: itertools.count[int]

    if TYPE_CHECKING:  # provided by AgentState
        @property
        def phase(self) -> str: ...
        def _changed(self, only: Iterable[AgentExecutor] | None = None) -> None: ...
        def _agent_info(self) -> AgentInfo: ...
        def _exit(self) -> list[Effect]: ...
        def _reject_executor(self, peer: str, reason: str, type_name: str) -> list[Effect]: ...
        def _on_executor_update(self, peer: str, executor: AgentExecutor, msg: StatusUpdate,
                                now: float) -> list[Effect]: ...
        def _transition(self, executor: AgentExecutor, task: AgentTask, update: StatusUpdate,
                        now: float) -> list[Effect]: ...
        def _status_update(self, framework_id: str, task_id: str, executor_id: str,
                           state: TaskState, reason: str, message: str, now: float,
                           healthy: bool | None = None,
                           source: str = Source.AGENT) -> StatusUpdate: ...
        def _launch_container(self, executor: AgentExecutor,
                              task: TaskInfo) -> list[Effect]: ...
        def _launch_host(self, executor: AgentExecutor, task: TaskInfo,
                         now: float) -> list[Effect]: ...

    def _new_executor(self, framework: AgentFramework, info: ExecutorInfo,
                      is_command: bool) -> AgentExecutor:
        run_id = self._new_id()
        directory = run_directory(self.config.work_dir, framework.id, info.executor_id, run_id)
        host_direct = (is_command and info.container is None
                       and self.config.command_tasks == "direct")
        executor = AgentExecutor(framework.id, info, run_id, directory, is_command,
                                 host_direct=host_direct)
        framework.executors[info.executor_id] = executor
        return executor

    def _launch_executor(self, executor: AgentExecutor, task: TaskInfo,
                         now: float) -> list[Effect]:
        executor.limits = limits.limits(executor)
        if executor.info.container is not None:  # no registration timer while pulling
            return self._launch_container(executor, task)
        if executor.host_direct:  # nothing to register: the agent runs the command
            return self._launch_host(executor, task, now)
        return [launch.launch(self.config, self.agent_id, executor, task,
                              self._run_user(executor, task)),
                *self._arm_executor_timer(executor, RegistrationTimeout,
                                          now + self.config.executor_registration_timeout)]

    def _update_limits(self, executor: AgentExecutor) -> list[Effect]:
        """The run's tasks changed: so may its limits (`agent.limits`)."""
        new = limits.limits(executor)
        if new == executor.limits:
            return []
        executor.limits = new
        if executor.phase not in LIVE_PHASES:
            return []
        return [UpdateLimits(*executor.key, new)]

    def _on_started(self, event: ExecutorStarted, now: float) -> list[Effect]:
        """The run's process exists. Its pid and start time are checkpointed before
        a direct run's TASK_RUNNING goes out, so a restarted agent finds it."""
        executor = self.records.executor(event.framework_id, event.executor_id)
        if executor is None or executor.run_id != event.run_id:
            return []
        executor.pid = event.pid
        executor.started = event.started
        self._changed((executor,))
        if executor.host_direct and executor.phase == LAUNCHING:
            return self._direct_running(executor, f"command started as pid {event.pid}", now)
        return []  # an executor: it registers; a direct run being killed: its exit follows

    # ------------------------------------------------------------ direct runs
    # A command task without an executor process, in a container (agent.containers_core)
    # or on the host (agent.host_runs): the agent plays its executor.

    def _direct_running(self, executor: AgentExecutor, message: str,
                        now: float) -> list[Effect]:
        """The run's process or container started: its tasks are TASK_RUNNING and
        their health checks start."""
        executor.phase = RUNNING
        effects: list[Effect] = []
        for task in list(executor.queued.values()):
            del executor.queued[task.task_id]
            executor.launched[task.task_id] = task
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_RUNNING,
                "", message, now, source=Source.EXECUTOR), now)
            effects += self._start_direct_check(executor, task, now)
        return effects

    def _start_direct_check(self, executor: AgentExecutor, task: AgentTask,
                            now: float) -> list[Effect]:
        check = task.info.health_check
        if check is None or task.kill_as is not None or task.state != TaskState.TASK_RUNNING:
            return []
        container = executor.info.container
        # A COMMAND check runs as the task's user on the host; in a container, inside it.
        user = "" if container is not None else self._run_user(executor, task.info)
        return [*self.health.start(task.framework_id, task.task_id,
                                   launch.health_check(container, check),
                                   executor.directory, self._task_env(executor, task), now,
                                   user)]

    def _end_direct(self, executor: AgentExecutor, end: TaskEnd, forced: bool, now: float,
                    source: str = Source.EXECUTOR) -> list[Effect]:
        """The run's process or container ended as `end` (told as `source`: the
        executor the agent plays, unless the agent itself knows the end): so do its
        tasks, unless the agent decided their end itself (`kill_as`, told as the
        agent's) and the end is not `forced` (a memory kill counts as the kernel's
        even then)."""
        effects: list[Effect] = []
        for task in list(executor.live_tasks()):
            outcome, told = (end, source) if forced or task.kill_as is None else (
                task.kill_as, Source.AGENT)
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, outcome.state,
                outcome.reason, outcome.message, now, source=told), now)
        return effects

    def _stop_direct(self, executor: AgentExecutor, grace: float | None,
                     now: float) -> list[Effect]:
        """Stop a direct run: SIGTERM now, SIGKILL after `grace` (else its task's
        kill grace period, else the agent's kill delay). The exit reports the end."""
        if executor.phase != RUNNING:
            return []
        if grace is None:
            grace = max((t.info.kill_grace_period for t in executor.live_tasks()
                         if t.info.kill_grace_period is not None),
                        default=self.config.executor_kill_delay)
        executor.phase = TERMINATING
        self._changed((executor,))
        what = "container" if executor.info.container is not None else "command"
        effects: list[Effect] = []
        for task in list(executor.launched.values()):
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLING,
                "", f"stopping {what}: SIGTERM, SIGKILL after {grace:g}s", now,
                source=Source.EXECUTOR), now)
        return [*effects, KillExecutor(*executor.key, "TERM"),
                *self._arm_executor_timer(executor, KillDue, now + grace)]

    def _on_register_executor(self, peer: str, msg: RegisterExecutor | ReregisterExecutor,
                              now: float) -> list[Effect]:
        claimed = self.records.peers.get(peer)
        if claimed is not None and claimed != (msg.framework_id, msg.executor_id):
            return self._reject_executor(
                peer, f"this connection is already executor {claimed[1]}", msg.TYPE)
        executor = self.records.executor(msg.framework_id, msg.executor_id)
        stop: list[Effect] = [Send(peer, ShutdownExecutor(
            grace_period=self.config.executor_shutdown_grace_period))]
        if executor is None or executor.phase == TERMINATING or executor.direct:
            return stop
        if executor.phase == RUNNING:
            # The same executor asking again (our answer was lost) gets it again;
            # a second process claiming the id is told to go away.
            return [self._registered(executor)] if executor.peer == peer else stop
        recovering = executor.phase == RECOVERING
        executor.phase = RUNNING
        self.records.attach(peer, executor)
        self._changed()
        effects = self._cancel(executor.timer)
        executor.timer = None
        effects.append(self._registered(executor))
        if recovering:
            effects += self._reconcile(peer, executor, msg, now)
            effects += self._restart_health_checks(executor, now)
        framework = self.records.frameworks[executor.framework_id]
        for task in list(executor.queued.values()):
            del executor.queued[task.task_id]
            executor.launched[task.task_id] = task
            effects.append(Send(peer, LaunchTask(framework=framework.info, task=task.info)))
        for task_id, grace in executor.pending_kills.items():
            effects.append(Send(peer, KillTask(framework_id=executor.framework_id,
                                               task_id=task_id, kill_grace_period=grace)))
        executor.pending_kills.clear()
        if self.draining:
            effects += self._drain_executor(executor, now)
        elif not executor.launched:
            effects += self._shutdown_executor(executor, now)  # its tasks were killed
        return effects

    def _registered(self, executor: AgentExecutor) -> Send:
        assert executor.peer is not None
        return Send(executor.peer, ExecutorRegistered(
            executor=executor.info, framework=self.records.frameworks[executor.framework_id].info,
            agent=self._agent_info(), agent_pid=self.config.pid))

    def _reconcile(self, peer: str, executor: AgentExecutor,
                   msg: RegisterExecutor | ReregisterExecutor, now: float) -> list[Effect]:
        """An executor re-registered after an agent restart: take its unacknowledged
        updates, and count as lost the launched tasks it no longer knows."""
        effects: list[Effect] = []
        known: set[str] = set()
        if isinstance(msg, ReregisterExecutor):
            known = {task.task_id for task in msg.tasks}
            for update in msg.updates:
                known.add(update.status.task_id)
                if update.framework_id == executor.framework_id:
                    effects += self._on_executor_update(peer, executor, update, now)
        for task in list(executor.launched.values()):
            if task.task_id not in known:
                effects += self._transition(executor, task, self._status_update(
                    task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_LOST,
                    Reason.AGENT_RESTARTED,
                    "the executor no longer knew the task when it re-registered after an "
                    "agent restart", now), now)
        return effects

    def _restart_health_checks(self, executor: AgentExecutor, now: float) -> list[Effect]:
        """Health is not checkpointed: checks of a recovered run start afresh."""
        effects: list[Effect] = []
        for task in executor.launched.values():
            check = task.info.health_check
            if task.state == TaskState.TASK_RUNNING and check and task.kill_as is None:
                effects += self.health.start(task.framework_id, task.task_id, check,
                                             executor.directory,
                                             self._task_env(executor, task), now,
                                             self._run_user(executor, task.info))
        return effects

    def _task_env(self, executor: AgentExecutor, task: AgentTask) -> dict[str, str]:
        return launch.task_env(self.config, self.agent_id, executor, task)

    def _run_user(self, executor: AgentExecutor, task: TaskInfo) -> str:
        """The user `executor`'s run runs as (its COMMAND health checks too)."""
        framework = self.records.frameworks.get(executor.framework_id)
        return launch.run_user(executor, task, framework.info.user if framework else "")

    def _arm_executor_timer(self, executor: AgentExecutor, kind: type[ExecutorTimer],
                            at: float) -> list[Effect]:
        effects = self._cancel(executor.timer)
        executor.timer = kind(executor.framework_id, executor.executor_id, next(self._seq))
        return effects + [ArmTimer(executor.timer, at)]

    def _on_executor_timer(self, executor: AgentExecutor, key: ExecutorTimer,
                           now: float) -> list[Effect]:
        match key:
            case RegistrationTimeout():
                return self._registration_timed_out(
                    executor, "register", self.config.executor_registration_timeout,
                    Reason.EXECUTOR_REGISTRATION_TIMEOUT, now)
            case ReregistrationTimeout():
                return self._registration_timed_out(
                    executor, "re-register after the agent restarted",
                    self.config.executor_reregistration_timeout,
                    Reason.EXECUTOR_REREGISTRATION_TIMEOUT, now)
            case TermDue():
                return [self._kill(executor, "TERM")] + self._arm_executor_timer(
                    executor, KillDue, now + self.config.executor_kill_delay)
            case KillDue():
                return [self._kill(executor, "KILL")]
            case _:
                raise UnknownTimer("AgentState", key)

    def _registration_timed_out(self, executor: AgentExecutor, verb: str, timeout: float,
                                reason: str, now: float) -> list[Effect]:
        log.warning("executor %s did not %s within %.0fs; killing it",
                    executor.executor_id, verb, timeout)
        executor.phase = TERMINATING
        self._changed()
        effects: list[Effect] = [self._kill(executor, "KILL")]
        for task in list(executor.live_tasks()):
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id,
                TaskState.TASK_FAILED, reason, f"executor did not {verb} within "
                f"{timeout:g}s", now), now)
        return effects

    def _memory_limitation(self, executor: AgentExecutor, message: str,
                           now: float) -> list[Effect]:
        """Fail the run's tasks with the memory reason and SIGKILL it at once."""
        log.warning("%s: killing it", message)
        self.counters["executors_memory_limited"] += 1
        effects = self._cancel(executor.timer)
        executor.timer = None
        for task in list(executor.live_tasks()):
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_FAILED,
                Reason.CONTAINER_LIMITATION_MEMORY, message, now), now)
        executor.phase = TERMINATING
        self._changed()
        return effects + [self._kill(executor, "KILL")]

    def _shutdown_executor(self, executor: AgentExecutor, now: float) -> list[Effect]:
        """Ask a registered executor to stop (SIGTERM after the grace period); an
        unregistered one cannot be asked, so it gets SIGTERM at once. SIGKILL follows.
        A direct run (no executor) is stopped with its tasks' grace."""
        if executor.direct and executor.phase == RUNNING:
            return self._stop_direct(executor, None, now)
        if executor.phase == RUNNING:
            executor.phase = TERMINATING
            self._changed()
            grace = launch.shutdown_grace(self.config, executor)
            assert executor.peer is not None
            return [Send(executor.peer, ShutdownExecutor(grace_period=grace)),
                    *self._arm_executor_timer(executor, TermDue, now + grace)]
        if executor.phase in (LAUNCHING, RECOVERING):
            executor.phase = TERMINATING
            self._changed()
            return [self._kill(executor, "TERM")] + self._arm_executor_timer(
                executor, KillDue, now + self.config.executor_kill_delay)
        return []

    @staticmethod
    def _kill(executor: AgentExecutor, sig: str) -> KillExecutor:
        return KillExecutor(executor.framework_id, executor.executor_id, executor.run_id, sig)

    def _on_executor_gone(self, framework_id: str, executor_id: str, run_id: str, status: int,
                          now: float, reason: str | None = None,
                          message: str | None = None) -> list[Effect]:
        """The run is over. `reason`/`message` say why its unfinished tasks fail when
        it is not a plain exit (a launch or fetch failure, a run lost in a restart)."""
        executor = self.records.executor(framework_id, executor_id)
        if executor is None or executor.run_id != run_id:
            return []
        self._changed((executor,))  # it leaves the records; the agent's own change too
        effects = self._cancel(executor.timer)
        executor.timer = None
        if reason is None:
            reason = (Reason.COMMAND_EXECUTOR_FAILED if executor.is_command
                      else Reason.EXECUTOR_TERMINATED)
        elif reason == Reason.CONTAINER_LAUNCH_FAILED:
            message = f"executor launch failed: {message}"
        text = message or f"Executor ended with status {status}"
        for task in list(executor.live_tasks()):
            end = task.kill_as or TaskEnd(TaskState.TASK_FAILED, reason, text)
            effects += self._transition(executor, task, self._status_update(
                framework_id, task.task_id, executor_id, end.state, end.reason, end.message,
                now), now)
        self.used = self.used - executor.info.resources
        executor.phase = TERMINATED
        executor.status = status
        self.records.retire(executor)
        # A command task's executor is the agent's own, never made known to the
        # master (as in Mesos): the task's terminal update tells all there is.
        if not executor.is_command:
            exited = ExecutorExited(agent_id=self.agent_id or "", framework_id=framework_id,
                                    executor_id=executor_id, status=status)
            if self.phase == REGISTERED:
                effects.append(SendMaster(exited))
            else:  # the master keeps charging the executor's resources until told
                self._exits = [*self._exits, exited][-self.config.completed_limit:]
        if self.shutting_down and not self.frameworks:
            effects += self._exit()
        return effects

    @staticmethod
    def _cancel(key: TimerKey | None) -> list[Effect]:
        return [] if key is None else [CancelTimer(key)]

    def _drain_executor(self, executor: AgentExecutor, now: float) -> list[Effect]:
        """Kill the run's tasks through a shutdown (their kill policy applies, then the
        executor's); they are reported TASK_KILLED with the drain reason."""
        if executor.phase == RECOVERING:
            return []  # drained once it re-registers (or is killed for not doing so)
        effects: list[Effect] = []
        for task in list(executor.queued.values()):
            effects += self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLED,
                Reason.AGENT_DRAINING, "killed before launch: the agent is draining", now), now)
        for task in executor.launched.values():
            task.kill_as = TaskEnd(TaskState.TASK_KILLED, Reason.AGENT_DRAINING,
                                   "killed: the agent is draining")
            effects += self.health.stop(task.framework_id, task.task_id)
        self._changed()
        return effects + self._shutdown_executor(executor, now)
