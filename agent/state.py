"""The agent's brain: executors, tasks and the link to the master, as a pure object.

`AgentState.handle(event, now) -> list[Effect]` is the only mutator. Events are what
the shell (`agent.server`) observed -- a message from the master or an executor, a
bad frame, a process exit, a detected master, a timer, a stop request; effects are
what it must do -- send, launch or signal an executor process, arm a timer, follow
a master. Nothing here touches a socket, a process or the clock, so every rule of
docs/protocol.md is tested by feeding events and reading effects.

Life of an executor run: LAUNCHING (process started, tasks queued) -> RUNNING
(registered: queued tasks sent as LaunchTask) -> TERMINATING (asked to stop; SIGTERM
after the grace period, SIGKILL 3 s later) -> gone (process exit: its unfinished
tasks fail, the master hears ExecutorExited, the run moves to completed_executors).

Life of the master link: DETECTING -> REGISTERING (RegisterAgent retried with
backoff) -> REGISTERED. Silence from the master for 3 x ping_interval sends the
agent back to DETECTING. Status updates flow only while REGISTERED (see
`agent.status_updates`); a (re-)registration replays every unacknowledged one.

Nothing that arrives from the network raises: bad input is answered with
`Rejected` or a terminal status update, and counted.
"""

from __future__ import annotations

import itertools
import logging
import signal
from collections import Counter, deque
from typing import Any, Callable, Hashable, Iterator

import attrs

from agent.sandbox import InvalidId, check_id, run_directory
from agent.status_updates import SendMaster as SendMaster
from agent.status_updates import StatusUpdateManager
from dyad.codec import to_json
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.ids import new_uuid
from dyad.messages import (
    AgentInfo, AgentRegistered, CommandInfo, ExecutorExited, ExecutorInfo,
    ExecutorRegistered, ExecutorToFramework, FrameworkInfo, FrameworkToExecutor, KillTask,
    LaunchTask, MasterInfo, Message, MessageError, Ping, Pong, Reason, RegisterAgent,
    RegisterExecutor, Rejected, ReregisterExecutor, RunTask, ShutdownExecutor,
    ShutdownFramework, Source, StatusUpdate, StatusUpdateAck, Task, TaskInfo, TaskState,
    TaskStatus,
)
from dyad.resources import Resources, ResourcesError

log = logging.getLogger(__name__)

COMMAND_EXECUTOR_MODULE = "frameworks.executors.command"
MAX_PING_INTERVAL = 3600.0

# ------------------------------------------------------------------------- events


@attrs.frozen
class MasterMessage:
    message: Message


@attrs.frozen
class ExecutorMessage:
    """`peer` is the hex identity of the executor's DEALER (how replies find it)."""

    peer: str
    message: Message


@attrs.frozen
class Invalid:
    """A frame that did not decode. `source` is "master" or "executor"."""

    source: str
    peer: str
    error: MessageError


@attrs.frozen
class ExecutorProcessExited:
    """`status` is the exit code, or minus the signal number that ended it."""

    framework_id: str
    executor_id: str
    run_id: str
    status: int


@attrs.frozen
class ExecutorLaunchFailed:
    framework_id: str
    executor_id: str
    run_id: str
    reason: str


@attrs.frozen
class MasterDetected:
    master_info: MasterInfo


@attrs.frozen
class Shutdown:
    """The agent is stopping: shut every executor down, then `Exit`."""


Event = (MasterMessage | ExecutorMessage | Invalid | ExecutorProcessExited
         | ExecutorLaunchFailed | MasterDetected | TimerFired | Shutdown)

# ------------------------------------------------------------------------ effects


@attrs.frozen
class LaunchExecutor:
    """Start `command` in a new session with cwd `sandbox_dir` (to be created) and
    `env` on top of the agent's environment; report `ExecutorProcessExited` (or
    `ExecutorLaunchFailed`) exactly once for this run."""

    framework_id: str
    executor_id: str
    run_id: str
    command: CommandInfo
    env: dict[str, str]
    sandbox_dir: str


