"""The master's books: every record `MasterState` keeps, and the bookkeeping
every handler shares -- effects out, refusals, who is asking, adding and
removing frameworks, offers held and returned, tasks ended and completed.

`MasterBooks` is the base of the master core (master/state.py); it handles no
event itself. Keeping these primitives in one place is what keeps the books
consistent: every change of an agent's `offered`/`used` goes through them, and
`validate()` (master/invariants.py) checks the result after every step in tests.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from dyad.effects import ArmTimer, CancelTimer, Send, TimerKey
from dyad.ids import IdGenerator
from dyad.messages import (
    AgentInfo, CheckpointResources, FrameworkInfo, KillTask, MasterInfo, Message, Offer,
    Rejected, Rescind, ShutdownFramework, Source, TaskState, TaskStatus, Update,
)
from dyad.resources import UNRESERVED
from dyad.volumes import DynamicResources
from master import invariants, views
from master.admission import Admission
from master.allocator import (
    Allocator, HierarchicalAllocator, PolicyError, Quota, check_quotas, parse_weights,
    role_problem,
)
from master.events import EventLog
from master.metrics import LATENCY_BOUNDS, Counters, Histogram, Window
from master.model import (
    EMPTY, Allocate, CompletedFramework, Effect, FailoverTimeout, HeartbeatDue, MasterAgent,
    MasterConfig, MasterFramework, MasterTask, OfferTimeout, PersistRegistry,
    UnreachableAgent, UsageDue, task_counter,
)
from master.removals import RemovalLimiter
from master.usage.schema import TERMINAL_STATES, EventItem, StateRow
from master.usage_rows import RecordUsage, task_facts

TASK_STATE_FIELDS = StateRow._fields
"""A `task_state` entry's fields in the events log, in order: its values are the
`StateRow` the usage store is sent (`_task_event`, `_master_update`)."""
TASK_COUNTERS = {state.name: task_counter(state) for state in TaskState}
"""`task_counter` of each state, by name: made once, not once a task."""


class MasterBooks:
    """The records and shared bookkeeping of the master core (see the module
    docstring). Collections are public for reading (views, invariants, restore
    planning); only the core's handlers change them."""

    def __init__(self, config: MasterConfig, info: MasterInfo, ids: IdGenerator,
                 start_time: float = 0.0, allocator: Allocator | None = None) -> None:
        self.config = config
        self.info = info
        self.start_time = start_time
        self._ids = ids
        self.allocator: Allocator = allocator or HierarchicalAllocator(
            {"cpus": config.min_allocatable_cpus, "mem": config.min_allocatable_mem})
        self.frameworks: dict[str, MasterFramework] = {}
        self.completed_frameworks: collections.OrderedDict[str, CompletedFramework] = \
            collections.OrderedDict()
        self.agents: dict[str, MasterAgent] = {}
        self.agent_by_peer: dict[str, str] = {}
        self.unreachable: collections.OrderedDict[str, UnreachableAgent] = collections.OrderedDict()
        self.recovering: dict[str, AgentInfo] = {}  # registry agents not yet back
        # The dynamic reservations and volumes of agents not registered now
        # (recovering or unreachable): taken back when they register.
        self.parked_dynamic: dict[str, DynamicResources] = {}
        self._removals = RemovalLimiter(config.agent_removal_rate)
        self._persist_pending = False  # a PersistRegistry is in this step's effects
        self.offers: dict[str, Offer] = {}
        self.admission = Admission(config.admission_limit)  # offers not yet out
        # Outstanding offers by the group sent together (keyed by its first offer,
        # in the order they went out) and the reverse: one `OfferTimeout` each.
        self.offer_groups: dict[str, dict[str, None]] = {}
        self.group_of: dict[str, str] = {}
        self._group_first: str | None = None  # of the group going out now
        # From agents' reports: the URIs each one's fetcher cache holds (put in its
        # offers), and the agents that are draining (offered nothing more).
        self.cached_uris: dict[str, list[str]] = {}
        self.drained: set[str] = set()
        # Refuse filters on revocable offers: (framework, agent) -> until.
        self.revocable_filters: dict[tuple[str, str], float] = {}
        # Agents that may lend (a superset, pruned by each pass): a pass looks at
        # these, not at every agent.
        self.lending: set[str] = set()
        # Operator policy, plain data for the registry: changed only by operator
        # calls (`SetWeights`/`SetQuota`) and `restore`.
        self.weights: dict[str, float] = {}
        self.quota: dict[str, Quota] = {}
        self._allocate_at: float | None = None
        self.counters = Counters()
        self.events = EventLog(config.max_events)
        self.allocation_ms = Window(1000)
        self.allocation_seconds = Histogram(LATENCY_BOUNDS)
        self._now = start_time
        self._out: list[Effect] = []
        self._usage_events: list[EventItem] = []  # gathered for `_usage_out`
        self._usage_items = 0  # of them, times and tasks' facts (not rows)
        self._usage_at: float | None = None  # the time of the latest row
        self._usage_due = 0.0  # when the gathered rows go at the latest

    # ============================================== effects and refusals

    def _send(self, peer: str, message: Message) -> None:
        self._out.append(Send(peer, message))
        agent_id = self.agent_by_peer.get(peer)
        # It hears from us, so its next ping may be skipped; but not by a refusal,
        # which an agent never takes for proof of life (agent/master_link.py).
        if agent_id is not None and not isinstance(message, Rejected):
            self.agents[agent_id].told = True

    def _arm(self, key: TimerKey, at: float) -> None:
        self._out.append(ArmTimer(key, at))

    def _cancel(self, key: TimerKey) -> None:
        self._out.append(CancelTimer(key))

    def _persist(self) -> None:
        """What the registry holds changed: ask for one write per step."""
        if not self._persist_pending:
            self._persist_pending = True
            self._out.append(PersistRegistry())

    def _set_dynamic(self, agent: MasterAgent, dynamic: DynamicResources) -> None:
        """The agent's reservations or volumes changed: persist, and tell the agent
        (before anything that relies on them, such as a task using a volume)."""
        agent.dynamic = dynamic
        self._persist()
        self._send(agent.peer, CheckpointResources(agent_id=agent.id, resources=dynamic))

    def _reply_rejected(self, peer: str, reason: str, message_type: str) -> None:
        self.counters.inc("master/messages_rejected")
        self._send(peer, Rejected(reason=reason, message_type=message_type))

    def _refuse(self, peer: str, message: Message, reason: str) -> None:
        """Refuse one message: reply `Rejected`, count it, change nothing else."""
        self.counters.inc("master/messages_invalid")
        self._reply_rejected(peer, reason, message.TYPE)

    def _to_framework(self, framework: MasterFramework, message: Message) -> None:
        if framework.peer is not None:
            self._send(framework.peer, message)

    # ------------------------------------------------------------ who is asking

    def _owned_framework(self, peer: str, message: Any) -> MasterFramework | None:
        """The framework `message` names, if `peer` owns it; otherwise refuse."""
        framework_id: str = message.framework_id
        framework = self.frameworks.get(framework_id)
        if framework is None:
            if framework_id in self.completed_frameworks:
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

    def _sending_agent(self, peer: str, message: Message, agent_id: str | None) -> MasterAgent | None:
        """The agent registered on `peer` (and called `agent_id`, if given)."""
        known = self.agent_by_peer.get(peer)
        if known is None:
            self._refuse(peer, message, "this connection has no registered agent; register first")
            return None
        if agent_id is not None and agent_id != known:
            self._refuse(peer, message,
                         f"agent id {agent_id} does not match this connection's agent {known}")
            return None
        agent = self.agents[known]
        agent.heard = True
        if agent.awaiting_pong and agent.any_frame_liveness:
            self._answered(agent)  # any frame from it is as good as a pong
        return agent

    def _answered(self, agent: MasterAgent) -> None:
        """The agent answered its ping (with LIVENESS_CAPABILITY: said anything)."""
        agent.awaiting_pong = False
        agent.missed_pongs = 0
        if self._removals.forget(agent.id):
            self.counters.inc("master/agent_removals_cancelled")

    # ======================================================== frameworks

    def _add_framework(self, info: FrameworkInfo, active: bool) -> MasterFramework:
        framework = MasterFramework(info=info, registered_time=self._now)
        self.frameworks[framework.id] = framework
        self.allocator.add_framework(framework.id, info.roles, active=active)
        return framework

    def _remove_framework(self, framework: MasterFramework, reason: str) -> None:
        """Teardown: rescind offers, kill tasks, shut down executors, forget it."""
        for offer_id in sorted(framework.offers):
            self._rescind(self.offers[offer_id], notify=True)
        fid = framework.id
        self.admission.forget_framework(fid)
        touched: set[str] = set()
        for task in list(framework.tasks.values()):
            agent = self.agents[task.agent_id]
            touched.add(agent.id)
            self._send(agent.peer, KillTask(framework_id=fid, task_id=task.task_id,
                                            kill_grace_period=task.kill_grace_period))
            self._note(task, f"killed: framework {reason}")
            self._end_task(framework, task, TaskState.TASK_KILLED)
            self._task_event(task, "master")
        for agent in self.agents.values():
            for executor_id in list(agent.executor_ids.get(fid, ())):
                executor = agent.remove_executor(fid, executor_id)
                assert executor is not None
                agent.used = agent.used - executor.resources
                touched.add(agent.id)
        for agent_id in sorted(touched):
            self._send(self.agents[agent_id].peer, ShutdownFramework(framework_id=fid))
        self.allocator.remove_framework(fid)
        self._cancel(HeartbeatDue(fid))
        self._cancel(FailoverTimeout(fid))
        del self.frameworks[fid]
        self.completed_frameworks[fid] = CompletedFramework(
            info=framework.info, registered_time=framework.registered_time,
            removed_time=self._now, reason=reason,
            tasks=tuple(framework.completed.values()))
        while len(self.completed_frameworks) > self.config.max_completed_frameworks:
            self.completed_frameworks.popitem(last=False)
        self.events.record(self._now, "framework_removed", framework_id=fid, reason=reason)
        self._request_allocation()

    # ============================================================ offers

    def _request_allocation(self) -> None:
        """Allocate soon: resources were added or freed. Batched: at most one early
        run is pending, and an already-due run is not postponed."""
        if self._allocate_at is None or self._allocate_at > self._now:
            self._arm_allocation(self._now)

    def _arm_allocation(self, at: float) -> None:
        self._allocate_at = at
        self._arm(Allocate(), at)

    def _forget_offer(self, offer: Offer) -> None:
        """Drop the master's record of an offer; the caller settles the resources
        with the allocator."""
        del self.offers[offer.id]
        self.admission.closed(offer.id)
        self.frameworks[offer.framework_id].offers.discard(offer.id)
        agent = self.agents[offer.agent_id]
        agent.offers.discard(offer.id)
        # Most agents hold one offer: its resources are the very value `offered` is.
        agent.offered = (EMPTY if agent.offered is offer.resources
                         else agent.offered - offer.resources)
        if offer.revocable:
            agent.revocable_offered = agent.revocable_offered - offer.revocable
        first = self.group_of.pop(offer.id, None)
        if first is None:  # never sent (held back by admission, or too large): no timer
            return
        made = self.offer_groups[first]
        del made[offer.id]
        if not made:
            del self.offer_groups[first]
            self._cancel(OfferTimeout(first))

    def _return_offer(self, offer: Offer, refuse_seconds: float) -> None:
        """The offer's resources go back whole; filter them for the framework."""
        self._forget_offer(offer)
        if offer.resources:  # a revocable-only offer is unknown to the allocator
            self.allocator.close_offer(offer.framework_id, offer.agent_id, offer.resources)
        if refuse_seconds > 0:
            self.allocator.add_filter(offer.framework_id, offer.agent_id,
                                       self._now + refuse_seconds)
            if offer.revocable:
                self._filter_revocable(offer.framework_id, offer.agent_id, refuse_seconds)
        self._request_allocation()

    def _return_offers(self, framework_id: str, offers: list[Offer],
                       refuse_seconds: float) -> None:
        """`_return_offer` for each of one framework's offers in turn, with one
        allocator call for all (a Decline of hundreds of offers)."""
        for offer in offers:
            self._forget_offer(offer)
        self.allocator.close_offers(framework_id, [
            (offer.agent_id, offer.resources) for offer in offers if offer.resources])
        if refuse_seconds > 0:
            self.allocator.add_filters(framework_id, [offer.agent_id for offer in offers],
                                       self._now + refuse_seconds)
            for offer in offers:
                if offer.revocable:
                    self._filter_revocable(framework_id, offer.agent_id, refuse_seconds)
        self._request_allocation()

    def _filter_revocable(self, framework_id: str, agent_id: str, refuse_seconds: float) -> None:
        key = (framework_id, agent_id)
        self.revocable_filters[key] = max(self.revocable_filters.get(key, 0.0),
                                          self._now + refuse_seconds)

    def _rescind(self, offer: Offer, notify: bool, refuse_seconds: float = 0.0) -> None:
        notify = notify and not self.admission.waiting(offer.id)  # never seen: no news
        self._return_offer(offer, refuse_seconds)
        self.counters.inc("master/offers_rescinded")
        self.events.record(self._now, "offer_rescinded", offer_id=offer.id,
                           framework_id=offer.framework_id, agent_id=offer.agent_id)
        if notify:
            self._to_framework(self.frameworks[offer.framework_id], Rescind(offer_id=offer.id))

    # ============================================================= tasks

    def _master_update(self, framework: MasterFramework, task_id: str, state: TaskState,
                       reason: str, message: str, agent_id: str, executor_id: str = "") -> None:
        """A status the master makes up itself: no uuid, so no acknowledgement."""
        if state.is_terminal:
            self.counters.inc(task_counter(state))
        task = (framework.tasks.get(task_id) or framework.unreachable_tasks.get(task_id)
                or framework.completed.get(task_id))
        row = (framework.id, task_id, state._name_, agent_id, "master", reason, message,
               task.healthy if task else None)
        self.events.record_values(self._now, "task_state", TASK_STATE_FIELDS, row)
        if self.config.record_usage:
            self._usage_row(framework, task, row)
        self._to_framework(framework, Update(status=TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message,
            source=Source.MASTER, agent_id=agent_id, executor_id=executor_id,
            timestamp=self._now)))

    def _note(self, task: MasterTask, text: str, *args: object) -> None:
        """Add to the task's story: `text`, or `text % args` if there are `args`.
        Kept as (time, text, args) and rendered only when read
        (`master.tasks.story_lines`): formatting the time and the args cost more
        than the rest of a note, and a task gets five under a launch flood."""
        task.story.append((self._now, text, args))

    def _task_event(self, task: MasterTask, source: str, reason: str = "",
                    message: str = "") -> None:
        """Log `task`'s current state in the events log (and the usage store)."""
        # `_name_`: the member's name without the enum property's cost (three a task).
        row = (task.framework_id, task.task_id, task.state._name_, task.agent_id, source,
               reason, message, task.healthy)
        self.events.record_values(self._now, "task_state", TASK_STATE_FIELDS, row)
        if self.config.record_usage:
            framework = self.frameworks.get(task.framework_id)
            if framework is not None:
                self._usage_row(framework, task, row)

    def _usage_row(self, framework: MasterFramework, task: MasterTask | None,
                   row: tuple) -> None:
        """Gather a state change for the usage store: the events log's own tuple
        (laid out as a `StateRow`, but a plain tuple: one allocation), behind
        its step's time and, on the task's first row since its record was made
        or last ended, the task's facts. Three rows a task under a launch
        flood: this is on the launch path, so a row costs an append, and a
        task's facts are built once."""
        events = self._usage_events
        now = self._now
        if now != self._usage_at:  # a step's first row
            if not events:
                self._usage_due = now + self.config.usage_batch
                if self.config.usage_batch:
                    self._arm(UsageDue(), self._usage_due)
            events.append(float(now))
            self._usage_items += 1
            self._usage_at = now
        if task is None or not task.usage_told:
            agent_id = row[3]
            events.append(task_facts(framework, self.agents.get(agent_id), row[1], task,
                                     self._role_of(framework, agent_id)))
            self._usage_items += 1
            if task is not None:
                task.usage_told = True
        events.append(row)
        if task is not None and row[2] in TERMINAL_STATES:
            task.usage_told = False  # the store forgets it here

    def _usage_out(self) -> None:
        """The rows gathered by `_usage_row` as one `RecordUsage`, after the
        step's other effects: at the end of the first step `usage_batch` after
        the first of them, or when `UsageDue` fires, so a launch flood hands the
        store a few large batches, not one a step. A step that raised leaves its
        rows here for a later step: what they record did happen."""
        events = self._usage_events
        if events:
            rows = len(events) - self._usage_items
            self.counters.inc("master/usage_events", rows)
            self._out.append(RecordUsage((), events, rows))
            self._usage_events = []
            self._usage_items = 0
            self._usage_at = None

    def _role_of(self, framework: MasterFramework, agent_id: str) -> str:
        """The role the framework's resources on the agent are charged to (its
        first role when it holds nothing there any more)."""
        role = (self.allocator.allocation_role(agent_id, framework.id)
                if agent_id in self.agents else None)
        return role or framework.info.roles[0]

    def _end_task(self, framework: MasterFramework, task: MasterTask, state: TaskState,
                  timestamp: float = 0.0, counted: bool = False) -> None:
        """A live task reached a terminal state: free its resources, keep it in the
        bounded completed list. `counted`: the caller's `_master_update` counts it."""
        task.state = state
        task.statuses.append((state, timestamp or self._now))
        if not counted:
            self.counters.inc(TASK_COUNTERS[state._name_])
        del framework.tasks[task.task_id]
        self.admission.started((framework.id, task.task_id), self._now)
        agent = self.agents[task.agent_id]
        agent.tasks.discard((framework.id, task.task_id))
        if task.revocable:  # lent: never in `used` or the allocator
            agent.revocable_used = agent.revocable_used - task.resources
        else:
            agent.used = agent.used - task.resources
            self.allocator.release(agent.id, framework.id, task.resources)
        self._complete(framework, task)
        self._request_allocation()

    def _complete(self, framework: MasterFramework, task: MasterTask) -> None:
        framework.completed.pop(task.task_id, None)
        framework.completed[task.task_id] = task
        while len(framework.completed) > self.config.max_completed_tasks:
            framework.completed.popitem(last=False)

    # =================================================== operator policy

    def _apply_weights(self, weights: Mapping[str, float]) -> None:
        """Set the weights of some roles (1.0 is the default and clears an entry):
        from `PUT /weights`, or the registry after a failover. Raises `PolicyError`
        and changes nothing if any is bad. Takes effect at the next allocation."""
        if not weights:
            return
        parse_weights([{"role": role, "weight": weight} for role, weight in weights.items()])
        for role, weight in weights.items():
            self.allocator.set_weight(role, weight)
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
            self.allocator.set_quota(role, quota)
        self.quota = merged

    # =========================================================== reading

    def admitted_agents(self) -> list[AgentInfo]:
        """The registry's admitted agents: registered ones and recovering ones."""
        return [agent.info for agent in self.agents.values()] + list(self.recovering.values())

    def unreachable_agents(self) -> list[UnreachableAgent]:
        return list(self.unreachable.values())

    def dynamic_resources(self) -> dict[str, DynamicResources]:
        """The registry's dynamic reservations and volumes, by agent: those of
        admitted and unreachable agents that offer operations ever changed."""
        kept = {**self.parked_dynamic,
                **{agent_id: agent.dynamic for agent_id, agent in self.agents.items()}}
        known = set(self.agents) | set(self.recovering) | set(self.unreachable)
        return {agent_id: dynamic for agent_id, dynamic in sorted(kept.items())
                if agent_id in known and dynamic.version}

    def validate(self) -> None:
        """Check every invariant (master/invariants.py); raise `InvariantError`
        listing all violations. Expensive; tests call it after every step."""
        invariants.check(self)

    def snapshot(self) -> dict[str, Any]:
        """The `/state` document (master/views.py)."""
        return views.snapshot(self)

    def roles_json(self) -> list[dict[str, Any]]:
        return views.roles_json(self)

    def histograms(self) -> dict[str, Histogram]:
        """Latency histograms for `/metrics`, by key (see `master.metrics.HISTOGRAMS`)."""
        return {"allocator/allocation_run_seconds": self.allocation_seconds}

    def metrics(self) -> dict[str, float]:
        """Flat counters and gauges for `/metrics/snapshot` (master/views.py)."""
        return views.metrics(self)
