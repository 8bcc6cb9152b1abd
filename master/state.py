"""The master's brain: a pure state machine over frameworks, agents, offers, tasks.

Rooms: master/model.py (config, events, effects, timer keys, records),
master/books.py (the records and shared bookkeeping), master/agents.py (the agent
half), this module (the one way in, the framework half, offers and operator
calls); pure helpers in master/tasks.py, reservations.py, volumes.py (offer
operations), removals.py, restore.py; views.py and invariants.py read the books.

Theory of operation
-------------------
`MasterState.handle(event, now)` is the only mutator. Events are `Received` (a
decoded message from a peer), `InvalidFrame` (a frame that failed to decode),
`TimerFired` (a timer this core armed came due), `AllocationTimed` (the shell's
measurement of the last allocation run) and `OperatorCall` (every operator action,
master/operator.py, answered by a `Reply` effect).
Changes worth an operator's attention also go to `events`, a bounded log
(master/events.py) served as `GET /events`. The result is a list of effects for the
shell: `Send` a message to a peer, `ArmTimer`, `CancelTimer`, `PersistRegistry`,
`Reply` (to an operator call). Nothing here does
I/O or reads a clock, so every behaviour is testable by feeding events.

Peers are the hex of ZMQ identities. A framework is *connected* while some peer
owns it (it subscribed from that peer and has not been disconnected); every
scheduler message must come from the owning peer, and every agent message from
the agent's registered peer -- anything else is answered `Rejected` and never
acted on. Nothing from the network raises: refusals are replies.

Resources, per agent: ``free = total - offered - used`` where *offered* is the sum
of its outstanding offers and *used* the sum of its live tasks and executors. The
allocator keeps its own view (allocated = offered + used per framework) and
`validate()` checks that both agree after every step in tests.

Timers are typed keys (`dyad.effects.TimerKey`, in master/model.py), matched
exhaustively:
`Allocate` the next allocation pass; `OfferTimeout(offer_id)` the offer timeout of
the offers sent together with that one (one per group); `PingDue(agent_id)`
agent liveness; `HeartbeatDue(framework_id)` heartbeats both ways;
`FailoverTimeout(framework_id)` teardown of a framework that stayed away;
`ReregisterTimeout` the end of the re-registration window after a failover;
`RemovalDue` the next permitted unreachable-marking (rate limit). A stale key of
a known kind (its offer or agent is gone) is ignored; any other key raises
`UnknownTimer`.

Registry (what survives failover, see master/registry.py): `restore()` hands a
new leader the admitted and unreachable agents, weights and quota; admitted
agents stay *recovering* (no offers, they are not in `agents`) until they
re-register or `agent_reregister_timeout` passes. Whenever what the registry
holds changes, the step's effects include one `PersistRegistry`, and the shell
writes `snapshot_of(state)` (coalescing bursts into one write).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import attrs

from dyad.effects import TimerFired, UnknownTimer
from dyad.ids import IdGenerator
from dyad.messages import (
    Accept, Acknowledge, Acknowledgements, Decline, DrainAgent, Error, ExecutorExited,
    ExecutorToFramework, FrameworkInfo, FrameworkToExecutor, Heartbeat, Kill, KillTask, MasterInfo, Message,
    Offer, Offers, OperationType, Pong, Preempt, Reason, Reconcile, RegisterAgent, Rejected,
    RequestResources, Revive, RunTask, SchedulerHeartbeat, StatusUpdate, Subscribe, Subscribed,
    Suppress, TaskInfo, TaskState, TaskStatus, Teardown, Unsubscribe, Update, UsageReport,
)
from dyad.resources import Resources
from master import revocable
from master.acks import AckHandlers
from master.agents import AgentHandlers
from master.preempting import PreemptionHandlers
from master.allocator import Allocator, PolicyError
from master.authorization import FORBIDDEN_COUNTER, Authorizer
from master.model import (
    EMPTY, Allocate, AllocationTimed, Effect, Event, FailoverTimeout, HeartbeatDue,
    InvalidFrame, MasterAgent, MasterConfig, MasterFramework, OfferTimeout, PingDue,
    Received, RemovalDue, ReregisterTimeout, UsageDue, roles_problem,
)
from master.operator import (
    CONFLICT, FORBIDDEN, INVALID, NOT_FOUND, DrainMachine, KillLiveTask, MalformedCall, OperatorCall,
    Reply, Request, SetQuota, SetWeights, TeardownFramework,
)
from master.offer_frames import offer_bytes, pack
from master.volumes import (
    COUNTERS, offered_volumes, plan_operation, task_volume_problem, volume_users,
)
from master.tasks import claim_offers, launched, reconciled, status_of, task_problem


class MasterState(PreemptionHandlers, AgentHandlers, AckHandlers):
    """The master as a pure state machine; see the module docstring."""

    def __init__(self, config: MasterConfig, info: MasterInfo, ids: IdGenerator,
                 start_time: float = 0.0, allocator: Allocator | None = None) -> None:
        super().__init__(config, info, ids, start_time, allocator)
        self.authorizer = Authorizer(config.acls)
        self._handlers: dict[type, Callable[[str, Any], None]] = {
            Subscribe: self._on_subscribe,
            Unsubscribe: self._on_unsubscribe,
            Teardown: self._on_teardown,
            Accept: self._on_accept,
            Decline: self._on_decline,
            Revive: self._on_revive,
            Suppress: self._on_suppress,
            RequestResources: self._on_request,
            Kill: self._on_kill,
            Acknowledge: self._on_acknowledge,
            Acknowledgements: self._on_acknowledgements,
            Reconcile: self._on_reconcile,
            SchedulerHeartbeat: self._on_scheduler_heartbeat,
            FrameworkToExecutor: self._on_framework_to_executor,
            RegisterAgent: self._on_register_agent,
            Pong: self._on_pong,
            StatusUpdate: self._on_status_update,
            ExecutorToFramework: self._on_executor_to_framework,
            ExecutorExited: self._on_executor_exited,
            UsageReport: self._on_usage_report,
            DrainAgent: self._on_drain_agent,
            Rejected: self._on_rejected,
            Preempt: self._on_preempt,
        }

    def handle(self, event: Event, now: float) -> list[Effect]:
        """Apply one event at time `now`; return what the shell must do, in order."""
        self._now = now
        self._out = []
        self._persist_pending = False
        if self._allocate_at is None:
            self._arm_allocation(now + self.config.allocation_interval)
        if isinstance(event, Received):
            admitted = self.authorizer.admit(self, event)
            if isinstance(admitted, str):
                self.counters.inc("master/messages_received")
                self.counters.inc(FORBIDDEN_COUNTER)
                self._refuse(event.peer, event.message, admitted)
            else:
                self._received(event.peer, admitted)
                self.authorizer.admitted(self, event)
        elif isinstance(event, InvalidFrame):
            self.counters.inc("master/messages_received")
            self.counters.inc("master/messages_invalid")
            # Never answer a broken rejection with one: two peers could loop forever.
            if event.error.type_name != Rejected.TYPE:
                self._reply_rejected(event.peer, event.error.reason, event.error.type_name)
        elif isinstance(event, TimerFired):
            self._timer(event.key)
        elif isinstance(event, AllocationTimed):
            self.allocation_ms.add(event.seconds * 1000.0)
            self.allocation_seconds.add(event.seconds)
        elif isinstance(event, OperatorCall):
            refusal = self.authorizer.call_refusal(self, event)
            if refusal is not None:
                self.counters.inc(FORBIDDEN_COUNTER)
            self._out.append(self._operator_call(event.call_id, event.request)
                             if refusal is None else Reply(event.call_id, refusal=FORBIDDEN,
                                                           error=refusal))
        else:
            raise TypeError(f"MasterState cannot handle {event!r}")
        if len(self.admission):
            self._send_offers_by_framework(self.admission.release(now))
        if self._usage_events and now >= self._usage_due:
            self._usage_out()
        out, self._out = self._out, []
        return out

    def _received(self, peer: str, message: Message) -> None:
        self.counters.inc("master/messages_received")
        handler = self._handlers.get(type(message))
        if handler is None:
            self._refuse(peer, message, f"the master does not accept {message.TYPE} messages")
            return
        handler(peer, message)

    # ======================================================== frameworks

    def _on_subscribe(self, peer: str, message: Subscribe) -> None:
        info = message.framework
        problem = roles_problem(info.roles)
        if problem:
            self._refuse(peer, message, problem)
            return
        if info.id is None:
            framework = self._find_by_peer_and_name(peer, info.name)
            reregistered = False
            if framework is None:
                framework = self._add_framework(attrs.evolve(info, id=self._ids.next("F")),
                                                active=True)
        else:
            if info.id in self.completed_frameworks:
                self._send(peer, Error(message=f"framework {info.id} has been torn down; "
                                               "subscribe without an id to start anew"))
                return
            framework = self.frameworks.get(info.id)
            reregistered = True
            if framework is None:
                framework = self._add_framework(info, active=True)
            else:
                self._resubscribe(framework, peer, info)
        self._connect(framework, peer)
        self.allocator.request(framework.id, [(r.resources, r.count) for r in message.requests])
        self.events.record(self._now, "framework_subscribed", framework_id=framework.id,
                           name=info.name, roles=list(info.roles), reregistered=reregistered)
        self._offer_capabilities(framework, peer)
        self._send(peer, Subscribed(framework_id=framework.id,
                                    heartbeat_interval=self.config.heartbeat_interval,
                                    master_info=self.info, reregistered=reregistered))
        self._request_allocation()

    def _find_by_peer_and_name(self, peer: str, name: str) -> MasterFramework | None:
        """A repeated first Subscribe (the driver retried while the master started)
        must not create a second framework."""
        for framework in self.frameworks.values():
            if framework.peer == peer and framework.info.name == name:
                return framework
        return None

    def _resubscribe(self, framework: MasterFramework, peer: str, info: FrameworkInfo) -> None:
        """A known framework subscribes again (driver failover or reconnect)."""
        if framework.peer is not None and framework.peer != peer:
            self._send(framework.peer, Error(
                message=f"framework {framework.id} was taken over by another connection"))
        # The new connection knows none of the old offers; the same one may have
        # lost them. Either way they are void.
        for offer_id in sorted(framework.offers):
            self._rescind(self.offers[offer_id], notify=framework.peer == peer)
        framework.info = attrs.evolve(info, id=framework.id)
        self.allocator.add_framework(framework.id, info.roles)

    def _connect(self, framework: MasterFramework, peer: str) -> None:
        framework.peer = peer
        framework.last_seen = self._now
        framework.disconnected_time = None
        self._cancel(FailoverTimeout(framework.id))
        self.allocator.activate(framework.id)
        self._arm(HeartbeatDue(framework.id), self._now + self.config.heartbeat_interval)

    def _disconnect(self, framework: MasterFramework) -> None:
        """The driver is gone (silent or unsubscribed): void its offers, keep its
        tasks, and tear it down if it stays away for `failover_timeout`."""
        for offer_id in sorted(framework.offers):
            self._rescind(self.offers[offer_id], notify=True)
        framework.peer = None
        framework.disconnected_time = self._now
        self.allocator.deactivate(framework.id)
        self._cancel(HeartbeatDue(framework.id))
        self._arm(FailoverTimeout(framework.id), self._now + framework.info.failover_timeout)

    def _on_unsubscribe(self, peer: str, message: Unsubscribe) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            self._disconnect(framework)

    def _on_teardown(self, peer: str, message: Teardown) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            self._remove_framework(framework, "torn down by the framework")

    def _on_scheduler_heartbeat(self, peer: str, message: SchedulerHeartbeat) -> None:
        self._owned_framework(peer, message)  # refreshes last_seen

    def _heartbeat_due(self, framework_id: str) -> None:
        framework = self.frameworks.get(framework_id)
        if framework is None or framework.peer is None:
            return
        interval = self.config.heartbeat_interval
        if self._now - framework.last_seen >= 3 * interval:
            self._disconnect(framework)
            return
        self._send(framework.peer, Heartbeat())
        self._arm(HeartbeatDue(framework_id), self._now + interval)

    def _failover_due(self, framework_id: str) -> None:
        framework = self.frameworks.get(framework_id)
        if framework is not None and framework.peer is None:
            self._remove_framework(framework, "failover timeout expired")

    def _on_revive(self, peer: str, message: Revive) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            framework.suppressed = False
            self._revive(framework.id)
            for key in [k for k in self.revocable_filters if k[0] == framework.id]:
                del self.revocable_filters[key]
            self._request_allocation()

    def _on_suppress(self, peer: str, message: Suppress) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            framework.suppressed = True
            self.allocator.suppress(framework.id)

    def _on_request(self, peer: str, message: RequestResources) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            self.allocator.request(framework.id, [(r.resources, r.count) for r in message.requests])
            self._request_allocation()

    # ==================================================== operator calls

    def _operator_call(self, call_id: int, request: Request) -> Reply:
        """Answer one operator call (master/operator.py); a refused one changes
        nothing, and one refused as invalid is counted."""
        match request:
            case SetWeights(weights=weights):
                return self._policy_call(call_id, lambda: self._apply_weights(weights),
                                         "master/weights_updates")
            case SetQuota(quotas=quotas):
                return self._policy_call(call_id, lambda: self._apply_quota(quotas),
                                         "master/quota_updates")
            case KillLiveTask():
                return self._operator_kill(call_id, request)
            case DrainMachine(agent_id=agent_id):
                agent = self.agents.get(agent_id)
                if agent is None:
                    return self._refuse_call(call_id, NOT_FOUND,
                                             f"agent {agent_id} is not registered")
                self.counters.inc("master/operator_drains")
                self.events.record(self._now, "agent_drain_requested", agent_id=agent_id,
                                   by="operator")
                return Reply(call_id, result={"agent_id": agent_id, "url": agent.info.url})
            case TeardownFramework(framework_id=framework_id):
                framework = self.frameworks.get(framework_id)
                if framework is None:
                    return self._refuse_call(call_id, NOT_FOUND,
                                             f"no active framework {framework_id}")
                self.counters.inc("master/operator_teardowns")
                self._remove_framework(framework, "torn down by an operator")
                return Reply(call_id, result={"framework_id": framework_id})
            case MalformedCall(reason=reason):
                return self._refuse_call(call_id, INVALID, reason)
        raise TypeError(f"MasterState cannot answer operator request {request!r}")

    def _policy_call(self, call_id: int, apply: Callable[[], None], counter: str) -> Reply:
        """Weights or quota: all or nothing, and persisted (the registry holds them)."""
        try:
            apply()
        except PolicyError as exc:
            return self._refuse_call(call_id, INVALID, str(exc))
        self.counters.inc(counter)
        self._persist()
        return Reply(call_id)

    def _refuse_call(self, call_id: int, refusal: str, error: str) -> Reply:
        if refusal == INVALID:
            self.counters.inc("master/operator_calls_invalid")
        return Reply(call_id, refusal=refusal, error=error)

    # ============================================================ offers

    def _allocate(self) -> None:
        self._arm_allocation(self._now + self.config.allocation_interval)
        self.counters.inc("allocator/allocation_runs")
        batches: dict[str, list[Offer]] = {}
        allocations = []
        for framework_id, agent_id, resources in self.allocator.allocate(self._now):
            if agent_id in self.drained:
                # A draining agent is offered nothing: its resources go straight back.
                self.allocator.close_offer(framework_id, agent_id, resources)
            else:
                allocations.append((framework_id, agent_id, resources))
                # Through the agent's few offers: `a & b` walks the table of the
                # smaller set, and a set keeps its table when it shrinks, so a job
                # once offered every agent has a vast, nearly empty one.
                offers = self.agents[agent_id].offers
                if offers:
                    theirs = self.frameworks[framework_id].offers
                    held = [offer_id for offer_id in offers if offer_id in theirs]
                    for offer_id in sorted(held):  # revocable-only: remade with the new one
                        self._rescind(self.offers[offer_id], notify=True)
        lent = self._revocable_plan()
        for framework_id, agent_id, resources in allocations:
            taker, extra = lent.get(agent_id, ("", EMPTY))
            if taker == framework_id:
                del lent[agent_id]
            self._offer(framework_id, agent_id, resources, extra if taker == framework_id
                        else EMPTY, batches)
        for agent_id, (framework_id, extra) in lent.items():
            self._offer(framework_id, agent_id, EMPTY, extra, batches)
        self._send_offers_by_framework(self.admission.admit(batches.values(), self._now))
        self._guarantee_preemption()

    def _offer(self, framework_id: str, agent_id: str, resources: Resources,
               lent: Resources, batches: dict[str, list[Offer]]) -> None:
        framework = self.frameworks[framework_id]
        agent = self.agents[agent_id]
        offer = Offer(
            id=self._ids.next("O"), framework_id=framework_id, agent_id=agent_id,
            hostname=agent.info.hostname, resources=resources,
            attributes=dict(agent.info.attributes),
            executor_ids=sorted(agent.executor_ids[framework_id])
            if framework_id in agent.executor_ids else [],
            url=agent.info.url, cached_uris=list(self.cached_uris.get(agent_id, ())),
            revocable=lent,
            volumes=offered_volumes(agent, resources) if agent.dynamic.volumes else [])
        self.offers[offer.id] = offer
        framework.offers.add(offer.id)
        agent.offers.add(offer.id)
        agent.offered = agent.offered + resources
        if lent:
            agent.revocable_offered = agent.revocable_offered + lent
            self.counters.inc("master/revocable_offers_sent")
        batches.setdefault(framework_id, []).append(offer)

    def _revocable_plan(self) -> dict[str, tuple[str, Resources]]:
        """Who is offered what agents lend in this pass (master/revocable.py)."""
        if not self.config.oversubscription:
            return {}
        now = self._now
        for key in [k for k, until in self.revocable_filters.items() if until <= now]:
            del self.revocable_filters[key]
        agents = {}
        for aid in list(self.lending):
            agent = self.agents.get(aid)
            if agent is None or not agent.revocable:
                self.lending.discard(aid)  # gone, re-registered or lends nothing now
            elif aid not in self.drained:
                agents[aid] = agent
        return revocable.plan(
            agents, self.frameworks.values(), self.allocator.share,
            lambda fid, aid: (fid, aid) in self.revocable_filters,
            (self.config.min_allocatable_cpus, self.config.min_allocatable_mem))

    def _send_offers_by_framework(self, offers: list[Offer]) -> None:
        """Offers going out now (master/admission.py), each framework's in frames."""
        batches: dict[str, list[Offer]] = {}
        for offer in offers:
            batches.setdefault(offer.framework_id, []).append(offer)
        self._group_first = None  # the offers going out now share one timeout
        for framework_id, batch in batches.items():
            self._send_offers(self.frameworks[framework_id], batch)

    def _send_offers(self, framework: MasterFramework, offers: list[Offer]) -> None:
        """A pass's offers to one framework, in frames under the byte budget; an offer
        no frame can hold goes back (filtered, so it is not made again at once)."""
        packed = pack(offers, self.config.offers_frame_bytes)
        for offer in packed.too_large:
            self.counters.inc("master/offers_too_large")
            self.events.record(self._now, "offer_too_large", offer_id=offer.id,
                               framework_id=framework.id, agent_id=offer.agent_id,
                               bytes=offer_bytes(offer))
            self._return_offer(offer, self.config.default_refuse_seconds)
        for frame in packed.frames:
            for offer in frame:  # an offer's time starts when it goes out
                self._time_offer(offer.id)
            self.counters.inc("master/offers_sent", len(frame))
            self.counters.inc("master/offers_frames")
            self._to_framework(framework, Offers(offers=frame))

    def _time_offer(self, offer_id: str) -> None:
        """Put an offer going out in the group sent with it: one `OfferTimeout`
        for the group (its offers are due together), not one per offer."""
        first = self._group_first
        if first is None:
            first = self._group_first = offer_id
            self.offer_groups[first] = {}
            self._arm(OfferTimeout(first), self._now + self.config.offer_timeout)
        self.offer_groups[first][offer_id] = None
        self.group_of[offer_id] = first

    def _on_rejected(self, peer: str, message: Rejected) -> None:
        """A peer could not take one of our frames. Never answered: two peers would
        refuse each other forever. A framework that refused offers (or a frame it
        could not even read the type of, such as an oversize one) holds nothing it
        can accept; its offers go back at once, rescinded, rather than stranding
        its share until the offer timeout."""
        self.counters.inc("master/rejections_received")
        framework = next((f for f in self.frameworks.values() if f.peer == peer), None)
        refused_offers = message.message_type in (Offers.TYPE, "")
        self.events.record(self._now, "rejected_by_peer", peer=peer,
                           framework_id=framework.id if framework else None,
                           message_type=message.message_type, reason=message.reason,
                           offers_returned=len(framework.offers)
                           if framework and refused_offers else 0)
        if framework is None or not refused_offers:
            return
        for offer_id in sorted(framework.offers):
            self.counters.inc("master/offers_refused")
            self._rescind(self.offers[offer_id], notify=True)

    def _offers_expired(self, first: str) -> None:
        """The offers sent with `first` are an offer timeout old: rescind those
        still outstanding, in the order they went out."""
        for offer_id in list(self.offer_groups.get(first, ())):
            self._rescind(self.offers[offer_id], notify=True,
                          refuse_seconds=self.config.default_refuse_seconds)

    def _on_decline(self, peer: str, message: Decline) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        # Unknown ids are ignored: a decline racing a rescind is normal.
        fid = framework.id  # once, not once an offer (a Decline may hold hundreds)
        offers = [offer for offer in map(self.offers.get, dict.fromkeys(message.offer_ids))
                  if offer is not None and offer.framework_id == fid]
        if offers:
            self.counters.inc("master/offers_declined", len(offers))
            self._return_offers(framework.id, offers, message.filters.refuse_seconds)

    def _on_accept(self, peer: str, message: Accept) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        launches = [task for op in message.operations if op.type == OperationType.LAUNCH
                    for task in op.tasks]
        offers, problem = claim_offers(self.offers, framework, message.offer_ids)
        if problem:
            for offer in offers:
                self._return_offer(offer, 0.0)
            for task in launches:
                self._master_update(framework, task.task_id, TaskState.TASK_DROPPED,
                                    Reason.INVALID_OFFERS, problem, task.agent_id)
            return
        agent = self.agents[offers[0].agent_id]
        remaining = lent = EMPTY
        known = False  # some offer held resources the allocator knows of
        for offer in offers:
            if offer.resources:
                known = True
                remaining = remaining + offer.resources
            if offer.revocable:
                lent = lent + offer.revocable
            self._forget_offer(offer)
        self.counters.inc("master/offers_accepted", len(offers))
        seen: set[str] = set()
        for op in message.operations:
            if op.type != OperationType.LAUNCH:
                remaining = self._operation(peer, message, framework, agent, op, remaining)
                continue
            for task in op.tasks:
                remaining, lent = self._launch(framework, agent, task, seen, remaining, lent)
        self.admission.accepted(framework.id, len(offers), len(launches))
        if known:  # else the allocator never knew
            self.allocator.close_offer(framework.id, agent.id, remaining)
        if not (remaining.is_empty() and lent.is_empty()):
            if message.filters.refuse_seconds > 0:
                self.allocator.add_filter(framework.id, agent.id,
                                           self._now + message.filters.refuse_seconds)
                if lent:
                    self._filter_revocable(framework.id, agent.id,
                                           message.filters.refuse_seconds)
            self._request_allocation()

    def _operation(self, peer: str, message: Accept, framework: MasterFramework,
                   agent: MasterAgent, op: Any, remaining: Resources) -> Resources:
        """Apply a RESERVE, UNRESERVE, CREATE or DESTROY (master/volumes.py) to the
        accepted offer's resources; return what remains of them. A refused one
        changes nothing."""
        plan = plan_operation(op, self.allocator.allocation_role(agent.id, framework.id),
                              agent, framework.info.principal, remaining,
                              volume_users(agent, self.frameworks))
        if isinstance(plan, str):
            self._refuse(peer, message, f"{op.type} refused: {plan}")
            return remaining
        self.allocator.transform(agent.id, framework.id, plan.consumed, plan.produced)
        self._set_dynamic(agent, plan.dynamic)
        self.counters.inc(COUNTERS[op.type])
        return remaining - plan.consumed + plan.produced

    # ============================================================= tasks

    def _launch(self, framework: MasterFramework, agent: MasterAgent, task: TaskInfo,
                seen: set[str], remaining: Resources,
                lent: Resources) -> tuple[Resources, Resources]:
        """Validate one task (protocol order) and start it; return what remains of
        the offers' resources and of their revocable resources."""
        borrowed = EMPTY
        if task.revocable:
            problem, needed, borrowed = revocable.launch_problem(
                framework, agent, task, seen, remaining, lent)
        else:
            problem, needed = task_problem(framework, agent, task, seen, remaining)
        problem = task_volume_problem(agent, task) or problem  # the more precise one
        seen.add(task.task_id)
        if problem:
            self._master_update(framework, task.task_id, TaskState.TASK_ERROR,
                                Reason.TASK_INVALID, problem, agent.id)
            return remaining, lent
        executor_id = task.task_id
        if task.executor is not None:
            executor_id = task.executor.executor_id
            if (framework.id, executor_id) not in agent.executors:
                agent.add_executor(framework.id, task.executor)
        record = launched(framework.id, agent.id, executor_id, task,
                          self.config.max_task_story, self._now)
        self._note(record, "launched on agent %s with %s", agent.id, task.resources)
        self._task_event(record, "master")
        framework.tasks[task.task_id] = record
        self.admission.launched((framework.id, task.task_id), self._now)
        agent.tasks.add((framework.id, task.task_id))
        agent.used = agent.used + needed
        self._send(agent.peer, RunTask(framework=framework.info, task=task))
        if borrowed:  # a revocable task's (`EMPTY` for every other)
            agent.revocable_used = agent.revocable_used + borrowed
            lent = lent - borrowed
        return remaining - needed, lent

    def _on_kill(self, peer: str, message: Kill) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        task = framework.tasks.get(message.task_id)
        if task is None:
            status = self._reconciled(framework, message.task_id, message.agent_id)
            if status is not None:
                self._to_framework(framework, Update(status=status))
            return
        grace = message.kill_grace_period
        self._note(task, "kill requested by the framework")
        self._send(self.agents[task.agent_id].peer, KillTask(
            framework_id=framework.id, task_id=task.task_id,
            kill_grace_period=grace if grace is not None else task.kill_grace_period))

    def _operator_kill(self, call_id: int, request: KillLiveTask) -> Reply:
        """Like a framework's Kill, for an operator: the agent kills the task and
        the framework hears TASK_KILLED from it. Task ids are unique only per
        framework, so an id live in two needs `framework_id`."""
        task_id, wanted = request.task_id, request.framework_id
        owners = sorted(fid for fid, framework in self.frameworks.items()
                        if task_id in framework.tasks and wanted in (None, fid))
        if not owners:
            return self._refuse_call(call_id, NOT_FOUND, f"no live task {task_id}" + (
                f" in framework {wanted}" if wanted else ""))
        if len(owners) > 1:
            return self._refuse_call(call_id, CONFLICT, f"task id {task_id} is live in "
                                     f"frameworks {', '.join(owners)}; give framework_id")
        task = self.frameworks[owners[0]].tasks[task_id]
        self.counters.inc("master/operator_kills")
        self._note(task, "kill requested by an operator")
        self.events.record(self._now, "task_kill_requested", framework_id=task.framework_id,
                           task_id=task.task_id, agent_id=task.agent_id, by="operator")
        self._send(self.agents[task.agent_id].peer, KillTask(
            framework_id=task.framework_id, task_id=task.task_id,
            kill_grace_period=task.kill_grace_period))
        return Reply(call_id, result={"killing": True, "task_id": task_id,
                                      "framework_id": task.framework_id})

    def _on_reconcile(self, peer: str, message: Reconcile) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        if message.tasks:
            for wanted in message.tasks:
                status = self._reconciled(framework, wanted.task_id, wanted.agent_id)
                if status is not None:
                    self._to_framework(framework, Update(status=status))
            return
        live = list(framework.tasks.values())
        if framework.info.partition_aware:
            live += framework.unreachable_tasks.values()
        for task in live:
            self._to_framework(framework, Update(status=status_of(task, self._now)))

    def _reconciled(self, framework: MasterFramework, task_id: str,
                    agent_id: str | None) -> TaskStatus | None:
        return reconciled(framework, task_id, agent_id, self.recovering, self.unreachable,
                          self._now)

    def _on_framework_to_executor(self, peer: str, message: FrameworkToExecutor) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        agent = self.agents.get(message.agent_id)
        if agent is None:
            self._refuse(peer, message, f"agent {message.agent_id} is not registered")
            return
        self._send(agent.peer, message)

    # ============================================================ timers

    def _timer(self, key: Hashable) -> None:
        """Dispatch a timer. Stale keys (the thing is gone) are ignored: a shell may
        deliver a timer that raced its cancellation."""
        match key:
            case Allocate():
                # Never second-guess the shell's timing: skipping an early-fired run
                # would also skip re-arming, and allocation would stop for good.
                self._allocate()
            case OfferTimeout(offer_id=first):
                self._offers_expired(first)
            case PingDue(agent_id=agent_id):
                self._ping_due(agent_id)
            case HeartbeatDue(framework_id=framework_id):
                self._heartbeat_due(framework_id)
            case FailoverTimeout(framework_id=framework_id):
                self._failover_due(framework_id)
            case ReregisterTimeout():
                self._recovery_timed_out()
            case RemovalDue():
                self._removal_due()
            case UsageDue():
                self._usage_out()
            case _:
                raise UnknownTimer("MasterState", key)