@attrs.frozen
class KillExecutor:
    """Signal the run's whole process group; `signal` is "TERM" or "KILL"."""

    framework_id: str
    executor_id: str
    run_id: str
    signal: str


@attrs.frozen
class ConnectMaster:
    endpoint: str


@attrs.frozen
class DetectMaster:
    """Find the leading master (the shell's detector) and answer `MasterDetected`."""


@attrs.frozen
class Exit:
    """Every executor is gone (or the deadline passed): the agent may stop."""


Effect = (SendMaster | Send | LaunchExecutor | KillExecutor | ArmTimer | CancelTimer
          | ConnectMaster | DetectMaster | Exit)

# ------------------------------------------------------------------------- config


@attrs.frozen(kw_only=True)
class AgentConfig:
    """What the agent is and how patient it is. `port` (HTTP) and `executor_port`
    are the bound ports; the shell fills them in once the sockets are bound."""

    hostname: str
    ip: str
    port: int
    executor_port: int
    work_dir: str
    resources: Resources
    python: str  # interpreter for the command executor (the agent's own)
    attributes: dict[str, str] = attrs.field(factory=dict)
    version: str = "0.1.0"
    ping_interval: float = 15.0  # assumed until the master says otherwise
    register_backoff: float = 1.0
    register_backoff_max: float = 30.0
    status_update_backoff: float = 1.0
    status_update_backoff_max: float = 30.0
    executor_registration_timeout: float = 60.0
    executor_shutdown_grace_period: float = 3.0
    executor_kill_delay: float = 3.0  # SIGTERM -> SIGKILL
    shutdown_slack: float = 2.0  # beyond grace + kill delay before exiting anyway
    completed_limit: int = 100  # completed frameworks/executors/tasks kept for /state

    @property
    def executor_endpoint(self) -> str:
        return f"tcp://{self.ip}:{self.executor_port}"


# -------------------------------------------------------------------------- model

DETECTING, REGISTERING, REGISTERED = "DETECTING", "REGISTERING", "REGISTERED"
LAUNCHING, RUNNING, TERMINATING, TERMINATED = "LAUNCHING", "RUNNING", "TERMINATING", "TERMINATED"


@attrs.define
class TaskRecord:
    info: TaskInfo
    framework_id: str
    executor_id: str
    state: TaskState = TaskState.TASK_STAGING
    status_uuid: str = ""
    seen_uuids: set[str] = attrs.field(factory=set)  # executor resends are dropped

    @property
    def task_id(self) -> str:
        return self.info.task_id


@attrs.define
class ExecutorRecord:
    framework_id: str
    info: ExecutorInfo
    run_id: str
    directory: str
    is_command: bool
    phase: str = LAUNCHING
    peer: str | None = None
    timer: Hashable | None = None  # registration timeout, or the next signal
    queued: dict[str, TaskRecord] = attrs.field(factory=dict)  # until registration
    launched: dict[str, TaskRecord] = attrs.field(factory=dict)  # non-terminal
    terminated: dict[str, TaskRecord] = attrs.field(factory=dict)  # terminal, unacked
    completed: deque[TaskRecord] = attrs.field(factory=deque)
    status: int | None = None  # exit status once gone

    @property
    def executor_id(self) -> str:
        return self.info.executor_id

    def live_tasks(self) -> Iterator[TaskRecord]:
        yield from self.queued.values()
        yield from self.launched.values()

    def find(self, task_id: str) -> TaskRecord | None:
        return (self.queued.get(task_id) or self.launched.get(task_id)
                or self.terminated.get(task_id))


@attrs.define
class FrameworkRecord:
    info: FrameworkInfo
    executors: dict[str, ExecutorRecord] = attrs.field(factory=dict)
    completed_executors: deque[ExecutorRecord] = attrs.field(factory=deque)

    @property
    def id(self) -> str:
        assert self.info.id is not None
        return self.info.id


def describe_exit(status: int) -> str:
    if status >= 0:
        return f"Executor exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return f"Executor terminated by {name}"


