"""The simple allocator: whole agents to the framework with the lowest DRF share.

Policy, per allocation cycle, agents in id order: while an agent's free resources
meet the minimum, offer *all* of what is free there and allocatable to a
framework's roles to the first framework in DRF order that is active, not
suppressed, not filtered for that agent, and holds no outstanding offer on it.

DRF order: lowest dominant share of the framework's allocation (used + offered,
over every agent) against the cluster total, then fewer allocations made so far,
then framework id. Shares are recomputed after every allocation inside a cycle,
so two equal frameworks alternate across equal agents.

The allocator does its own bookkeeping of what is allocated where and trusts the
master to tell it about every change; `MasterState.validate()` cross-checks the
two views. It is pure (no clock, no I/O): time arrives as `now` in `allocate`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import attrs

from dyad.resources import SHARE_KINDS, UNRESERVED, Resources, ResourcesError
EMPTY = Resources()


class Allocation(NamedTuple):
    """Resources of one agent allocated (offered) to one framework."""

    framework_id: str
    agent_id: str
    resources: Resources


class AllocatorError(ValueError):
    """The master told the allocator something inconsistent with its books."""


@attrs.define(eq=False)
class _Agent:
    total: Resources
    free: Resources
    allocated: dict[str, Resources] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _Framework:
    roles: tuple[str, ...]
    active: bool
    suppressed: bool = False
    # Scalar totals in milli over every agent; Resources cannot sum across agents
    # because each agent has its own port 31000.
    allocated: Counter[str] = attrs.field(factory=Counter)
    allocations: int = 0
    filters: dict[str, float] = attrs.field(factory=dict)  # agent id -> until
    offered_on: set[str] = attrs.field(factory=set)  # agents with an outstanding offer


def allowed_roles(roles: Iterable[str]) -> frozenset[str]:
    """Roles whose reservations a framework in `roles` may be offered: `*`, each
    role and each role's ancestors (`eng` for `eng/ml`)."""
    allowed = {UNRESERVED}
    for role in roles:
        allowed.add(role)
        cut = role.rfind("/")
        while cut > 0:
            role = role[:cut]
            allowed.add(role)
            cut = role.rfind("/")
    return frozenset(allowed)


def allocatable_for_roles(free: Resources, roles: tuple[str, ...]) -> Resources:
    """The part of `free` a framework subscribed to `roles` may be offered."""
    if len(roles) == 1:
        return free.allocatable_for(roles[0])
    result = EMPTY
    for role in sorted(allowed_roles(roles)):
        result = result + free.reserved(role)  # disjoint roles: never overlaps
    return result


