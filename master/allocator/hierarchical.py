"""The hierarchical DRF allocator: roles, weights, quota, reservations, filters.

Theory of operation
-------------------
Two levels of sorters (`master.allocator.sorter`): one over roles, and one per
role over the frameworks subscribed to it. A framework subscribed to several
roles is a client of each of those sorters; what it is allocated is charged to
exactly one of them per agent (its first offer there picks the role, and the
role sticks while it holds anything on that agent), so every resource on every
agent is accounted to one (framework, role).

A pass (`allocate`) walks candidate agents twice:

1. **Quota guarantees.** For roles whose subtree has a guarantee that is not yet
   allocated, in role order: offer what the role may use, the guaranteed kinds
   capped at what is still missing.
2. **Fair share.** For every role in DRF order and every framework in the role's
   DRF order: offer all that the role may use on the agent. Unreserved amounts
   of the guaranteed kinds are capped so that, cluster-wide, what is still free
   covers the *other* roles' unmet guarantees (the headroom).

In both stages an offer holds the agent's free resources that are unreserved or
reserved to the role or one of its ancestors, never beyond any quota limit on
the role or its ancestors, and only for a framework that is active, not
suppressed, not filtered for the agent (decline/accept `refuse_seconds`) and
holds no outstanding offer there (and, if it declared demand with `request`,
whose offers do not yet cover it, and for an offer that holds none of its
declared tasks, whose budget of such offers is not spent:
`master.allocator.demand`). Each offer is
recorded immediately, so the
sorters' order changes as the pass goes on (progressive filling). An agent is
worth offering when its free resources hold any of `min_allocatable`.

Which agents are candidates
---------------------------
A pass that looked at every agent would cost O(agents x frameworks) even when
nothing changed. Instead the allocator remembers which agents might yield an
offer: an agent becomes *dirty* when something that could let it be offered
happens -- it joined, resources on it were freed or returned, a filter on it
expired (a heap of expiry times), or an offer on it closed. Events that may
change the answer everywhere (a framework added, activated or revived after a
suppression, its roles changed, quota changed) make every agent dirty. Agents
whose offer was reduced by quota (a limit, or headroom held back) are
remembered too, and become dirty again whenever any role's allocation changes.
A pass looks only at dirty agents and leaves all of them clean: whatever it did
not offer, nobody could take, and stays so until one of those events. Weights
change only the order among takers, so they dirty nothing.

What a pass keeps
-----------------
A full pass (a framework subscribed) asks the quota cut of every role on every
agent. The cut's room -- per kind, what limits and other roles' unmet
guarantees leave -- depends only on quota, role allocations and the free
unreserved amounts, so it is computed once and kept until one of those changes
(any offer made or resource freed empties it); which roles hold guarantees
below which is kept until quota changes (`master.allocator.quota_rooms` holds
those caches). The DRF sorters keep the order they read last until it changes
(most allocations change a client's share without moving it), and each agent
knows which frameworks filter it, so the walk down the order past frameworks
that declined the agent costs one dict lookup per framework.
`tests/unit/test_allocator_equivalence.py` drives this allocator
and one without these shortcuts through generated event sequences and checks
that they make the very same offers.

Everything is pure: no clock (time comes in as `now`), no I/O, deterministic
(agents in the order they became dirty, sorters with explicit tie-breaks).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from dyad.resources import SHARE_KINDS, UNRESERVED, Resources, ResourcesError
from master.allocator.demand import FRAGMENTS, Demands
from master.allocator.policy import Quota
from master.allocator.quota_rooms import QuotaRooms, _cut, _Plan, _Rooms, allowed_roles
from master.allocator.quota_rooms import _cut_entries  # noqa: F401 (tests reach it here)
from master.allocator.sorter import DRFSorter, Sorter
from master.allocator.sorting import SorterBooks, _Framework, _Role, told

__all__ = ["Allocation", "AllocatorError", "HierarchicalAllocator", "allowed_roles"]

EMPTY = Resources()


class Allocation(NamedTuple):
    """Resources of one agent allocated (offered) to one framework."""

    framework_id: str
    agent_id: str
    resources: Resources


class AllocatorError(ValueError):
    """The master told the allocator something inconsistent with its books."""


class _Agent:
    __slots__ = ("total", "free", "allocated", "role_of", "offered_to", "reserved", "filtered")

    def __init__(self, total: Resources) -> None:
        self.total = total
        self.free = total
        self.allocated: dict[str, Resources] = {}  # framework -> used + offered
        self.role_of: dict[str, str] = {}  # framework -> role its allocation is charged to
        self.offered_to: set[str] = set()  # frameworks with an outstanding offer here
        # framework -> refused until: `_Framework.filters` by agent, for `_pick`,
        # which asks it of each framework in DRF order (late in a busy day, of
        # dozens that declined the agent a moment ago).
        self.filtered: dict[str, float] = {}
        self.reserved = total.roles() - {UNRESERVED} != set()


class HierarchicalAllocator(SorterBooks, QuotaRooms):
    """See the module docstring. `min_allocatable` maps a resource name to an
    amount: resources are worth offering if they hold *any* of those amounts.
    `sorter` makes the sorters (one over roles, one per role)."""

    def __init__(self, min_allocatable: Mapping[str, float],
                 sorter: Callable[[], Sorter] = DRFSorter) -> None:
        self._min = [(name, round(amount * 1000)) for name, amount in sorted(min_allocatable.items())]
        self._empty_worth = any(milli <= 0 for _, milli in self._min)
        self._make_sorter = sorter
        self._agents: dict[str, _Agent] = {}
        self._frameworks: dict[str, _Framework] = {}
        self._role_sorter = sorter()
        self._roles: dict[str, _Role] = {}
        self._total: Counter[str] = Counter()  # scalar milli over every agent
        self._free_unreserved: Counter[str] = Counter()
        self._quota: dict[str, Quota] = {}
        # Filter ends: a heap of times, and per time the (framework, agent) pairs
        # filtered until then (a Decline of thousands of offers sets one time).
        self._filter_expiry: list[float] = []
        self._filters_until: dict[float, list[tuple[str, str]]] = {}
        self._dirty: dict[str, None] = {}  # ordered: deterministic passes
        self._all_dirty = False
        self._quota_blocked: dict[str, None] = {}
        # (role, guarantee stage) -> `_room`; emptied whenever quota, a role's
        # allocation or the free unreserved amounts change.
        self._rooms: dict[tuple[str, bool], _Rooms | None] = {}
        self._below: dict[str, list[str]] = {}  # `_guaranteed_below`, until quota changes
        # Per role, until quota changes: its quota chain, the ancestors in it with a
        # limit, the outermost guaranteed role of it, and whether any has a guarantee.
        self._chains: dict[str, tuple[list[str], list[tuple[str, Mapping[str, int]]],
                                      str | None, bool]] = {}
        # Guaranteed role -> `_need`, and their sum (`_headroom`), until quota or an
        # allocation in a guaranteed subtree changes.
        self._needs: dict[str, dict[str, int]] = {}
        self._required: dict[str, int] | None = None  # only kinds still missed
        self._plans: dict[tuple[str, bool], _Plan | tuple[()]] = {}  # `_plan`, until needs change
        self._memo: tuple[Resources | None, dict[str, int]] = (None, {})
        self._demands = Demands()  # declared demand bounds offers (`request`)
        # role -> framework -> scalar milli released and not told the sorters yet
        # (no quota: nothing reads them before `_sort_released`).
        self._unsorted: dict[str, dict[str, dict[str, int]]] = {}
        self.last_considered = 0  # agents looked at by the last pass

    # ------------------------------------------------------------------ agents

    @told
    def add_agent(self, agent_id: str, total: Resources) -> None:
        if agent_id in self._agents:
            raise AllocatorError(f"agent {agent_id} is already known")
        agent = _Agent(total)
        self._agents[agent_id] = agent
        scalars = total.scalar_items()
        self._total.update(scalars)
        self._role_sorter.add_total(scalars)
        for role in self._roles.values():
            role.sorter.add_total(scalars)
        self._free_unreserved.update(_unreserved_scalars(agent, total))
        self._dirty[agent_id] = None
        self._consumption_changed()

    @told
    def remove_agent(self, agent_id: str) -> None:
        agent = self._agent(agent_id)
        for framework_id in list(agent.allocated):
            self._release(agent_id, agent, framework_id, agent.allocated[framework_id])
        for framework in self._frameworks.values():
            framework.filters.pop(agent_id, None)  # the agent's `filtered` goes with it
        scalars = agent.total.scalar_items()
        self._total.subtract(scalars)
        self._role_sorter.remove_total(scalars)
        for role in self._roles.values():
            role.sorter.remove_total(scalars)
        self._free_unreserved.subtract(_unreserved_scalars(agent, agent.free))
        del self._agents[agent_id]
        self._demands.agent_removed(agent_id)
        self._dirty.pop(agent_id, None)
        self._quota_blocked.pop(agent_id, None)
        self._consumption_changed()

    def transform(self, agent_id: str, framework_id: str, consumed: Resources,
                  produced: Resources) -> None:
        """Within what the framework holds on the agent, `consumed` becomes
        `produced`: the same amounts with other reservations (a dynamic RESERVE or
        UNRESERVE). The agent's total changes the same way."""
        agent = self._agent(agent_id)
        self._framework(framework_id)
        if consumed.flatten() != produced.flatten():
            raise AllocatorError(f"cannot turn {consumed} into {produced}: amounts differ")
        role = agent.role_of.get(framework_id)
        held = agent.allocated.get(framework_id, EMPTY)
        try:
            if role is None or not consumed <= held:
                raise ResourcesError(f"it holds only {held or 'nothing'}")
            bad = produced.roles() - set(allowed_roles(role))
            if bad:
                raise ResourcesError(f"its allocation is in role {role}, which may not use "
                                     f"resources reserved to {', '.join(sorted(bad))}")
            agent.allocated[framework_id] = held - consumed + produced
            agent.total = agent.total - consumed + produced
        except ResourcesError as exc:
            raise AllocatorError(f"framework {framework_id} on agent {agent_id} cannot turn "
                                 f"{consumed} into {produced}: {exc}") from None
        agent.reserved = agent.total.roles() - {UNRESERVED} != set()

    # -------------------------------------------------------------- frameworks

    @told
    def add_framework(self, framework_id: str, roles: Iterable[str], active: bool = True) -> None:
        """Add a framework, or change the roles of a known one. What it holds stays
        charged to the role it was allocated in."""
        roles = tuple(dict.fromkeys(roles))
        if not roles:
            raise AllocatorError(f"framework {framework_id} has no roles")
        framework = self._frameworks.get(framework_id)
        if framework is None:
            framework = _Framework(roles, active)
            self._frameworks[framework_id] = framework
            old: tuple[str, ...] = ()
        else:
            old, framework.roles = framework.roles, roles
        for role in roles:
            known = self._role(role)
            if not known.sorter.contains(framework_id):
                known.sorter.add(framework_id)
                known.clients += 1
        self._sync(framework_id)
        for role in old:
            if role not in roles:
                self._forget_client(role, framework_id, leaving=False)
        self._all_dirty = True

    @told
    def remove_framework(self, framework_id: str) -> None:
        """Forget the framework; everything allocated to it is free again."""
        framework = self._framework(framework_id)
        self._unfilter(framework_id, framework)
        for agent_id in sorted(framework.agents):
            agent = self._agents[agent_id]
            self._release(agent_id, agent, framework_id, agent.allocated[framework_id])
            agent.offered_to.discard(framework_id)
        for role in framework.roles:
            self._forget_client(role, framework_id, leaving=True)
        del self._frameworks[framework_id]
        self._demands.clear(framework_id)

    @told
    def activate(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        if not framework.active:
            framework.active = True
            self._sync(framework_id)
            self._all_dirty = True

    @told
    def deactivate(self, framework_id: str) -> None:
        self._framework(framework_id).active = False
        self._sync(framework_id)
        self._demands.clear(framework_id)

    @told
    def suppress(self, framework_id: str) -> None:
        self._framework(framework_id).suppressed = True
        self._sync(framework_id)
        self._demands.clear(framework_id)

    def request(self, framework_id: str, requests: Iterable[tuple[Resources, int]]) -> None:
        """Declare what the framework wants now (task shapes and how many of
        each; none: no bound), replacing what it declared before: offers to it
        stop once they cover it with headroom (`master.allocator.demand`)."""
        self._framework(framework_id)
        self._dirty.update(dict.fromkeys(self._demands.declare(framework_id, requests)))

    @told
    def revive(self, framework_id: str) -> None:
        """Resume offers and drop every filter the framework set."""
        framework = self._framework(framework_id)
        if framework.suppressed:
            framework.suppressed = False
            self._sync(framework_id)
            self._all_dirty = True
        self._dirty.update(dict.fromkeys(framework.filters))
        self._unfilter(framework_id, framework)

    def add_filter(self, framework_id: str, agent_id: str, until: float) -> None:
        """Offer nothing from `agent_id` to `framework_id` before `until`."""
        self.add_filters(framework_id, (agent_id,), until)

    def add_filters(self, framework_id: str, agent_ids: Iterable[str], until: float) -> None:
        """`add_filter` for several agents (a Decline of hundreds of offers)."""
        framework = self._framework(framework_id)
        filters = framework.filters
        ending = self._filters_until
        for agent_id in agent_ids:
            agent = self._agent(agent_id)
            at = max(until, filters.get(agent_id, until))
            filters[agent_id] = agent.filtered[framework_id] = at
            pairs = ending.get(at)
            if pairs is None:
                pairs = ending[at] = []
                heapq.heappush(self._filter_expiry, at)
            pairs.append((framework_id, agent_id))

    def _unfilter(self, framework_id: str, framework: _Framework) -> None:
        agents = self._agents
        for agent_id in framework.filters:
            del agents[agent_id].filtered[framework_id]
        framework.filters.clear()

    # ------------------------------------------------------------------ policy

    @told
    def set_weight(self, role: str, weight: float) -> None:
        """Weight of `role`'s subtree among its siblings (default 1.0)."""
        self._role_sorter.update_weight(role, weight)

    @told
    def set_quota(self, role: str, quota: Quota | None) -> None:
        """Set (or, with None or an empty `Quota`, clear) the quota of `role`. The
        caller checks that the whole set is coherent (`policy.check_quotas`)."""
        if quota is None or quota.is_empty():
            self._quota.pop(role, None)
        else:
            self._quota[role] = quota
        self._rooms.clear()
        self._below.clear()
        self._chains.clear()
        self._guarantee_changed()
        self._all_dirty = True

    # -------------------------------------------------------------- accounting

    @told
    def update_used(self, agent_id: str, framework_id: str, delta: Resources) -> None:
        """Charge `delta` to a framework on an agent without an offer: tasks and
        executors that an agent reported when it re-registered."""
        agent = self._agent(agent_id)
        framework = self._framework(framework_id)
        if delta.is_empty():
            return
        role = agent.role_of.get(framework_id)
        if role is None:
            reserved = delta.roles() - {UNRESERVED}
            role = next((r for r in framework.roles if reserved <= set(allowed_roles(r))),
                        framework.roles[0])
        self._charge(agent_id, agent, framework_id, role, delta)

    def release(self, agent_id: str, framework_id: str, resources: Resources) -> None:
        """`resources` allocated to the framework on the agent are free again (a task
        ended, an executor exited, an offer came back)."""
        agent = self._agents.get(agent_id)  # `_agent`, `_framework`: without a call
        if agent is None:
            agent = self._agent(agent_id)  # raises
        if framework_id not in self._frameworks:
            self._framework(framework_id)  # raises
        if resources.is_empty():
            return
        held = agent.allocated.get(framework_id, EMPTY)
        try:  # what is left, and the check that it was held, in one subtraction
            left = EMPTY if held is resources else held - resources
        except ResourcesError:
            raise AllocatorError(f"framework {framework_id} does not hold {resources} on "
                                 f"agent {agent_id}: it holds {held or 'nothing'}") from None
        self._release(agent_id, agent, framework_id, resources, left=left)

    def close_offer(self, framework_id: str, agent_id: str, returned: Resources) -> None:
        """The framework's offer on the agent ended (accepted, declined, rescinded);
        `returned` is the part it did not use."""
        agent = self._agent(agent_id)
        agent.offered_to.discard(framework_id)
        self._demands.closed(framework_id, agent_id)
        self.release(agent_id, framework_id, returned)
        self._dirty[agent_id] = None  # the framework may be offered here again

    def close_offers(self, framework_id: str, returned: Iterable[tuple[str, Resources]]) -> None:
        """`close_offer` for several offers of one framework in turn (a Decline of
        hundreds), with the same outcome; the sorters hear once per role, not once
        per offer, because nothing reads them in between."""
        self._framework(framework_id)
        demands = self._demands
        pending: dict[str, dict[str, int]] = {}
        try:
            for agent_id, resources in returned:
                agent = self._agent(agent_id)
                agent.offered_to.discard(framework_id)
                if framework_id in demands:
                    demands.closed(framework_id, agent_id)
                if not resources.is_empty():
                    held = agent.allocated.get(framework_id, EMPTY)
                    if held is not resources and not resources <= held:
                        raise AllocatorError(
                            f"framework {framework_id} does not hold {resources} on agent "
                            f"{agent_id}: it holds {held or 'nothing'}")
                    self._release(agent_id, agent, framework_id, resources, pending)
                self._dirty[agent_id] = None
        finally:
            self._unallocate(framework_id, pending)

    # ----------------------------------------------------------------- queries

    def free(self, agent_id: str) -> Resources:
        return self._agent(agent_id).free

    def allocated(self, agent_id: str, framework_id: str) -> Resources:
        return self._agent(agent_id).allocated.get(framework_id, EMPTY)

    def allocation_role(self, agent_id: str, framework_id: str) -> str | None:
        """The role the framework's allocation on the agent is charged to."""
        return self._agent(agent_id).role_of.get(framework_id)

    @told
    def share(self, framework_id: str) -> float:
        """Unweighted dominant share of all the framework holds, over its roles."""
        self._framework(framework_id)
        held: Counter[str] = Counter()
        for role in self._roles.values():
            if role.sorter.contains(framework_id):
                held.update(role.sorter.client_allocation(framework_id))
        return _dominant(held, self._total)

    @told
    def role_shares(self) -> dict[str, float]:
        """Weighted dominant share of every role that has frameworks or allocations."""
        return {role: self._role_sorter.share(role) for role in sorted(self._roles)}

    @told
    def role_allocation(self, role: str) -> dict[str, int]:
        """Scalar milli allocated to `role`'s subtree (what quota counts)."""
        return self._role_sorter.allocation(role)

    # -------------------------------------------------------------- allocation

    @told
    def allocate(self, now: float) -> list[Allocation]:
        """Run one pass over the agents that may yield an offer; the returned
        resources are now allocated (as offers)."""
        self._expire_filters(now)
        if self._all_dirty:
            candidates = list(self._agents)
        else:
            candidates = list(self._dirty)
        self._dirty = {}
        self._all_dirty = False
        self.last_considered = len(candidates)
        result: list[Allocation] = []
        reopened = self._demands.take_reopened()
        if not (candidates or reopened) or not self._role_sorter.any_active():
            return result  # nobody would be offered anything (all suppressed or away)
        guarantees = self._guarantees_unmet() and self._guarantee_takers()
        if guarantees:
            for agent_id in candidates:
                self._fill(agent_id, now, result, guarantees=True)
        for agent_id in candidates:
            self._fill(agent_id, now, result, guarantees=False)
        for framework_id in reopened:
            self._refill(framework_id, now, result, guarantees)
        return result

    def _refill(self, framework_id: str, now: float, result: list[Allocation],
                guarantees: bool) -> None:
        """Look again at the agents skipped for the framework's declared demand,
        now that its offers no longer cover it, until they do again (the rest
        stay skipped: nothing else about them changed, or they would be dirty)."""
        demand = self._demands.wanting.get(framework_id)
        if demand is None:
            return
        for agent_id in list(demand.blocked):
            if demand.covered:
                return
            del demand.blocked[agent_id]
            self._fill_again(agent_id, now, result, guarantees)
        # Spared fragments, while a fresh declaration's budget lasts.
        for agent_id in list(demand.spared):
            if demand.covered or demand.fragments >= FRAGMENTS:
                return
            del demand.spared[agent_id]
            self._fill_again(agent_id, now, result, guarantees)

    def _fill_again(self, agent_id: str, now: float, result: list[Allocation],
                    guarantees: bool) -> None:
        self.last_considered += 1
        if guarantees:
            self._fill(agent_id, now, result, guarantees=True)
        self._fill(agent_id, now, result, guarantees=False)

    def _expire_filters(self, now: float) -> None:
        heap = self._filter_expiry
        while heap and heap[0] <= now:
            until = heapq.heappop(heap)
            # Sorted: filters ending together expire by framework, then agent.
            for framework_id, agent_id in sorted(self._filters_until.pop(until)):
                framework = self._frameworks.get(framework_id)
                if framework is not None and framework.filters.get(agent_id) == until:
                    del framework.filters[agent_id]
                    del self._agents[agent_id].filtered[framework_id]  # known: filtered
                    self._dirty[agent_id] = None

    def _fill(self, agent_id: str, now: float, result: list[Allocation], guarantees: bool) -> None:
        """Offer the agent's free resources until nobody (eligible) can take more."""
        agent = self._agents[agent_id]
        while self._worth(agent.free):
            choice = self._pick(agent_id, agent, now, guarantees)
            if choice is None:
                return
            framework_id, role, resources = choice
            self._charge(agent_id, agent, framework_id, role, resources)
            agent.offered_to.add(framework_id)
            result.append(Allocation(framework_id, agent_id, resources))
            demand = self._demands.wanting.get(framework_id)
            if demand is not None:
                demand.count(agent_id, self._scalars(resources))

    def _pick(self, agent_id: str, agent: _Agent, now: float,
              guarantees: bool) -> tuple[str, str, Resources] | None:
        """The first (framework, role) in sort order that may take something here,
        and what it is offered."""
        filtered, offered_to, role_of = agent.filtered, agent.offered_to, agent.role_of
        wanting = self._demands.wanting
        for role in self._role_sorter.iter_sorted():
            offerable = agent.free.allocatable_for(role) if agent.reserved else agent.free
            if self._quota:
                capped = self._capped(role, offerable, guarantees)
                if capped is None:
                    continue  # stage 1 and the role has no unmet guarantee
                if capped != offerable:
                    self._quota_blocked[agent_id] = None
                offerable = capped
            # `_fill` found the agent's whole free part worth offering just now.
            if offerable is not agent.free and not self._worth(offerable):
                continue
            for framework_id in self._roles[role].sorter.iter_sorted():
                if framework_id in offered_to:
                    continue
                until = filtered.get(framework_id)
                if until is not None and until > now:
                    continue
                charged = role_of.get(framework_id)
                if charged is not None and charged != role:
                    continue
                demand = wanting.get(framework_id)
                if demand is not None:
                    if demand.covered:  # its offers hold what it declared
                        demand.blocked[agent_id] = None
                        continue
                    if charged is None and demand.spares(self._scalars(offerable)):
                        demand.spared[agent_id] = None  # a fragment, beyond its budget
                        continue
                return framework_id, role, offerable
        return None

    def _worth(self, resources: Resources) -> bool:
        # One sum over the scalars rather than one scan per name; a name that is no
        # scalar here (ports) is asked for as `get_milli` would count it.
        if resources.is_empty():  # the common end of `_fill`: an agent offered whole
            return self._empty_worth
        totals = self._scalars(resources)
        for name, milli in self._min:
            if totals.get(name, 0) >= milli or (
                    name not in totals and resources.get_milli(name) >= milli):
                return True
        return False

    # -------------------------------------------------------------------- quota

    def _capped(self, role: str, offerable: Resources, guarantees: bool) -> Resources | None:
        """`offerable` cut down by quota for `role`: limits of the role and its
        ancestors, and the headroom other roles' unmet guarantees need. In the
        guarantee stage (`guarantees`) the guaranteed kinds are also cut to what the
        role's quota subtree still misses, and None means it misses nothing."""
        rooms = self._kept_room(role, guarantees)
        if rooms is None:
            return None
        return _cut(offerable, *rooms, self._scalars(offerable))

    def _kept_room(self, role: str, guarantees: bool) -> _Rooms | None:
        key = (role, guarantees)
        if key in self._rooms:
            return self._rooms[key]
        rooms = self._rooms[key] = self._room(role, guarantees)
        return rooms

    def _guarantee_takers(self) -> bool:
        """Whether the guarantee stage can offer anything: some active role's
        quota chain still misses something (its room there is not None; it does
        not depend on the agent). Without one, `_pick` would walk every candidate
        and find nobody, and a stage that offers nothing changes nothing."""
        return any(role.active and self._kept_room(name, True) is not None
                   for name, role in self._roles.items())

    def _scalars(self, resources: Resources) -> dict[str, int]:
        """`resources.scalar_items()`, remembered for the last value asked (a pass
        asks it of the same free resources several times); never mutated."""
        memo, scalars = self._memo
        if resources is not memo:
            scalars = resources.scalar_items()
            self._memo = (resources, scalars)
        return scalars

    # --------------------------------------------------------------- bookkeeping

    def _charge(self, agent_id: str, agent: _Agent, framework_id: str, role: str,
                resources: Resources) -> None:
        try:
            agent.free = EMPTY if resources is agent.free else agent.free - resources
        except ResourcesError as exc:
            raise AllocatorError(f"agent {agent_id} cannot spare {resources}: {exc}") from None
        held = agent.allocated.get(framework_id)
        if held is None:
            agent.allocated[framework_id] = resources
            agent.role_of[framework_id] = role
            framework = self._frameworks[framework_id]
            framework.agents.add(agent_id)
            framework.charged[role] += 1
        else:
            agent.allocated[framework_id] = held + resources
        scalars = self._scalars(resources)
        free = self._free_unreserved
        unreserved = _unreserved_scalars(agent, resources, scalars)
        for kind, milli in unreserved.items():
            free[kind] -= milli
        self._role_sorter.allocated(role, scalars)
        self._roles[role].sorter.allocated(framework_id, scalars)
        if self._quota or self._quota_blocked or self._rooms:  # else it changes nothing
            self._allocation_changed(role, scalars, unreserved)

    def _release(self, agent_id: str, agent: _Agent, framework_id: str,
                 resources: Resources, pending: dict[str, dict[str, int]] | None = None,
                 left: Resources | None = None) -> None:
        """With `pending`, what the sorters must hear is added up there per role
        (`close_offers`) instead of told at once, and the caches hear of the role
        once: nothing reads them in between, so telling them again changes nothing.
        `left`: what the framework keeps on the agent, if the caller has it."""
        role = agent.role_of[framework_id]
        if left is None:
            held = agent.allocated[framework_id]
            left = EMPTY if held is resources else held - resources  # a whole offer back
        agent.free = agent.free + resources
        scalars = self._scalars(resources)
        free = self._free_unreserved
        for kind, milli in _unreserved_scalars(agent, resources, scalars).items():
            free[kind] += milli
        told = False
        if pending is None:
            if self._quota:  # its rooms read the role sorter: tell them now
                self._role_sorter.unallocated(role, scalars)
                self._roles[role].sorter.unallocated(framework_id, scalars)
            else:
                # Told at the next read instead (`_sort_released`): tasks end by
                # the dozen between passes, and a sorter's sums come out the same.
                by_framework = self._unsorted.get(role)
                if by_framework is None:
                    by_framework = self._unsorted[role] = {}
                adding = by_framework.get(framework_id)
                if adding is None:
                    by_framework[framework_id] = dict(scalars)
                else:
                    for kind, milli in scalars.items():
                        adding[kind] = adding.get(kind, 0) + milli
        else:
            adding = pending.get(role)
            if adding is None:
                pending[role] = dict(scalars)
            else:
                told = True
                for kind, milli in scalars.items():
                    adding[kind] = adding.get(kind, 0) + milli
        if left.is_empty():
            del agent.allocated[framework_id]
            del agent.role_of[framework_id]
            framework = self._frameworks[framework_id]
            framework.agents.discard(agent_id)
            framework.charged[role] -= 1
            if not framework.charged[role]:
                del framework.charged[role]
                if role not in framework.roles:
                    if pending:
                        self._unallocate(framework_id, pending)  # before it leaves the sorter
                    self._forget_client(role, framework_id, leaving=False)
        else:
            agent.allocated[framework_id] = left
        self._dirty[agent_id] = None
        # Without quota, nothing kept or blocked: `_allocation_changed` changes nothing.
        if not told and (self._quota or self._quota_blocked or self._rooms):
            self._allocation_changed(role)

    def _unallocate(self, framework_id: str, pending: dict[str, dict[str, int]]) -> None:
        for role, scalars in pending.items():
            self._role_sorter.unallocated(role, scalars)
            self._roles[role].sorter.unallocated(framework_id, scalars)
            self._allocation_changed(role)
        pending.clear()

    def _agent(self, agent_id: str) -> _Agent:
        try:
            return self._agents[agent_id]
        except KeyError:
            raise AllocatorError(f"unknown agent {agent_id}") from None

    def _framework(self, framework_id: str) -> _Framework:
        try:
            return self._frameworks[framework_id]
        except KeyError:
            raise AllocatorError(f"unknown framework {framework_id}") from None


def _unreserved_scalars(agent: _Agent, resources: Resources,
                        scalars: Mapping[str, int] | None = None) -> Mapping[str, int]:
    """The unreserved scalar part of `resources` on `agent` (all of it when the
    agent has no reservations, the common case)."""
    if not agent.reserved:
        return scalars if scalars is not None else resources.scalar_items()
    return resources.unreserved().scalar_items()


def _dominant(held: Mapping[str, int], total: Mapping[str, int]) -> float:
    return max((held.get(kind, 0) / total[kind] for kind in SHARE_KINDS if total.get(kind)),
               default=0.0)
