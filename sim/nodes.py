"""The simulated processes: thin shells that put pure cores on the engine.

Each shell does for its core what the asyncio shell does in production, with
the engine standing in for sockets and the loop: a wire message becomes the
core's event, `Send` goes on the engine's wire, `ArmTimer`/`CancelTimer` go to
the engine's timers (keys untouched), anything else is counted by kind and
otherwise ignored (a registry write has nothing to do in a simulation).

- `MasterNode`: the real `master.state.MasterState` with its real allocator.
- `AgentNode`: a `sim.agent.SimAgent`.
- `SimDriver`: the real scheduler-driver core (`frameworks.scheduler_core.
  SchedulerCore`) with the methods of `frameworks.SchedulerDriver`, so a
  framework written against the public driver API runs here unchanged. Like the
  real driver it declares `ACKNOWLEDGEMENT_BATCHES`; once the master says it
  honours it (`MasterCapabilities`), the acknowledgements the driver sends at
  one instant wait until everything else already due at that instant has run,
  and go as the real outbox would send them had they queued together
  (`frameworks.outbox.merged_acks`: a run of two or more is one
  `Acknowledgements`). Any other message the driver sends first sends the acks
  waiting before it, so the driver's messages keep their order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import attrs

from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.messages import (
    ACK_BATCH_CAPABILITY, Acknowledge, Filters, FrameworkInfo, MasterCapabilities, MasterInfo,
    Message, Operation, OperationType, ResourceRequest, TaskInfo, TaskStatus,
)
from dyad.resources import Resources
from frameworks.driver_core import Callback, Finish, Received as DriverReceived, Started
from frameworks.outbox import merged_acks
from frameworks.scheduler import Scheduler, reconcile_list
from frameworks.scheduler_core import (
    AcceptCall, AcknowledgeCall, DeclineCall, Detect, KillCall, MasterDetected, PreemptCall,
    ReconcileCall, RequestCall, ReviveCall, SchedulerCore, SendToExecutorCall, StopCall,
    SuppressCall,
)
from master.operator import OperatorCall, Reply, Request
from master.state import MasterState, Received
from sim.agent import FromMaster, SimAgent, Start
from sim.engine import Engine

MASTER = "master"


class _Shell:
    """Performs the effects every core shares, for the node `name`."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.name = name
        self.other_effects: Counter[str] = Counter()

    def _perform(self, effects: Iterable[Any]) -> None:
        engine = self.engine
        for effect in effects:
            if isinstance(effect, Send):
                self._send(effect.to, effect.message)
            elif isinstance(effect, ArmTimer):
                engine.arm(self.name, effect.key, effect.at)
            elif isinstance(effect, CancelTimer):
                engine.cancel(self.name, effect.key)
            else:
                self._other(effect)

    def _send(self, to: str, message: Message) -> None:
        self.engine.send(self.name, to, message)

    def _other(self, effect: Any) -> None:
        self.other_effects[type(effect).__name__] += 1


class MasterNode(_Shell):
    """With `validate`, the master's invariants are checked after every event
    (`MasterState.validate`: expensive, for tests)."""

    def __init__(self, engine: Engine, state: MasterState, validate: bool = False) -> None:
        super().__init__(engine, MASTER)
        self.state = state
        self.validate = validate
        self._calls = 0
        self._replies: list[Reply] = []
        engine.add_node(MASTER, self)

    def deliver(self, sender: str, message: Message, now: float) -> None:
        self.handle(Received(sender, message), now)

    def fire(self, key: Hashable, now: float) -> None:
        self.handle(TimerFired(key), now)

    def handle(self, event: Any, now: float) -> None:
        self._perform(self.state.handle(event, now))
        if self.validate:
            self.state.validate()

    def call(self, request: Request, now: float) -> Reply:
        """An operator call (`PUT /weights`, ...), answered as the HTTP layer is."""
        self._calls += 1
        self._replies.clear()
        self.handle(OperatorCall(self._calls, request), now)
        (reply,) = self._replies
        return reply

    def _other(self, effect: Any) -> None:
        if isinstance(effect, Reply):
            self._replies.append(effect)
        super()._other(effect)


class AgentNode(_Shell):
    def __init__(self, engine: Engine, name: str, agent: SimAgent) -> None:
        super().__init__(engine, name)
        self.agent = agent
        engine.add_node(name, self)
        engine.add_echo(name, agent.answer_ping)

    def start(self, now: float) -> None:
        self._perform(self.agent.handle(Start(), now))

    def deliver(self, sender: str, message: Message, now: float) -> None:
        self._perform(self.agent.handle(FromMaster(message), now))

    def fire(self, key: Hashable, now: float) -> None:
        self._perform(self.agent.handle(TimerFired(key), now))


