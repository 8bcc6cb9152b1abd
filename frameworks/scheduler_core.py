"""`SchedulerCore`: every decision of the scheduler driver, without I/O.

One way in, `handle(event, now) -> effects`. Events are what the shell saw (the
driver started, a leader was detected, a message arrived, a timer fired) and what
the user called (`AcceptCall`, `KillCall`, ...); effects say what to send, which
callback to run, which timer to arm, and when to detect the leader again. `now` is
seconds on the driver's injected clock, so the tests drive it with a FakeClock.

Connection (docs/protocol.md): subscribe every `subscribe_retry` seconds until
`Subscribed`, detecting the leader again after `subscribe_attempts_before_redetect`
unanswered tries; once subscribed, heartbeat both ways, and call the master lost
after `missed_heartbeats` intervals without a word from it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Hashable

import attrs

from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    Accept, Acknowledge, Decline, Error, ExecutorToFramework, Failure, Filters,
    FrameworkInfo, FrameworkToExecutor, Heartbeat, Kill, MasterInfo, Message, Offers,
    Operation, OperationType, Preempt, Reconcile, ReconcileTask, Rejected, RequestResources,
    Rescind, ResourceRequest, Revive,
    SchedulerHeartbeat, Source, Subscribe, Subscribed, Suppress, TaskInfo, TaskState,
    TaskStatus, Teardown, Unsubscribe, Update)
from dyad.resources import Resources
from dyad.wire_types import priority_field
from frameworks.driver_core import Callback, DriverStatus, Finish, Received, Started

log = logging.getLogger("frameworks.scheduler")

REASON_MASTER_DISCONNECTED = "REASON_MASTER_DISCONNECTED"
"""Reason on the TASK_LOST/TASK_DROPPED updates the driver makes for tasks launched
while it had no master (Mesos' name)."""


@attrs.frozen
class SchedulerTimings:
    """How patient the driver is with the master; the defaults are the protocol's."""

    subscribe_retry: float = 1.0
    """Seconds between `Subscribe` attempts while the master has not answered."""
    subscribe_attempts_before_redetect: int = 5
    """Unanswered `Subscribe`s after which the leader is detected again (it may have
    changed while we were knocking on the old one's door)."""
    missed_heartbeats: int = 3
    """Master heartbeat intervals without any message before we call it disconnected."""


# ------------------------------------------------------------------ events


@attrs.frozen
class MasterDetected:
    """The shell found a leader and connected its socket to it."""

    master: MasterInfo


@attrs.frozen
class AcceptCall:
    offer_ids: list[str]
    operations: list[Operation]
    filters: Filters


@attrs.frozen
class DeclineCall:
    offer_ids: list[str]
    filters: Filters


@attrs.frozen
class SuppressCall:
    pass


@attrs.frozen
class ReviveCall:
    pass


@attrs.frozen
class RequestCall:
    """Declare what we want now (replacing what we declared; empty clears it)."""

    requests: list[ResourceRequest]


@attrs.frozen
class KillCall:
    task_id: str
    kill_grace_period: float | None


@attrs.frozen
class PreemptCall:
    """Ask for room for one task of `priority` needing `resources` (validated here,
    where the caller can be told)."""

    resources: Resources = attrs.field(validator=attrs.validators.instance_of(Resources))
    priority: int = attrs.field(validator=priority_field)


@attrs.frozen
class AcknowledgeCall:
    status: TaskStatus


@attrs.frozen
class ReconcileCall:
    tasks: list[ReconcileTask]


@attrs.frozen
class SendToExecutorCall:
    executor_id: str
    agent_id: str
    data: bytes


@attrs.frozen
class StopCall:
    """End for good; the effects are the farewell to send (none if we never
    registered): `Unsubscribe` on failover, else `Teardown`."""

    failover: bool


Event = (Started | MasterDetected | Received | TimerFired | AcceptCall | DeclineCall
         | SuppressCall | ReviveCall | RequestCall | KillCall | PreemptCall | AcknowledgeCall
         | ReconcileCall | SendToExecutorCall | StopCall)

# ------------------------------------------------------------------ effects


@attrs.frozen
class Detect:
    """Effect: find the leading master and answer with `MasterDetected`."""


Effect = Send | ArmTimer | CancelTimer | Callback | Finish | Detect

# -------------------------------------------------------------- timer keys


@attrs.frozen
class SubscribeRetry(TimerKey):
    """Time to send `Subscribe` again (or to detect the leader again)."""


@attrs.frozen
class HeartbeatDue(TimerKey):
    """Time to send our `SchedulerHeartbeat`."""


@attrs.frozen
class LivenessCheck(TimerKey):
    """Time to check whether the master has said anything lately."""


class _State(enum.Enum):
    DETECTING = "detecting"
    SUBSCRIBING = "subscribing"
    SUBSCRIBED = "subscribed"
    DONE = "done"


def _send(message: Message) -> Send:
    return Send(to="master", message=message)


class SchedulerCore:
    """Decides what the scheduler driver does; no I/O."""

    def __init__(self, framework: FrameworkInfo,
                 timings: SchedulerTimings = SchedulerTimings()) -> None:
        self.framework = framework
        self.timings = timings
        self.framework_id: str | None = framework.id
        self.master: MasterInfo | None = None
        self.heartbeat_interval = 0.0
        self._state = _State.DETECTING
        self._last_seen = 0.0
        self._attempts = 0
        self._ever_registered = False
        self._suppressed = False
        self._revive_pending = False
        self._requests: list[ResourceRequest] = []  # declared demand, cleared by suppress
        self._subscribed_with: list[ResourceRequest] = []  # the demand the last Subscribe held
        # Where each live task runs, so a kill can name the agent.
        self._task_agents: dict[str, str] = {}
        # Kill/Reconcile/Acknowledge made while disconnected; sent once subscribed.
        self._queued: list[Kill | Reconcile | Acknowledge] = []

    @property
    def subscribed(self) -> bool:
        return self._state is _State.SUBSCRIBED

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def handle(self, event: Event, now: float) -> list[Effect]:
        """Apply one event at time `now`; return what the shell must do, in order."""
        match event:
            case Started():
                return [Detect()]
            case MasterDetected(master):
                return self._master_detected(master, now)
            case Received(message):
                return self._on_message(message, now)
            case TimerFired(key):
                return self._on_timer(key, now)
            case AcceptCall(offer_ids, operations, filters):
                return self._accept(offer_ids, operations, filters)
            case DeclineCall(offer_ids, filters):
                return self._decline(offer_ids, filters)
            case SuppressCall():
                return self._suppress()
            case ReviveCall():
                return self._revive()
            case RequestCall(requests):
                return self._request(requests)
            case KillCall(task_id, grace):
                return self._send_or_queue(Kill(
                    framework_id=self.framework_id or "", task_id=task_id,
                    agent_id=self._task_agents.get(task_id), kill_grace_period=grace))
            case PreemptCall(resources, priority):
                return self._preempt(resources, priority)
            case AcknowledgeCall(status):
                return self._acknowledge(status)
            case ReconcileCall(tasks):
                return self._send_or_queue(Reconcile(framework_id=self.framework_id or "",
                                                     tasks=tasks))
            case SendToExecutorCall(executor_id, agent_id, data):
                return self._send_to_executor(executor_id, agent_id, data)
            case StopCall(failover):
                return self._stop(failover)
            case _:
                raise TypeError(f"SchedulerCore cannot handle {event!r}")

    # ------------------------------------------------------------ connection

    def _master_detected(self, master: MasterInfo, now: float) -> list[Effect]:
        """Subscribe to the leader. A new leader while subscribed (a failover the
        detector saw) is a disconnection."""
        effects: list[Effect] = []
        if self._state is _State.SUBSCRIBED and self.master is not None \
                and master.id != self.master.id:
            log.info("leading master changed to %s; subscribing there", master.id)
            effects = [CancelTimer(HeartbeatDue()), CancelTimer(LivenessCheck()),
                       Callback("disconnected")]
        elif self._state not in (_State.DETECTING, _State.SUBSCRIBING):
            return []
        self.master = master
        self._state = _State.SUBSCRIBING
        self._attempts = 0
        return effects + self._subscribe(now)

    def _subscribe(self, now: float) -> list[Effect]:
        self._attempts += 1
        framework = attrs.evolve(self.framework, id=self.framework_id)
        self._subscribed_with = [] if self._suppressed else self._requests
        return [_send(Subscribe(framework=framework, requests=self._subscribed_with)),
                ArmTimer(SubscribeRetry(), now + self.timings.subscribe_retry)]

    def _on_timer(self, key: Hashable, now: float) -> list[Effect]:
        # A key of a known kind that fires in the wrong state is stale: ignored.
        match key:
            case SubscribeRetry():
                if self._state is not _State.SUBSCRIBING:
                    return []
                if self._attempts >= self.timings.subscribe_attempts_before_redetect:
                    self._state = _State.DETECTING
                    return [Detect()]
                return self._subscribe(now)
            case HeartbeatDue():
                if not self.subscribed:
                    return []
                assert self.framework_id is not None
                return [_send(SchedulerHeartbeat(framework_id=self.framework_id)),
                        ArmTimer(HeartbeatDue(), now + self.heartbeat_interval)]
            case LivenessCheck():
                return self._check_liveness(now) if self.subscribed else []
            case _:
                raise UnknownTimer("SchedulerCore", key)

    def _check_liveness(self, now: float) -> list[Effect]:
        deadline = self._last_seen + self.timings.missed_heartbeats * self.heartbeat_interval
        if now < deadline:
            return [ArmTimer(LivenessCheck(), deadline)]
        log.warning("no word from the master for %.1fs; looking for it again",
                    now - self._last_seen)
        self._state = _State.DETECTING
        return [CancelTimer(HeartbeatDue()), Callback("disconnected"), Detect()]

    # --------------------------------------------------------------- inbound

    def _on_message(self, message: Message, now: float) -> list[Effect]:
        if self.done:
            return []
        if isinstance(message, Error):
            log.error("master error: %s", message.message)
            self._state = _State.DONE
            return [Callback("error", (message.message,)), Finish(DriverStatus.ABORTED)]
        if isinstance(message, Rejected):
            what = message.message_type or "a message"
            return [Callback("error", (f"master rejected {what}: {message.reason}",))]
        if isinstance(message, Subscribed):
            return self._on_subscribed(message, now)
        if not self.subscribed:
            # Offers and updates from a connection we no longer trust: the master
            # voids the offers, and agents resend unacknowledged updates.
            log.debug("ignoring %s while not subscribed", type(message).__name__)
            return []
        self._last_seen = now
        if isinstance(message, Heartbeat):
            return []
        if isinstance(message, Offers):
            return [Callback("resource_offers", (list(message.offers),))]
        if isinstance(message, Rescind):
            return [Callback("offer_rescinded", (message.offer_id,))]
        if isinstance(message, Update):
            return self._on_update(message.status)
        if isinstance(message, ExecutorToFramework):
            return [Callback("framework_message",
                             (message.executor_id, message.agent_id, message.data))]
        if isinstance(message, Failure):
            if message.executor_id is None:
                return [Callback("agent_lost", (message.agent_id,))]
            return [Callback("executor_lost",
                             (message.executor_id, message.agent_id, message.status))]
        log.warning("unexpected %s from the master ignored", type(message).__name__)
        return []

    def _on_subscribed(self, message: Subscribed, now: float) -> list[Effect]:
        if self._state is not _State.SUBSCRIBING:
            return []  # an answer to a retried Subscribe: we are already subscribed
        self._state = _State.SUBSCRIBED
        self.framework_id = message.framework_id
        self.master = message.master_info
        self.heartbeat_interval = message.heartbeat_interval
        self._last_seen = now
        effects: list[Effect] = [CancelTimer(SubscribeRetry())]
        if self.heartbeat_interval > 0:
            patience = self.timings.missed_heartbeats * self.heartbeat_interval
            effects += [ArmTimer(HeartbeatDue(), now + self.heartbeat_interval),
                        ArmTimer(LivenessCheck(), now + patience)]
        if self._ever_registered:
            effects.append(Callback("reregistered", (message.master_info,)))
        else:
            self._ever_registered = True
            effects.append(Callback("registered",
                                    (message.framework_id, message.master_info)))
        queued, self._queued = self._queued, []
        effects += [_send(attrs.evolve(m, framework_id=self.framework_id)) for m in queued]
        # A new leader does not know our offer preference; restate it (the
        # Subscribe carried the demand: restate it only if it changed since).
        if self._requests != self._subscribed_with and not self._suppressed:
            effects.append(_send(RequestResources(framework_id=self.framework_id,
                                                  requests=self._requests)))
        if self._suppressed:
            effects.append(_send(Suppress(framework_id=self.framework_id)))
        elif self._revive_pending:
            effects.append(_send(Revive(framework_id=self.framework_id)))
        self._revive_pending = False
        return effects

    def _on_update(self, status: TaskStatus) -> list[Effect]:
        if status.agent_id:
            if status.state.is_terminal:
                self._task_agents.pop(status.task_id, None)
            else:
                self._task_agents[status.task_id] = status.agent_id
        ack = status if self.framework.implicit_acknowledgements and status.uuid else None
        return [Callback("status_update", (status,), ack=ack)]

    # ------------------------------------------------------------ user calls

    def _accept(self, offer_ids: list[str], operations: list[Operation],
                filters: Filters) -> list[Effect]:
        tasks = [t for op in operations if op.type == OperationType.LAUNCH for t in op.tasks]
        if not self.subscribed:
            log.warning("accept of %s ignored: not subscribed to a master", offer_ids)
            return [] if self.done else [self._lost(task) for task in tasks]
        for task in tasks:
            self._task_agents[task.task_id] = task.agent_id
        assert self.framework_id is not None
        return [_send(Accept(framework_id=self.framework_id, offer_ids=offer_ids,
                             operations=operations, filters=filters))]

    def _lost(self, task: TaskInfo) -> Callback:
        """What a launch without a master becomes (as in Mesos): a terminal update
        with no uuid, so nothing waits for an acknowledgement."""
        state = (TaskState.TASK_DROPPED if self.framework.partition_aware
                 else TaskState.TASK_LOST)
        return Callback("status_update", (TaskStatus(
            task_id=task.task_id, state=state, reason=REASON_MASTER_DISCONNECTED,
            message="Master disconnected", source=Source.MASTER,
            agent_id=task.agent_id),))

    def _decline(self, offer_ids: list[str], filters: Filters) -> list[Effect]:
        if not self.subscribed:
            log.warning("decline of %s ignored: not subscribed (offers are void anyway)",
                        offer_ids)
            return []
        assert self.framework_id is not None
        return [_send(Decline(framework_id=self.framework_id, offer_ids=offer_ids,
                              filters=filters))]

    def _suppress(self) -> list[Effect]:
        self._suppressed, self._revive_pending = True, False
        self._requests = []  # the master clears declared demand on suppress too
        if not self.subscribed:
            log.info("suppress noted; sent once subscribed")
            return []
        assert self.framework_id is not None
        return [_send(Suppress(framework_id=self.framework_id))]

    def _revive(self) -> list[Effect]:
        self._suppressed = False
        if not self.subscribed:
            log.info("revive noted; sent once subscribed")
            self._revive_pending = True
            return []
        assert self.framework_id is not None
        return [_send(Revive(framework_id=self.framework_id))]

    def _request(self, requests: list[ResourceRequest]) -> list[Effect]:
        self._requests = list(requests)
        if not self.subscribed:
            log.info("resource request noted; sent once subscribed")
            return []
        assert self.framework_id is not None
        return [_send(RequestResources(framework_id=self.framework_id,
                                       requests=self._requests))]

    def _acknowledge(self, status: TaskStatus) -> list[Effect]:
        if not status.uuid:
            return []  # master-made updates carry no uuid and need no ack
        return self._send_or_queue(Acknowledge(
            framework_id=self.framework_id or "", agent_id=status.agent_id,
            task_id=status.task_id, uuid=status.uuid))

    def _send_or_queue(self, message: Kill | Reconcile | Acknowledge) -> list[Effect]:
        if self.subscribed:
            return [_send(message)]
        if not self.done:
            log.info("%s queued until subscribed", type(message).__name__)
            self._queued.append(message)
        return []

    def _preempt(self, resources: Resources, priority: int) -> list[Effect]:
        """Sent only while subscribed: the master keeps no request, and one held
        over a reconnection could free room for a task placed meanwhile."""
        if not self.subscribed:
            log.warning("preempt request dropped: not subscribed (ask again once placed)")
            return []
        assert self.framework_id is not None
        return [_send(Preempt(framework_id=self.framework_id, resources=resources,
                              priority=priority))]

    def _send_to_executor(self, executor_id: str, agent_id: str,
                          data: bytes) -> list[Effect]:
        if not self.subscribed:
            log.warning("framework message to %s dropped: not subscribed", executor_id)
            return []
        assert self.framework_id is not None
        return [_send(FrameworkToExecutor(framework_id=self.framework_id,
                                          agent_id=agent_id, executor_id=executor_id,
                                          data=data))]

    def _stop(self, failover: bool) -> list[Effect]:
        self._state = _State.DONE
        if self.framework_id is None:
            return []
        if failover:
            return [_send(Unsubscribe(framework_id=self.framework_id))]
        return [_send(Teardown(framework_id=self.framework_id))]
