"""The master's brain: a pure state machine over frameworks, agents, offers, tasks.

Theory of operation
-------------------
`MasterState.handle(event, now)` is the only mutator. Events are `Received` (a
decoded message from a peer), `Invalid` (a frame that failed to decode),
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

Timers are typed keys (`dyad.effects.TimerKey`, below), matched exhaustively:
`Allocate` the next allocation pass; `OfferTimeout(offer_id)`; `PingDue(agent_id)`
agent liveness; `HeartbeatDue(framework_id)` heartbeats both ways;
`FailoverTimeout(framework_id)` teardown of a framework that stayed away;
`ReregisterTimeout` the end of the re-registration window after a failover;
`RemovalDue` the next permitted unreachable-marking (rate limit). A stale key of
a known kind (its offer or agent is gone) is ignored; any other key raises
`UnknownTimer`.

Registry (what survives failover, see master/registry.py): `restore()` hands a
new leader the admitted and unreachable agents, weights and quota; admitted
agents stay *recovering* (no offers, they are not in `_agents`) until they
re-register or `agent_reregister_timeout` passes. Whenever what the registry
holds changes, the step's effects include one `PersistRegistry`, and the shell
writes `snapshot_of(state)` (coalescing bursts into one write).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import attrs

from dyad.codec import to_json
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.ids import IdGenerator
from dyad.messages import (
    Accept, Acknowledge, AgentInfo, AgentRegistered, Decline, Error, ExecutorExited,
    ExecutorInfo, ExecutorToFramework, Failure, FrameworkInfo, FrameworkToExecutor,
    Heartbeat, Kill, KillTask, MasterInfo, Message, MessageError, Offer, Offers,
    OperationType, Ping, Pong, Reason, Reconcile, RegisterAgent, Rejected, Rescind,
    Revive, RunTask, SchedulerHeartbeat, ShutdownFramework, Source, StatusUpdate,
    StatusUpdateAck, Subscribe, Subscribed, Suppress, Task, TaskInfo, TaskState,
    TaskStatus, Teardown, Unsubscribe, Update,
)
from dyad.messages import DrainAgent, UsageReport  # what agents report (docs/agent.md)
from dyad.resources import SHARE_KINDS, UNRESERVED, Resources, ResourcesError
from master.allocator import (
    Allocator, HierarchicalAllocator, PolicyError, Quota, allowed_roles, check_quotas,
    parse_weights, role_problem,
)
from master.events import DEFAULT_CAPACITY as DEFAULT_EVENTS, EventLog
from master.metrics import Counters, Window
from master.operator import (
    CONFLICT, INVALID, NOT_FOUND, DrainMachine, KillLiveTask, MalformedCall, OperatorCall,
    Reply, Request, SetQuota, SetWeights, TeardownFramework,
)

EMPTY = Resources()
VERSION = "0.1.0"



@attrs.frozen
class PersistRegistry:
    """What the registry holds changed (admitted or unreachable agents, weights,
    quota): the shell writes `snapshot_of(state)` soon, coalescing a burst of
    these into one write (every write is the whole registry)."""


Effect = Send | ArmTimer | CancelTimer | PersistRegistry | Reply


# --------------------------------------------------------------------- config/events


@attrs.frozen(kw_only=True)
class MasterConfig:
    """Tunables; durations in seconds."""

    offer_timeout: float = 30.0
    allocation_interval: float = 1.0
    agent_ping_timeout: float = 15.0  # also the ping interval, as in Mesos
    max_agent_ping_timeouts: int = 5
    heartbeat_interval: float = 5.0  # framework heartbeats, both directions
    min_allocatable_cpus: float = 0.01  # an agent is worth offering if it has
    min_allocatable_mem: float = 32.0   # at least this much cpus OR this much mem
    # Filter applied when an offer times out unanswered, so a silent framework
    # (always lowest share) does not get the same resources straight back.
    default_refuse_seconds: float = 5.0
    max_completed_tasks: int = 1000  # per framework, for /state and reconciliation
    max_completed_frameworks: int = 100
    max_unreachable_agents: int = 1000
    max_task_story: int = 32
    # After a failover: how long agents from the registry have to re-register.
    agent_reregister_timeout: float = 600.0
    # At most `permits` agents marked unreachable per `seconds` (a mass outage and
    # a partition look alike); None: no limit. dyad-master defaults to 1/10s.
    agent_removal_rate: tuple[int, float] | None = None
    max_events: int = DEFAULT_EVENTS  # entries kept in the events log (GET /events)


# ------------------------------------------------------------------------ timer keys


@attrs.frozen
class Allocate(TimerKey):
    """The next allocation pass (periodic, or early after something was freed)."""


@attrs.frozen
class OfferTimeout(TimerKey):
    offer_id: str


@attrs.frozen
class PingDue(TimerKey):
    agent_id: str


@attrs.frozen
class HeartbeatDue(TimerKey):
    framework_id: str


@attrs.frozen
class FailoverTimeout(TimerKey):
    """A disconnected framework's `failover_timeout` is over: tear it down."""

    framework_id: str


@attrs.frozen
class ReregisterTimeout(TimerKey):
    """After a failover: agents from the registry not back yet are unreachable."""


@attrs.frozen
class RemovalDue(TimerKey):
    """The agent-removal rate limit permits the next queued removal."""


@attrs.frozen
class Received:
    peer: str
    message: Message


@attrs.frozen
class Invalid:
    peer: str
    error: MessageError


@attrs.frozen
class AllocationTimed:
    """How long the last allocation run took, measured by the shell: the core
    stays deterministic by never reading a perf counter itself."""

    seconds: float


Event = Received | Invalid | TimerFired | AllocationTimed | OperatorCall


class InvariantError(AssertionError):
    """`validate()` found the master's books inconsistent (a bug, never input)."""


# --------------------------------------------------------------------------- records


@attrs.define(eq=False)
class TaskRecord:
    task_id: str
    framework_id: str
    agent_id: str
    executor_id: str
    name: str
    resources: Resources
    state: TaskState
    labels: dict[str, str]
    kill_grace_period: float | None
    statuses: collections.deque[tuple[TaskState, float]]
    story: collections.deque[str]
    healthy: bool | None = None
    usage: dict[str, Any] | None = None  # latest UsageReport of its executor


@attrs.define(eq=False)
class FrameworkRecord:
    info: FrameworkInfo  # always with its id set
    registered_time: float
    peer: str | None = None  # the owning connection; None = disconnected
    last_seen: float = 0.0
    suppressed: bool = False
    disconnected_time: float | None = None
    tasks: dict[str, TaskRecord] = attrs.field(factory=dict)
    # Tasks of partition-aware frameworks on agents that became unreachable.
    unreachable_tasks: dict[str, TaskRecord] = attrs.field(factory=dict)
    completed: collections.OrderedDict[str, TaskRecord] = attrs.field(factory=collections.OrderedDict)
    offers: set[str] = attrs.field(factory=set)

    @property
    def id(self) -> str:
        assert self.info.id is not None
        return self.info.id


@attrs.define(eq=False)
class AgentRecord:
    info: AgentInfo  # always with its id set
    peer: str
    registered_time: float
    reregistered_time: float | None = None
    offered: Resources = EMPTY
    used: Resources = EMPTY
    offers: set[str] = attrs.field(factory=set)
    tasks: set[tuple[str, str]] = attrs.field(factory=set)  # (framework id, task id)
    executors: dict[tuple[str, str], ExecutorInfo] = attrs.field(factory=dict)
    awaiting_pong: bool = False
    missed_pongs: int = 0
    # Dynamic reservations (RESERVE operations), kept by the master only: the
    # agent knows its static resources (`info.resources`), and tasks on these are
    # sent to it as unreserved (see `_for_agent`).
    reservations: Resources = EMPTY

    @property
    def id(self) -> str:
        assert self.info.id is not None
        return self.info.id

    @property
    def total(self) -> Resources:
        """What the master offers from: static resources with dynamic reservations."""
        if not self.reservations:
            return self.info.resources
        return self.info.resources - self.reservations.flatten() + self.reservations


@attrs.frozen
class UnreachableAgent:
    info: AgentInfo
    since: float


@attrs.frozen
class CompletedFramework:
    info: FrameworkInfo
    registered_time: float
    removed_time: float
    reason: str
    tasks: tuple[TaskRecord, ...]


# ----------------------------------------------------------------------------- core


