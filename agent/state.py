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
alone: a task's life from `RunTask` to its last update in `agent.tasks` and an
executor run's life in `agent.runs` (both inherited), the records and their
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
from agent.health import HealthCheckResult, HealthChecker, HealthRound, RunHealthCheck
from agent.master_link import MasterLink, MasterSilent, RegisterRetry
from agent.oversubscription import Oversubscription, as_resources
from agent.model import (
    DETECTING, LAUNCHING, REGISTERED, TERMINATING, UNKNOWN_EXIT,
    AgentConfig, AgentExecutor, AgentFramework, AgentTask, Checkpoint, ConnectMaster,
    DetectMaster, Drain, ExecutorLaunchFailed, ExecutorMessage, ExecutorProcessExited,
    ExecutorStarted, ExecutorTimer, Exit, InvalidFrame, KillDue, KillExecutor, LaunchExecutor,
    MasterDetected, MasterMessage, ReregistrationTimeout, Shutdown, ShutdownDeadline,
    UpdateLimits, UsageSampled,
)
from agent.records import LIVE_PHASES, Records
from agent.status_updates import SendMaster, StatusUpdateManager, UpdateRetry
from agent.tasks import AgentTasks
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, UnknownTimer
from dyad.ids import new_uuid
from dyad.messages import (
    ACK_BATCH_CAPABILITY, BATCH_CAPABILITY, LIVENESS_CAPABILITY, AgentInfo, AgentRegistered,
    CheckpointResources, DrainAgent, ExecutorExited, ExecutorInfo, ExecutorToFramework, FrameworkInfo,
    FrameworkToExecutor, KillTask, MasterInfo, Message, Ping, Pong, Reason, RegisterAgent,
    RegisterExecutor, Rejected, ReregisterExecutor, RunTask, ShutdownFramework, StatusUpdate,
    StatusUpdateAck, StatusUpdateAcks, Task, UsageReport,
)
from dyad.resources import Resources
from dyad.volumes import DynamicResources

log = logging.getLogger(__name__)


Event = (MasterMessage | ExecutorMessage | InvalidFrame | ExecutorStarted | ExecutorProcessExited
         | ExecutorLaunchFailed | MasterDetected | TimerFired | Shutdown | Drain
         | UsageSampled | HealthCheckResult | Recover | ContainerEvent)

Effect = (SendMaster | Send | LaunchExecutor | KillExecutor | UpdateLimits | RunHealthCheck
          | ArmTimer | CancelTimer | ConnectMaster | DetectMaster | Checkpoint | Exit
          | LaunchContainer | RemoveContainer
          | persistent.CreateVolume | persistent.DestroyVolume | persistent.MountVolumes)


class AgentState(AgentTasks):
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
            if not isinstance(event.message, Rejected):  # a refusal proves nothing
                self.link.heard(now)  # any other frame proves the master alive (master_link)
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
            return self._on_ping(msg)
        if isinstance(msg, RunTask):
            return self._on_run_task(msg, now)
        if isinstance(msg, KillTask):
            return self._on_kill_task(msg, now)
        if isinstance(msg, StatusUpdateAck):
            return self._on_ack(msg, now)
        if isinstance(msg, StatusUpdateAcks):  # as if each had come alone
            return [effect for ack in msg.each() for effect in self._on_ack(ack, now)]
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
                if not executor.is_command:  # the agent's own, unknown to the master
                    executors.append(executor.info)
                tasks += [self._task_view(t) for t in executor.live_tasks()]
        return RegisterAgent(agent=self._agent_info(), version=self.config.version,
                             tasks=tasks, executors=executors, frameworks=frameworks,
                             dynamic=self.dynamic,
                             capabilities=[BATCH_CAPABILITY, LIVENESS_CAPABILITY,
                                           ACK_BATCH_CAPABILITY])

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

    def _on_ping(self, msg: Ping) -> list[Effect]:
        return [SendMaster(Pong(agent_id=self.agent_id or msg.agent_id))]

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
                effects = self.link.silence(key, now)
                if effects is not None:
                    return effects
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