class SimpleAllocator:
    """See the module docstring. `min_allocatable` maps a resource name to an
    amount; resources are worth offering if they hold *any* of those amounts."""

    def __init__(self, min_allocatable: Mapping[str, float]) -> None:
        self._min = dict(min_allocatable)
        self._agents: dict[str, _Agent] = {}
        self._frameworks: dict[str, _Framework] = {}
        self._cluster_total: Counter[str] = Counter()

    # ------------------------------------------------------------------ agents

    def add_agent(self, agent_id: str, total: Resources) -> None:
        if agent_id in self._agents:
            raise AllocatorError(f"agent {agent_id} is already known")
        self._agents[agent_id] = _Agent(total=total, free=total)
        self._cluster_total.update(total.scalar_items())

    def remove_agent(self, agent_id: str) -> None:
        agent = self._agent(agent_id)
        for framework_id, resources in agent.allocated.items():
            framework = self._frameworks[framework_id]
            framework.allocated.subtract(resources.scalar_items())
        for framework in self._frameworks.values():
            framework.offered_on.discard(agent_id)
            framework.filters.pop(agent_id, None)
        self._cluster_total.subtract(agent.total.scalar_items())
        del self._agents[agent_id]

    # -------------------------------------------------------------- frameworks

    def add_framework(self, framework_id: str, roles: Iterable[str], active: bool = True) -> None:
        """Add a framework, or update the roles of a known one (future offers only)."""
        roles = tuple(roles)
        if not roles:
            raise AllocatorError(f"framework {framework_id} has no roles")
        known = self._frameworks.get(framework_id)
        if known is not None:
            known.roles = roles
            return
        self._frameworks[framework_id] = _Framework(roles=roles, active=active)

    def remove_framework(self, framework_id: str) -> None:
        """Forget the framework; everything allocated to it is free again."""
        self._framework(framework_id)
        for agent_id, agent in self._agents.items():
            resources = agent.allocated.pop(framework_id, None)
            if resources is not None:
                agent.free = agent.free + resources
        del self._frameworks[framework_id]

    def activate(self, framework_id: str) -> None:
        self._framework(framework_id).active = True

    def deactivate(self, framework_id: str) -> None:
        self._framework(framework_id).active = False

    def suppress(self, framework_id: str) -> None:
        self._framework(framework_id).suppressed = True

    def revive(self, framework_id: str) -> None:
        """Resume offers and drop every filter the framework set."""
        framework = self._framework(framework_id)
        framework.suppressed = False
        framework.filters.clear()

    def add_filter(self, framework_id: str, agent_id: str, until: float) -> None:
        """Offer nothing from `agent_id` to `framework_id` before `until`."""
        framework = self._framework(framework_id)
        self._agent(agent_id)
        framework.filters[agent_id] = max(until, framework.filters.get(agent_id, until))

    # -------------------------------------------------------------- accounting

    def update_used(self, agent_id: str, framework_id: str, delta: Resources) -> None:
        """Charge `delta` to a framework on an agent without an offer: tasks and
        executors that an agent reported when it re-registered."""
        self._charge(agent_id, framework_id, delta)

    def recover(self, agent_id: str, framework_id: str, resources: Resources) -> None:
        """`resources` allocated to the framework on the agent are free again (a task
        ended, an executor exited)."""
        agent = self._agent(agent_id)
        framework = self._framework(framework_id)
        if resources.is_empty():
            return
        held = agent.allocated.get(framework_id, EMPTY)
        try:
            left = held - resources
        except ResourcesError as exc:
            raise AllocatorError(
                f"framework {framework_id} does not hold {resources} on agent {agent_id}: {exc}"
            ) from None
        if left.is_empty():
            agent.allocated.pop(framework_id, None)
        else:
            agent.allocated[framework_id] = left
        agent.free = agent.free + resources
        framework.allocated.subtract(resources.scalar_items())

    def close_offer(self, framework_id: str, agent_id: str, returned: Resources) -> None:
        """The framework's offer on the agent ended (accepted, declined, rescinded);
        `returned` is the part it did not use."""
        self._framework(framework_id).offered_on.discard(agent_id)
        self.recover(agent_id, framework_id, returned)

    # ----------------------------------------------------------------- queries

    def free(self, agent_id: str) -> Resources:
        return self._agent(agent_id).free

    def allocated(self, agent_id: str, framework_id: str) -> Resources:
        return self._agent(agent_id).allocated.get(framework_id, EMPTY)

    def share(self, framework_id: str) -> float:
        """Dominant share: the largest allocated/total over the DRF kinds."""
        allocated = self._framework(framework_id).allocated
        return max((allocated[kind] / self._cluster_total[kind]
                    for kind in SHARE_KINDS if self._cluster_total[kind] > 0), default=0.0)

    # -------------------------------------------------------------- allocation

    def allocate(self, now: float) -> list[Allocation]:
        """Run one cycle; the returned resources are now allocated (as offers)."""
        candidates = [fid for fid, f in self._frameworks.items() if f.active and not f.suppressed]
        for framework in self._frameworks.values():
            for agent_id, until in list(framework.filters.items()):
                if until <= now:
                    del framework.filters[agent_id]
        if not candidates:
            return []
        shares = {fid: self.share(fid) for fid in candidates}
        result: list[Allocation] = []
        for agent_id in sorted(self._agents):
            agent = self._agents[agent_id]
            while self._worth_offering(agent.free):
                choice = self._pick(agent_id, agent.free, candidates, shares, now)
                if choice is None:
                    break
                framework_id, resources = choice
                framework = self._frameworks[framework_id]
                self._charge(agent_id, framework_id, resources)
                framework.offered_on.add(agent_id)
                framework.allocations += 1
                shares[framework_id] = self.share(framework_id)
                result.append(Allocation(framework_id, agent_id, resources))
        return result

    def _pick(self, agent_id: str, free: Resources, candidates: list[str],
              shares: dict[str, float], now: float) -> tuple[str, Resources] | None:
        def order(fid: str) -> tuple[float, int, str]:
            return (shares[fid], self._frameworks[fid].allocations, fid)

        for framework_id in sorted(candidates, key=order):
            framework = self._frameworks[framework_id]
            if agent_id in framework.offered_on:
                continue
            if framework.filters.get(agent_id, now) > now:
                continue
            resources = allocatable_for_roles(free, framework.roles)
            if self._worth_offering(resources):
                return framework_id, resources
        return None

    def _worth_offering(self, resources: Resources) -> bool:
        return any(resources.get(name) >= amount for name, amount in self._min.items())

    def _charge(self, agent_id: str, framework_id: str, resources: Resources) -> None:
        agent = self._agent(agent_id)
        framework = self._framework(framework_id)
        if resources.is_empty():
            return
        try:
            agent.free = agent.free - resources
        except ResourcesError as exc:
            raise AllocatorError(f"agent {agent_id} cannot spare {resources}: {exc}") from None
        agent.allocated[framework_id] = agent.allocated.get(framework_id, EMPTY) + resources
        framework.allocated.update(resources.scalar_items())

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
