"""The agent's brain: executors, tasks and the link to the master, as a pure object.

`AgentState.handle(event, now) -> list[Effect]` is the only mutator. Events are what
the shell (`agent.server`) observed -- a message from the master or an executor, a
bad frame, a process start or exit, a usage sample, a health-check result, a
detected master, a timer, a drain or stop request, a checkpoint to recover from;
effects are what it must do -- send, launch, limit or signal an executor process,
run a health check, write the checkpoint, arm a timer, follow a master. Nothing
here touches a socket, a process, a file or the clock, so every rule of
docs/protocol.md and docs/agent.md is tested by feeding events and reading effects.
The vocabulary lives in `agent.model`, health-check timing in `agent.health`,
delivery of status updates in `agent.status_updates`, `/state` in `agent.views`.

Life of an executor run: LAUNCHING (fetching and starting; tasks queued) -> RUNNING
(registered: queued tasks sent as LaunchTask) -> TERMINATING (asked to stop;
SIGTERM after the grace period, SIGKILL later) -> gone (process exit: its
unfinished tasks fail, the master hears ExecutorExited). After an agent restart,
runs whose process survived are RECOVERING until they re-register (-> RUNNING) or
the re-registration timeout kills them.

Life of the master link: DETECTING -> REGISTERING (RegisterAgent retried with
backoff) -> REGISTERED. Silence from the master for 3 x ping_interval sends the
agent back to DETECTING. Status updates flow only while REGISTERED (see
`agent.status_updates`); a (re-)registration replays every unacknowledged one.

Whenever something a restarted agent would need changes, the effects of that
event begin with `Checkpoint` (see `agent.checkpoint`), so nothing is acknowledged
or reported before it is written down.

Nothing that arrives from the network raises: bad input is answered with
`Rejected` or a terminal status update, and counted.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from typing import Any, Callable

import attrs

from agent import checkpoint, limits, views
from agent.checkpoint import Recover, SavedAgent
from agent.health import (
    HealthChanged, HealthChecker, HealthCheckResult, HealthRound, RunHealthCheck,
)
from agent.model import (
    COMMAND_EXECUTOR_MODULE, DETECTING, LAUNCHING, RECOVERING, REGISTERED, REGISTERING,
    RUNNING, TERMINATED, TERMINATING, UNKNOWN_EXIT, AgentConfig, Checkpoint, ConnectMaster,
    DetectMaster, Drain, ExecutorLaunchFailed, ExecutorMessage, ExecutorProcessExited,
    ExecutorRecord, ExecutorStarted, ExecutorTimer, Exit, FrameworkRecord, Invalid, KillDue,
    KillExecutor, LaunchExecutor, MasterDetected, MasterMessage, MasterSilent, Outcome,
    RegisterRetry, RegistrationTimeout, ReregistrationTimeout, Shutdown, ShutdownDeadline,
    TaskRecord, TermDue, UpdateLimits, UsageSampled,
)
from agent.sandbox import InvalidId, check_id, run_directory
from agent.status_updates import SendMaster, StatusUpdateManager, UpdateRetry
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.ids import new_uuid
from dyad.messages import (
    AgentInfo, AgentRegistered, CommandInfo, DrainAgent, ExecutorExited, ExecutorInfo,
    ExecutorRegistered, ExecutorToFramework, FrameworkInfo,
    FrameworkToExecutor, KillTask, LaunchTask, MasterInfo, Message, Ping, Pong, Reason,
    RegisterAgent, RegisterExecutor, Rejected, ReregisterExecutor, RunTask, ShutdownExecutor,
    ShutdownFramework, Source, StatusUpdate, StatusUpdateAck, Task, TaskInfo, TaskState,
    TaskStatus, UsageReport,
)
from dyad.resources import Resources, ResourcesError

log = logging.getLogger(__name__)

MAX_PING_INTERVAL = 3600.0
LIVE_PHASES = (LAUNCHING, RECOVERING, RUNNING)

Event = (MasterMessage | ExecutorMessage | Invalid | ExecutorStarted | ExecutorProcessExited
         | ExecutorLaunchFailed | MasterDetected | TimerFired | Shutdown | Drain
         | UsageSampled | HealthCheckResult | Recover)

Effect = (SendMaster | Send | LaunchExecutor | KillExecutor | UpdateLimits | RunHealthCheck
          | ArmTimer | CancelTimer | ConnectMaster | DetectMaster | Checkpoint | Exit)


class AgentState:
    """One agent's executors, tasks and master link. See the module docstring."""

    def __init__(self, config: AgentConfig, new_id: Callable[[], str] = new_uuid) -> None:
        self.config = config
        self._new_id = new_id
        self.agent_id: str | None = None
        self.master: MasterInfo | None = None
        self.phase = DETECTING
        self.ping_interval = config.ping_interval
        self.frameworks: dict[str, FrameworkRecord] = {}
        self.completed_frameworks: deque[FrameworkRecord] = deque(maxlen=config.completed_limit)
        self.updates = StatusUpdateManager(config.status_update_backoff,
                                           config.status_update_backoff_max)
        self.health = HealthChecker()
        self.used = Resources()
        self.draining = False
        self.cached_uris: list[str] = []
        self.shutting_down = False
        self.exited = False
        self.exit_deadline: float | None = None
        self.counters: Counter[str] = Counter()
        self._peers: dict[str, tuple[str, str]] = {}  # executor peer -> (framework, executor)
        self._exits: list[ExecutorExited] = []  # told to the master once registered
        self._seq = itertools.count()
        self._register_backoff = config.register_backoff
        self._register_timer: RegisterRetry | None = None
        self._master_timer: MasterSilent | None = None
        self._shutdown_timer: ShutdownDeadline | None = None
        self._next_report = 0.0
        self._dirty = False

    # ----------------------------------------------------------------- dispatch

    def handle(self, event: Event, now: float) -> list[Effect]:
        effects = self._dispatch(event, now)
        if self._dirty:
            self._dirty = False
            effects.insert(0, Checkpoint())
        return effects

    def _dispatch(self, event: Event, now: float) -> list[Effect]:
        if isinstance(event, MasterMessage):
            self.counters["messages_received"] += 1
            return self._on_master_message(event.message, now)
        if isinstance(event, ExecutorMessage):
            self.counters["messages_received"] += 1
            return self._on_executor_message(event.peer, event.message, now)
        if isinstance(event, Invalid):
            return self._on_invalid(event)
        if isinstance(event, TimerFired):
            return self._on_timer(event.key, now)
        if isinstance(event, ExecutorStarted):
            return self._on_started(event)
        if isinstance(event, ExecutorProcessExited):
            return self._on_executor_gone(event.framework_id, event.executor_id, event.run_id,
                                          event.status, now, message=event.description)
        if isinstance(event, ExecutorLaunchFailed):
            # 127 is what a shell reports when a command cannot be executed.
            return self._on_executor_gone(event.framework_id, event.executor_id, event.run_id,
                                          127, now, reason=event.status_reason,
                                          message=event.reason)
        if isinstance(event, UsageSampled):
            return self._on_usage(event, now)
        if isinstance(event, HealthCheckResult):
            return self._on_health_result(event, now)
        if isinstance(event, MasterDetected):
            return self._on_master_detected(event.master_info, now)
        if isinstance(event, Drain):
            return self._on_drain(now)
        if isinstance(event, Recover):
            return self._on_recover(event, now)
        if isinstance(event, Shutdown):
            return self._on_shutdown(now)
        raise TypeError(f"not an agent event: {event!r}")

    def _changed(self) -> None:
        """Something a restarted agent needs changed: checkpoint before acting."""
        self._dirty = True

    def _on_master_message(self, msg: Message, now: float) -> list[Effect]:
        if isinstance(msg, AgentRegistered):
            return self._on_registered(msg, now)
        if isinstance(msg, Ping):
            return self._on_ping(msg, now)
        if isinstance(msg, RunTask):
            return self._on_run_task(msg, now)
        if isinstance(msg, KillTask):
            return self._on_kill_task(msg, now)
        if isinstance(msg, StatusUpdateAck):
            return self._on_ack(msg, now)
        if isinstance(msg, FrameworkToExecutor):
            return self._on_framework_message(msg)
        if isinstance(msg, ShutdownFramework):
            return self._on_shutdown_framework(msg, now)
        if isinstance(msg, Rejected):
            self.counters["rejected_by_master"] += 1
            log.warning("master rejected our %s: %s", msg.message_type or "message", msg.reason)
            return []
        return self._reject_master(f"agent does not accept {msg.TYPE} from the master",
                                   msg.TYPE)

    def _on_executor_message(self, peer: str, msg: Message, now: float) -> list[Effect]:
        if isinstance(msg, RegisterExecutor | ReregisterExecutor):
            return self._on_register_executor(peer, msg, now)
        if not isinstance(msg, StatusUpdate | ExecutorToFramework):
            return self._reject_executor(
                peer, f"agent does not accept {msg.TYPE} from an executor", msg.TYPE)
        executor = self._executor_of_peer(peer)
        if executor is None:
            return self._reject_executor(peer, "executor is not registered", msg.TYPE)
        if msg.framework_id != executor.framework_id:
            return self._reject_executor(
                peer, f"executor belongs to framework {executor.framework_id}", msg.TYPE)
        if isinstance(msg, StatusUpdate):
            return self._on_executor_update(peer, executor, msg, now)
        return self._to_master(attrs.evolve(msg, agent_id=self.agent_id or msg.agent_id,
                                            executor_id=executor.executor_id))

    def _on_invalid(self, event: Invalid) -> list[Effect]:
        self.counters["messages_received"] += 1
        self.counters["messages_invalid"] += 1
        log.info("invalid frame from %s %s: %s", event.source, event.peer, event.error.reason)
        if event.error.type_name == Rejected.TYPE:
            return []  # never answer a rejection with one: two peers could loop forever
        reply = Rejected(reason=event.error.reason, message_type=event.error.type_name)
        if event.source == "executor":
            return [Send(event.peer, reply)]
        return [SendMaster(reply)]

    def _reject_master(self, reason: str, type_name: str) -> list[Effect]:
        self.counters["messages_invalid"] += 1
        log.info("rejecting %s from the master: %s", type_name, reason)
        return [SendMaster(Rejected(reason=reason, message_type=type_name))]

    def _reject_executor(self, peer: str, reason: str, type_name: str) -> list[Effect]:
        self.counters["messages_invalid"] += 1
        log.info("rejecting %s from executor %s: %s", type_name, peer, reason)
        return [Send(peer, Rejected(reason=reason, message_type=type_name))]

    # --------------------------------------------------------------- the master

    def _on_master_detected(self, master: MasterInfo, now: float) -> list[Effect]:
        self.master = master
        self.phase = REGISTERING
        self._register_backoff = self.config.register_backoff
        effects: list[Effect] = [ConnectMaster(master.zmq_endpoint)]
        effects += self.updates.pause()
        effects += self._send_registration(now)
        effects += self._arm_master_timeout(now)
        return effects

    def _send_registration(self, now: float) -> list[Effect]:
        """RegisterAgent now, and again after a backoff unless answered."""
        effects = self._cancel(self._register_timer)
        self._register_timer = RegisterRetry(next(self._seq))
        at = now + self._register_backoff
        self._register_backoff = min(self._register_backoff * 2, self.config.register_backoff_max)
        return effects + [SendMaster(self._registration()), ArmTimer(self._register_timer, at)]

    def _registration(self) -> RegisterAgent:
        tasks: list[Task] = []
        executors: list[ExecutorInfo] = []
        frameworks: list[FrameworkInfo] = []
        for framework in self.frameworks.values():
            frameworks.append(framework.info)
            for executor in framework.executors.values():
                executors.append(executor.info)
                tasks += [self._task_view(t) for t in executor.live_tasks()]
        return RegisterAgent(agent=self._agent_info(), version=self.config.version,
                             tasks=tasks, executors=executors, frameworks=frameworks)

    def _agent_info(self) -> AgentInfo:
        c = self.config
        return AgentInfo(hostname=c.hostname, port=c.port, resources=c.resources,
                         attributes=dict(c.attributes), id=self.agent_id, ip=c.ip)

    def _task_view(self, task: TaskRecord) -> Task:
        return Task(task_id=task.task_id, framework_id=task.framework_id,
                    agent_id=self.agent_id or "", executor_id=task.executor_id,
                    name=task.info.name, state=task.state, resources=task.info.resources,
                    status_uuid=task.status_uuid, labels=dict(task.info.labels))

    def _arm_master_timeout(self, now: float) -> list[Effect]:
        effects = self._cancel(self._master_timer)
        self._master_timer = MasterSilent(next(self._seq))
        return effects + [ArmTimer(self._master_timer, now + 3 * self.ping_interval)]

    def _on_registered(self, msg: AgentRegistered, now: float) -> list[Effect]:
        if self.phase == DETECTING:
            return []  # an answer from a master we have since given up on
        # A nonsensical interval must not make the agent give up on the master at once.
        ok = 0 < msg.ping_interval <= MAX_PING_INTERVAL
        self.ping_interval = msg.ping_interval if ok else self.config.ping_interval
        self.master = msg.master_info
        effects = self._arm_master_timeout(now)
        if self.phase == REGISTERED:
            return effects  # a duplicate answer to a retried RegisterAgent
        if self.agent_id is not None and self.agent_id != msg.agent_id:
            log.warning("master gave us a new agent id %s (was %s)", msg.agent_id, self.agent_id)
        if self.agent_id != msg.agent_id:
            self._changed()
        self.agent_id = msg.agent_id
        self.phase = REGISTERED
        effects += self._cancel(self._register_timer)
        self._register_timer = None
        effects += self.updates.resume(now)
        if self._exits:
            effects += [SendMaster(attrs.evolve(e, agent_id=msg.agent_id)) for e in self._exits]
            self._exits.clear()
            self._changed()
        if self.draining:
            effects.append(SendMaster(DrainAgent(agent_id=msg.agent_id)))
        return effects

    def _on_ping(self, msg: Ping, now: float) -> list[Effect]:
        effects: list[Effect] = [SendMaster(Pong(agent_id=self.agent_id or msg.agent_id))]
        if self.phase != DETECTING:
            effects += self._arm_master_timeout(now)
        return effects

    def _master_lost(self) -> list[Effect]:
        log.warning("no word from the master for %.1fs; detecting it again",
                    3 * self.ping_interval)
        self.phase = DETECTING
        self._master_timer = None
        effects = self._cancel(self._register_timer)
        self._register_timer = None
        return effects + self.updates.pause() + [DetectMaster()]

    def _to_master(self, msg: Message) -> list[Effect]:
        """Best-effort messages go to whichever master we are connected to."""
        if self.phase == DETECTING:
            self.counters["messages_dropped"] += 1
            return []
        return [SendMaster(msg)]

    # ----------------------------------------------------------------- timers

    def _on_timer(self, key: object, now: float) -> list[Effect]:
        """A key that is not the one armed now is stale (re-armed, or its subject is
        gone) and ignored; a kind of key the agent never arms is a bug."""
        match key:
            case UpdateRetry():
                return [*self.updates.timer_fired(key, now)]
            case HealthRound():
                return [*self.health.timer_fired(key, now)]
            case RegisterRetry():
                if key == self._register_timer and self.phase == REGISTERING:
                    return self._send_registration(now)
                return []
            case MasterSilent():
                return self._master_lost() if key == self._master_timer else []
            case ShutdownDeadline():
                if key != self._shutdown_timer:
                    return []
                log.warning("executors still running after the shutdown deadline; exiting")
                return self._exit()
            case ExecutorTimer():
                executor = self._executor(key.framework_id, key.executor_id)
                if executor is None or executor.timer != key:
                    return []
                executor.timer = None
                return self._on_executor_timer(executor, key, now)
            case _:
                raise UnknownTimer("AgentState", key)

    def _arm_executor_timer(self, executor: ExecutorRecord, kind: type[ExecutorTimer],
                            at: float) -> list[Effect]:
        effects = self._cancel(executor.timer)
        executor.timer = kind(executor.framework_id, executor.executor_id, next(self._seq))
        return effects + [ArmTimer(executor.timer, at)]

    @staticmethod
    def _cancel(key: TimerKey | None) -> list[Effect]:
        return [] if key is None else [CancelTimer(key)]

    # ------------------------------------------------------------------- tasks

    def _on_run_task(self, msg: RunTask, now: float) -> list[Effect]:
        task, framework_id = msg.task, msg.framework.id
        if framework_id is None:
            return self._reject_master("run_task needs framework.id", msg.TYPE)
        if (self._find_task(framework_id, task.task_id) is not None
                or self.updates.has_stream(framework_id, task.task_id)):
            return self._reject_master(f"task {task.task_id} already exists on this agent",
                                       msg.TYPE)
        if (task.command is None) == (task.executor is None):
            return self._agent_update(framework_id, task.task_id, "", TaskState.TASK_ERROR,
                                      Reason.TASK_INVALID,
                                      "task needs exactly one of command or executor", now)
        executor_id = task.executor.executor_id if task.executor else task.task_id
        try:
            check_id("framework id", framework_id)
            check_id("executor id", executor_id)
        except InvalidId as exc:
            return self._agent_update(framework_id, task.task_id, executor_id,
                                      TaskState.TASK_ERROR, Reason.TASK_INVALID, str(exc), now)
        info = self._executor_info_for(framework_id, task)
        if self.shutting_down:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_LOST, Reason.AGENT_RESTARTED,
                                      "agent is shutting down", now)
        if self.draining:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_DROPPED, Reason.AGENT_DRAINING,
                                      "agent is draining", now)
        framework = self.frameworks.get(framework_id)
        executor = framework.executors.get(info.executor_id) if framework else None
        if executor is not None and executor.phase == TERMINATING:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_LOST, Reason.EXECUTOR_TERMINATED,
                                      "executor is shutting down", now)
        needed = self._needed(task, info, executor is None)
        if needed is None:
            return self._agent_update(
                framework_id, task.task_id, info.executor_id, TaskState.TASK_ERROR,
                Reason.TASK_INVALID,
                f"task needs {task.resources} but the agent has only "
                f"{self._free()} free", now)

        self._changed()
        effects: list[Effect] = []
        if framework is None:
            framework = self.frameworks[framework_id] = FrameworkRecord(msg.framework)
        else:
            framework.info = msg.framework
        self.used = self.used + needed
        record = TaskRecord(task, framework_id, info.executor_id)
        if executor is None:
            executor = self._new_executor(framework, info, task.command is not None)
            executor.queued[task.task_id] = record
            return self._launch_executor(framework, executor, task, now)
        if executor.phase == RUNNING:
            assert executor.peer is not None
            executor.launched[task.task_id] = record
            effects.append(Send(executor.peer, LaunchTask(framework=framework.info, task=task)))
        else:  # LAUNCHING, or RECOVERING: sent once it (re-)registers
            executor.queued[task.task_id] = record
        return effects + self._update_limits(executor)

    def _executor_info_for(self, framework_id: str, task: TaskInfo) -> ExecutorInfo:
        if task.executor is not None:
            return attrs.evolve(task.executor, framework_id=framework_id)
        # A plain command runs under the built-in command executor, one per task,
        # with the task's id and no resources of its own (docs/protocol.md).
        command = CommandInfo(argv=[self.config.python, "-m", COMMAND_EXECUTOR_MODULE])
        return ExecutorInfo(executor_id=task.task_id, command=command,
                            name=f"Command Executor (Task: {task.task_id})",
                            framework_id=framework_id)

    def _needed(self, task: TaskInfo, info: ExecutorInfo, new_executor: bool) -> Resources | None:
        """What accepting `task` adds to `used`, or None if that does not fit."""
        try:
            needed = task.resources + info.resources if new_executor else task.resources
            fits = self.used + needed <= self.config.resources
        except ResourcesError:  # e.g. the same port twice
            return None
        return needed if fits else None

    def _free(self) -> Resources:
        try:
            return self.config.resources - self.used
        except ResourcesError:
            return Resources()

    def _new_executor(self, framework: FrameworkRecord, info: ExecutorInfo,
                      is_command: bool) -> ExecutorRecord:
        run_id = self._new_id()
        directory = run_directory(self.config.work_dir, framework.id, info.executor_id, run_id)
        executor = ExecutorRecord(framework.id, info, run_id, directory, is_command)
        framework.executors[info.executor_id] = executor
        return executor

    def _launch_executor(self, framework: FrameworkRecord, executor: ExecutorRecord,
                         task: TaskInfo, now: float) -> list[Effect]:
        info = executor.info
        env = dict(info.command.environment)
        env.update(self._executor_env(executor))
        # A command task's URIs are fetched into its command executor's sandbox.
        uris = (task.command if executor.is_command and task.command else info.command).uris
        executor.limits = limits.limits(executor)
        effects: list[Effect] = [LaunchExecutor(
            framework.id, info.executor_id, executor.run_id, info.command, env,
            executor.directory, tuple(uris), executor.limits)]
        return effects + self._arm_executor_timer(
            executor, RegistrationTimeout, now + self.config.executor_registration_timeout)

    def _executor_env(self, executor: ExecutorRecord) -> dict[str, str]:
        endpoint = self.config.executor_endpoint
        return {
            "DYAD_AGENT_ENDPOINT": endpoint, "DYAD_AGENT_ID": self.agent_id or "",
            "DYAD_FRAMEWORK_ID": executor.framework_id,
            "DYAD_EXECUTOR_ID": executor.executor_id,
            "DYAD_SANDBOX_DIRECTORY": executor.directory,
            "DYAD_RECOVERY_TIMEOUT": f"{self.config.recovery_timeout:g}s",
            "MESOS_AGENT_ENDPOINT": endpoint, "MESOS_FRAMEWORK_ID": executor.framework_id,
            "MESOS_EXECUTOR_ID": executor.executor_id, "MESOS_DIRECTORY": executor.directory,
            "MESOS_SANDBOX": executor.directory,
        }

    def _update_limits(self, executor: ExecutorRecord) -> list[Effect]:
        """The run's tasks changed: so may its limits (`agent.limits`)."""
        new = limits.limits(executor)
        if new == executor.limits:
            return []
        executor.limits = new
        if executor.phase not in LIVE_PHASES:
            return []
        return [UpdateLimits(*executor.key, new)]

    def _on_kill_task(self, msg: KillTask, now: float) -> list[Effect]:
        found = self._find_task_with_executor(msg.framework_id, msg.task_id)
        if found is None:
            if self._is_completed(msg.framework_id, msg.task_id):
                return []  # its terminal update already went out
            return self._agent_update(msg.framework_id, msg.task_id, "", TaskState.TASK_LOST,
                                      Reason.TASK_UNKNOWN, "task is unknown to the agent", now)
        executor, task = found
        if task.task_id in executor.queued:
            killed = self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLED,
                Reason.TASK_KILLED_DURING_LAUNCH, "killed before the executor registered", now),
                now)
            if executor.phase == LAUNCHING and not any(executor.live_tasks()):
                killed += self._shutdown_executor(executor, now)  # launched for nothing
            return killed
        if task.task_id not in executor.launched:
            return []  # terminal already; its update is on its way
        effects: list[Effect] = [*self.health.stop(task.framework_id, task.task_id)]
        if executor.phase == RECOVERING:
            executor.pending_kills[task.task_id] = msg.kill_grace_period
            self._changed()
        elif executor.peer is not None:
            effects.append(Send(executor.peer, msg))
        return effects

    def _kill_launched(self, executor: ExecutorRecord, task: TaskRecord,
                       outcome: Outcome) -> list[Effect]:
        """Ask the executor to kill `task` (its kill policy applies) and report the
        end as `outcome`, whatever the executor calls it."""
        task.kill_as = outcome
        self._changed()
        effects: list[Effect] = [*self.health.stop(task.framework_id, task.task_id)]
        if executor.phase == RUNNING and executor.peer is not None:
            effects.append(Send(executor.peer, KillTask(
                framework_id=task.framework_id, task_id=task.task_id,
                kill_grace_period=task.info.kill_grace_period)))
        return effects

    def _on_ack(self, msg: StatusUpdateAck, now: float) -> list[Effect]:
        acked = self.updates.acked
        effects: list[Effect] = [*self.updates.acknowledge(msg.framework_id, msg.task_id,
                                                            msg.uuid, now)]
        if self.updates.acked != acked:
            self._changed()
        if not self.updates.has_stream(msg.framework_id, msg.task_id):
            found = self._find_task_with_executor(msg.framework_id, msg.task_id)
            if found is not None and found[1].task_id in found[0].terminated:
                executor, task = found
                del executor.terminated[task.task_id]
                self._keep_completed(executor.completed, task)
        return effects

    def _on_executor_update(self, peer: str, executor: ExecutorRecord, msg: StatusUpdate,
                            now: float) -> list[Effect]:
        status = msg.status
        if not status.uuid:
            return self._reject_executor(peer, "status update needs a uuid", msg.TYPE)
        ack: list[Effect] = [Send(peer, StatusUpdateAck(
            agent_id=self.agent_id or "", framework_id=msg.framework_id,
            task_id=status.task_id, uuid=status.uuid))]
        task = executor.launched.get(status.task_id) or executor.terminated.get(status.task_id)
        if task is None or status.uuid in task.seen_uuids or task.state.is_terminal:
            # Unknown task, an executor's resend, or news after the end: acknowledged
            # so the executor stops resending, but never forwarded.
            self.counters["status_updates_dropped"] += 1
            return ack
        status = attrs.evolve(status, agent_id=status.agent_id or self.agent_id or "",
                              executor_id=status.executor_id or executor.executor_id)
        outcome = task.kill_as
        if status.state.is_terminal and outcome is not None:
            told = f" ({status.message})" if status.message else ""
            status = attrs.evolve(status, state=outcome.state, reason=outcome.reason,
                                  message=outcome.message + told)
        effects = self._transition(executor, task, attrs.evolve(msg, status=status), now)
        check = task.info.health_check
        if status.state == TaskState.TASK_RUNNING and check is not None and outcome is None:
            effects += self.health.start(task.framework_id, task.task_id, check,
                                         executor.directory, self._task_env(executor, task), now)
        return effects + ack

    def _task_env(self, executor: ExecutorRecord, task: TaskRecord) -> dict[str, str]:
        """The environment a COMMAND health check of `task` runs with: its executor's,
        its command's, and its id -- what the task itself saw."""
        env = dict(executor.info.command.environment)
        env.update(self._executor_env(executor))
        if task.info.command is not None:
            env.update(task.info.command.environment)
        env["DYAD_TASK_ID"] = env["MESOS_TASK_ID"] = task.task_id
        return env

    def _transition(self, executor: ExecutorRecord, task: TaskRecord, update: StatusUpdate,
                    now: float) -> list[Effect]:
        """Record `update` as `task`'s latest state and hand it to its stream."""
        self._changed()
        state = update.status.state
        task.state = state
        task.status_uuid = update.status.uuid
        task.seen_uuids.add(update.status.uuid)
        effects: list[Effect] = []
        if state.is_terminal or state == TaskState.TASK_KILLING:
            effects += self.health.stop(task.framework_id, task.task_id)
        if state.is_terminal:
            del (executor.queued if task.task_id in executor.queued
                 else executor.launched)[task.task_id]
            executor.terminated[task.task_id] = task
            executor.pending_kills.pop(task.task_id, None)
            self.used = self.used - task.info.resources
            self.counters[_state_metric(state)] += 1
            effects += self._update_limits(executor)
        return effects + [*self.updates.add(update, now)]

    def _agent_update(self, framework_id: str, task_id: str, executor_id: str,
                      state: TaskState, reason: str, message: str,
                      now: float) -> list[Effect]:
        """A terminal update for a task the agent never ran (no record to keep)."""
        self._changed()
        self.counters[_state_metric(state)] += 1
        update = self._status_update(framework_id, task_id, executor_id, state, reason,
                                     message, now)
        return [*self.updates.add(update, now)]

    def _status_update(self, framework_id: str, task_id: str, executor_id: str,
                       state: TaskState, reason: str, message: str, now: float,
                       healthy: bool | None = None) -> StatusUpdate:
        return StatusUpdate(framework_id=framework_id, status=TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message,
            source=Source.AGENT, agent_id=self.agent_id or "", executor_id=executor_id,
            uuid=self._new_id(), healthy=healthy, timestamp=now))

    # ------------------------------------------------------------------ health

    def _on_health_result(self, event: HealthCheckResult, now: float) -> list[Effect]:
        effects: list[Effect] = []
        results, outcomes = self.health.result(event, now)
        effects += results
        for outcome in outcomes:
            found = self._find_task_with_executor(outcome.framework_id, outcome.task_id)
            if found is None or outcome.task_id not in found[0].launched:
                continue
            executor, task = found
            if isinstance(outcome, HealthChanged):
                self.counters["health_changes"] += 1
                effects += self._transition(executor, task, self._status_update(
                    task.framework_id, task.task_id, executor.executor_id,
                    TaskState.TASK_RUNNING, Reason.TASK_HEALTH_CHECK_STATUS_UPDATED,
                    outcome.message, now, healthy=outcome.healthy), now)
            else:
                log.warning("killing task %s: %s", task.task_id, outcome.message)
                self.counters["tasks_killed_unhealthy"] += 1
                effects += self._kill_launched(executor, task, Outcome(
                    TaskState.TASK_FAILED, Reason.TASK_UNHEALTHY, outcome.message))
        return effects

    # ------------------------------------------------------------------- usage

    def _on_usage(self, event: UsageSampled, now: float) -> list[Effect]:
        self.cached_uris = sorted(event.cached_uris)
        effects: list[Effect] = []
        for sample in event.samples:
            executor = self._executor(sample.framework_id, sample.executor_id)
            if executor is None or executor.run_id != sample.run_id:
                continue  # the run ended since the shell looked
            executor.usage = limits.usage(executor, sample)
            executor.last_sample = sample
            problem = limits.memory_problem(executor, sample, self.config.isolation)
            if problem and executor.phase in LIVE_PHASES:
                effects += self._memory_limitation(executor, problem, now)
        if self.phase == REGISTERED and self.agent_id and now >= self._next_report:
            self._next_report = now + self.config.usage_report_interval
            effects.append(SendMaster(UsageReport(
                agent_id=self.agent_id, cached_uris=list(self.cached_uris),
                executors=[e.usage for e in self._executors() if e.usage is not None])))
        return effects

    def _memory_limitation(self, executor: ExecutorRecord, message: str,
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

    # ------------------------------------------------------------------- drain

    def _on_drain(self, now: float) -> list[Effect]:
        if self.draining:
            return []
        log.warning("draining: killing every task and accepting no new ones")
        self.draining = True
        self._changed()
        effects: list[Effect] = []
        if self.phase == REGISTERED and self.agent_id:
            effects.append(SendMaster(DrainAgent(agent_id=self.agent_id)))
        for executor in self._executors():
            effects += self._drain_executor(executor, now)
        return effects

    def _drain_executor(self, executor: ExecutorRecord, now: float) -> list[Effect]:
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
            task.kill_as = Outcome(TaskState.TASK_KILLED, Reason.AGENT_DRAINING,
                                   "killed: the agent is draining")
            effects += self.health.stop(task.framework_id, task.task_id)
        self._changed()
        return effects + self._shutdown_executor(executor, now)

    # ---------------------------------------------------------------- recovery

    def saved(self) -> SavedAgent:
        """What a restarted agent needs (see `agent.checkpoint`)."""
        c = self.config
        executors = [checkpoint.save_executor(e) for e in self._executors()]
        return SavedAgent(
            agent_id=self.agent_id, hostname=c.hostname, resources=c.resources,
            attributes=dict(c.attributes), port=c.port, executor_port=c.executor_port,
            draining=self.draining, frameworks=[f.info for f in self.frameworks.values()],
            executors=executors, updates=self.updates.all_queued(), exits=list(self._exits))

    def _on_recover(self, event: Recover, now: float) -> list[Effect]:
        """Take back what a killed agent left: runs whose process is still alive
        (`event.alive`) wait to re-register; the others are gone."""
        saved = event.saved
        if self.frameworks or self.agent_id is not None:
            raise RuntimeError("recovery must come first")
        self.agent_id = saved.agent_id
        self.draining = saved.draining
        infos = {f.id: f for f in saved.frameworks}
        for save in saved.executors:
            framework = self.frameworks.get(save.framework_id)
            if framework is None:
                framework = self.frameworks[save.framework_id] = FrameworkRecord(
                    infos.get(save.framework_id) or FrameworkInfo(name=save.framework_id,
                                                                  id=save.framework_id))
            executor = checkpoint.load_executor(save, RECOVERING)
            framework.executors[save.info.executor_id] = executor
            self.used = self.used + save.info.resources
            for task in executor.live_tasks():
                self.used = self.used + task.info.resources
            executor.limits = limits.limits(executor)
        for update in saved.updates:
            self.updates.add(update, now)  # paused: queued until a master registers us
        self._exits = list(saved.exits)
        self._changed()
        effects: list[Effect] = []
        phases = {(s.framework_id, s.info.executor_id): s.phase for s in saved.executors}
        for executor in list(self._executors()):
            was = phases[(executor.framework_id, executor.executor_id)]
            if executor.key not in event.alive:
                effects += self._on_executor_gone(
                    *executor.key, UNKNOWN_EXIT, now, reason=Reason.EXECUTOR_TERMINATED,
                    message="executor ended while the agent was down")
            elif was == TERMINATING:
                executor.phase = TERMINATING  # it was being stopped: finish the job
                effects += [self._kill(executor, "TERM"), *self._arm_executor_timer(
                    executor, KillDue, now + self.config.executor_kill_delay)]
            else:
                timeout = (self.config.executor_registration_timeout if was == LAUNCHING
                           else self.config.executor_reregistration_timeout)
                effects += [UpdateLimits(*executor.key, executor.limits),
                            *self._arm_executor_timer(executor, ReregistrationTimeout,
                                                      now + timeout)]
        log.info("recovered agent %s: %d executors alive, %d updates to resend",
                 self.agent_id, sum(1 for _ in self._executors()), len(saved.updates))
        return effects

    # --------------------------------------------------------------- executors

    def _on_started(self, event: ExecutorStarted) -> list[Effect]:
        executor = self._executor(event.framework_id, event.executor_id)
        if executor is not None and executor.run_id == event.run_id:
            executor.pid = event.pid
            executor.started = event.started
            self._changed()
        return []

    def _on_register_executor(self, peer: str, msg: RegisterExecutor | ReregisterExecutor,
                              now: float) -> list[Effect]:
        claimed = self._peers.get(peer)
        if claimed is not None and claimed != (msg.framework_id, msg.executor_id):
            return self._reject_executor(
                peer, f"this connection is already executor {claimed[1]}", msg.TYPE)
        executor = self._executor(msg.framework_id, msg.executor_id)
        stop: list[Effect] = [Send(peer, ShutdownExecutor(
            grace_period=self.config.executor_shutdown_grace_period))]
        if executor is None or executor.phase == TERMINATING:
            return stop
        if executor.phase == RUNNING:
            # The same executor asking again (our answer was lost) gets it again;
            # a second process claiming the id is told to go away.
            return [self._registered(executor)] if executor.peer == peer else stop
        recovering = executor.phase == RECOVERING
        executor.phase = RUNNING
        executor.peer = peer
        self._peers[peer] = (executor.framework_id, executor.executor_id)
        self._changed()
        effects = self._cancel(executor.timer)
        executor.timer = None
        effects.append(self._registered(executor))
        if recovering:
            effects += self._reconcile(peer, executor, msg, now)
            effects += self._restart_health_checks(executor, now)
        framework = self.frameworks[executor.framework_id]
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

    def _registered(self, executor: ExecutorRecord) -> Send:
        assert executor.peer is not None
        return Send(executor.peer, ExecutorRegistered(
            executor=executor.info, framework=self.frameworks[executor.framework_id].info,
            agent=self._agent_info(), agent_pid=self.config.pid))

    def _reconcile(self, peer: str, executor: ExecutorRecord,
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

    def _restart_health_checks(self, executor: ExecutorRecord, now: float) -> list[Effect]:
        """Health is not checkpointed: checks of a recovered run start afresh."""
        effects: list[Effect] = []
        for task in executor.launched.values():
            check = task.info.health_check
            if task.state == TaskState.TASK_RUNNING and check and task.kill_as is None:
                effects += self.health.start(task.framework_id, task.task_id, check,
                                             executor.directory,
                                             self._task_env(executor, task), now)
        return effects

    def _on_executor_timer(self, executor: ExecutorRecord, key: ExecutorTimer,
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

    def _registration_timed_out(self, executor: ExecutorRecord, verb: str, timeout: float,
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

    def _shutdown_grace(self, executor: ExecutorRecord) -> float:
        """Time an executor gets to stop: its tasks' longest kill grace period (their
        kill policy holds) plus the agent's own grace period."""
        task_grace = max((t.info.kill_grace_period or 0.0 for t in executor.live_tasks()),
                         default=0.0)
        return self.config.executor_shutdown_grace_period + task_grace

    def _shutdown_executor(self, executor: ExecutorRecord, now: float) -> list[Effect]:
        """Ask a registered executor to stop (SIGTERM after the grace period); an
        unregistered one cannot be asked, so it gets SIGTERM at once. SIGKILL follows."""
        if executor.phase == RUNNING:
            executor.phase = TERMINATING
            self._changed()
            grace = self._shutdown_grace(executor)
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
    def _kill(executor: ExecutorRecord, sig: str) -> KillExecutor:
        return KillExecutor(executor.framework_id, executor.executor_id, executor.run_id, sig)

    def _on_executor_gone(self, framework_id: str, executor_id: str, run_id: str, status: int,
                          now: float, reason: str | None = None,
                          message: str | None = None) -> list[Effect]:
        """The run is over. `reason`/`message` say why its unfinished tasks fail when
        it is not a plain exit (a launch or fetch failure, a run lost in a restart)."""
        executor = self._executor(framework_id, executor_id)
        if executor is None or executor.run_id != run_id:
            return []
        self._changed()
        framework = self.frameworks[framework_id]
        effects = self._cancel(executor.timer)
        executor.timer = None
        if reason is None:
            reason = (Reason.COMMAND_EXECUTOR_FAILED if executor.is_command
                      else Reason.EXECUTOR_TERMINATED)
        elif reason == Reason.CONTAINER_LAUNCH_FAILED:
            message = f"executor launch failed: {message}"
        text = message or f"Executor ended with status {status}"
        for task in list(executor.live_tasks()):
            end = task.kill_as or Outcome(TaskState.TASK_FAILED, reason, text)
            effects += self._transition(executor, task, self._status_update(
                framework_id, task.task_id, executor_id, end.state, end.reason, end.message,
                now), now)
        self.used = self.used - executor.info.resources
        executor.phase = TERMINATED
        executor.status = status
        if executor.peer is not None:
            self._peers.pop(executor.peer, None)
        for task in executor.terminated.values():
            self._keep_completed(executor.completed, task)
        executor.terminated.clear()
        del framework.executors[executor_id]
        self._keep_completed(framework.completed_executors, executor)
        if not framework.executors:
            del self.frameworks[framework_id]
            self.completed_frameworks.append(framework)
        exited = ExecutorExited(agent_id=self.agent_id or "", framework_id=framework_id,
                                executor_id=executor_id, status=status)
        if self.phase == REGISTERED:
            effects.append(SendMaster(exited))
        else:  # the master keeps charging the executor's resources until told
            self._exits = [*self._exits, exited][-self.config.completed_limit:]
        if self.shutting_down and not self.frameworks:
            effects += self._exit()
        return effects

    def _keep_completed(self, into: deque[Any], item: Any) -> None:
        into.append(item)
        while len(into) > self.config.completed_limit:
            into.popleft()

    def _on_framework_message(self, msg: FrameworkToExecutor) -> list[Effect]:
        executor = self._executor(msg.framework_id, msg.executor_id)
        if executor is None or executor.peer is None:
            self.counters["messages_dropped"] += 1  # best effort, like Mesos
            return []
        return [Send(executor.peer, msg)]

    def _on_shutdown_framework(self, msg: ShutdownFramework, now: float) -> list[Effect]:
        framework = self.frameworks.get(msg.framework_id)
        if framework is None:
            return []
        effects: list[Effect] = []
        for executor in list(framework.executors.values()):
            effects += self._shutdown_executor(executor, now)
        return effects

    def _on_shutdown(self, now: float) -> list[Effect]:
        if self.shutting_down:
            return []
        self.shutting_down = True
        effects: list[Effect] = []
        graces = [self.config.executor_shutdown_grace_period]
        for executor in list(self._executors()):
            graces.append(self._shutdown_grace(executor))
            effects += self._shutdown_executor(executor, now)
        if not self.frameworks:
            return effects + self._exit()
        c = self.config
        self._shutdown_timer = ShutdownDeadline()
        self.exit_deadline = now + max(graces) + c.executor_kill_delay + c.shutdown_slack
        return effects + [ArmTimer(self._shutdown_timer, self.exit_deadline)]

    def _exit(self) -> list[Effect]:
        if self.exited:
            return []
        self.exited = True
        effects = self._cancel(self._shutdown_timer)
        self._shutdown_timer = None
        return effects + [Exit()]

    # ----------------------------------------------------------------- lookups

    def _executors(self) -> list[ExecutorRecord]:
        return [e for f in self.frameworks.values() for e in f.executors.values()]

    def _executor(self, framework_id: str, executor_id: str) -> ExecutorRecord | None:
        framework = self.frameworks.get(framework_id)
        return framework.executors.get(executor_id) if framework else None

    def _executor_of_peer(self, peer: str) -> ExecutorRecord | None:
        ids = self._peers.get(peer)
        return self._executor(*ids) if ids else None

    def _find_task_with_executor(self, framework_id: str,
                                 task_id: str) -> tuple[ExecutorRecord, TaskRecord] | None:
        framework = self.frameworks.get(framework_id)
        for executor in framework.executors.values() if framework else ():
            task = executor.find(task_id)
            if task is not None:
                return executor, task
        return None

    def _find_task(self, framework_id: str, task_id: str) -> TaskRecord | None:
        found = self._find_task_with_executor(framework_id, task_id)
        return found[1] if found else None

    def _is_completed(self, framework_id: str, task_id: str) -> bool:
        frameworks = [f for f in (*self.frameworks.values(), *self.completed_frameworks)
                      if f.id == framework_id]
        return any(t.task_id == task_id for f in frameworks
                   for e in (*f.executors.values(), *f.completed_executors) for t in e.completed)

    # ------------------------------------------------------------ observation

    @property
    def drain_state(self) -> str | None:
        """None, "DRAINING" (tasks still live) or "DRAINED"."""
        if not self.draining:
            return None
        live = any(any(e.live_tasks()) for e in self._executors())
        return "DRAINING" if live else "DRAINED"

    def snapshot(self) -> dict[str, Any]:
        """The agent's `/state` (`agent.views`)."""
        return views.snapshot(self)

    def statistics(self) -> list[dict[str, Any]]:
        """The agent's `/monitor/statistics` (`agent.views`)."""
        return views.statistics(self)

    def metrics(self) -> dict[str, float]:
        return views.metrics(self)

    def validate(self) -> None:
        """Check the invariants; tests call this after every step."""
        used = Resources()
        for framework_id, framework in self.frameworks.items():
            assert framework.id == framework_id
            assert framework.executors, f"framework {framework_id} without executors"
            task_ids: set[str] = set()
            for executor_id, executor in framework.executors.items():
                assert executor.executor_id == executor_id
                assert executor.framework_id == framework_id
                assert executor.phase in (*LIVE_PHASES, TERMINATING), executor.phase
                assert (executor.phase == RUNNING) <= (executor.peer is not None)
                assert (executor.phase in (LAUNCHING, RECOVERING)) <= (executor.timer is not None)
                assert executor.limits == limits.limits(executor), executor
                assert not executor.pending_kills or executor.phase == RECOVERING
                if executor.peer is not None:
                    assert self._peers[executor.peer] == (framework_id, executor_id)
                if executor.phase == RUNNING:
                    assert not executor.queued, "a registered executor has no queue"
                used = used + executor.info.resources
                groups = (executor.queued, executor.launched, executor.terminated)
                for group in groups:
                    for task_id, task in group.items():
                        assert task.task_id == task_id
                        assert (task.framework_id, task.executor_id) == (framework_id, executor_id)
                        assert task_id not in task_ids, f"task {task_id} twice"
                        task_ids.add(task_id)
                        assert task.state.is_terminal == (group is executor.terminated), task
                        if group is not executor.terminated:
                            used = used + task.info.resources
        assert used == self.used, (used, self.used)
        assert self.used <= self.config.resources, (self.used, self.config.resources)
        for peer, (framework_id, executor_id) in self._peers.items():
            owner = self._executor(framework_id, executor_id)
            assert owner is not None and owner.peer == peer
        assert (self.phase == REGISTERED) == (not self.updates.paused)
        assert (self._register_timer is not None) == (self.phase == REGISTERING)
        assert (self._master_timer is not None) == (self.phase != DETECTING)
        assert not self._exits or self.phase != REGISTERED
        self.updates.validate()
        self.health.validate()


def _state_metric(state: TaskState) -> str:
    return "tasks_" + state.name.removeprefix("TASK_").lower()
