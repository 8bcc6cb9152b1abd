"""The master core's vocabulary: its configuration, the events it handles, the
effects it returns, its timer keys and the records it keeps.

Everything here is plain data. `MasterState` (master/state.py) is the only thing
that changes the records; `views`, `invariants` and `restore` read them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import attrs

from dyad.authz import Acls
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey
from dyad.messages import (
    AgentInfo, ExecutorInfo, FrameworkInfo, Message, MessageError, TaskState,
)
from dyad.resources import Resources, is_valid_role
from dyad.volumes import DynamicResources, total_of
from master.allocator.preemption import PreemptionConfig
from master.events import DEFAULT_CAPACITY as DEFAULT_EVENTS
from master.offer_frames import DEFAULT_BUDGET as OFFERS_FRAME_BUDGET
from master.operator import OperatorCall, Reply
from master.usage_rows import RecordUsage

EMPTY = Resources()
VERSION = "0.1.0"
MAX_STATUSES = 32  # per task; an agent cannot grow a record without bound


# --------------------------------------------------------------------------- effects


@attrs.frozen
class PersistRegistry:
    """What the registry holds changed (admitted or unreachable agents, weights,
    quota, agents' dynamic reservations and volumes): the shell writes `snapshot_of(state)` soon, coalescing a burst of
    these into one write (every write is the whole registry)."""


Effect = Send | ArmTimer | CancelTimer | PersistRegistry | Reply | RecordUsage


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
    # Most bytes in one Offers frame: a pass's offers to a framework are split.
    offers_frame_bytes: int = OFFERS_FRAME_BUDGET
    # Emit `RecordUsage` rows for the usage store (master/usage_rows.py); the shell
    # sets it when it has a store, so without one the core builds no rows.
    record_usage: bool = False
    # Seconds the core gathers task events before it hands them over as one
    # `RecordUsage` (`UsageDue`); 0: at the end of every step.
    usage_batch: float = 0.05
    # Offer what agents lend (master/revocable.py) to frameworks that opt in.
    oversubscription: bool = True
    preemption: PreemptionConfig = PreemptionConfig()  # master/preempting.py; off by default
    # Tasks in flight (launched, not yet heard of; offers out, as the tasks they
    # are expected to become) beyond which a pass's offers wait (master/admission.py);
    # 0: off, every offer goes out at once. dyad-master turns it on.
    admission_limit: int = 0
    # Who may do what (master/authorization.py); open: security is off.
    acls: Acls = attrs.field(factory=Acls.open)


# ------------------------------------------------------------------------ timer keys


@attrs.frozen
class Allocate(TimerKey):
    """The next allocation pass (periodic, or early after something was freed)."""


@attrs.frozen
class OfferTimeout(TimerKey):
    """The offers sent together (an allocation pass's, or those admission let go
    at once; so all due at once) have been outstanding for the offer timeout;
    `offer_id` is the group's first. One timer per group, not per offer: a pass
    offering a thousand agents arms one."""

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
class UsageDue(TimerKey):
    """The task events gathered for the usage store go (`MasterConfig.usage_batch`)."""


@attrs.frozen
class Received:
    peer: str
    message: Message
    principal: str | None = None  # ZAP's name for the sender; None: no authentication


@attrs.frozen
class InvalidFrame:
    peer: str
    error: MessageError


@attrs.frozen
class AllocationTimed:
    """How long the last allocation run took, measured by the shell: the core
    stays deterministic by never reading a perf counter itself."""

    seconds: float


Event = Received | InvalidFrame | TimerFired | AllocationTimed | OperatorCall


class InvariantError(AssertionError):
    """`validate()` found the master's books inconsistent (a bug, never input)."""


# --------------------------------------------------------------------------- records


@attrs.define(eq=False)
class MasterTask:
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
    story: collections.deque[tuple[float, str, tuple[object, ...]]]  # `tasks.story_lines`
    healthy: bool | None = None
    usage: dict[str, Any] | None = None  # latest UsageReport of its executor
    priority: int = 100  # dyad/priority.py
    revocable: bool = False  # runs on revocable resources: not in `used`, DRF or quota
    usage_told: bool = False  # the usage store has its facts (master.books._usage_row)


@attrs.define(eq=False)
class MasterFramework:
    info: FrameworkInfo  # always with its id set
    registered_time: float
    peer: str | None = None  # the owning connection; None = disconnected
    last_seen: float = 0.0
    suppressed: bool = False
    disconnected_time: float | None = None
    tasks: dict[str, MasterTask] = attrs.field(factory=dict)
    # Tasks of partition-aware frameworks on agents that became unreachable.
    unreachable_tasks: dict[str, MasterTask] = attrs.field(factory=dict)
    completed: collections.OrderedDict[str, MasterTask] = attrs.field(factory=collections.OrderedDict)
    offers: set[str] = attrs.field(factory=set)

    @property
    def id(self) -> str:
        assert self.info.id is not None
        return self.info.id


@attrs.define(eq=False)
class MasterAgent:
    info: AgentInfo  # always with its id set
    peer: str
    registered_time: float
    reregistered_time: float | None = None
    offered: Resources = EMPTY
    used: Resources = EMPTY
    offers: set[str] = attrs.field(factory=set)
    tasks: set[tuple[str, str]] = attrs.field(factory=set)  # (framework id, task id)
    # Change through `add_executor` and `remove_executor`, which keep `executor_ids`.
    executors: dict[tuple[str, str], ExecutorInfo] = attrs.field(factory=dict)
    # Executor ids by framework id, in `executors`' order: an offer lists its
    # framework's, and a framework's removal finds them, without a scan of every
    # executor on the agent.
    executor_ids: dict[str, dict[str, None]] = attrs.field(factory=dict)
    awaiting_pong: bool = False
    missed_pongs: int = 0
    # Liveness (master/agents.py): the agent declared LIVENESS_CAPABILITY (any frame
    # from it is as good as a pong, and a frame from us proves us alive to it);
    # whether it spoke to us, and we to it, since its last ping tick.
    any_frame_liveness: bool = False
    ack_batches: bool = False  # it takes StatusUpdateAcks (ACK_BATCH_CAPABILITY)
    heard: bool = False
    told: bool = False
    # What offer operations changed (dynamic reservations, persistent volumes);
    # the registry and the agent's checkpoint keep it too (dyad/volumes.py).
    dynamic: DynamicResources = attrs.field(factory=DynamicResources)
    # Oversubscription (master/revocable.py): what the agent lends, and what of it
    # offers and revocable tasks hold; none of it is in `offered`, `used` or the
    # allocator. `reservation` is the agent's estimate of what its tasks reserve.
    revocable: Resources = EMPTY
    revocable_offered: Resources = EMPTY
    revocable_used: Resources = EMPTY
    reservation: Resources = EMPTY

    def add_executor(self, framework_id: str, executor: ExecutorInfo) -> None:
        """The framework's executor runs here (replacing what was known of it)."""
        self.executors[(framework_id, executor.executor_id)] = executor
        self.executor_ids.setdefault(framework_id, {})[executor.executor_id] = None

    def remove_executor(self, framework_id: str, executor_id: str) -> ExecutorInfo | None:
        """The framework's executor is gone from here (None if it was not known)."""
        executor = self.executors.pop((framework_id, executor_id), None)
        if executor is not None:
            ids = self.executor_ids[framework_id]
            del ids[executor_id]
            if not ids:
                del self.executor_ids[framework_id]
        return executor

    @property
    def id(self) -> str:
        assert self.info.id is not None
        return self.info.id

    @property
    def reservations(self) -> Resources:
        """The dynamic reservations, volumes' disk included."""
        return self.dynamic.reservations

    @property
    def total(self) -> Resources:
        """What the master offers from: static resources with dynamic reservations."""
        return total_of(self.info.resources, self.dynamic)


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
    tasks: tuple[MasterTask, ...]


# ------------------------------------------------------------------------- helpers


def task_counter(state: TaskState) -> str:
    return "master/tasks_" + state.name.removeprefix("TASK_").lower()


def roles_problem(roles: Iterable[str]) -> str:
    """Why a framework's roles are unusable ('' if fine). A role is valid exactly
    when a resource can be reserved to it."""
    roles = list(roles)
    if not roles:
        return "a framework needs at least one role"
    for role in roles:
        if not is_valid_role(role):
            return f"invalid role {role!r}"
    return ""
