"""The scheduler side of a framework: `Scheduler` (your callbacks) and
`SchedulerDriver` (the connection to the master).

The driver is an asyncio shell around `frameworks.scheduler_core.SchedulerCore`, a
pure state machine that decides what every inbound message, timer and user call
means (which callback to run, what to send, what to queue while disconnected, when
to acknowledge). The core imports no I/O, so its decisions are tested without
sockets.

Connection (docs/protocol.md): detect the leading master, connect a DEALER to its
ZMQ endpoint, send `Subscribe` every second until `Subscribed`, then heartbeat both
ways. Three heartbeat intervals without a word from the master means the connection
is lost: `disconnected()`, detect again, re-subscribe with the same framework id,
`reregistered()`.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from dyad.clock import Clock
from dyad.detector import LeaderFollower, make_detector
from dyad.effects import Send
from dyad.messages import (
    ACK_BATCH_CAPABILITY, BATCH_CAPABILITY, Filters, FrameworkInfo, MasterCapabilities,
    MasterInfo, Message, Offer, Operation, OperationType, ReconcileTask, ResourceRequest,
    TaskInfo, TaskStatus)
from frameworks._callbacks import DriverRuntime
from frameworks._security import client_from_env
from frameworks.driver_core import Callback, DriverStatus
from frameworks.scheduler_core import (
    AcceptCall, AcknowledgeCall, DeclineCall, Detect,
    KillCall, MasterDetected, PreemptCall, ReconcileCall, RequestCall, ReviveCall, SchedulerCore,
    SchedulerTimings,
    SendToExecutorCall, StopCall, SuppressCall)

log = logging.getLogger(__name__)


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


# --------------------------------------------------------------------- the shell


def _with_defaults(framework: FrameworkInfo) -> FrameworkInfo:
    """Fill `user` and `hostname` as Mesos drivers do, so the UI can show them,
    and say that this driver takes `Batch` frames and would send `Acknowledgements`
    (docs/protocol.md)."""
    capabilities = list(framework.capabilities)
    for capability in (BATCH_CAPABILITY, ACK_BATCH_CAPABILITY):
        if capability not in capabilities:
            capabilities.append(capability)
    return attrs.evolve(framework, user=framework.user or getpass.getuser(),
                        hostname=framework.hostname or socket.gethostname(),
                        capabilities=capabilities)


def _id_list(ids: Sequence[str], what: str) -> list[str]:
    if isinstance(ids, str):
        raise TypeError(f"{what} must be a list of ids, not the string {ids!r}")
    return list(ids)


def reconcile_list(statuses: Iterable[TaskStatus | tuple[str, str | None]]) -> list[ReconcileTask]:
    """What `reconcile_tasks` accepts, as the wire wants it."""
    return [ReconcileTask(task_id=s.task_id, agent_id=s.agent_id or None)
            if isinstance(s, TaskStatus) else ReconcileTask(task_id=s[0], agent_id=s[1])
            for s in statuses]


class SchedulerDriver(DriverRuntime[SchedulerCore]):
    """Connects a `Scheduler` to the leading master and carries out its calls.

    ``master`` is what users type: ``host:5050`` (the master's HTTP address).
    Every method may be called from a callback or from any thread. While the driver
    is not subscribed, calls about offers are dropped with a warning (offers do not
    survive a reconnection), launches come back as TASK_LOST updates, and kills,
    reconciliations and acknowledgements wait until it is subscribed again.

    ``clock`` (default: wall-clock seconds) and ``timings`` (retry and heartbeat
    patience, `SchedulerTimings`) are for tests and unusual networks.
    ``credentials`` (`dyad.auth.ClientCredentials`; default: from ``$DYAD_CURVE_KEY``,
    ``$DYAD_MASTER_KEY``, ``$DYAD_CA``, ``$DYAD_TOKEN[_FILE]``) for a secured cluster.
    """

    def __init__(self, scheduler: Scheduler, framework_info: FrameworkInfo,
                 master: str, *, clock: Clock | None = None,
                 timings: SchedulerTimings | None = None, credentials: Any = None) -> None:
        core = SchedulerCore(_with_defaults(framework_info), timings or SchedulerTimings())
        client = credentials if credentials is not None else client_from_env(os.environ)
        super().__init__(scheduler, log, core, clock, client)
        self._detector = make_detector(master, client)
        self._failover = False
        self._leaders = LeaderFollower(self._detector, self._use_master)

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
        self._on_loop("accept_offers", lambda: self._handle(AcceptCall(ids, ops, flt)))

    def decline_offer(self, offer_id: str, filters: Filters | None = None) -> None:
        """Give the offer back; its agent is not offered to us again for
        ``filters.refuse_seconds`` (default 5 s)."""
        self.decline_offers([offer_id], filters)

    def decline_offers(self, offer_ids: Sequence[str], filters: Filters | None = None) -> None:
        """`decline_offer` for several offers in one message."""
        ids, flt = _id_list(offer_ids, "offer_ids"), filters or Filters()
        self._on_loop("decline_offer", lambda: self._handle(DeclineCall(ids, flt)))

    def revive_offers(self) -> None:
        """Clear our filters and resume offers (undoes `suppress_offers`)."""
        self._on_loop("revive_offers", lambda: self._handle(ReviveCall()))

    def suppress_offers(self) -> None:
        """Stop receiving offers until `revive_offers`; restated after reconnection."""
        self._on_loop("suppress_offers", lambda: self._handle(SuppressCall()))

    def request_resources(self, requests: Sequence[ResourceRequest]) -> None:
        """Declare what we want now (Mesos' `requestResources`): offers to us stop
        once they cover it with headroom. Replaces the last declaration; empty
        clears it, as does `suppress_offers`; restated after reconnection."""
        reqs = list(requests)
        self._on_loop("request_resources", lambda: self._handle(RequestCall(reqs)))

    def kill_task(self, task_id: str, kill_grace_period: float | None = None) -> None:
        """Ask the master to kill the task; its terminal update arrives as usual.
        ``kill_grace_period`` overrides the executor's default SIGTERM→SIGKILL wait."""
        self._on_loop("kill_task",
                      lambda: self._handle(KillCall(task_id, kill_grace_period)))

    def preempt(self, resources: Resources, priority: int) -> None:
        """Ask the master to make room on one agent for a task of `priority` needing
        `resources`, by preempting strictly lower-priority tasks (their frameworks
        see them end TASK_KILLED, reason REASON_CONTAINER_PREEMPTED); the room is then
        offered to us. Honoured with `dyad-master --preemption` when we have the
        PREEMPTION capability or a role below its quota guarantee; a refusal comes
        back through `error` ("master rejected preempt: ..."). The master keeps no
        request, and none is sent while disconnected: ask again while the task
        still cannot be placed (docs/oversubscription.md)."""
        call = PreemptCall(resources, priority)  # raises here on a bad argument
        self._on_loop("preempt", lambda: self._handle(call))

    def acknowledge_status_update(self, status: TaskStatus) -> None:
        """Acknowledge an update; only needed with
        ``FrameworkInfo(implicit_acknowledgements=False)``. Until you do, the agent
        holds the task's later updates back."""
        self._on_loop("acknowledge_status_update",
                      lambda: self._handle(AcknowledgeCall(status)))

    def reconcile_tasks(self, statuses: Iterable[TaskStatus | tuple[str, str | None]]) -> None:
        """Ask for the latest state of tasks (TaskStatus or (task_id, agent_id)
        pairs); an empty list asks for every non-terminal task of the framework.
        Answers arrive as `status_update` with reason REASON_RECONCILIATION."""
        tasks = reconcile_list(statuses)
        self._on_loop("reconcile_tasks", lambda: self._handle(ReconcileCall(tasks)))

    def send_framework_message(self, executor_id: str, agent_id: str, data: bytes) -> None:
        """Send bytes to one of our executors (best effort: may be lost)."""
        self._on_loop("send_framework_message", lambda: self._handle(
            SendToExecutorCall(executor_id, agent_id, bytes(data))))

    # ------------------------------------------------------------ shell hooks

    async def _open(self) -> None:
        # Successions are pushed by the detector, long before the master's
        # heartbeats would be missed.
        self._spawn(self._leaders.run())

    async def _close(self) -> None:
        await self._detector.close()

    def _use_master(self, master: MasterInfo) -> None:
        assert self._secure is not None
        log.info("master %s at %s", master.id, master.zmq_endpoint)
        if self._core.master is None or self._core.master.id != master.id:
            self.peer_batches = False  # until this master sends a batch itself
            self._outbox.merge_acks = False  # until it says it takes Acknowledgements
        if self._secure.connect_master(master.zmq_endpoint, master.curve_key):
            self._handle(MasterDetected(master))

    def _received(self, message: Message) -> None:
        if isinstance(message, MasterCapabilities):  # the shell's business, not the core's
            master = self._core.master
            if master is not None and message.master_id == master.id:
                self._outbox.merge_acks = ACK_BATCH_CAPABILITY in message.capabilities
            return
        super()._received(message)

    def _perform_other(self, effect: Any) -> None:
        if isinstance(effect, Detect):
            self._leaders.detect_again()
        else:
            super()._perform_other(effect)

    def _callback_returned(self, callback: Callback) -> None:
        if callback.ack is not None:
            self._handle(AcknowledgeCall(callback.ack))

    def _farewell(self) -> list[Message]:
        effects = self._core.handle(StopCall(self._failover), self._clock.now())
        return [effect.message for effect in effects if isinstance(effect, Send)]
