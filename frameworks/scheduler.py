"""The scheduler side of a framework: `Scheduler` (your callbacks) and
`SchedulerDriver` (the connection to the master).

The driver is an asyncio shell around `SchedulerCore`, a pure state machine that
decides what every inbound message, timer and user call means (which callback to
run, what to send, what to queue while disconnected, when to acknowledge). The core
imports no asyncio or zmq, so its decisions are tested without sockets.

Connection (docs/protocol.md): detect the leading master, connect a DEALER to its
ZMQ endpoint, send `Subscribe` every second until `Subscribed`, then heartbeat both
ways. Three heartbeat intervals without a word from the master means the connection
is lost: `disconnected()`, detect again, re-subscribe with the same framework id,
`reregistered()`.
"""

from __future__ import annotations

import asyncio
import enum
import getpass
import logging
import socket
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import attrs

from dyad.detector import make_detector
from dyad.effects import ArmTimer, CancelTimer, Send
from dyad.messages import (
    Accept, Acknowledge, Decline, Error, ExecutorToFramework, Failure, Filters,
    FrameworkInfo, FrameworkToExecutor, Heartbeat, Kill, MasterInfo, Message, Offer,
    Offers, Operation, OperationType, Reconcile, ReconcileTask, Rejected, Rescind,
    Revive, SchedulerHeartbeat, Source, Subscribe, Subscribed, Suppress, TaskInfo,
    TaskState, TaskStatus, Teardown, Unsubscribe, Update)
from frameworks._callbacks import Callback, DriverRuntime, DriverStatus, Finish

log = logging.getLogger(__name__)

SUBSCRIBE_RETRY = 1.0
"""Seconds between `Subscribe` attempts while the master has not answered."""

SUBSCRIBE_ATTEMPTS_BEFORE_REDETECT = 5
"""Unanswered `Subscribe`s after which the leader is detected again (it may have
changed while we were knocking on the old one's door)."""

MISSED_HEARTBEATS = 3
"""Master heartbeat intervals without any message before we call it disconnected."""

REASON_MASTER_DISCONNECTED = "REASON_MASTER_DISCONNECTED"
"""Reason on the TASK_LOST/TASK_DROPPED updates the driver makes for tasks launched
while it had no master (Mesos' name)."""


class Scheduler:
    """Your framework's scheduler: override the callbacks you need.

    Every callback receives the driver first; each may be a plain method or
    ``async def``. Callbacks run one at a time on the driver's loop, in the order
    their events arrived: keep plain methods short (they block the loop) and do slow
    work in async callbacks or threads. An exception is logged and reported through
    `error`; the driver carries on.
    """

    def registered(self, driver: Any, framework_id: str, master_info: MasterInfo) -> Any:
        """The first `Subscribed` of this driver: `framework_id` is yours to keep."""

    def reregistered(self, driver: Any, master_info: MasterInfo) -> Any:
        """Subscribed again after a disconnection (same framework id). Offers made
        before it are void; reconcile tasks if you may have missed updates."""

    def disconnected(self, driver: Any) -> Any:
        """The master fell silent; the driver is looking for it. Outstanding offers
        are void."""

    def resource_offers(self, driver: Any, offers: list[Offer]) -> Any:
        """New offers: launch on them, or decline them (an offer you ignore holds its
        resources until the master rescinds it)."""

    def offer_rescinded(self, driver: Any, offer_id: str) -> Any:
        """The offer is gone (timeout, agent lost); launches on it will fail."""

    def status_update(self, driver: Any, status: TaskStatus) -> Any:
        """A task changed state. With implicit acknowledgements the driver
        acknowledges it after this returns; if this raises, it is not acknowledged
        and the agent delivers it again later."""

    def framework_message(self, driver: Any, executor_id: str, agent_id: str,
                          data: bytes) -> Any:
        """Bytes an executor sent with `send_framework_message` (best effort)."""

    def agent_lost(self, driver: Any, agent_id: str) -> Any:
        """The agent is unreachable or removed; its tasks' updates follow."""

    def executor_lost(self, driver: Any, executor_id: str, agent_id: str,
                      status: int | None) -> Any:
        """A custom executor exited (`status` is its exit code when known)."""

    def error(self, driver: Any, message: str) -> Any:
        """A master `Error` (the driver then aborts), a `Rejected` message, or an
        exception in one of your callbacks."""


# ---------------------------------------------------------------------- pure core


@attrs.frozen
class Detect:
    """Effect: find the leading master and call `SchedulerCore.master_detected`."""


class _Timer(enum.Enum):
    SUBSCRIBE = "subscribe"
    HEARTBEAT = "heartbeat"
    LIVENESS = "liveness"


class _State(enum.Enum):
    DETECTING = "detecting"
    SUBSCRIBING = "subscribing"
    SUBSCRIBED = "subscribed"
    DONE = "done"


