"""The agent's brain: executors, tasks and the link to the master, as a pure object.

`AgentState.handle(event, now) -> list[Effect]` is the only mutator. Events are what
the shell (`agent.server`) observed -- a message from the master or an executor, a
bad frame, a process start or exit, a usage sample, a health-check result, a
detected master, a timer, a drain or stop request, a checkpoint to recover from;
effects are what it must do -- send, launch, limit or signal an executor process,
run a health check, write the checkpoint, arm a timer, follow a master. Nothing
here touches a socket, a process, a file or the clock, so every rule of
docs/protocol.md and docs/agent.md is tested by feeding events and reading effects.
The vocabulary lives in `agent.model`; the parts, each small enough to read
alone: an executor run's life in `agent.runs` (inherited), the records and their
lookups in `agent.records`, what a run is given in `agent.launch`, the master link
(DETECTING -> REGISTERING -> REGISTERED) in `agent.master_link`, health-check
timing in `agent.health`, delivery of status updates in `agent.status_updates`
(they flow only while REGISTERED; a (re-)registration replays every
unacknowledged one), `/state` in `agent.views`.

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
from typing import Any, Callable, Iterable

import attrs

from agent import checkpoint, launch, limits, persistent, views
from agent.checkpoint import Recover, SavedAgent
from agent.containers_core import ContainerEvent, LaunchContainer, RemoveContainer
from agent.health import (
    HealthChanged, HealthCheckResult, HealthChecker, HealthRound, RunHealthCheck,
)
from agent.host_runs import HostRuns
from agent.master_link import MasterLink, MasterSilent, RegisterRetry
from agent.oversubscription import Oversubscription, as_resources
from agent.model import (
    DETECTING, LAUNCHING, RECOVERING, REGISTERED, RUNNING, TERMINATING, UNKNOWN_EXIT,
    AgentConfig, AgentExecutor, AgentFramework, AgentTask, Checkpoint, ConnectMaster,
    DetectMaster, Drain, ExecutorLaunchFailed, ExecutorMessage, ExecutorProcessExited,
    ExecutorStarted, ExecutorTimer, Exit, InvalidFrame, KillDue, KillExecutor, LaunchExecutor,
    MasterDetected, MasterMessage, ReregistrationTimeout, Shutdown, ShutdownDeadline, TaskEnd,
    UpdateLimits, UsageSampled,
)
from agent.records import LIVE_PHASES, Records
from agent.sandbox import InvalidId, check_id
from agent.status_updates import SendMaster, StatusUpdateManager, UpdateRetry
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, UnknownTimer
from dyad.ids import new_uuid
from dyad.messages import (
    AgentInfo, AgentRegistered, CheckpointResources, DrainAgent, ExecutorExited, ExecutorInfo, ExecutorToFramework,
    FrameworkInfo, FrameworkToExecutor, KillTask, LaunchTask, MasterInfo, Message, Ping, Pong,
    Reason, RegisterAgent, RegisterExecutor, Rejected, ReregisterExecutor, RunTask,
    ShutdownFramework, Source, StatusUpdate, StatusUpdateAck, Task, TaskInfo, TaskState,
    TaskStatus, UsageReport,
)
from dyad.resources import Resources, ResourcesError
from dyad.volumes import DynamicResources, total_of

log = logging.getLogger(__name__)


Event = (MasterMessage | ExecutorMessage | InvalidFrame | ExecutorStarted | ExecutorProcessExited
         | ExecutorLaunchFailed | MasterDetected | TimerFired | Shutdown | Drain
         | UsageSampled | HealthCheckResult | Recover | ContainerEvent)

Effect = (SendMaster | Send | LaunchExecutor | KillExecutor | UpdateLimits | RunHealthCheck
          | ArmTimer | CancelTimer | ConnectMaster | DetectMaster | Checkpoint | Exit
          | LaunchContainer | RemoveContainer
          | persistent.CreateVolume | persistent.DestroyVolume | persistent.MountVolumes)


class AgentState(HostRuns):
    """One agent's executors, tasks and master link. See the module docstring."""

    def __init__(self, config: AgentConfig, new_id: Callable[[], str] = new_uuid) -> None:
        self.config = config
        self._new_id = new_id
        self.agent_id: str | None = None
        self.link = MasterLink(config)
        self.records = Records(config.completed_limit)
        # Seeded by what tells agents apart, so their retries spread yet replay.
        self.updates = StatusUpdateManager(
            config.status_update_backoff, config.status_update_backoff_max,
            seed=f"{config.hostname}:{config.port}:{config.work_dir}")
        self.health = HealthChecker()
        self.oversubscription = Oversubscription(config.reclaim, config.qos, config.resources)
        self.used = Resources()  # what the agent's own resources hold; revocable tasks aside
        # Reservations and volumes the master made here (agent.persistent).
        self.dynamic = DynamicResources()
        self.draining = False
        self.cached_uris: list[str] = []
        self.shutting_down = False
        self.exited = False
        self.exit_deadline: float | None = None
        self.counters: Counter[str] = Counter()
        self._exits: list[ExecutorExited] = []  # told to the master once registered
        self._seq = itertools.count()
        self._shutdown_timer: ShutdownDeadline | None = None
        self._next_report = 0.0
        self._dirty = False
        self._saved_runs = checkpoint.SavedRuns()

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
        if isinstance(event, InvalidFrame):
            return self._on_invalid(event)
        if isinstance(event, TimerFired):
            return self._on_timer(event.key, now)
        if isinstance(event, ExecutorStarted):
            return self._on_started(event, now)
        if isinstance(event, ExecutorProcessExited):
            return self._on_process_exited(event, now)
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
        if isinstance(event, ContainerEvent):
            return self._on_container(event, now)
        if isinstance(event, Shutdown):
            return self._on_shutdown(now)
        raise TypeError(f"not an agent event: {event!r}")

    def _changed(self, only: Iterable[AgentExecutor] | None = None) -> None:
        """Something a restarted agent needs changed: checkpoint before acting. `only`:
        no run changed but these (the agent's own records may have); None: any."""
        self._dirty = True
        self._saved_runs.changed(only)

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
        if isinstance(msg, CheckpointResources):
            return self._on_checkpoint_resources(msg)
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
        executor = self.records.by_peer(peer)
        if executor is None:
            return self._reject_executor(peer, "executor is not registered", msg.TYPE)
        if msg.framework_id != executor.framework_id:
            return self._reject_executor(
                peer, f"executor belongs to framework {executor.framework_id}", msg.TYPE)
        if isinstance(msg, StatusUpdate):
            return self._on_executor_update(peer, executor, msg, now)
        return self._to_master(attrs.evolve(msg, agent_id=self.agent_id or msg.agent_id,
                                            executor_id=executor.executor_id))

    def _on_invalid(self, event: InvalidFrame) -> list[Effect]:
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

    @property
    def frameworks(self) -> dict[str, AgentFramework]:
        return self.records.frameworks

    @property
    def completed_frameworks(self) -> deque[AgentFramework]:
        return self.records.completed_frameworks

    # --------------------------------------------------------------- the master

    @property
    def phase(self) -> str:
        """The master link's phase (`agent.master_link`)."""
        return self.link.phase

    @property
    def master(self) -> MasterInfo | None:
        return self.link.master

    @property
    def ping_interval(self) -> float:
        return self.link.ping_interval

    def _on_master_detected(self, master: MasterInfo, now: float) -> list[Effect]:
        """The leader, found after silence or named by ZooKeeper as the successor:
        move to it (a failover needs no missed pings); the one we have: nothing."""
        if self.link.with_master(master):
            return []
        return [*self.updates.pause(), *self.link.detected(master, self._registration(), now)]

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
                             tasks=tasks, executors=executors, frameworks=frameworks,
                             dynamic=self.dynamic)

    def _agent_info(self) -> AgentInfo:
        c = self.config
        return AgentInfo(hostname=c.hostname, port=c.port, resources=c.resources,
                         attributes=dict(c.attributes), id=self.agent_id, ip=c.ip)

    def _task_view(self, task: AgentTask) -> Task:
        return Task(task_id=task.task_id, framework_id=task.framework_id,
                    agent_id=self.agent_id or "", executor_id=task.executor_id,
                    name=task.info.name, state=task.state, resources=task.info.resources,
                    status_uuid=task.status_uuid, labels=dict(task.info.labels),
                    priority=task.info.priority, revocable=task.info.revocable)

    def _on_registered(self, msg: AgentRegistered, now: float) -> list[Effect]:
        effects, first = self.link.answered(msg, now)
        if not first:
            return effects
        if self.agent_id is not None and self.agent_id != msg.agent_id:
            log.warning("master gave us a new agent id %s (was %s)", msg.agent_id, self.agent_id)
        if self.agent_id != msg.agent_id:
            self._changed()
        self.agent_id = msg.agent_id
        effects += self.updates.resume(now)
        if self._exits:
            effects += [SendMaster(attrs.evolve(e, agent_id=msg.agent_id)) for e in self._exits]
            self._exits.clear()
            self._changed()
        if self.draining:
            effects.append(SendMaster(DrainAgent(agent_id=msg.agent_id)))
        return effects

    def _on_ping(self, msg: Ping, now: float) -> list[Effect]:
        return [SendMaster(Pong(agent_id=self.agent_id or msg.agent_id)), *self.link.heard(now)]

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
                return self.link.register(self._registration(), now) if self.link.retry_due(
                    key) else []
            case MasterSilent():
                if not self.link.silence_due(key):
                    return []
                return [*self.link.lost(), *self.updates.pause()]
            case ShutdownDeadline():
                if key != self._shutdown_timer:
                    return []
                log.warning("executors still running after the shutdown deadline; exiting")
                return self._exit()
            case ExecutorTimer():
                executor = self.records.executor(key.framework_id, key.executor_id)
                if executor is None or executor.timer != key:
                    return []
                executor.timer = None
                return self._on_executor_timer(executor, key, now)
            case _:
                raise UnknownTimer("AgentState", key)

    # ------------------------------------------------------------------- tasks

    def _on_run_task(self, msg: RunTask, now: float) -> list[Effect]:
        task, framework_id = msg.task, msg.framework.id
        if framework_id is None:
            return self._reject_master("run_task needs framework.id", msg.TYPE)
        if (self.records.find_task(framework_id, task.task_id) is not None
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
        info = launch.executor_info_for(self.config, framework_id, task)
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
        problem = self._container_problem(task, info, executor is None)
        if problem:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_ERROR, Reason.TASK_INVALID, problem, now)
        needed = self._needed(task, info, executor is None)
        if needed is None:
            return self._agent_update(
                framework_id, task.task_id, info.executor_id, TaskState.TASK_ERROR,
                Reason.TASK_INVALID,
                f"task needs {task.resources} but the agent has only "
                f"{self._free()} free", now)

        effects: list[Effect] = []
        if framework is None:
            framework = self.frameworks[framework_id] = AgentFramework(msg.framework)
        else:
            framework.info = msg.framework
        self.used = self.used + needed
        record = AgentTask(task, framework_id, info.executor_id)
        self.records.place(record)
        if executor is None:
            executor = self._new_executor(framework, info, task.command is not None)
            self._changed((executor,))
            executor.queued[task.task_id] = record
            return [*self._mounts(executor, needed), *self._launch_executor(executor, task, now)]
        self._changed((executor,))
        effects += self._mounts(executor, needed)
        if executor.phase == RUNNING:
            assert executor.peer is not None
            executor.launched[task.task_id] = record
            effects.append(Send(executor.peer, LaunchTask(framework=framework.info, task=task)))
        else:  # LAUNCHING, or RECOVERING: sent once it (re-)registers
            executor.queued[task.task_id] = record
        return effects + self._update_limits(executor)

    def _needed(self, task: TaskInfo, info: ExecutorInfo, new_executor: bool) -> Resources | None:
        """What accepting `task` adds to `used`, or None if that does not fit. A task
        on revocable resources adds only its new executor's: it runs in what others
        leave idle, and the QoS controller evicts it when they need that back."""
        own = Resources() if task.revocable else task.resources
        try:
            needed = own + info.resources if new_executor else own
            fits = self.used + needed <= self.total
        except ResourcesError:  # e.g. the same port twice
            return None
        return needed if fits else None

    @property
    def total(self) -> Resources:
        """The agent's resources with the master's dynamic reservations applied."""
        return total_of(self.config.resources, self.dynamic)

    def _free(self) -> Resources:
        try:
            return self.total - self.used
        except ResourcesError:
            return Resources()

    def _mounts(self, executor: AgentExecutor, needed: Resources) -> list[Effect]:
        """A process run sees its volumes through links in its sandbox; a container
        gets them bound when it is created (`_launch_container`)."""
        if executor.info.container is not None:
            return []
        return [*persistent.mounts(self.config.work_dir, self.dynamic, executor.directory,
                                   [needed])]

    def _on_checkpoint_resources(self, msg: CheckpointResources) -> list[Effect]:
        """The master changed this agent's reservations or volumes (agent.persistent)."""
        dynamic, effects, why = persistent.adopt(self.config.work_dir, self.config.resources,
                                                 self.dynamic, msg.resources,
                                                 self.used.volumes())
        if why:
            return self._reject_master(f"checkpoint_resources refused: {why}", msg.TYPE)
        if dynamic != self.dynamic:
            self.dynamic = dynamic
            self._changed()
        return [*effects]

    def _on_kill_task(self, msg: KillTask, now: float) -> list[Effect]:
        found = self.records.find(msg.framework_id, msg.task_id)
        if found is None:
            if self.records.is_completed(msg.framework_id, msg.task_id):
                return []  # its terminal update already went out
            return self._agent_update(msg.framework_id, msg.task_id, "", TaskState.TASK_LOST,
                                      Reason.TASK_UNKNOWN, "task is unknown to the agent", now)
        executor, task = found
        if msg.reason:  # the master preempts it
            return self._preempt(executor, task, msg.reason, msg.message, now)
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
        if executor.direct:
            return self._stop_direct(executor, msg.kill_grace_period, now)
        effects: list[Effect] = [*self.health.stop(task.framework_id, task.task_id)]
        if executor.phase == RECOVERING:
            executor.pending_kills[task.task_id] = msg.kill_grace_period
            self._changed()
        elif executor.peer is not None:
            effects.append(Send(executor.peer, msg))
        return effects

    def _preempt(self, executor: AgentExecutor, task: AgentTask, reason: str, message: str,
                 now: float) -> list[Effect]:
        """End `task` TASK_KILLED with `reason`: evicted here, or preempted by the master."""
        if task.task_id in executor.queued:
            return self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLED,
                reason, message, now), now)
        if task.task_id not in executor.launched:
            return []  # terminal already
        return self._kill_launched(executor, task, TaskEnd(TaskState.TASK_KILLED, reason, message),
                                   now)

    def _kill_launched(self, executor: AgentExecutor, task: AgentTask,
                       outcome: TaskEnd, now: float) -> list[Effect]:
        """Ask the executor to kill `task` (its kill policy applies) and report the
        end as `outcome`, whatever the executor calls it."""
        task.kill_as = outcome
        self._changed()
        effects: list[Effect] = [*self.health.stop(task.framework_id, task.task_id)]
        if executor.direct:
            return effects + self._stop_direct(executor, None, now)
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
            self._changed(())
        if not self.updates.has_stream(msg.framework_id, msg.task_id):
            found = self.records.find(msg.framework_id, msg.task_id)
            if found is not None and found[1].task_id in found[0].terminated:
                self.records.complete_task(*found)
                self._changed(found[:1])
        return effects

    def _on_executor_update(self, peer: str, executor: AgentExecutor, msg: StatusUpdate,
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
                                         executor.directory, self._task_env(executor, task), now,
                                         self._run_user(executor, task.info))
        return effects + ack

    def _transition(self, executor: AgentExecutor, task: AgentTask, update: StatusUpdate,
                    now: float) -> list[Effect]:
        """Record `update` as `task`'s latest state and hand it to its stream."""
        self._changed((executor,))
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
            if not task.info.revocable:
                self.used = self.used - task.info.resources
            self.counters[_state_metric(state)] += 1
            effects += self._update_limits(executor)
        return effects + [*self.updates.add(update, now)]

    def _agent_update(self, framework_id: str, task_id: str, executor_id: str,
                      state: TaskState, reason: str, message: str,
                      now: float) -> list[Effect]:
        """A terminal update for a task the agent never ran (no record to keep)."""
        self._changed(())
        self.counters[_state_metric(state)] += 1
        update = self._status_update(framework_id, task_id, executor_id, state, reason,
                                     message, now)
        return [*self.updates.add(update, now)]

    def _status_update(self, framework_id: str, task_id: str, executor_id: str,
                       state: TaskState, reason: str, message: str, now: float,
                       healthy: bool | None = None, source: str = Source.AGENT) -> StatusUpdate:
        """An update the agent makes; `source` is SOURCE_EXECUTOR where the agent
        plays a direct run's executor (its start, kill and end)."""
        return StatusUpdate(framework_id=framework_id, status=TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message,
            source=source, agent_id=self.agent_id or "", executor_id=executor_id,
            uuid=self._new_id(), healthy=healthy, timestamp=now))

    # ------------------------------------------------------------------ health

    def _on_health_result(self, event: HealthCheckResult, now: float) -> list[Effect]:
        effects: list[Effect] = []
        results, outcomes = self.health.result(event, now)
        effects += results
        for outcome in outcomes:
            found = self.records.find(outcome.framework_id, outcome.task_id)
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
                effects += self._kill_launched(executor, task, TaskEnd(
                    TaskState.TASK_FAILED, Reason.TASK_UNHEALTHY, outcome.message), now)
        return effects

    # ------------------------------------------------------------------- usage

    def _on_usage(self, event: UsageSampled, now: float) -> list[Effect]:
        self.cached_uris = sorted(event.cached_uris)
        effects: list[Effect] = []
        for sample in event.samples:
            executor = self.records.executor(sample.framework_id, sample.executor_id)
            if executor is None or executor.run_id != sample.run_id:
                continue  # the run ended since the shell looked
            executor.usage = limits.usage(executor, sample)
            executor.last_sample = sample
            problem = limits.memory_problem(executor, sample, self.config.isolation)
            if problem and executor.phase in LIVE_PHASES:
                effects += self._memory_limitation(executor, problem, now)
        lent_before = self.oversubscription.last.revocable
        estimate, victims = self.oversubscription.sampled(self.records.executors(), now)
        for executor, task, why in victims:
            log.warning("evicting revocable task %s: %s", task.task_id, why)
            self.counters["tasks_evicted"] += 1
            effects += self._preempt(executor, task, Reason.CONTAINER_PREEMPTED, why, now)
        # Less to lend is told at once, so the master stops offering it.
        shrank = estimate.revocable.at_least(lent_before) != estimate.revocable
        if self.phase == REGISTERED and self.agent_id and (now >= self._next_report or shrank):
            self._next_report = now + self.config.usage_report_interval
            effects.append(SendMaster(UsageReport(
                agent_id=self.agent_id, cached_uris=list(self.cached_uris),
                executors=[e.usage for e in self.records.executors() if e.usage is not None],
                revocable=as_resources(estimate.revocable),
                reservation=as_resources(estimate.reservation))))
        return effects

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
        for executor in self.records.executors():
            effects += self._drain_executor(executor, now)
        return effects

    # ---------------------------------------------------------------- recovery

    def saved(self) -> SavedAgent:
        """What a restarted agent needs (see `agent.checkpoint`)."""
        c = self.config
        executors = self._saved_runs.save(self.records.executors())
        return SavedAgent(
            agent_id=self.agent_id, hostname=c.hostname, resources=c.resources,
            attributes=dict(c.attributes), port=c.port, executor_port=c.executor_port,
            draining=self.draining, frameworks=[f.info for f in self.frameworks.values()],
            executors=executors, updates=self.updates.all_queued(), exits=list(self._exits),
            dynamic=self.dynamic)

    def _on_recover(self, event: Recover, now: float) -> list[Effect]:
        """Take back what a killed agent left: runs whose process is still alive
        (`event.alive`) wait to re-register; the others are gone."""
        saved = event.saved
        if self.frameworks or self.agent_id is not None:
            raise RuntimeError("recovery must come first")
        self.agent_id = saved.agent_id
        self.draining = saved.draining
        self.dynamic = saved.dynamic
        self.records.restore(saved)
        self.used = self.records.charged()
        for update in saved.updates:
            self.updates.add(update, now)  # paused: queued until a master registers us
        self._exits = list(saved.exits)
        self._changed()
        effects: list[Effect] = [*persistent.recreate(self.config.work_dir, self.dynamic)]
        phases = {(s.framework_id, s.info.executor_id): s.phase for s in saved.executors}
        for executor in list(self.records.executors()):
            was = phases[(executor.framework_id, executor.executor_id)]
            if executor.host_direct and executor.pid is not None:
                effects += self._host_recovered(executor, was, event, now)
            elif executor.key not in event.alive:
                effects += self._on_executor_gone(
                    *executor.key, UNKNOWN_EXIT, now, reason=Reason.EXECUTOR_TERMINATED,
                    message=("container vanished" if executor.info.container else
                             "command did not start" if executor.host_direct else
                             "executor ended") + " while the agent was down")
            elif was == TERMINATING:
                executor.phase = TERMINATING  # it was being stopped: finish the job
                effects += [self._kill(executor, "TERM"), *self._arm_executor_timer(
                    executor, KillDue, now + self.config.executor_kill_delay)]
            elif executor.direct:
                effects += self._container_recovered(
                    executor, event.containers.get(executor.key), now)
            else:
                timeout = (self.config.executor_registration_timeout if was == LAUNCHING
                           else self.config.executor_reregistration_timeout)
                effects += [UpdateLimits(*executor.key, executor.limits),
                            *self._arm_executor_timer(executor, ReregistrationTimeout,
                                                      now + timeout)]
        log.info("recovered agent %s: %d executors alive, %d updates to resend",
                 self.agent_id, sum(1 for _ in self.records.executors()), len(saved.updates))
        return effects

    # --------------------------------------------------------------- executors

    def _on_framework_message(self, msg: FrameworkToExecutor) -> list[Effect]:
        executor = self.records.executor(msg.framework_id, msg.executor_id)
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
        for executor in list(self.records.executors()):
            graces.append(launch.shutdown_grace(self.config, executor))
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

    # ------------------------------------------------------------ observation

    @property
    def drain_state(self) -> str | None:
        """None, "DRAINING" (tasks still live) or "DRAINED"."""
        if not self.draining:
            return None
        live = any(any(e.live_tasks()) for e in self.records.executors())
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
        self.records.validate()
        self._saved_runs.validate(self.records.executors())
        assert self.records.charged() == self.used, (self.records.charged(), self.used)
        assert self.used <= self.total, (self.used, self.total)
        assert (self.phase == REGISTERED) == (not self.updates.paused)
        self.link.validate()
        assert not self._exits or self.phase != REGISTERED
        self.updates.validate()
        self.health.validate()


def _state_metric(state: TaskState) -> str:
    return "tasks_" + state.name.removeprefix("TASK_").lower()
