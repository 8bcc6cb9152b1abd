"""A simulated agent: the agent<->master protocol, with tasks played from plans.

Why not the real `agent.state.AgentState`? Its decisions are about executor
processes, sandboxes, fetching, checkpoints and health checks, none of which a
simulation has; answering its effects in simulation would mean faking an
executor per task (register, launch, status updates) and costs several events
per task that change nothing the master sees. What the master and the
frameworks *do* see is reproduced here from docs/protocol.md:

- register with `RegisterAgent` (retried every `register_retry` seconds until
  `AgentRegistered`), answer every `Ping` with a `Pong`;
- `RunTask` -> TASK_STARTING at once, TASK_RUNNING after `launch_delay`, then
  after the plan's duration TASK_FINISHED (or the plan's end state), or
  TASK_FAILED with REASON_CONTAINER_LIMITATION_MEMORY the moment its memory
  curve crosses its memory allocation (the OOM killer);
- `KillTask` -> TASK_KILLED (a kill of a task it no longer knows: TASK_LOST,
  REASON_TASK_UNKNOWN, as the real agent answers); `ShutdownFramework` kills
  all of the framework's tasks and forgets its executors;
- status updates go one task-stream at a time: the next update of a task is
  sent only once the previous one is acknowledged (`StatusUpdateAck`), and an
  unacknowledged one is resent with backoff (1 s doubling to 30 s, the real
  agent's defaults); it declares `ACKNOWLEDGEMENT_BATCHES`, as the real agent
  does, and takes a `StatusUpdateAcks` as its `StatusUpdateAck`s one by one;
- every `usage_report_interval` seconds a `UsageReport` with each executor's
  usage read from the plans' curves;
- with oversubscription on (`AgentSettings.reclaim`), at each report the real
  estimator and QoS controller (sim/lending.py) say what the agent lends (the
  report's `revocable`) and which revocable tasks to evict: those end
  TASK_KILLED with REASON_CONTAINER_PREEMPTED and the controller's message,
  before the report goes out. A `KillTask` with a reason (a master preemption)
  ends the task with that reason and message, as the real agent does.

A custom executor (`TaskInfo.executor`) is remembered per framework and lives
until the framework shuts down, as the batch executor does.

Like every core this is pure: `handle(event, now) -> effects` (`Send` to
"master", `ArmTimer`, `CancelTimer`); the engine performs them. The optional
`observer` hears when tasks start and stop using resources (the report's usage
ledger), and never changes what the agent does.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

import attrs

from agent.qos import QosConfig
from agent.reclaim import ReclaimConfig
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    ACK_BATCH_CAPABILITY, AgentInfo, AgentRegistered, ExecutorUsage, FrameworkInfo, FrameworkToExecutor, KillTask,
    Message, Ping, Pong, Reason, RegisterAgent, Rejected, RunTask, ShutdownFramework, Source,
    StatusUpdate, StatusUpdateAck, StatusUpdateAcks, TaskInfo, TaskState, TaskStatus, UsageReport,
)
from dyad.resources import Resources
from sim.lending import ExecutorView, Lending, RunView, TaskView
from sim.usage import TaskPlan

MASTER = "master"
STATUS_BACKOFF = 1.0
STATUS_BACKOFF_MAX = 30.0
_MB = 2 ** 20

Effect = Send | ArmTimer | CancelTimer
TaskKey = tuple[str, str]  # (framework id, task id)
PlanFor = Callable[[FrameworkInfo, TaskInfo], TaskPlan]


# --------------------------------------------------------------------- timer keys


@attrs.frozen
class RegisterRetry(TimerKey):
    pass


@attrs.frozen
class TaskRuns(TimerKey):
    framework_id: str
    task_id: str


@attrs.frozen
class TaskEnds(TimerKey):
    framework_id: str
    task_id: str


@attrs.frozen
class UpdateRetry(TimerKey):
    framework_id: str
    task_id: str


@attrs.frozen
class UsageReportDue(TimerKey):
    pass


# ------------------------------------------------------------------------ events


@attrs.frozen
class Start:
    """Boot: register with the master."""


@attrs.frozen
class FromMaster:
    message: Message


Event = Start | FromMaster | TimerFired


class Observer(Protocol):
    def task_started(self, key: TaskKey, plan: TaskPlan, now: float,
                     revocable: bool = False) -> None: ...

    def task_stopped(self, key: TaskKey, now: float) -> None: ...


@attrs.frozen(kw_only=True)
class AgentSettings:
    launch_delay: float = 0.5
    usage_report_interval: float = 0.0  # 0: no usage reports
    register_retry: float = 1.0
    reclaim: ReclaimConfig | None = None  # None: oversubscription off, nothing lent
    qos: QosConfig = QosConfig()


@attrs.define(eq=False)
class _Task:
    info: TaskInfo
    plan: TaskPlan
    executor_id: str
    state: TaskState = TaskState.TASK_STAGING
    started_at: float | None = None
    stream: deque[TaskStatus] = attrs.field(factory=deque)  # head sent, unacknowledged
    backoff: float = STATUS_BACKOFF


class SimAgent:
    """One simulated agent; see the module docstring."""

    def __init__(self, info: AgentInfo, plan_for: PlanFor, settings: AgentSettings,
                 observer: Observer | None = None) -> None:
        self.info = info
        self.agent_id: str | None = None
        self._pong: Pong | None = None  # `answer_ping`'s, kept
        self.settings = settings
        self.counters: Counter[str] = Counter()
        self._plan_for = plan_for
        self._observer = observer
        self._tasks: dict[TaskKey, _Task] = {}
        self._executors: dict[tuple[str, str], int] = {}  # custom executor -> live tasks
        self._done: deque[TaskKey] = deque(maxlen=1000)  # recently ended, for late kills
        self._done_set: set[TaskKey] = set()
        self._uuids = 0
        self._out: list[Effect] = []
        self._lending = (None if settings.reclaim is None
                         else Lending(settings.reclaim, settings.qos, info.resources))

    @property
    def live_tasks(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.state.is_terminal)

    def answer_ping(self, ping: Message) -> Message | None:
        """The `Pong` that `handle` would send for `ping` at any time from now on
        (None before registration: it would send nothing yet), counted as
        received; the engine's one-entry round trip (sim/engine.py)."""
        if self.agent_id is None:
            return None
        self.counters["messages_received"] += 1
        if self._pong is None or self._pong.agent_id != self.agent_id:
            self._pong = Pong(agent_id=self.agent_id)  # immutable: one serves every ping
        return self._pong

    def handle(self, event: Event, now: float) -> list[Effect]:
        self._out = []
        if isinstance(event, FromMaster):
            self._on_message(event.message, now)
        elif isinstance(event, TimerFired):
            self._on_timer(event.key, now)
        elif isinstance(event, Start):
            self._register(now)
        else:
            raise TypeError(f"SimAgent cannot handle {event!r}")
        out, self._out = self._out, []
        return out

    # --------------------------------------------------------------- helpers

    def _send(self, message: Message) -> None:
        self._out.append(Send(MASTER, message))

    def _register(self, now: float) -> None:
        self._send(RegisterAgent(agent=self.info, version="sim",
                                 capabilities=[ACK_BATCH_CAPABILITY]))
        self._out.append(ArmTimer(RegisterRetry(), now + self.settings.register_retry))

    # -------------------------------------------------------------- messages

    def _on_message(self, message: Message, now: float) -> None:
        self.counters["messages_received"] += 1
        if isinstance(message, Ping):
            if self.agent_id is not None:
                self._send(Pong(agent_id=self.agent_id))
        elif isinstance(message, RunTask):
            self._run(message.framework, message.task, now)
        elif isinstance(message, StatusUpdateAck):
            self._acknowledged((message.framework_id, message.task_id), message.uuid, now)
        elif isinstance(message, StatusUpdateAcks):
            for ack in message.acks:
                self._acknowledged((ack.framework_id, ack.task_id), ack.uuid, now)
        elif isinstance(message, KillTask):
            self._kill((message.framework_id, message.task_id), now, message.reason,
                       message.message)
        elif isinstance(message, ShutdownFramework):
            self._shutdown_framework(message.framework_id, now)
        elif isinstance(message, AgentRegistered):
            self._registered(message, now)
        elif isinstance(message, Rejected):
            self.counters["rejected"] += 1
            self.counters[f"rejected/{message.message_type}"] += 1
        elif isinstance(message, FrameworkToExecutor):
            self.counters["framework_messages"] += 1
        else:
            self.counters["unexpected_messages"] += 1

    def _registered(self, message: AgentRegistered, now: float) -> None:
        if self.agent_id is not None:
            return  # the answer to a retried registration
        self.agent_id = message.agent_id
        self.info = attrs.evolve(self.info, id=message.agent_id)
        self._out.append(CancelTimer(RegisterRetry()))
        if self.settings.usage_report_interval > 0:
            self._out.append(ArmTimer(UsageReportDue(), now + self.settings.usage_report_interval))

    def _run(self, framework: FrameworkInfo, task: TaskInfo, now: float) -> None:
        assert framework.id is not None
        key = (framework.id, task.task_id)
        if key in self._tasks:
            self.counters["duplicate_launches"] += 1
            return
        executor_id = task.task_id
        if task.executor is not None:
            executor_id = task.executor.executor_id
            custom = (framework.id, executor_id)
            self._executors[custom] = self._executors.get(custom, 0) + 1
        record = _Task(info=task, plan=self._plan_for(framework, task), executor_id=executor_id)
        self._tasks[key] = record
        self.counters["tasks_launched"] += 1
        self._update(key, record, TaskState.TASK_STARTING, now)
        delay = self.settings.launch_delay
        if delay > 0:
            self._out.append(ArmTimer(TaskRuns(*key), now + delay))
        else:
            self._running(key, record, now)

    def _running(self, key: TaskKey, task: _Task, now: float) -> None:
        if task.state.is_terminal:
            return
        task.started_at = now
        self._update(key, task, TaskState.TASK_RUNNING, now)
        if self._observer is not None:
            self._observer.task_started(key, task.plan, now, task.info.revocable)
        plan = task.plan
        ends = None if plan.duration is None else now + plan.duration
        oom = plan.mem.first_above(task.info.resources.get("mem"))
        if oom is not None and (ends is None or now + oom < ends):
            ends = now + oom
        if ends is not None:
            self._out.append(ArmTimer(TaskEnds(*key), ends))

    def _ended(self, key: TaskKey, task: _Task, now: float) -> None:
        plan = task.plan
        assert task.started_at is not None
        oom = plan.mem.first_above(task.info.resources.get("mem"))
        if oom is not None and (plan.duration is None or oom < plan.duration):
            self.counters["ooms"] += 1
            self._finish(key, task, TaskState.TASK_FAILED, now,
                         Reason.CONTAINER_LIMITATION_MEMORY,
                         f"memory limit {task.info.resources.get('mem'):g} MB exceeded")
        else:
            self._finish(key, task, plan.end, now, "", plan.message, plan.data)

    def _kill(self, key: TaskKey, now: float, reason: str = "", message: str = "") -> None:
        task = self._tasks.get(key)
        if task is None:
            if key not in self._done_set:
                self._lone_update(key, now)
            return
        if not task.state.is_terminal:
            if reason == Reason.CONTAINER_PREEMPTED:
                self.counters["preempted"] += 1
            self._finish(key, task, TaskState.TASK_KILLED, now, reason, message or "killed")

    def _lone_update(self, key: TaskKey, now: float) -> None:
        """A kill of a task this agent never ran: say so, as the real agent does."""
        status = TaskStatus(task_id=key[1], state=TaskState.TASK_LOST,
                            reason=Reason.TASK_UNKNOWN, message="task is unknown to the agent",
                            source=Source.AGENT, agent_id=self.agent_id or "",
                            timestamp=now)
        self._send(StatusUpdate(framework_id=key[0], status=status))

    def _shutdown_framework(self, framework_id: str, now: float) -> None:
        for key in sorted(k for k in self._tasks if k[0] == framework_id):
            task = self._tasks[key]
            if not task.state.is_terminal:
                self._finish(key, task, TaskState.TASK_KILLED, now, Reason.FRAMEWORK_REMOVED,
                             "framework shut down")
        for custom in [c for c in self._executors if c[0] == framework_id]:
            del self._executors[custom]

    def _finish(self, key: TaskKey, task: _Task, state: TaskState, now: float,
                reason: str, message: str, data: bytes = b"") -> None:
        if task.started_at is not None and self._observer is not None:
            self._observer.task_stopped(key, now)
        self._out.append(CancelTimer(TaskRuns(*key)))
        self._out.append(CancelTimer(TaskEnds(*key)))
        self._update(key, task, state, now, reason, message, data)
        custom = (key[0], task.executor_id)
        if custom in self._executors:
            self._executors[custom] -= 1  # the executor stays until its framework goes

    # -------------------------------------------------------- status updates

    def _update(self, key: TaskKey, task: _Task, state: TaskState, now: float,
                reason: str = "", message: str = "", data: bytes = b"") -> None:
        task.state = state
        self._uuids += 1
        status = TaskStatus(task_id=key[1], state=state, reason=reason, message=message,
                            source=Source.EXECUTOR if not reason else Source.AGENT,
                            agent_id=self.agent_id or "", executor_id=task.executor_id,
                            uuid=f"{self.agent_id}-u{self._uuids}", timestamp=now, data=data)
        task.stream.append(status)
        if len(task.stream) == 1:
            self._send_head(key, task, now)

    def _send_head(self, key: TaskKey, task: _Task, now: float) -> None:
        self._send(StatusUpdate(framework_id=key[0], status=task.stream[0]))
        self._out.append(ArmTimer(UpdateRetry(*key), now + task.backoff))

    def _acknowledged(self, key: TaskKey, uuid: str, now: float) -> None:
        task = self._tasks.get(key)
        if task is None or not task.stream or task.stream[0].uuid != uuid:
            self.counters["stale_acks"] += 1
            return
        task.stream.popleft()
        task.backoff = STATUS_BACKOFF
        self._out.append(CancelTimer(UpdateRetry(*key)))
        if task.stream:
            self._send_head(key, task, now)
        elif task.state.is_terminal:
            del self._tasks[key]
            if len(self._done) == self._done.maxlen:
                self._done_set.discard(self._done[0])
            self._done.append(key)
            self._done_set.add(key)

    def _retry(self, key: TaskKey, now: float) -> None:
        task = self._tasks.get(key)
        if task is None or not task.stream:
            return
        self.counters["status_update_retries"] += 1
        task.backoff = min(STATUS_BACKOFF_MAX, task.backoff * 2)
        self._send_head(key, task, now)

    # ---------------------------------------------------------------- timers

    def _on_timer(self, key: object, now: float) -> None:
        match key:
            case TaskEnds(framework_id, task_id):
                task = self._tasks.get((framework_id, task_id))
                if task is not None and not task.state.is_terminal:
                    self._ended((framework_id, task_id), task, now)
            case TaskRuns(framework_id, task_id):
                task = self._tasks.get((framework_id, task_id))
                if task is not None:
                    self._running((framework_id, task_id), task, now)
            case UpdateRetry(framework_id, task_id):
                self._retry((framework_id, task_id), now)
            case UsageReportDue():
                self._report_usage(now)
            case RegisterRetry():
                if self.agent_id is None:
                    self._register(now)
            case _:
                raise UnknownTimer("SimAgent", key)  # type: ignore[arg-type]

    def _report_usage(self, now: float) -> None:
        assert self.agent_id is not None
        runs: dict[tuple[str, str], list[_Task]] = {}
        for (framework_id, _), task in self._tasks.items():
            if not task.state.is_terminal:
                runs.setdefault((framework_id, task.executor_id), []).append(task)
        executors: dict[tuple[str, str], ExecutorUsage] = {}
        for (framework_id, executor_id), tasks in sorted(runs.items()):
            started = [t for t in tasks if t.started_at is not None]
            if not started:
                continue
            ages = [now - t.started_at for t in started]  # type: ignore[operator]
            cpus = sum(t.plan.cpus.at(age) for t, age in zip(started, ages))
            mem = sum(t.plan.mem.at(age) for t, age in zip(started, ages))
            executors[(framework_id, executor_id)] = ExecutorUsage(
                framework_id=framework_id, executor_id=executor_id,
                task_ids=[t.info.task_id for t in started], timestamp=now,
                cpus_used=round(cpus, 3),
                cpus_limit=sum(t.info.resources.get("cpus") for t in started),
                mem_rss_bytes=int(mem * _MB),
                mem_limit_bytes=int(sum(t.info.resources.get("mem") for t in started) * _MB),
                processes=len(started))
        revocable = reservation = Resources()
        if self._lending is not None:
            views = [self._run_view(key, tasks, executors.get(key))
                     for key, tasks in sorted(runs.items())]
            sample = self._lending.sampled(views, now)
            for key, why in sample.evict:
                self.counters["evictions"] += 1
                self._finish(key, self._tasks[key], TaskState.TASK_KILLED, now,
                             Reason.CONTAINER_PREEMPTED, why)
            revocable, reservation = sample.revocable, sample.reservation
        self._send(UsageReport(agent_id=self.agent_id, executors=list(executors.values()),
                               revocable=revocable, reservation=reservation))
        self._out.append(ArmTimer(UsageReportDue(), now + self.settings.usage_report_interval))

    @staticmethod
    def _run_view(key: tuple[str, str], tasks: list[_Task], usage: ExecutorUsage | None
                  ) -> RunView:
        executor = next((t.info.executor for t in tasks if t.info.executor is not None), None)
        return RunView(key[0], key[1],
                       ExecutorView(executor.resources if executor else Resources()),
                       tuple(TaskView(key[0], t.info, t.state) for t in tasks), usage)