Effect = Send | ArmTimer | CancelTimer | Callback | Finish | Detect


def _send(message: Message) -> Send:
    return Send(to="master", message=message)


class SchedulerCore:
    """Decides what the scheduler driver does; no I/O. One way in per event
    (`start`, `master_detected`, `on_message`, `on_timer`, the user calls), effects
    out. `now` is seconds on the driver's clock."""

    def __init__(self, framework: FrameworkInfo) -> None:
        self.framework = framework
        self.framework_id: str | None = framework.id
        self.master: MasterInfo | None = None
        self.heartbeat_interval = 0.0
        self._state = _State.DETECTING
        self._last_seen = 0.0
        self._attempts = 0
        self._ever_registered = False
        self._suppressed = False
        self._revive_pending = False
        # Where each live task runs, so `kill` can name the agent.
        self._task_agents: dict[str, str] = {}
        # Kill/Reconcile/Acknowledge made while disconnected; sent once subscribed.
        self._queued: list[Kill | Reconcile | Acknowledge] = []

    @property
    def subscribed(self) -> bool:
        return self._state is _State.SUBSCRIBED

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    # ------------------------------------------------------------ connection

    def start(self, now: float) -> list[Effect]:
        return [Detect()]

    def master_detected(self, master: MasterInfo, now: float) -> list[Effect]:
        """The shell found a leader and connected to it: subscribe. A new leader
        while subscribed (a failover the detector saw) is a disconnection."""
        effects: list[Effect] = []
        if self._state is _State.SUBSCRIBED and self.master is not None \
                and master.id != self.master.id:
            log.info("leading master changed to %s; subscribing there", master.id)
            effects = [CancelTimer(_Timer.HEARTBEAT), CancelTimer(_Timer.LIVENESS),
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
        return [_send(Subscribe(framework=framework)),
                ArmTimer(_Timer.SUBSCRIBE, now + SUBSCRIBE_RETRY)]

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key is _Timer.SUBSCRIBE and self._state is _State.SUBSCRIBING:
            if self._attempts >= SUBSCRIBE_ATTEMPTS_BEFORE_REDETECT:
                self._state = _State.DETECTING
                return [Detect()]
            return self._subscribe(now)
        if key is _Timer.HEARTBEAT and self.subscribed:
            assert self.framework_id is not None
            return [_send(SchedulerHeartbeat(framework_id=self.framework_id)),
                    ArmTimer(_Timer.HEARTBEAT, now + self.heartbeat_interval)]
        if key is _Timer.LIVENESS and self.subscribed:
            deadline = self._last_seen + MISSED_HEARTBEATS * self.heartbeat_interval
            if now < deadline:
                return [ArmTimer(_Timer.LIVENESS, deadline)]
            log.warning("no word from the master for %.1fs; looking for it again",
                        now - self._last_seen)
            self._state = _State.DETECTING
            return [CancelTimer(_Timer.HEARTBEAT), Callback("disconnected"), Detect()]
        return []

    # --------------------------------------------------------------- inbound

    def on_message(self, message: Message, now: float) -> list[Effect]:
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
        effects: list[Effect] = [CancelTimer(_Timer.SUBSCRIBE)]
        if self.heartbeat_interval > 0:
            effects += [ArmTimer(_Timer.HEARTBEAT, now + self.heartbeat_interval),
                        ArmTimer(_Timer.LIVENESS,
                                 now + MISSED_HEARTBEATS * self.heartbeat_interval)]
        if self._ever_registered:
            effects.append(Callback("reregistered", (message.master_info,)))
        else:
            self._ever_registered = True
            effects.append(Callback("registered",
                                    (message.framework_id, message.master_info)))
        queued, self._queued = self._queued, []
        effects += [_send(attrs.evolve(m, framework_id=self.framework_id)) for m in queued]
        # A new leader does not know our offer preference; restate it.
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

    def accept(self, offer_ids: list[str], operations: list[Operation],
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

    def decline(self, offer_ids: list[str], filters: Filters) -> list[Effect]:
        if not self.subscribed:
            log.warning("decline of %s ignored: not subscribed (offers are void anyway)",
                        offer_ids)
            return []
        assert self.framework_id is not None
        return [_send(Decline(framework_id=self.framework_id, offer_ids=offer_ids,
                              filters=filters))]

    def suppress(self) -> list[Effect]:
        self._suppressed, self._revive_pending = True, False
        if not self.subscribed:
            log.info("suppress noted; sent once subscribed")
            return []
        assert self.framework_id is not None
        return [_send(Suppress(framework_id=self.framework_id))]

    def revive(self) -> list[Effect]:
        self._suppressed = False
        if not self.subscribed:
            log.info("revive noted; sent once subscribed")
            self._revive_pending = True
            return []
        assert self.framework_id is not None
        return [_send(Revive(framework_id=self.framework_id))]

    def kill(self, task_id: str, kill_grace_period: float | None) -> list[Effect]:
        return self._send_or_queue(Kill(
            framework_id=self.framework_id or "", task_id=task_id,
            agent_id=self._task_agents.get(task_id), kill_grace_period=kill_grace_period))

    def acknowledge(self, status: TaskStatus) -> list[Effect]:
        if not status.uuid:
            return []  # master-made updates carry no uuid and need no ack
        return self._send_or_queue(Acknowledge(
            framework_id=self.framework_id or "", agent_id=status.agent_id,
            task_id=status.task_id, uuid=status.uuid))

    def reconcile(self, tasks: list[ReconcileTask]) -> list[Effect]:
        return self._send_or_queue(Reconcile(framework_id=self.framework_id or "",
                                             tasks=tasks))

    def _send_or_queue(self, message: Kill | Reconcile | Acknowledge) -> list[Effect]:
        if self.subscribed:
            return [_send(message)]
        if not self.done:
            log.info("%s queued until subscribed", type(message).__name__)
            self._queued.append(message)
        return []

    def send_framework_message(self, executor_id: str, agent_id: str,
                               data: bytes) -> list[Effect]:
        if not self.subscribed:
            log.warning("framework message to %s dropped: not subscribed", executor_id)
            return []
        assert self.framework_id is not None
        return [_send(FrameworkToExecutor(framework_id=self.framework_id,
                                          agent_id=agent_id, executor_id=executor_id,
                                          data=data))]

    def stop(self, failover: bool) -> list[Message]:
        """End for good; the farewell to send (none if we never registered)."""
        self._state = _State.DONE
        if self.framework_id is None:
            return []
        if failover:
            return [Unsubscribe(framework_id=self.framework_id)]
        return [Teardown(framework_id=self.framework_id)]


# --------------------------------------------------------------------- the shell


def _with_defaults(framework: FrameworkInfo) -> FrameworkInfo:
    """Fill `user` and `hostname` as Mesos drivers do, so the UI can show them."""
    return attrs.evolve(framework, user=framework.user or getpass.getuser(),
                        hostname=framework.hostname or socket.gethostname())


def _id_list(ids: Sequence[str], what: str) -> list[str]:
    if isinstance(ids, str):
        raise TypeError(f"{what} must be a list of ids, not the string {ids!r}")
    return list(ids)


def reconcile_list(statuses: Iterable[TaskStatus | tuple[str, str | None]]) -> list[ReconcileTask]:
    """What `reconcile_tasks` accepts, as the wire wants it."""
    return [ReconcileTask(task_id=s.task_id, agent_id=s.agent_id or None)
            if isinstance(s, TaskStatus) else ReconcileTask(task_id=s[0], agent_id=s[1])
            for s in statuses]


class SchedulerDriver(DriverRuntime):
    """Connects a `Scheduler` to the leading master and carries out its calls.

    ``master`` is what users type: ``host:5050`` (the master's HTTP address).
    Every method may be called from a callback or from any thread. While the driver
    is not subscribed, calls about offers are dropped with a warning (offers do not
    survive a reconnection), launches come back as TASK_LOST updates, and kills,
    reconciliations and acknowledgements wait until it is subscribed again.
    """

    def __init__(self, scheduler: Scheduler, framework_info: FrameworkInfo,
                 master: str) -> None:
        super().__init__(scheduler, log)
        self._detector = make_detector(master)
        self._core = SchedulerCore(_with_defaults(framework_info))
        self._failover = False
        self._detect_wanted = asyncio.Event()

    @property
    def framework_id(self) -> str | None:
        """The id the master gave us (or the one we were created with), else None."""
        return self._core.framework_id

    @property
    def master_info(self) -> MasterInfo | None:
        """The master we are (or were last) subscribed to."""
        return self._core.master

    # ----------------------------------------------------------------- calls

    def stop(self, failover: bool = False) -> DriverStatus:
        """Stop the driver. ``failover=False`` tears the framework down (its tasks are
        killed); ``failover=True`` only unsubscribes, so its tasks keep running until
        ``failover_timeout`` and a new driver with the same framework id takes over."""
        def call() -> None:
            self._failover = failover
            self._request_stop()
        self._on_loop("stop", call)
        return DriverStatus.STOPPED

    def launch_tasks(self, offer_ids: Sequence[str], tasks: Sequence[TaskInfo],
                     filters: Filters | None = None) -> None:
        """Accept the offers with one LAUNCH of `tasks`; no tasks means decline."""
        if not tasks:
            self.decline_offers(offer_ids, filters)
            return
        self.accept_offers(offer_ids, [Operation(type=OperationType.LAUNCH,
                                                 tasks=list(tasks))], filters)

    def accept_offers(self, offer_ids: Sequence[str], operations: Sequence[Operation],
                      filters: Filters | None = None) -> None:
        """Accept offers (all from one agent) with `operations`; what they leave
        unused returns to the pool, refused to us for ``filters.refuse_seconds``."""
        ids, ops, flt = _id_list(offer_ids, "offer_ids"), list(operations), filters or Filters()
        self._on_loop("accept_offers", lambda: self._apply(self._core.accept(ids, ops, flt)))

    def decline_offer(self, offer_id: str, filters: Filters | None = None) -> None:
        """Give the offer back; its agent is not offered to us again for
        ``filters.refuse_seconds`` (default 5 s)."""
        self.decline_offers([offer_id], filters)

    def decline_offers(self, offer_ids: Sequence[str], filters: Filters | None = None) -> None:
        """`decline_offer` for several offers in one message."""
        ids, flt = _id_list(offer_ids, "offer_ids"), filters or Filters()
        self._on_loop("decline_offer", lambda: self._apply(self._core.decline(ids, flt)))

    def revive_offers(self) -> None:
        """Clear our filters and resume offers (undoes `suppress_offers`)."""
        self._on_loop("revive_offers", lambda: self._apply(self._core.revive()))

    def suppress_offers(self) -> None:
        """Stop receiving offers until `revive_offers`; restated after reconnection."""
        self._on_loop("suppress_offers", lambda: self._apply(self._core.suppress()))

    def kill_task(self, task_id: str, kill_grace_period: float | None = None) -> None:
        """Ask the master to kill the task; its terminal update arrives as usual.
        ``kill_grace_period`` overrides the executor's default SIGTERM→SIGKILL wait."""
        self._on_loop("kill_task",
                      lambda: self._apply(self._core.kill(task_id, kill_grace_period)))

    def acknowledge_status_update(self, status: TaskStatus) -> None:
        """Acknowledge an update; only needed with
        ``FrameworkInfo(implicit_acknowledgements=False)``. Until you do, the agent
        holds the task's later updates back."""
        self._on_loop("acknowledge_status_update",
                      lambda: self._apply(self._core.acknowledge(status)))

    def reconcile_tasks(self, statuses: Iterable[TaskStatus | tuple[str, str | None]]) -> None:
        """Ask for the latest state of tasks (TaskStatus or (task_id, agent_id)
        pairs); an empty list asks for every non-terminal task of the framework.
        Answers arrive as `status_update` with reason REASON_RECONCILIATION."""
        tasks = reconcile_list(statuses)
        self._on_loop("reconcile_tasks", lambda: self._apply(self._core.reconcile(tasks)))

    def send_framework_message(self, executor_id: str, agent_id: str, data: bytes) -> None:
        """Send bytes to one of our executors (best effort: may be lost)."""
        self._on_loop("send_framework_message", lambda: self._apply(
            self._core.send_framework_message(executor_id, agent_id, bytes(data))))

    # ------------------------------------------------------------ shell hooks

    async def _open(self) -> None:
        self._spawn(self._detect_forever())

    async def _close(self) -> None:
        await self._detector.close()

    async def _detect_forever(self) -> None:
        following: asyncio.Task[None] | None = None
        try:
            while True:
                await self._detect_wanted.wait()
                self._detect_wanted.clear()
                master = await self._detector.detect()
                self._use_master(master)
                # Follow successions from here on: a failover is pushed to us by
                # the detector, long before the master's heartbeats would be missed.
                if following is not None:
                    following.cancel()
                following = asyncio.ensure_future(self._follow(master))
        finally:
            if following is not None:
                following.cancel()

    async def _follow(self, master: MasterInfo) -> None:
        while True:
            master = await self._detector.next_leader(master)
            self._use_master(master)

    def _use_master(self, master: MasterInfo) -> None:
        assert self._dealer is not None
        log.info("master %s at %s", master.id, master.zmq_endpoint)
        self._dealer.connect(master.zmq_endpoint)
        self._apply(self._core.master_detected(master, self._clock.now()))

    def _begin(self, now: float) -> list[Any]:
        return self._core.start(now)

    def _on_message(self, message: Message, now: float) -> list[Any]:
        return self._core.on_message(message, now)

    def _on_timer(self, key: Hashable, now: float) -> list[Any]:
        return self._core.on_timer(key, now)

    def _perform_other(self, effect: Any) -> None:
        if isinstance(effect, Detect):
            self._detect_wanted.set()
        else:
            super()._perform_other(effect)

    def _callback_returned(self, callback: Callback) -> None:
        if callback.ack is not None:
            self._apply(self._core.acknowledge(callback.ack))

    def _farewell(self) -> list[Message]:
        return self._core.stop(self._failover)