class SimDriver(_Shell):
    """A scheduler driver on the simulated wire: the real `SchedulerCore`
    decides, this shell sends, arms and calls back `scheduler` at once (a
    simulated callback takes no time). Implicit acknowledgements go out after the
    callback returns, as in `SchedulerDriver`."""

    def __init__(self, engine: Engine, name: str, framework: FrameworkInfo,
                 scheduler: Scheduler, master_info: MasterInfo) -> None:
        super().__init__(engine, name)
        if ACK_BATCH_CAPABILITY not in framework.capabilities:
            framework = attrs.evolve(framework, capabilities=[*framework.capabilities,
                                                              ACK_BATCH_CAPABILITY])
        self.core = SchedulerCore(framework)
        self.scheduler = scheduler
        self.master_info = master_info
        self.finished: Any = None
        self.errors: list[str] = []
        self.merge_acks = False  # the master said it takes `Acknowledgements`
        self._acks: list[Message] = []  # sent this instant, not yet on the wire
        engine.add_node(name, self)

    @property
    def framework_id(self) -> str | None:
        return self.core.framework_id

    def start(self, now: float) -> None:
        self._call(Started())

    def deliver(self, sender: str, message: Message, now: float) -> None:
        if isinstance(message, MasterCapabilities):  # the shell's business, as in production
            master = self.core.master
            if master is not None and message.master_id == master.id:
                self.merge_acks = ACK_BATCH_CAPABILITY in message.capabilities
            return
        self._perform(self.core.handle(DriverReceived(message), now))

    def fire(self, key: Hashable, now: float) -> None:
        self._perform(self.core.handle(TimerFired(key), now))

    def _send(self, to: str, message: Message) -> None:
        if self.merge_acks and isinstance(message, Acknowledge):
            if not self._acks:
                self.engine.call_at(self.engine.now, self._flush_acks)
            self._acks.append(message)
            return
        self._flush_acks(self.engine.now)
        super()._send(to, message)

    def _flush_acks(self, now: float) -> None:
        """Put the acknowledgements waiting on the wire (class docstring)."""
        acks, self._acks = self._acks, []
        for message, _ in merged_acks(acks):
            self.engine.send(self.name, MASTER, message)

    def _call(self, event: Any) -> None:
        self._perform(self.core.handle(event, self.engine.now))

    def _other(self, effect: Any) -> None:
        if isinstance(effect, Callback):
            if effect.name == "error":
                self.errors.append(str(effect.args[0]))
            getattr(self.scheduler, effect.name)(self, *effect.args)
            if effect.ack is not None:
                self._call(AcknowledgeCall(effect.ack))
        elif isinstance(effect, Detect):
            self._call(MasterDetected(self.master_info))
        elif isinstance(effect, Finish):
            self.finished = effect.status
        else:
            super()._other(effect)

    # ------------------------------------------- frameworks.SchedulerDriver API

    def launch_tasks(self, offer_ids: Sequence[str], tasks: Sequence[TaskInfo],
                     filters: Filters | None = None) -> None:
        self.accept_offers(offer_ids, [Operation(type=OperationType.LAUNCH, tasks=list(tasks))],
                           filters)

    def accept_offers(self, offer_ids: Sequence[str], operations: Sequence[Operation],
                      filters: Filters | None = None) -> None:
        self._call(AcceptCall(list(offer_ids), list(operations), filters or Filters()))

    def decline_offer(self, offer_id: str, filters: Filters | None = None) -> None:
        self.decline_offers([offer_id], filters)

    def decline_offers(self, offer_ids: Sequence[str], filters: Filters | None = None) -> None:
        self._call(DeclineCall(list(offer_ids), filters or Filters()))

    def revive_offers(self) -> None:
        self._call(ReviveCall())

    def suppress_offers(self) -> None:
        self._call(SuppressCall())

    def request_resources(self, requests: Sequence[ResourceRequest]) -> None:
        self._call(RequestCall(list(requests)))

    def kill_task(self, task_id: str, kill_grace_period: float | None = None) -> None:
        self._call(KillCall(task_id, kill_grace_period))

    def preempt(self, resources: Resources, priority: int) -> None:
        self._call(PreemptCall(resources, priority))

    def acknowledge_status_update(self, status: TaskStatus) -> None:
        self._call(AcknowledgeCall(status))

    def reconcile_tasks(self, statuses: Iterable[TaskStatus | tuple[str, str | None]]) -> None:
        self._call(ReconcileCall(reconcile_list(statuses)))

    def send_framework_message(self, executor_id: str, agent_id: str, data: bytes) -> None:
        self._call(SendToExecutorCall(executor_id, agent_id, data))

    def stop(self, failover: bool = False) -> None:
        self._call(StopCall(failover))