class MasterState:
    """The master as a pure state machine; see the module docstring."""

    def __init__(self, config: MasterConfig, info: MasterInfo, ids: IdGenerator,
                 start_time: float = 0.0, allocator: Allocator | None = None) -> None:
        self.config = config
        self.info = info
        self.start_time = start_time
        self._ids = ids
        self._allocator: Allocator = allocator or HierarchicalAllocator(
            {"cpus": config.min_allocatable_cpus, "mem": config.min_allocatable_mem})
        self._frameworks: dict[str, FrameworkRecord] = {}
        self._completed_frameworks: collections.OrderedDict[str, CompletedFramework] = \
            collections.OrderedDict()
        self._agents: dict[str, AgentRecord] = {}
        self._agent_by_peer: dict[str, str] = {}
        self._unreachable: collections.OrderedDict[str, UnreachableAgent] = collections.OrderedDict()
        self._recovering: dict[str, AgentInfo] = {}  # registry agents not yet back
        self._removals: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._next_removal = float("-inf")
        self._persist_pending = False  # a PersistRegistry is in this step's effects
        self._offers: dict[str, Offer] = {}
        # From agents' reports: the URIs each one's fetcher cache holds (put in its
        # offers), and the agents that are draining (offered nothing more).
        self._cached_uris: dict[str, list[str]] = {}
        self._drained: set[str] = set()
        # Operator policy, plain data for the registry: change it only through
        # `set_weights`/`set_quota`.
        self.weights: dict[str, float] = {}
        self.quota: dict[str, Quota] = {}
        self._allocate_at: float | None = None
        self._counters = Counters()
        self.events = EventLog(config.max_events)
        self._allocation_ms = Window(1000)
        self._now = start_time
        self._out: list[Effect] = []
        self._handlers: dict[type, Callable[[str, Any], None]] = {
            Subscribe: self._on_subscribe,
            Unsubscribe: self._on_unsubscribe,
            Teardown: self._on_teardown,
            Accept: self._on_accept,
            Decline: self._on_decline,
            Revive: self._on_revive,
            Suppress: self._on_suppress,
            Kill: self._on_kill,
            Acknowledge: self._on_acknowledge,
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
        }

    # ------------------------------------------------------------------ the mutator

    def handle(self, event: Event, now: float) -> list[Effect]:
        """Apply one event at time `now`; return what the shell must do, in order."""
        self._now = now
        self._out = []
        self._persist_pending = False
        if self._allocate_at is None:
            self._arm_allocation(now + self.config.allocation_interval)
        if isinstance(event, Received):
            self._received(event.peer, event.message)
        elif isinstance(event, Invalid):
            self._counters.inc("master/messages_received")
            self._counters.inc("master/messages_invalid")
            self._reply_rejected(event.peer, event.error.reason, event.error.type_name)
        elif isinstance(event, TimerFired):
            self._timer(event.key)
        elif isinstance(event, AllocationTimed):
            self._allocation_ms.add(event.seconds * 1000.0)
        elif isinstance(event, OperatorCall):
            self._out.append(self._operator_call(event.call_id, event.request))
        else:
            raise TypeError(f"MasterState cannot handle {event!r}")
        out, self._out = self._out, []
        return out

    def _received(self, peer: str, message: Message) -> None:
        self._counters.inc("master/messages_received")
        handler = self._handlers.get(type(message))
        if handler is None:
            self._refuse(peer, message, f"the master does not accept {message.TYPE} messages")
            return
        handler(peer, message)

    # --------------------------------------------------------------- effect helpers

    def _send(self, peer: str, message: Message) -> None:
        self._out.append(Send(peer, message))

    def _arm(self, key: TimerKey, at: float) -> None:
        self._out.append(ArmTimer(key, at))

    def _cancel(self, key: TimerKey) -> None:
        self._out.append(CancelTimer(key))

    def _persist(self) -> None:
        """What the registry holds changed: ask for one write per step."""
        if not self._persist_pending:
            self._persist_pending = True
            self._out.append(PersistRegistry())

    def _reply_rejected(self, peer: str, reason: str, message_type: str) -> None:
        self._counters.inc("master/messages_rejected")
        self._send(peer, Rejected(reason=reason, message_type=message_type))

    def _refuse(self, peer: str, message: Message, reason: str) -> None:
        """Refuse one message: reply `Rejected`, count it, change nothing else."""
        self._counters.inc("master/messages_invalid")
        self._reply_rejected(peer, reason, message.TYPE)

    def _to_framework(self, framework: FrameworkRecord, message: Message) -> None:
        if framework.peer is not None:
            self._send(framework.peer, message)

    # ------------------------------------------------------------ who is asking

    def _owned_framework(self, peer: str, message: Any) -> FrameworkRecord | None:
        """The framework `message` names, if `peer` owns it; otherwise refuse."""
        framework_id: str = message.framework_id
        framework = self._frameworks.get(framework_id)
        if framework is None:
            if framework_id in self._completed_frameworks:
                self._refuse(peer, message, f"framework {framework_id} has been torn down")
            else:
                self._refuse(peer, message, f"unknown framework {framework_id}; subscribe first")
            return None
        if framework.peer != peer:
            self._refuse(peer, message,
                         f"framework {framework_id} is not subscribed on this connection")
            return None
        framework.last_seen = self._now
        return framework

    def _sending_agent(self, peer: str, message: Message, agent_id: str | None) -> AgentRecord | None:
        """The agent registered on `peer` (and called `agent_id`, if given)."""
        known = self._agent_by_peer.get(peer)
        if known is None:
            self._refuse(peer, message, "this connection has no registered agent; register first")
            return None
        if agent_id is not None and agent_id != known:
            self._refuse(peer, message,
                         f"agent id {agent_id} does not match this connection's agent {known}")
            return None
        return self._agents[known]

    # ============================================================ frameworks

    def _on_subscribe(self, peer: str, message: Subscribe) -> None:
        info = message.framework
        problem = _roles_problem(info.roles)
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
            if info.id in self._completed_frameworks:
                self._send(peer, Error(message=f"framework {info.id} has been torn down; "
                                               "subscribe without an id to start anew"))
                return
            framework = self._frameworks.get(info.id)
            reregistered = True
            if framework is None:
                framework = self._add_framework(info, active=True)
            else:
                self._resubscribe(framework, peer, info)
        self._connect(framework, peer)
        self.events.record(self._now, "framework_subscribed", framework_id=framework.id,
                           name=info.name, roles=list(info.roles), reregistered=reregistered)
        self._send(peer, Subscribed(framework_id=framework.id,
                                    heartbeat_interval=self.config.heartbeat_interval,
                                    master_info=self.info, reregistered=reregistered))
        self._request_allocation()

    def _find_by_peer_and_name(self, peer: str, name: str) -> FrameworkRecord | None:
        """A repeated first Subscribe (the driver retried while the master started)
        must not create a second framework."""
        for framework in self._frameworks.values():
            if framework.peer == peer and framework.info.name == name:
                return framework
        return None

    def _add_framework(self, info: FrameworkInfo, active: bool) -> FrameworkRecord:
        framework = FrameworkRecord(info=info, registered_time=self._now)
        self._frameworks[framework.id] = framework
        self._allocator.add_framework(framework.id, info.roles, active=active)
        return framework

    def _resubscribe(self, framework: FrameworkRecord, peer: str, info: FrameworkInfo) -> None:
        """A known framework subscribes again (driver failover or reconnect)."""
        if framework.peer is not None and framework.peer != peer:
            self._send(framework.peer, Error(
                message=f"framework {framework.id} was taken over by another connection"))
        # The new connection knows none of the old offers; the same one may have
        # lost them. Either way they are void.
        for offer_id in sorted(framework.offers):
            self._rescind(self._offers[offer_id], notify=framework.peer == peer)
        framework.info = attrs.evolve(info, id=framework.id)
        self._allocator.add_framework(framework.id, info.roles)

    def _connect(self, framework: FrameworkRecord, peer: str) -> None:
        framework.peer = peer
        framework.last_seen = self._now
        framework.disconnected_time = None
        self._cancel(FailoverTimeout(framework.id))
        self._allocator.activate(framework.id)
        self._arm(HeartbeatDue(framework.id), self._now + self.config.heartbeat_interval)

    def _disconnect(self, framework: FrameworkRecord) -> None:
        """The driver is gone (silent or unsubscribed): void its offers, keep its
        tasks, and tear it down if it stays away for `failover_timeout`."""
        for offer_id in sorted(framework.offers):
            self._rescind(self._offers[offer_id], notify=True)
        framework.peer = None
        framework.disconnected_time = self._now
        self._allocator.deactivate(framework.id)
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
        framework = self._frameworks.get(framework_id)
        if framework is None or framework.peer is None:
            return
        interval = self.config.heartbeat_interval
        if self._now - framework.last_seen >= 3 * interval:
            self._disconnect(framework)
            return
        self._send(framework.peer, Heartbeat())
        self._arm(HeartbeatDue(framework_id), self._now + interval)

    def _failover_due(self, framework_id: str) -> None:
        framework = self._frameworks.get(framework_id)
        if framework is not None and framework.peer is None:
            self._remove_framework(framework, "failover timeout expired")

    def _remove_framework(self, framework: FrameworkRecord, reason: str) -> None:
        """Teardown: rescind offers, kill tasks, shut down executors, forget it."""
        for offer_id in sorted(framework.offers):
            self._rescind(self._offers[offer_id], notify=True)
        fid = framework.id
        touched: set[str] = set()
        for task in list(framework.tasks.values()):
            agent = self._agents[task.agent_id]
            touched.add(agent.id)
            self._send(agent.peer, KillTask(framework_id=fid, task_id=task.task_id,
                                            kill_grace_period=task.kill_grace_period))
            self._note(task, f"killed: framework {reason}")
            self._end_task(framework, task, TaskState.TASK_KILLED)
            self._task_event(task, "master")
        for agent in self._agents.values():
            for key in [k for k in agent.executors if k[0] == fid]:
                agent.used = agent.used - agent.executors.pop(key).resources
                touched.add(agent.id)
        for agent_id in sorted(touched):
            self._send(self._agents[agent_id].peer, ShutdownFramework(framework_id=fid))
        self._allocator.remove_framework(fid)
        self._cancel(HeartbeatDue(fid))
        self._cancel(FailoverTimeout(fid))
        del self._frameworks[fid]
        self._completed_frameworks[fid] = CompletedFramework(
            info=framework.info, registered_time=framework.registered_time,
            removed_time=self._now, reason=reason,
            tasks=tuple(framework.completed.values()))
        while len(self._completed_frameworks) > self.config.max_completed_frameworks:
            self._completed_frameworks.popitem(last=False)
        self.events.record(self._now, "framework_removed", framework_id=fid, reason=reason)
        self._request_allocation()

    def _on_revive(self, peer: str, message: Revive) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            framework.suppressed = False
            self._allocator.revive(framework.id)
            self._request_allocation()

    def _on_suppress(self, peer: str, message: Suppress) -> None:
        framework = self._owned_framework(peer, message)
        if framework is not None:
            framework.suppressed = True
            self._allocator.suppress(framework.id)

    # ======================================================== operator calls

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
                agent = self._agents.get(agent_id)
                if agent is None:
                    return self._refuse_call(call_id, NOT_FOUND,
                                             f"agent {agent_id} is not registered")
                self._counters.inc("master/operator_drains")
                self.events.record(self._now, "agent_drain_requested", agent_id=agent_id,
                                   by="operator")
                return Reply(call_id, result={"agent_id": agent_id, "url": agent.info.url})
            case TeardownFramework(framework_id=framework_id):
                framework = self._frameworks.get(framework_id)
                if framework is None:
                    return self._refuse_call(call_id, NOT_FOUND,
                                             f"no active framework {framework_id}")
                self._counters.inc("master/operator_teardowns")
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
        self._counters.inc(counter)
        self._persist()
        return Reply(call_id)

    def _refuse_call(self, call_id: int, refusal: str, error: str) -> Reply:
        if refusal == INVALID:
            self._counters.inc("master/operator_calls_invalid")
        return Reply(call_id, refusal=refusal, error=error)

    def _apply_weights(self, weights: Mapping[str, float]) -> None:
        """Set the weights of some roles (1.0 is the default and clears an entry):
        from `PUT /weights`, or the registry after a failover. Raises `PolicyError`
        and changes nothing if any is bad. Takes effect at the next allocation."""
        if not weights:
            return
        parse_weights([{"role": role, "weight": weight} for role, weight in weights.items()])
        for role, weight in weights.items():
            self._allocator.set_weight(role, weight)
            if weight == 1.0:
                self.weights.pop(role, None)
            else:
                self.weights[role] = float(weight)

    def _apply_quota(self, quotas: Mapping[str, Quota]) -> None:
        """Set the quota of some roles (an empty `Quota` removes a role's): from
        `PUT /quota`, or the registry after a failover. The resulting set must be
        coherent (`check_quotas`); otherwise `PolicyError` is raised and nothing
        changes. Takes effect at the next allocation."""
        if not quotas:
            return
        merged = dict(self.quota)
        for role, quota in quotas.items():
            problem = role_problem(role)
            if problem or role == UNRESERVED:
                raise PolicyError(problem or f"role {UNRESERVED} cannot have quota")
            if quota.is_empty():
                merged.pop(role, None)
            else:
                merged[role] = quota
        check_quotas(merged)
        for role, quota in quotas.items():
            self._allocator.set_quota(role, quota)
        self.quota = merged

    def roles_json(self) -> list[dict[str, Any]]:
        """Every role with a weight, a quota, frameworks or allocations: its weight,
        quota, what its subtree is allocated (offered + used) and its share."""
        shares = self._allocator.role_shares()
        names = sorted(set(shares) | set(self.weights) | set(self.quota))
        return [{"name": role, "weight": self.weights.get(role, 1.0),
                 "quota": self.quota.get(role, Quota()).to_json(),
                 "allocated": {kind: milli / 1000 for kind, milli in
                               sorted(self._allocator.role_allocation(role).items())},
                 "dominant_share": shares.get(role, 0.0)}
                for role in names]

    # ================================================================ offers

    def _request_allocation(self) -> None:
        """Allocate soon: resources were added or freed. Batched: at most one early
        run is pending, and an already-due run is not postponed."""
        if self._allocate_at is None or self._allocate_at > self._now:
            self._arm_allocation(self._now)

    def _arm_allocation(self, at: float) -> None:
        self._allocate_at = at
        self._arm(Allocate(), at)

    def _allocate(self) -> None:
        self._arm_allocation(self._now + self.config.allocation_interval)
        self._counters.inc("allocator/allocation_runs")
        batches: dict[str, list[Offer]] = {}
        for framework_id, agent_id, resources in self._allocator.allocate(self._now):
            if agent_id in self._drained:
                # A draining agent is offered nothing: its resources go straight back.
                self._allocator.close_offer(framework_id, agent_id, resources)
                continue
            framework = self._frameworks[framework_id]
            agent = self._agents[agent_id]
            offer = Offer(
                id=self._ids.next("O"), framework_id=framework_id, agent_id=agent_id,
                hostname=agent.info.hostname, resources=resources,
                attributes=dict(agent.info.attributes),
                executor_ids=sorted(eid for fid, eid in agent.executors if fid == framework_id),
                url=agent.info.url, cached_uris=list(self._cached_uris.get(agent_id, ())))
            self._offers[offer.id] = offer
            framework.offers.add(offer.id)
            agent.offers.add(offer.id)
            agent.offered = agent.offered + resources
            self._arm(OfferTimeout(offer.id), self._now + self.config.offer_timeout)
            batches.setdefault(framework_id, []).append(offer)
        for framework_id, offers in batches.items():
            self._counters.inc("master/offers_sent", len(offers))
            self._to_framework(self._frameworks[framework_id], Offers(offers=offers))

    def _forget_offer(self, offer: Offer) -> None:
        """Drop the master's record of an offer; the caller settles the resources
        with the allocator."""
        del self._offers[offer.id]
        self._frameworks[offer.framework_id].offers.discard(offer.id)
        agent = self._agents[offer.agent_id]
        agent.offers.discard(offer.id)
        agent.offered = agent.offered - offer.resources
        self._cancel(OfferTimeout(offer.id))

    def _return_offer(self, offer: Offer, refuse_seconds: float) -> None:
        """The offer's resources go back whole; filter them for the framework."""
        self._forget_offer(offer)
        self._allocator.close_offer(offer.framework_id, offer.agent_id, offer.resources)
        if refuse_seconds > 0:
            self._allocator.add_filter(offer.framework_id, offer.agent_id,
                                       self._now + refuse_seconds)
        self._request_allocation()

    def _rescind(self, offer: Offer, notify: bool, refuse_seconds: float = 0.0) -> None:
        self._return_offer(offer, refuse_seconds)
        self._counters.inc("master/offers_rescinded")
        self.events.record(self._now, "offer_rescinded", offer_id=offer.id,
                           framework_id=offer.framework_id, agent_id=offer.agent_id)
        if notify:
            self._to_framework(self._frameworks[offer.framework_id], Rescind(offer_id=offer.id))

    def _offer_expired(self, offer_id: str) -> None:
        offer = self._offers.get(offer_id)
        if offer is not None:
            self._rescind(offer, notify=True, refuse_seconds=self.config.default_refuse_seconds)

    def _on_decline(self, peer: str, message: Decline) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        # Unknown ids are ignored: a decline racing a rescind is normal.
        for offer_id in dict.fromkeys(message.offer_ids):
            offer = self._offers.get(offer_id)
            if offer is not None and offer.framework_id == framework.id:
                self._counters.inc("master/offers_declined")
                self._return_offer(offer, message.filters.refuse_seconds)

    def _on_accept(self, peer: str, message: Accept) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        launches = [task for op in message.operations if op.type == OperationType.LAUNCH
                    for task in op.tasks]
        offers, problem = self._claim_offers(framework, message.offer_ids)
        if problem:
            for offer in offers:
                self._return_offer(offer, 0.0)
            for task in launches:
                self._master_update(framework, task.task_id, TaskState.TASK_DROPPED,
                                    Reason.INVALID_OFFERS, problem, task.agent_id)
            return
        agent = self._agents[offers[0].agent_id]
        remaining = EMPTY
        for offer in offers:
            remaining = remaining + offer.resources
            self._forget_offer(offer)
        self._counters.inc("master/offers_accepted", len(offers))
        seen: set[str] = set()
        for op in message.operations:
            if op.type != OperationType.LAUNCH:
                remaining = self._reservation(peer, message, framework, agent, op, remaining)
                continue
            for task in op.tasks:
                remaining = self._launch(framework, agent, task, seen, remaining)
        self._allocator.close_offer(framework.id, agent.id, remaining)
        if not remaining.is_empty():
            if message.filters.refuse_seconds > 0:
                self._allocator.add_filter(framework.id, agent.id,
                                           self._now + message.filters.refuse_seconds)
            self._request_allocation()

    def _reservation(self, peer: str, message: Accept, framework: FrameworkRecord,
                     agent: AgentRecord, op: Any, remaining: Resources) -> Resources:
        """Apply a RESERVE or UNRESERVE to the accepted offer's resources; return
        what remains of them. An invalid one is refused and changes nothing."""
        reserve = op.type == OperationType.RESERVE
        problem = self._reservation_problem(framework, agent, op.resources, remaining, reserve)
        if problem:
            self._refuse(peer, message, f"{op.type} refused: {problem}")
            return remaining
        flat = op.resources.flatten()
        consumed, produced = (flat, op.resources) if reserve else (op.resources, flat)
        self._allocator.transform(agent.id, framework.id, consumed, produced)
        agent.reservations = (agent.reservations + op.resources if reserve
                              else agent.reservations - op.resources)
        self._counters.inc("master/operations_reserve" if reserve else "master/operations_unreserve")
        return remaining - consumed + produced

    def _reservation_problem(self, framework: FrameworkRecord, agent: AgentRecord,
                             resources: Resources, remaining: Resources, reserve: bool) -> str:
        """Why a RESERVE (or UNRESERVE) of `resources` cannot apply ('' if it can).
        Dynamic reservations are scalar, to the role the offer was made in (an
        UNRESERVE may also release the role's ancestors'), and never of a (resource, role) the agent also
        reserves statically: the agent is told about neither (see `_for_agent`)."""
        if resources.is_empty():
            return "no resources given"
        if set(resources.scalar_items()) != resources.names():
            return "only scalar resources (cpus, mem, disk, gpus, ...) can be reserved dynamically"
        roles = resources.roles()
        if UNRESERVED in roles:
            return f"resources must name the role, like cpus(role):1; got {resources}"
        role = self._allocator.allocation_role(agent.id, framework.id)
        if role is None or (roles != {role} if reserve else not roles <= set(allowed_roles(role))):
            return (f"the offer was made to role {role}, which cannot "
                    f"{'reserve' if reserve else 'unreserve'} for {', '.join(sorted(roles))}")
        if reserve:
            if not resources.flatten() <= remaining:
                return f"{resources.flatten()} is not unreserved in what remains of the offer"
            for name in resources.names():
                for reserved in roles:
                    if agent.info.resources.reserved(reserved).get_milli(name):
                        return (f"agent {agent.id} reserves {name} to {reserved} statically; "
                                "a dynamic reservation of the same resource and role is not "
                                "supported")
            return ""
        if not resources <= remaining:
            return f"{resources} is not in what remains of the offer"
        if not resources <= agent.reservations:
            return f"{resources} is not dynamically reserved (static reservations stay)"
        return ""

    def _for_agent(self, agent: AgentRecord, task: TaskInfo) -> TaskInfo:
        """The task as its agent must see it: the agent knows only its static
        reservations, so dynamically reserved amounts go to it as unreserved
        (the master alone keeps the roles of those)."""
        if not agent.reservations:
            return task
        dynamic = agent.reservations.roles()

        def strip(resources: Resources) -> Resources:
            moved = Resources()
            for role in dynamic & resources.roles():
                part = resources.reserved(role)
                keep = part.names() & agent.info.resources.reserved(role).names()
                for name in part.names() - keep:
                    milli = part.get_milli(name)
                    moved = moved + Resources.parse(f"{name}({role}):{milli / 1000}")
            return resources - moved + moved.flatten() if moved else resources

        executor = task.executor
        if executor is not None:
            executor = attrs.evolve(executor, resources=strip(executor.resources))
        return attrs.evolve(task, resources=strip(task.resources), executor=executor)

    def _claim_offers(self, framework: FrameworkRecord,
                      offer_ids: list[str]) -> tuple[list[Offer], str]:
        """The framework's offers among `offer_ids` and, if the set is unusable for
        an accept, why."""
        offers: list[Offer] = []
        problems: list[str] = []
        if not offer_ids:
            problems.append("no offers given")
        for offer_id in dict.fromkeys(offer_ids):
            offer = self._offers.get(offer_id)
            if offer is None:
                problems.append(f"offer {offer_id} is unknown or no longer valid")
            elif offer.framework_id != framework.id:
                problems.append(f"offer {offer_id} belongs to another framework")
            else:
                offers.append(offer)
        if len(offer_ids) != len(set(offer_ids)):
            problems.append("an offer is listed twice")
        agents = sorted({offer.agent_id for offer in offers})
        if len(agents) > 1:
            problems.append(f"offers span several agents ({', '.join(agents)})")
        return offers, "; ".join(problems)

    # ================================================================= tasks

    def _launch(self, framework: FrameworkRecord, agent: AgentRecord, task: TaskInfo,
                seen: set[str], remaining: Resources) -> Resources:
        """Validate one task (protocol order) and start it; return what remains."""
        problem, needed = self._task_problem(framework, agent, task, seen, remaining)
        seen.add(task.task_id)
        if problem:
            self._master_update(framework, task.task_id, TaskState.TASK_ERROR,
                                Reason.TASK_INVALID, problem, agent.id)
            return remaining
        executor_id = task.task_id
        if task.executor is not None:
            executor_id = task.executor.executor_id
            agent.executors.setdefault((framework.id, executor_id), task.executor)
        record = TaskRecord(
            task_id=task.task_id, framework_id=framework.id, agent_id=agent.id,
            executor_id=executor_id, name=task.name, resources=task.resources,
            state=TaskState.TASK_STAGING, labels=dict(task.labels),
            kill_grace_period=task.kill_grace_period,
            statuses=collections.deque([(TaskState.TASK_STAGING, self._now)], maxlen=_MAX_STATUSES),
            story=collections.deque(maxlen=self.config.max_task_story))
        self._note(record, f"launched on agent {agent.id} with {task.resources}")
        self._task_event(record, "master")
        framework.tasks[task.task_id] = record
        agent.tasks.add((framework.id, task.task_id))
        agent.used = agent.used + needed
        self._send(agent.peer, RunTask(framework=framework.info, task=self._for_agent(agent, task)))
        return remaining - needed

    def _task_problem(self, framework: FrameworkRecord, agent: AgentRecord, task: TaskInfo,
                      seen: set[str], remaining: Resources) -> tuple[str, Resources]:
        """Why `task` cannot launch ('' if it can), and what it takes from the offer."""
        if not task.task_id:
            return "task id is empty", EMPTY
        if task.task_id in framework.tasks or task.task_id in seen:
            return f"task id {task.task_id} is already in use", EMPTY
        if task.agent_id != agent.id:
            return f"task agent id {task.agent_id} is not the offer's agent {agent.id}", EMPTY
        if (task.command is None) == (task.executor is None):
            return "a task needs exactly one of command or executor", EMPTY
        if task.resources.is_empty():
            return "task resources are empty", EMPTY
        needed = task.resources
        if task.executor is not None:
            executor = task.executor
            if executor.framework_id not in (None, framework.id):
                return (f"executor {executor.executor_id} names framework "
                        f"{executor.framework_id}, not {framework.id}"), EMPTY
            running = agent.executors.get((framework.id, executor.executor_id))
            if running is not None and running != executor:
                return (f"executor {executor.executor_id} is already running on agent "
                        f"{agent.id} with a different ExecutorInfo"), EMPTY
            if running is None:
                try:
                    needed = needed + executor.resources
                except ResourcesError as exc:
                    return f"task and executor resources overlap: {exc}", EMPTY
        if not needed <= remaining:
            return (f"task needs {needed} but only {remaining or 'nothing'} remains "
                    "of the offered resources"), EMPTY
        return "", needed

    def _master_update(self, framework: FrameworkRecord, task_id: str, state: TaskState,
                       reason: str, message: str, agent_id: str, executor_id: str = "") -> None:
        """A status the master makes up itself: no uuid, so no acknowledgement."""
        if state.is_terminal:
            self._counters.inc(_task_counter(state))
        self.events.record(self._now, "task_state", framework_id=framework.id,
                           task_id=task_id, state=state.name, agent_id=agent_id,
                           source="master", reason=reason, message=message)
        self._to_framework(framework, Update(status=TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message,
            source=Source.MASTER, agent_id=agent_id, executor_id=executor_id,
            timestamp=self._now)))

    def _note(self, task: TaskRecord, text: str) -> None:
        task.story.append(f"{self._now:.3f} {text}")

    def _task_event(self, task: TaskRecord, source: str, reason: str = "") -> None:
        """Log `task`'s current state in the events log."""
        self.events.record(self._now, "task_state", framework_id=task.framework_id,
                           task_id=task.task_id, state=task.state.name,
                           agent_id=task.agent_id, source=source, reason=reason)

    def _end_task(self, framework: FrameworkRecord, task: TaskRecord, state: TaskState,
                  timestamp: float = 0.0) -> None:
        """A live task reached a terminal state: free its resources, keep it in the
        bounded completed list."""
        task.state = state
        task.statuses.append((state, timestamp or self._now))
        self._counters.inc(_task_counter(state))
        del framework.tasks[task.task_id]
        agent = self._agents[task.agent_id]
        agent.tasks.discard((framework.id, task.task_id))
        agent.used = agent.used - task.resources
        self._allocator.recover(agent.id, framework.id, task.resources)
        self._complete(framework, task)
        self._request_allocation()

    def _complete(self, framework: FrameworkRecord, task: TaskRecord) -> None:
        framework.completed.pop(task.task_id, None)
        framework.completed[task.task_id] = task
        while len(framework.completed) > self.config.max_completed_tasks:
            framework.completed.popitem(last=False)

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
        self._send(self._agents[task.agent_id].peer, KillTask(
            framework_id=framework.id, task_id=task.task_id,
            kill_grace_period=grace if grace is not None else task.kill_grace_period))

    def _operator_kill(self, call_id: int, request: KillLiveTask) -> Reply:
        """Like a framework's Kill, for an operator: the agent kills the task and
        the framework hears TASK_KILLED from it. Task ids are unique only per
        framework, so an id live in two needs `framework_id`."""
        task_id, wanted = request.task_id, request.framework_id
        owners = sorted(fid for fid, framework in self._frameworks.items()
                        if task_id in framework.tasks and wanted in (None, fid))
        if not owners:
            return self._refuse_call(call_id, NOT_FOUND, f"no live task {task_id}" + (
                f" in framework {wanted}" if wanted else ""))
        if len(owners) > 1:
            return self._refuse_call(call_id, CONFLICT, f"task id {task_id} is live in "
                                     f"frameworks {', '.join(owners)}; give framework_id")
        task = self._frameworks[owners[0]].tasks[task_id]
        self._counters.inc("master/operator_kills")
        self._note(task, "kill requested by an operator")
        self.events.record(self._now, "task_kill_requested", framework_id=task.framework_id,
                           task_id=task.task_id, agent_id=task.agent_id, by="operator")
        self._send(self._agents[task.agent_id].peer, KillTask(
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
            self._to_framework(framework, Update(status=self._status_of(task)))

    def _reconciled(self, framework: FrameworkRecord, task_id: str,
                    agent_id: str | None) -> TaskStatus | None:
        """The master's best knowledge of a task, as a reconciliation answer; None
        (no answer yet, as in Mesos) while the task may be on an agent that is
        still re-registering after a failover."""
        task = (framework.tasks.get(task_id) or framework.unreachable_tasks.get(task_id)
                or framework.completed.get(task_id))
        if task is not None:
            return self._status_of(task)
        if agent_id in self._recovering or (agent_id is None and self._recovering):
            return None
        aware = framework.info.partition_aware
        if agent_id in self._unreachable:
            return TaskStatus(task_id=task_id, state=(TaskState.TASK_UNREACHABLE if aware
                                                      else TaskState.TASK_LOST),
                              reason=Reason.RECONCILIATION, source=Source.MASTER,
                              message=f"agent {agent_id} is unreachable",
                              agent_id=agent_id or "", timestamp=self._now)
        unknown = TaskState.TASK_UNKNOWN if aware else TaskState.TASK_LOST
        return TaskStatus(task_id=task_id, state=unknown, reason=Reason.RECONCILIATION,
                          message="task is unknown to the master", source=Source.MASTER,
                          agent_id=agent_id or "", timestamp=self._now)

    def _status_of(self, task: TaskRecord) -> TaskStatus:
        return TaskStatus(task_id=task.task_id, state=task.state, reason=Reason.RECONCILIATION,
                          message="reconciliation", source=Source.MASTER,
                          agent_id=task.agent_id, executor_id=task.executor_id,
                          healthy=task.healthy, timestamp=self._now)

    def _on_acknowledge(self, peer: str, message: Acknowledge) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        if not message.uuid:
            self._refuse(peer, message, "nothing to acknowledge: the uuid is empty")
            return
        agent = self._agents.get(message.agent_id)
        if agent is None:
            self._refuse(peer, message, f"agent {message.agent_id} is not registered")
            return
        task = framework.tasks.get(message.task_id) or framework.completed.get(message.task_id)
        if task is not None:
            self._note(task, f"acknowledged {message.uuid}")
        self._send(agent.peer, StatusUpdateAck(agent_id=agent.id, framework_id=framework.id,
                                               task_id=message.task_id, uuid=message.uuid))

    def _on_framework_to_executor(self, peer: str, message: FrameworkToExecutor) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        agent = self._agents.get(message.agent_id)
        if agent is None:
            self._refuse(peer, message, f"agent {message.agent_id} is not registered")
            return
        self._send(agent.peer, message)

    # ================================================================ agents

    def _on_register_agent(self, peer: str, message: RegisterAgent) -> None:
        info = message.agent
        if not info.hostname:
            self._refuse(peer, message, "agent hostname is empty")
            return
        if info.id is None:
            self._register_new_agent(peer, message)
            return
        problem, restore = self._restore_plan(message)
        if problem:
            self._refuse(peer, message, problem)
            return
        agent = self._agents.get(info.id)
        if agent is not None and agent.info.resources != info.resources:
            self._refuse(peer, message,
                         f"agent {info.id} registered with {agent.total}, now reports "
                         f"{info.resources}; restart it without its id")
            return
        came_back = self._unreachable.pop(info.id, None) is not None
        if agent is None:
            agent = self._add_agent(peer, info)
        else:
            self._rebind_agent(agent, peer)
        agent.reregistered_time = self._now
        self._restore(agent, restore, kill_lost=came_back)
        self._send(peer, AgentRegistered(agent_id=agent.id, master_info=self.info,
                                         ping_interval=self.config.agent_ping_timeout))
        self._request_allocation()

    def _register_new_agent(self, peer: str, message: RegisterAgent) -> None:
        known = self._agent_by_peer.get(peer)
        if known is None:
            if message.tasks or message.executors:
                self._refuse(peer, message, "a first registration cannot carry tasks or "
                                            "executors; re-register with the agent id")
                return
            known = self._add_agent(peer, attrs.evolve(message.agent, id=self._ids.next("S"))).id
            self._request_allocation()
        # else: a retry whose answer crossed it on the wire; answer again.
        self._send(peer, AgentRegistered(agent_id=known, master_info=self.info,
                                         ping_interval=self.config.agent_ping_timeout))

    def _add_agent(self, peer: str, info: AgentInfo) -> AgentRecord:
        agent = AgentRecord(info=info, peer=peer, registered_time=self._now)
        if self._recovering.pop(agent.id, None) != info:  # else the registry has it
            self._persist()
        self._removals.pop(agent.id, None)
        self._drop_peer(peer)
        self._agents[agent.id] = agent
        self._agent_by_peer[peer] = agent.id
        self._allocator.add_agent(agent.id, info.resources)
        self._arm(PingDue(agent.id), self._now)
        self.events.record(self._now, "agent_registered", agent_id=agent.id,
                           hostname=info.hostname, url=info.url)
        return agent

    def _rebind_agent(self, agent: AgentRecord, peer: str) -> None:
        """A registered agent re-registers (it lost us, or restarted with its id)."""
        self._agent_by_peer.pop(agent.peer, None)
        self._drop_peer(peer)
        agent.peer = peer
        self._agent_by_peer[peer] = agent.id
        agent.awaiting_pong = False
        agent.missed_pongs = 0
        self._removals.pop(agent.id, None)
        for offer_id in sorted(agent.offers):  # the agent's view may have changed
            self._rescind(self._offers[offer_id], notify=True)

    def _drop_peer(self, peer: str) -> None:
        """A peer can be one agent only; a new registration from it replaces the old."""
        old = self._agent_by_peer.pop(peer, None)
        if old is not None and old in self._agents:
            self._agent_unreachable(self._agents[old])

    def _restore_plan(self, message: RegisterAgent) -> tuple[str, _Restore]:
        """Check a re-registration before touching any state: what to restore, or why not."""
        info = message.agent
        agent_id = info.id
        assert agent_id is not None
        agent = self._agents.get(agent_id)
        infos: dict[str, FrameworkInfo] = {}
        for framework_info in message.frameworks:
            if framework_info.id is None:
                return f"framework {framework_info.name!r} is reported without an id", _Restore()
            problem = _roles_problem(framework_info.roles)
            if problem:
                return f"framework {framework_info.id}: {problem}", _Restore()
            infos[framework_info.id] = framework_info
        plan = _Restore(infos=infos)
        seen: set[tuple[str, str]] = set()
        for task in message.tasks:
            key = (task.framework_id, task.task_id)
            if task.agent_id != agent_id:
                return f"task {task.task_id} is reported on agent {task.agent_id}", _Restore()
            if key in seen:
                return f"task {task.task_id} is reported twice", _Restore()
            seen.add(key)
            if task.state.is_terminal:
                continue
            if task.framework_id in self._completed_frameworks:
                plan.orphaned.add(task.framework_id)
                continue
            if task.framework_id not in self._frameworks and task.framework_id not in infos:
                return f"task {task.task_id} belongs to unreported framework {task.framework_id}", _Restore()
            framework = self._frameworks.get(task.framework_id)
            if framework is not None and task.task_id in framework.tasks:
                continue  # the master's record is newer than the report
            plan.tasks.append(task)
        executor_frameworks = {t.executor_id: t.framework_id for t in message.tasks}
        for executor in message.executors:
            framework_id = executor.framework_id or executor_frameworks.get(executor.executor_id)
            if framework_id is None:
                return f"executor {executor.executor_id} has no framework id", _Restore()
            if framework_id in self._completed_frameworks:
                plan.orphaned.add(framework_id)
                continue
            if framework_id not in self._frameworks and framework_id not in infos:
                return f"executor {executor.executor_id} belongs to unreported framework {framework_id}", _Restore()
            if agent is not None and (framework_id, executor.executor_id) in agent.executors:
                continue
            plan.executors.append((framework_id, executor))
        try:
            needed = agent.used if agent is not None else EMPTY
            for task in plan.tasks:
                needed = needed + task.resources
            for _, executor in plan.executors:
                needed = needed + executor.resources
        except ResourcesError as exc:
            return f"reported tasks and executors overlap: {exc}", _Restore()
        if not needed <= (agent.total if agent is not None else info.resources):
            return (f"reported tasks and executors use {needed}, more than the agent's "
                    f"{info.resources}"), _Restore()
        return "", plan

    def _restore(self, agent: AgentRecord, plan: _Restore, kill_lost: bool) -> None:
        """Take over what a re-registering agent runs. `kill_lost`: the agent comes
        back from unreachable, and non-partition-aware frameworks were told its tasks
        are lost (and may have replaced them), so those tasks are killed."""
        for framework_id in sorted(plan.orphaned):
            self._send(agent.peer, ShutdownFramework(framework_id=framework_id))
        for framework_id, info in plan.infos.items():
            if framework_id not in self._frameworks and framework_id not in self._completed_frameworks:
                framework = self._add_framework(info, active=False)
                framework.disconnected_time = self._now
                # Its driver needs 3 heartbeat intervals to notice that the master
                # changed and one more to subscribe here; a shorter failover timeout
                # (0 is the default) would kill its tasks before it could return.
                grace = max(info.failover_timeout, 4 * self.config.heartbeat_interval)
                self._arm(FailoverTimeout(framework_id), self._now + grace)
        for framework_id, executor in plan.executors:
            agent.executors[(framework_id, executor.executor_id)] = executor
            agent.used = agent.used + executor.resources
            self._allocator.update_used(agent.id, framework_id, executor.resources)
        for task in plan.tasks:
            framework = self._frameworks[task.framework_id]
            record = _record_from_report(task, self.config.max_task_story, self._now)
            self._note(record, f"restored from agent {agent.id} re-registration")
            framework.unreachable_tasks.pop(task.task_id, None)
            framework.tasks[task.task_id] = record
            agent.tasks.add((framework.id, task.task_id))
            agent.used = agent.used + task.resources
            self._allocator.update_used(agent.id, framework.id, task.resources)
            if kill_lost and not framework.info.partition_aware:
                self._note(record, "killed: it was reported lost while its agent was unreachable")
                self._send(agent.peer, KillTask(framework_id=framework.id, task_id=task.task_id,
                                                kill_grace_period=record.kill_grace_period))
            elif kill_lost:  # it was reported TASK_UNREACHABLE: give the real state back
                self._to_framework(framework, Update(status=self._status_of(record)))

    def _on_pong(self, peer: str, message: Pong) -> None:
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is not None:
            agent.awaiting_pong = False
            agent.missed_pongs = 0
            if agent.id in self._removals:
                del self._removals[agent.id]
                self._counters.inc("master/agent_removals_cancelled")

    def _ping_due(self, agent_id: str) -> None:
        agent = self._agents.get(agent_id)
        if agent is None:
            return
        if agent.awaiting_pong:
            agent.missed_pongs += 1
            if (agent.missed_pongs >= self.config.max_agent_ping_timeouts
                    and self._removal_permitted(agent.id)):
                self._agent_unreachable(agent)
                return
            # else: waiting for a removal permit; a pong meanwhile cancels it
        agent.awaiting_pong = True
        self._send(agent.peer, Ping(agent_id=agent.id))
        self._arm(PingDue(agent.id), self._now + self.config.agent_ping_timeout)

    def _agent_unreachable(self, agent: AgentRecord) -> None:
        """Stop counting on the agent: rescind its offers, report its tasks lost
        (unreachable for partition-aware frameworks), drop its resources."""
        for offer_id in sorted(agent.offers):
            self._rescind(self._offers[offer_id], notify=True)
        for framework_id, task_id in sorted(agent.tasks):
            framework = self._frameworks[framework_id]
            task = framework.tasks.pop(task_id)
            state = (TaskState.TASK_UNREACHABLE if framework.info.partition_aware
                     else TaskState.TASK_LOST)
            task.state = state
            task.statuses.append((state, self._now))
            self._note(task, f"agent {agent.id} unreachable")
            if state is TaskState.TASK_UNREACHABLE:
                framework.unreachable_tasks[task_id] = task
            else:
                self._complete(framework, task)
            self._master_update(framework, task_id, state, Reason.AGENT_UNREACHABLE,
                                f"agent {agent.id} is unreachable", agent.id, task.executor_id)
        self._allocator.remove_agent(agent.id)
        del self._agents[agent.id]
        if self._agent_by_peer.get(agent.peer) == agent.id:
            del self._agent_by_peer[agent.peer]
        self._cancel(PingDue(agent.id))
        self._mark_unreachable(agent.info)

    def _mark_unreachable(self, info: AgentInfo) -> None:
        """Remember an agent as unreachable (persisted) and tell every framework."""
        assert info.id is not None
        self._removals.pop(info.id, None)
        self._unreachable[info.id] = UnreachableAgent(info=info, since=self._now)
        self.events.record(self._now, "agent_unreachable", agent_id=info.id,
                           hostname=info.hostname)
        while len(self._unreachable) > self.config.max_unreachable_agents:
            self._unreachable.popitem(last=False)
        self._persist()
        for framework in self._frameworks.values():
            self._to_framework(framework, Failure(agent_id=info.id))

    def _on_status_update(self, peer: str, message: StatusUpdate) -> None:
        agent = self._sending_agent(peer, message, message.status.agent_id or None)
        if agent is None:
            return
        self._counters.inc("master/status_updates")
        status = message.status
        if not status.agent_id:
            status = attrs.evolve(status, agent_id=agent.id)
        framework = self._frameworks.get(message.framework_id)
        if framework is None:
            if message.framework_id in self._completed_frameworks and status.uuid:
                # Nobody will ever acknowledge it; do so, or the agent retries forever.
                self._send(peer, StatusUpdateAck(agent_id=agent.id,
                                                 framework_id=message.framework_id,
                                                 task_id=status.task_id, uuid=status.uuid))
            else:
                self._refuse(peer, message, f"unknown framework {message.framework_id}")
            return
        task = framework.tasks.get(status.task_id)
        if task is not None:
            if task.agent_id != agent.id:
                self._refuse(peer, message,
                             f"task {task.task_id} runs on agent {task.agent_id}, not "
                             f"{agent.id}; story: {' | '.join(task.story)}")
                return
            self._note(task, f"{status.state.name} from {status.source or 'agent'} ({status.uuid})")
            task.healthy = status.healthy
            if status.executor_id:
                task.executor_id = status.executor_id
            if status.state.is_terminal:
                self._end_task(framework, task, status.state, status.timestamp)
            else:
                task.state = status.state
                task.statuses.append((status.state, status.timestamp or self._now))
            self._task_event(task, status.source or "agent", status.reason)
        # Forwarded even for tasks no longer live: a retried terminal update must
        # reach the framework again, or the agent never gets its acknowledgement.
        self._to_framework(framework, Update(status=status))

    def _on_executor_to_framework(self, peer: str, message: ExecutorToFramework) -> None:
        if self._sending_agent(peer, message, message.agent_id) is None:
            return
        framework = self._frameworks.get(message.framework_id)
        if framework is None:
            self._refuse(peer, message, f"unknown framework {message.framework_id}")
            return
        self._to_framework(framework, message)  # best effort, like Mesos

    def _on_usage_report(self, peer: str, message: UsageReport) -> None:
        """Record what each executor uses on its tasks (`/state` shows it beside what
        they were given) and which URIs the agent's fetcher cache holds."""
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is None:
            return
        self._cached_uris[agent.id] = sorted(set(message.cached_uris))
        for usage in message.executors:
            framework = self._frameworks.get(usage.framework_id)
            for task_id in usage.task_ids:
                task = framework.tasks.get(task_id) if framework else None
                if task is not None and task.agent_id == agent.id:
                    task.usage = {
                        "executor_id": usage.executor_id, "tasks_sharing": len(usage.task_ids),
                        "timestamp": usage.timestamp, "cpus_used": usage.cpus_used,
                        "cpus_limit": usage.cpus_limit,
                        "mem_rss_mb": round(usage.mem_rss_bytes / 2 ** 20, 1),
                        "mem_limit_mb": round(usage.mem_limit_bytes / 2 ** 20, 1),
                        "cpus_throttled_time_secs": usage.cpus_throttled_time_secs}

    def _on_drain_agent(self, peer: str, message: DrainAgent) -> None:
        """The agent is draining (its tasks are being killed): offer nothing more."""
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is None or agent.id in self._drained:
            return
        self._drained.add(agent.id)
        self._counters.inc("master/agents_drained")
        for offer_id in sorted(agent.offers):
            self._rescind(self._offers[offer_id], notify=True)

    def _on_executor_exited(self, peer: str, message: ExecutorExited) -> None:
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is None:
            return
        executor = agent.executors.pop((message.framework_id, message.executor_id), None)
        if executor is not None:
            agent.used = agent.used - executor.resources
            self._allocator.recover(agent.id, message.framework_id, executor.resources)
            self._request_allocation()
        framework = self._frameworks.get(message.framework_id)
        if framework is not None:
            self._to_framework(framework, Failure(agent_id=agent.id,
                                                  executor_id=message.executor_id,
                                                  status=message.status))

    # ====================================================== registry, recovery

    def restore(self, agents: Iterable[AgentInfo], unreachable: Iterable[UnreachableAgent],
                weights: Mapping[str, float], quotas: Mapping[str, Quota],
                now: float) -> list[Effect]:
        """Call once, before any event, with what the registry held. Admitted agents
        become *recovering*: none of their resources are offered until they
        re-register (with their tasks), and those still away after
        `agent_reregister_timeout` are marked unreachable. Raises `PolicyError`
        if the weights or quota are invalid."""
        self._now = now
        self._out = []
        self._apply_weights(weights)
        self._apply_quota(quotas)
        for entry in unreachable:
            if entry.info.id is not None:
                self._unreachable[entry.info.id] = entry
        for info in agents:
            if info.id is not None and info.id not in self._unreachable:
                self._recovering[info.id] = info
        if self._recovering:
            self._arm(ReregisterTimeout(), now + self.config.agent_reregister_timeout)
        out, self._out = self._out, []
        return out

    def admitted_agents(self) -> list[AgentInfo]:
        """The registry's admitted agents: registered ones and recovering ones."""
        return [agent.info for agent in self._agents.values()] + list(self._recovering.values())

    def unreachable_agents(self) -> list[UnreachableAgent]:
        return list(self._unreachable.values())

    def _recovery_timed_out(self) -> None:
        for agent_id in sorted(self._recovering):
            if self._removal_permitted(agent_id):
                self._recovered_unreachable(agent_id)

    def _recovered_unreachable(self, agent_id: str) -> None:
        """A registry agent did not re-register in time. Its tasks were never
        learned; frameworks find out through `agent_lost` and reconciliation."""
        info = self._recovering.pop(agent_id)
        self._counters.inc("master/recovery_agents_unreachable")
        self._mark_unreachable(info)

    def _removal_permitted(self, agent_id: str) -> bool:
        """May `agent_id` be marked unreachable now? If not, it joins the queue
        that `RemovalDue` drains at the configured rate."""
        rate = self.config.agent_removal_rate
        if rate is None:
            return True
        if agent_id in self._removals:
            return False
        if self._removals or self._now < self._next_removal:
            self._removals[agent_id] = None
            self._counters.inc("master/agent_removals_deferred")
            if len(self._removals) == 1:
                self._arm(RemovalDue(), max(self._now, self._next_removal))
            return False
        self._spend_removal_permit(rate)
        return True

    def _spend_removal_permit(self, rate: tuple[int, float]) -> None:
        permits, seconds = rate
        self._next_removal = self._now + seconds / permits

    def _removal_due(self) -> None:
        """Spend one permit on the oldest queued agent that is still failing."""
        while self._removals:
            agent_id, _ = self._removals.popitem(last=False)
            agent = self._agents.get(agent_id)
            failing = (agent is not None
                       and agent.missed_pongs >= self.config.max_agent_ping_timeouts)
            if failing or agent_id in self._recovering:
                assert self.config.agent_removal_rate is not None
                self._spend_removal_permit(self.config.agent_removal_rate)
                if agent is not None:
                    self._agent_unreachable(agent)
                else:
                    self._recovered_unreachable(agent_id)
                break
        if self._removals:
            self._arm(RemovalDue(), self._next_removal)

    # ================================================================ timers

    def _timer(self, key: Hashable) -> None:
        """Dispatch a timer. Stale keys (the thing is gone) are ignored: a shell may
        deliver a timer that raced its cancellation."""
        match key:
            case Allocate():
                # Never second-guess the shell's timing: skipping an early-fired run
                # would also skip re-arming, and allocation would stop for good.
                self._allocate()
            case OfferTimeout(offer_id=offer_id):
                self._offer_expired(offer_id)
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
            case _:
                raise UnknownTimer("MasterState", key)

    # ============================================================== checking

    def validate(self) -> None:
        """Check every invariant; raise `InvariantError` listing all violations.
        Expensive; tests call it after every step."""
        errors: list[str] = []
        for offer in self._offers.values():
            framework = self._frameworks.get(offer.framework_id)
            if framework is None or framework.peer is None:
                errors.append(f"offer {offer.id} is held by unconnected framework {offer.framework_id}")
            elif offer.id not in framework.offers:
                errors.append(f"offer {offer.id} missing from framework {framework.id}")
            agent = self._agents.get(offer.agent_id)
            if agent is None:
                errors.append(f"offer {offer.id} is for unregistered agent {offer.agent_id}")
            elif offer.id not in agent.offers:
                errors.append(f"offer {offer.id} missing from agent {agent.id}")
        for framework in self._frameworks.values():
            agents = [self._offers[o].agent_id for o in framework.offers if o in self._offers]
            if len(agents) != len(framework.offers):
                errors.append(f"framework {framework.id} lists offers that do not exist")
            if len(agents) != len(set(agents)):
                errors.append(f"framework {framework.id} holds two offers for one agent")
            for task in framework.tasks.values():
                agent = self._agents.get(task.agent_id)
                if agent is None or (framework.id, task.task_id) not in agent.tasks:
                    errors.append(f"task {task.task_id} is not on its agent {task.agent_id}; "
                                  f"story: {' | '.join(task.story)}")
                if task.state.is_terminal:
                    errors.append(f"live task {task.task_id} is {task.state.name}")
        for agent_id in self._recovering:
            if agent_id in self._agents:
                errors.append(f"agent {agent_id} is both registered and recovering")
        for peer, agent_id in self._agent_by_peer.items():
            if agent_id not in self._agents or self._agents[agent_id].peer != peer:
                errors.append(f"peer {peer} maps to agent {agent_id}, which is not on it")
        for agent in self._agents.values():
            errors.extend(self._agent_problems(agent))
        if errors:
            raise InvariantError("\n".join(errors))

    def _agent_problems(self, agent: AgentRecord) -> list[str]:
        errors: list[str] = []
        if self._agent_by_peer.get(agent.peer) != agent.id:
            errors.append(f"agent {agent.id} is not reachable through its peer")
        offered: dict[str, Resources] = {}
        used: dict[str, Resources] = {}
        try:
            for offer_id in agent.offers:
                offer = self._offers[offer_id]
                offered[offer.framework_id] = offered.get(offer.framework_id, EMPTY) + offer.resources
            for framework_id, task_id in agent.tasks:
                task = self._frameworks[framework_id].tasks[task_id]
                used[framework_id] = used.get(framework_id, EMPTY) + task.resources
            for (framework_id, _), executor in agent.executors.items():
                used[framework_id] = used.get(framework_id, EMPTY) + executor.resources
            total_offered = sum(offered.values(), EMPTY)
            total_used = sum(used.values(), EMPTY)
            free = agent.total - total_offered - total_used
        except (ResourcesError, KeyError) as exc:
            return [f"agent {agent.id}: resources held twice or records dangling: {exc!r}"]
        if total_offered != agent.offered:
            errors.append(f"agent {agent.id}: offered {agent.offered} but offers sum to {total_offered}")
        if total_used != agent.used:
            errors.append(f"agent {agent.id}: used {agent.used} but tasks and executors sum to {total_used}")
        if self._allocator.free(agent.id) != free:
            errors.append(f"agent {agent.id}: allocator has {self._allocator.free(agent.id)} "
                          f"free, master has {free}")
        for framework_id in set(offered) | set(used) | set(self._frameworks):
            mine = offered.get(framework_id, EMPTY) + used.get(framework_id, EMPTY)
            theirs = self._allocator.allocated(agent.id, framework_id)
            if mine != theirs:
                errors.append(f"agent {agent.id}: framework {framework_id} holds {mine}, "
                              f"allocator says {theirs}")
        return errors

    # ========================================================== observability

    def snapshot(self) -> dict[str, Any]:
        """The `/state` document, with Mesos' field names where Mesos has them."""
        pid = f"master@{self.info.ip}:{self.info.zmq_port}"
        agents = [self._agent_json(agent) for agent in self._agents.values()]
        return {
            "id": self.info.id,
            "pid": pid,
            "hostname": self.info.hostname,
            "leader": pid,
            "leader_info": to_json(self.info),
            "version": self.info.version,
            "start_time": self.start_time,
            "elected_time": self.start_time,
            "activated_slaves": len(self._agents),
            "deactivated_slaves": 0,
            "unreachable_slaves": len(self._unreachable),
            "agents": agents,
            "slaves": agents,
            "recovering_agents": [
                {"id": aid, "hostname": info.hostname} for aid, info in self._recovering.items()],
            "unreachable_agents": [
                {"id": aid, "hostname": u.info.hostname, "since": u.since}
                for aid, u in self._unreachable.items()],
            "frameworks": [self._framework_json(f) for f in self._frameworks.values()],
            "roles": self.roles_json(),
            "completed_frameworks": [
                _completed_framework_json(c) for c in self._completed_frameworks.values()],
        }

    def _agent_json(self, agent: AgentRecord) -> dict[str, Any]:
        return {
            "id": agent.id, "hostname": agent.info.hostname, "port": agent.info.port,
            "url": agent.info.url, "pid": f"agent@{agent.info.ip or agent.info.hostname}:{agent.info.port}",
            "resources": resources_json(agent.total),
            "used_resources": resources_json(agent.used),
            "offered_resources": resources_json(agent.offered),
            "unreserved_resources": resources_json(agent.total.unreserved()),
            "reserved_resources": {role: resources_json(agent.total.reserved(role))
                                   for role in sorted(agent.total.roles() - {UNRESERVED})},
            "dynamic_reservations": str(agent.reservations),
            "attributes": dict(agent.info.attributes),
            "registered_time": agent.registered_time,
            "reregistered_time": agent.reregistered_time,
            "active": True,
            "drained": agent.id in self._drained,
            "cached_uris": list(self._cached_uris.get(agent.id, ())),
        }

    def _framework_json(self, framework: FrameworkRecord) -> dict[str, Any]:
        """One entry of `frameworks`; `completed_frameworks` entries have the same keys."""
        used = [task.resources for task in framework.tasks.values()]
        executors = []
        for agent in self._agents.values():
            for (fid, eid), executor in agent.executors.items():
                if fid == framework.id:
                    used.append(executor.resources)
                    executors.append({"executor_id": eid, "agent_id": agent.id,
                                      "resources": resources_json(executor.resources)})
        offers = [self._offers[oid] for oid in sorted(framework.offers)]
        info = framework.info
        return {
            "id": framework.id, "name": info.name, "roles": list(info.roles),
            "user": info.user, "hostname": info.hostname, "principal": info.principal,
            "webui_url": info.webui_url, "failover_timeout": info.failover_timeout,
            "capabilities": list(info.capabilities),
            "active": framework.peer is not None, "connected": framework.peer is not None,
            "suppressed": framework.suppressed,
            "registered_time": framework.registered_time,
            "unregistered_time": framework.disconnected_time,
            "used_resources": resources_json(*used),
            "offered_resources": resources_json(*(offer.resources for offer in offers)),
            "dominant_share": self._allocator.share(framework.id),
            "tasks": [_task_json(t) for t in framework.tasks.values()],
            "unreachable_tasks": [_task_json(t) for t in framework.unreachable_tasks.values()],
            "completed_tasks": [_task_json(t) for t in framework.completed.values()],
            "offers": [{"id": o.id, "framework_id": o.framework_id, "agent_id": o.agent_id,
                        "hostname": o.hostname, "resources": resources_json(o.resources)}
                       for o in offers],
            "executors": executors,
        }

    def metrics(self) -> dict[str, float]:
        """Flat counters and gauges for `/metrics/snapshot`."""
        result: dict[str, float] = {name: 0 for name in _ZERO_COUNTERS}
        result.update(self._counters.items())
        live: collections.Counter[TaskState] = collections.Counter()
        unreachable = 0
        connected = 0
        for framework in self._frameworks.values():
            live.update(task.state for task in framework.tasks.values())
            unreachable += len(framework.unreachable_tasks)
            connected += framework.peer is not None
        for state in (TaskState.TASK_STAGING, TaskState.TASK_STARTING,
                      TaskState.TASK_RUNNING, TaskState.TASK_KILLING):
            result[_task_counter(state)] = live[state]
        result["master/tasks_unreachable"] = unreachable
        for kind in SHARE_KINDS:
            result[f"master/{kind}_total"] = sum(a.total.get(kind) for a in self._agents.values())
            result[f"master/{kind}_used"] = sum(a.used.get(kind) for a in self._agents.values())
            result[f"master/{kind}_offered"] = sum(a.offered.get(kind) for a in self._agents.values())
        result.update({
            "master/agents_active": len(self._agents),
            "master/agents_unreachable": len(self._unreachable),
            "master/agents_recovering": len(self._recovering),
            "master/frameworks_active": connected,
            "master/frameworks_connected": connected,
            "master/frameworks_disconnected": len(self._frameworks) - connected,
            "master/frameworks_completed": len(self._completed_frameworks),
            "master/outstanding_offers": len(self._offers),
            "allocator/agents_considered": self._allocator.last_considered,
            "allocator/allocation_run_ms": self._allocation_ms.last,
            "allocator/allocation_run_ms_p50": self._allocation_ms.percentile(50),
            "allocator/allocation_run_ms_p99": self._allocation_ms.percentile(99),
        })
        for role, share in self._allocator.role_shares().items():
            result[f"allocator/roles/{role}/shares/dominant"] = share
        return result


# ------------------------------------------------------------------------- helpers


@attrs.define
class _Restore:
    """What a re-registration brings back, checked before anything is changed."""

    infos: dict[str, FrameworkInfo] = attrs.field(factory=dict)
    tasks: list[Task] = attrs.field(factory=list)
    executors: list[tuple[str, ExecutorInfo]] = attrs.field(factory=list)
    orphaned: set[str] = attrs.field(factory=set)  # torn-down frameworks still running


_MAX_STATUSES = 32  # per task; an agent cannot grow a record without bound

_ZERO_COUNTERS = (
    "master/messages_received", "master/messages_invalid", "master/messages_rejected",
    "master/status_updates", "master/offers_sent", "master/offers_declined",
    "master/offers_rescinded", "master/offers_accepted", "allocator/allocation_runs",
    "master/operator_kills",
    "master/tasks_finished", "master/tasks_failed", "master/tasks_killed",
    "master/tasks_lost", "master/tasks_error", "master/tasks_dropped", "master/tasks_gone",
    "master/tasks_unknown", "master/agent_removals_deferred",
    "master/agent_removals_cancelled", "master/recovery_agents_unreachable",
)


def _task_counter(state: TaskState) -> str:
    return "master/tasks_" + state.name.removeprefix("TASK_").lower()


def _roles_problem(roles: Iterable[str]) -> str:
    """Why a framework's roles are unusable ('' if fine). A role is valid exactly
    when a resource can be reserved to it."""
    roles = list(roles)
    if not roles:
        return "a framework needs at least one role"
    for role in roles:
        try:
            Resources.parse(f"cpus({role}):1")
        except ResourcesError:
            return f"invalid role {role!r}"
    return ""


def _record_from_report(task: Task, story: int, now: float) -> TaskRecord:
    return TaskRecord(
        task_id=task.task_id, framework_id=task.framework_id, agent_id=task.agent_id,
        executor_id=task.executor_id, name=task.name, resources=task.resources,
        state=task.state, labels=dict(task.labels), kill_grace_period=None,
        statuses=collections.deque([(task.state, now)], maxlen=_MAX_STATUSES),
        story=collections.deque(maxlen=story))


def resources_json(*parts: Resources) -> dict[str, float | str]:
    """Resources as `/state` shows them: scalars summed over roles (and over
    `parts`) as floats, the DRF kinds always present; ranges as Mesos'
    ``"[31000-32000]"`` text. Parts may come from different agents, so their
    ranges are united rather than added (each agent has its own port 31000)."""
    scalars: collections.Counter[str] = collections.Counter()
    ranges: dict[str, list[tuple[int, int]]] = {}
    for resources in parts:
        scalars.update(resources.scalar_items())
        for name in resources.names() - set(resources.scalar_items()):
            ranges.setdefault(name, []).extend(resources.ranges(name))
    out: dict[str, float | str] = {kind: 0.0 for kind in SHARE_KINDS}
    out.update({name: milli / 1000 for name, milli in scalars.items()})
    for name in sorted(ranges):
        out[name] = "[" + ",".join(f"{b}-{e}" for b, e in _union(ranges[name])) + "]"
    return out


def _union(pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(pieces):
        if merged and begin <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


def _completed_framework_json(framework: CompletedFramework) -> dict[str, Any]:
    info = framework.info
    return {
        "id": info.id, "name": info.name, "roles": list(info.roles), "user": info.user,
        "hostname": info.hostname, "principal": info.principal, "webui_url": info.webui_url,
        "failover_timeout": info.failover_timeout, "capabilities": list(info.capabilities),
        "active": False, "connected": False, "suppressed": False,
        "registered_time": framework.registered_time,
        "unregistered_time": framework.removed_time, "removal_reason": framework.reason,
        "used_resources": resources_json(), "offered_resources": resources_json(),
        "dominant_share": 0.0, "tasks": [], "unreachable_tasks": [],
        "completed_tasks": [_task_json(t) for t in framework.tasks], "offers": [],
        "executors": [],
    }


def _task_json(task: TaskRecord) -> dict[str, Any]:
    return {
        "id": task.task_id, "name": task.name, "framework_id": task.framework_id,
        "agent_id": task.agent_id, "slave_id": task.agent_id, "executor_id": task.executor_id,
        "state": task.state.name, "resources": resources_json(task.resources),
        "labels": dict(task.labels),
        "statuses": [{"state": s.name, "timestamp": t} for s, t in task.statuses],
        "healthy": task.healthy, "usage": task.usage,
    }