def resources_dict(resources: Resources) -> dict[str, float | str]:
    """`{"cpus": 1.0, "ports": "[31000-32000]"}`: the shape operators know from Mesos."""
    scalars = resources.scalar_items()
    out: dict[str, float | str] = {}
    for name in sorted(resources.names()):
        if name in scalars:
            out[name] = scalars[name] / 1000
        else:
            out[name] = "[" + ",".join(f"{b}-{e}" for b, e in resources.ranges(name)) + "]"
    return out


# -------------------------------------------------------------------------- state


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
        self.used = Resources()
        self.shutting_down = False
        self.exited = False
        self.counters: Counter[str] = Counter()
        self._peers: dict[str, tuple[str, str]] = {}  # executor peer -> (framework, executor)
        self._seq = itertools.count()
        self._register_backoff = config.register_backoff
        self._register_timer: Hashable | None = None
        self._master_timer: Hashable | None = None
        self._shutdown_timer: Hashable | None = None

    # ----------------------------------------------------------------- dispatch

    def handle(self, event: Event, now: float) -> list[Effect]:
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
        if isinstance(event, ExecutorProcessExited):
            return self._on_executor_gone(event.framework_id, event.executor_id, event.run_id,
                                          event.status, None, now)
        if isinstance(event, ExecutorLaunchFailed):
            # 127 is what a shell reports when a command cannot be executed.
            return self._on_executor_gone(event.framework_id, event.executor_id, event.run_id,
                                          127, event.reason, now)
        if isinstance(event, MasterDetected):
            return self._on_master_detected(event.master_info, now)
        if isinstance(event, Shutdown):
            return self._on_shutdown(now)
        raise TypeError(f"not an agent event: {event!r}")

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
        if isinstance(msg, RegisterExecutor):
            return self._on_register_executor(peer, msg, now)
        if isinstance(msg, ReregisterExecutor):
            # Reattaching to executors of an earlier agent run needs checkpointing,
            # which this agent does not do: such an executor is told to stop.
            grace = self.config.executor_shutdown_grace_period
            return [Send(peer, ShutdownExecutor(grace_period=grace))]
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
        self._register_timer = ("register", next(self._seq))
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
        self._master_timer = ("master_timeout", next(self._seq))
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
        self.agent_id = msg.agent_id
        self.phase = REGISTERED
        effects += self._cancel(self._register_timer)
        self._register_timer = None
        return effects + self.updates.resume(now)

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

    def _on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if self.updates.owns(key):
            return [*self.updates.timer_fired(key, now)]
        if key == self._register_timer and self.phase == REGISTERING:
            return self._send_registration(now)
        if key == self._master_timer:
            return self._master_lost()
        if key == self._shutdown_timer:
            log.warning("executors still running after the shutdown deadline; exiting")
            return self._exit()
        if isinstance(key, tuple) and len(key) == 4 and key[0] in (
                "executor_registration", "executor_term", "executor_kill"):
            executor = self._executor(key[1], key[2])
            if executor is not None and executor.timer == key:
                executor.timer = None
                return self._on_executor_timer(executor, key[0], now)
        return []  # stale: the timer was re-armed or its subject is gone

    def _arm_executor_timer(self, executor: ExecutorRecord, kind: str,
                            at: float) -> list[Effect]:
        effects = self._cancel(executor.timer)
        executor.timer = (kind, executor.framework_id, executor.executor_id, next(self._seq))
        return effects + [ArmTimer(executor.timer, at)]

    @staticmethod
    def _cancel(key: Hashable | None) -> list[Effect]:
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

        effects: list[Effect] = []
        if framework is None:
            framework = self.frameworks[framework_id] = FrameworkRecord(msg.framework)
        else:
            framework.info = msg.framework
        if executor is None:
            executor, effects = self._launch_executor(framework, info, task.command is not None,
                                                      now)
        self.used = self.used + needed
        record = TaskRecord(task, framework_id, executor.executor_id)
        if executor.phase == LAUNCHING:
            executor.queued[task.task_id] = record
        else:
            assert executor.peer is not None
            executor.launched[task.task_id] = record
            effects.append(Send(executor.peer, LaunchTask(framework=framework.info, task=task)))
        return effects

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

    def _launch_executor(self, framework: FrameworkRecord, info: ExecutorInfo,
                         is_command: bool, now: float) -> tuple[ExecutorRecord, list[Effect]]:
        run_id = self._new_id()
        directory = run_directory(self.config.work_dir, framework.id, info.executor_id, run_id)
        executor = ExecutorRecord(framework.id, info, run_id, directory, is_command)
        framework.executors[info.executor_id] = executor
        env = dict(info.command.environment)
        env.update(self._executor_env(executor))
        effects: list[Effect] = [LaunchExecutor(framework.id, info.executor_id, run_id,
                                                info.command, env, directory)]
        effects += self._arm_executor_timer(
            executor, "executor_registration", now + self.config.executor_registration_timeout)
        return executor, effects

    def _executor_env(self, executor: ExecutorRecord) -> dict[str, str]:
        endpoint = self.config.executor_endpoint
        return {
            "DYAD_AGENT_ENDPOINT": endpoint, "DYAD_AGENT_ID": self.agent_id or "",
            "DYAD_FRAMEWORK_ID": executor.framework_id,
            "DYAD_EXECUTOR_ID": executor.executor_id,
            "DYAD_SANDBOX_DIRECTORY": executor.directory,
            "MESOS_AGENT_ENDPOINT": endpoint, "MESOS_FRAMEWORK_ID": executor.framework_id,
            "MESOS_EXECUTOR_ID": executor.executor_id, "MESOS_DIRECTORY": executor.directory,
            "MESOS_SANDBOX": executor.directory,
        }

    def _on_kill_task(self, msg: KillTask, now: float) -> list[Effect]:
        found = self._find_task_with_executor(msg.framework_id, msg.task_id)
        if found is None:
            if self._is_completed(msg.framework_id, msg.task_id):
                return []  # its terminal update already went out
            return self._agent_update(msg.framework_id, msg.task_id, "", TaskState.TASK_LOST,
                                      Reason.TASK_UNKNOWN, "task is unknown to the agent", now)
        executor, task = found
        if task.task_id in executor.queued:
            effects = self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLED,
                Reason.TASK_KILLED_DURING_LAUNCH, "killed before the executor registered", now),
                now)
            if not any(executor.live_tasks()):
                effects += self._shutdown_executor(executor, now)  # launched for nothing
            return effects
        if task.task_id in executor.launched and executor.peer is not None:
            return [Send(executor.peer, msg)]
        return []  # terminal already; its update is on its way

    def _on_ack(self, msg: StatusUpdateAck, now: float) -> list[Effect]:
        effects: list[Effect] = [*self.updates.acknowledge(msg.framework_id, msg.task_id,
                                                            msg.uuid, now)]
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
        return self._transition(executor, task, attrs.evolve(msg, status=status), now) + ack

    def _transition(self, executor: ExecutorRecord, task: TaskRecord, update: StatusUpdate,
                    now: float) -> list[Effect]:
        """Record `update` as `task`'s latest state and hand it to its stream."""
        state = update.status.state
        task.state = state
        task.status_uuid = update.status.uuid
        task.seen_uuids.add(update.status.uuid)
        if state.is_terminal:
            del (executor.queued if task.task_id in executor.queued
                 else executor.launched)[task.task_id]
            executor.terminated[task.task_id] = task
            self.used = self.used - task.info.resources
            self.counters[_state_metric(state)] += 1
        return [*self.updates.add(update, now)]

    def _agent_update(self, framework_id: str, task_id: str, executor_id: str,
                      state: TaskState, reason: str, message: str,
                      now: float) -> list[Effect]:
        """A terminal update for a task the agent never ran (no record to keep)."""
        self.counters[_state_metric(state)] += 1
        update = self._status_update(framework_id, task_id, executor_id, state, reason,
                                     message, now)
        return [*self.updates.add(update, now)]

    def _status_update(self, framework_id: str, task_id: str, executor_id: str,
                       state: TaskState, reason: str, message: str, now: float) -> StatusUpdate:
        return StatusUpdate(framework_id=framework_id, status=TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message,
            source=Source.AGENT, agent_id=self.agent_id or "", executor_id=executor_id,
            uuid=self._new_id(), timestamp=now))

    # --------------------------------------------------------------- executors

    def _on_register_executor(self, peer: str, msg: RegisterExecutor,
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
        framework = self.frameworks[msg.framework_id]
        registered = Send(peer, ExecutorRegistered(
            executor=executor.info, framework=framework.info, agent=self._agent_info()))
        if executor.phase == RUNNING:
            # The same executor asking again (our answer was lost) gets it again;
            # a second process claiming the id is told to go away.
            return [registered] if executor.peer == peer else stop
        executor.phase = RUNNING
        executor.peer = peer
        self._peers[peer] = (executor.framework_id, executor.executor_id)
        effects = self._cancel(executor.timer)
        executor.timer = None
        effects.append(registered)
        for task in list(executor.queued.values()):
            del executor.queued[task.task_id]
            executor.launched[task.task_id] = task
            effects.append(Send(peer, LaunchTask(framework=framework.info, task=task.info)))
        if not executor.launched:
            effects += self._shutdown_executor(executor, now)  # its tasks were killed
        return effects

    def _on_executor_timer(self, executor: ExecutorRecord, kind: str,
                           now: float) -> list[Effect]:
        if kind == "executor_registration":
            timeout = self.config.executor_registration_timeout
            log.warning("executor %s did not register within %.0fs; killing it",
                        executor.executor_id, timeout)
            executor.phase = TERMINATING
            effects: list[Effect] = [self._kill(executor, "KILL")]
            for task in list(executor.queued.values()):
                effects += self._transition(executor, task, self._status_update(
                    task.framework_id, task.task_id, executor.executor_id,
                    TaskState.TASK_FAILED, Reason.EXECUTOR_REGISTRATION_TIMEOUT,
                    f"executor did not register within {timeout:g}s", now), now)
            return effects
        if kind == "executor_term":
            return [self._kill(executor, "TERM")] + self._arm_executor_timer(
                executor, "executor_kill", now + self.config.executor_kill_delay)
        return [self._kill(executor, "KILL")]

    def _shutdown_executor(self, executor: ExecutorRecord, now: float) -> list[Effect]:
        """Ask a registered executor to stop (SIGTERM after the grace period); an
        unregistered one cannot be asked, so it gets SIGTERM at once. SIGKILL follows."""
        if executor.phase == RUNNING:
            executor.phase = TERMINATING
            grace = self.config.executor_shutdown_grace_period
            assert executor.peer is not None
            return [Send(executor.peer, ShutdownExecutor(grace_period=grace)),
                    *self._arm_executor_timer(executor, "executor_term", now + grace)]
        if executor.phase == LAUNCHING:
            executor.phase = TERMINATING
            return [self._kill(executor, "TERM")] + self._arm_executor_timer(
                executor, "executor_kill", now + self.config.executor_kill_delay)
        return []

    @staticmethod
    def _kill(executor: ExecutorRecord, sig: str) -> KillExecutor:
        return KillExecutor(executor.framework_id, executor.executor_id, executor.run_id, sig)

    def _on_executor_gone(self, framework_id: str, executor_id: str, run_id: str, status: int,
                          launch_error: str | None, now: float) -> list[Effect]:
        executor = self._executor(framework_id, executor_id)
        if executor is None or executor.run_id != run_id:
            return []
        framework = self.frameworks[framework_id]
        effects = self._cancel(executor.timer)
        executor.timer = None
        if launch_error is not None:
            reason = Reason.CONTAINER_LAUNCH_FAILED
            message = f"executor launch failed: {launch_error}"
        else:
            reason = (Reason.COMMAND_EXECUTOR_FAILED if executor.is_command
                      else Reason.EXECUTOR_TERMINATED)
            message = describe_exit(status)
        for task in list(executor.live_tasks()):
            effects += self._transition(executor, task, self._status_update(
                framework_id, task.task_id, executor_id, TaskState.TASK_FAILED, reason,
                message, now), now)
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
        effects += self._to_master(ExecutorExited(
            agent_id=self.agent_id or "", framework_id=framework_id, executor_id=executor_id,
            status=status))
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
        for framework in list(self.frameworks.values()):
            for executor in list(framework.executors.values()):
                effects += self._shutdown_executor(executor, now)
        if not self.frameworks:
            return effects + self._exit()
        c = self.config
        self._shutdown_timer = ("shutdown_deadline", next(self._seq))
        deadline = (now + c.executor_shutdown_grace_period + c.executor_kill_delay
                    + c.shutdown_slack)
        return effects + [ArmTimer(self._shutdown_timer, deadline)]

    def _exit(self) -> list[Effect]:
        if self.exited:
            return []
        self.exited = True
        effects = self._cancel(self._shutdown_timer)
        self._shutdown_timer = None
        return effects + [Exit()]

    # ----------------------------------------------------------------- lookups

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

    def snapshot(self) -> dict[str, Any]:
        """The agent's `/state`, shaped like Mesos' so operators feel at home."""
        c = self.config
        return {
            "id": self.agent_id, "hostname": c.hostname, "ip": c.ip, "port": c.port,
            "version": c.version, "registered": self.phase == REGISTERED,
            "master": to_json(self.master) if self.master else None,
            "resources": resources_dict(c.resources),
            "used_resources": resources_dict(self.used),
            "attributes": dict(c.attributes),
            "frameworks": [self._framework_view(f) for f in self.frameworks.values()],
            "completed_frameworks": [self._framework_view(f) for f in self.completed_frameworks],
        }

    def _framework_view(self, framework: FrameworkRecord) -> dict[str, Any]:
        return {
            "id": framework.id, "name": framework.info.name, "roles": framework.info.roles,
            "executors": [self._executor_view(e) for e in framework.executors.values()],
            "completed_executors": [self._executor_view(e)
                                    for e in framework.completed_executors],
        }

    def _executor_view(self, executor: ExecutorRecord) -> dict[str, Any]:
        return {
            "id": executor.executor_id, "name": executor.info.name,
            "framework_id": executor.framework_id, "run_id": executor.run_id,
            "directory": executor.directory, "state": executor.phase,
            "resources": resources_dict(executor.info.resources), "exit_status": executor.status,
            "tasks": [self._task_dict(t) for t in (*executor.launched.values(),
                                                   *executor.terminated.values())],
            "queued_tasks": [self._task_dict(t) for t in executor.queued.values()],
            "completed_tasks": [self._task_dict(t) for t in executor.completed],
        }

    def _task_dict(self, task: TaskRecord) -> dict[str, Any]:
        return {
            "id": task.task_id, "name": task.info.name, "framework_id": task.framework_id,
            "executor_id": task.executor_id, "agent_id": self.agent_id, "state": task.state.name,
            "resources": resources_dict(task.info.resources), "labels": dict(task.info.labels),
        }

    def metrics(self) -> dict[str, float]:
        executors = [e for f in self.frameworks.values() for e in f.executors.values()]
        running = sum(t.state == TaskState.TASK_RUNNING
                      for e in executors for t in e.launched.values())
        out: dict[str, float] = {f"agent/{name}": 0 for name in (
            "messages_received", "messages_invalid", "tasks_finished", "tasks_failed",
            "tasks_killed", "tasks_lost")}
        out.update({f"agent/{name}": value for name, value in self.counters.items()})
        out.update({
            "agent/registered": int(self.phase == REGISTERED),
            "agent/executors_running": sum(e.phase != TERMINATED for e in executors),
            "agent/tasks_running": running,
            "agent/status_updates_sent": self.updates.sent,
            "agent/status_updates_retried": self.updates.retried,
            "agent/status_updates_acked": self.updates.acked,
            "agent/status_updates_stale_acks": self.updates.stale_acks,
            "agent/status_updates_pending": len(self.updates.pending()),
        })
        return out

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
                assert executor.phase in (LAUNCHING, RUNNING, TERMINATING), executor.phase
                assert (executor.phase == RUNNING) <= (executor.peer is not None)
                assert (executor.phase == LAUNCHING) <= (executor.timer is not None)
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
        self.updates.validate()


def _state_metric(state: TaskState) -> str:
    return "tasks_" + state.name.removeprefix("TASK_").lower()
