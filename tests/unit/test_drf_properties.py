"""Fairness proven by hypothesis: the hierarchical allocator, driven through offers,
against Ghodsi et al., "Dominant Resource Fairness" (NSDI'11), and a stateful
machine that checks the allocator's books after every step.

Frameworks here have a fixed per-task demand, take one task per offer and decline
the rest with ``refuse_seconds=0``: that is progressive filling through offers.
A framework whose task does not fit declines with a long filter (it is blocked on
that agent); one that reached its task count declines likewise (satisfied).

Every test here uses the `allocator-ci` hypothesis profile: derandomized (CI is
stable) with bounded examples, so the whole file runs in seconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule,
)

from dyad.clock import FakeClock
from dyad.resources import Resources
from master.allocator import Allocation, HierarchicalAllocator, Quota, allowed_roles

settings.register_profile("allocator-ci", max_examples=80, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
CI = settings.get_profile("allocator-ci")
KINDS = ("cpus", "mem")
LONG = 1e9
EMPTY = Resources()


@attrs.define
class User:
    """A framework of the paper: one demand vector, an optional task cap."""

    name: str
    demand: dict[str, int]  # milli by kind
    wants: int | None = None  # None: unbounded
    role: str = "*"
    tasks: int = 0

    def resources(self) -> Resources:
        return Resources.parse(";".join(f"{k}:{v / 1000}" for k, v in self.demand.items()))


def share(amounts: Mapping[str, int], total: Mapping[str, int]) -> float:
    return max(amounts.get(k, 0) / total[k] for k in total if total[k])


def allocation(user: User) -> dict[str, int]:
    return {k: v * user.tasks for k, v in user.demand.items()}


def run_offers(users: list[User], capacity: dict[str, int],
               weights: Mapping[str, float] | None = None) -> None:
    """Drive the allocator as the module docstring says, until no offer is made."""
    allocator = HierarchicalAllocator({"cpus": 0.001, "mem": 0.001})
    allocator.add_agent("s1", Resources.parse(";".join(f"{k}:{v / 1000}" for k, v in capacity.items())))
    for role, weight in (weights or {}).items():
        allocator.set_weight(role, weight)
    by_name = {user.name: user for user in users}
    for user in users:
        allocator.add_framework(user.name, [user.role])
    clock = FakeClock(0.0)
    for _ in range(10_000):
        offers = allocator.allocate(clock.now())
        if not offers:
            return
        for framework_id, agent_id, offered in offers:
            user = by_name[framework_id]
            task = user.resources()
            if (user.wants is None or user.tasks < user.wants) and task <= offered:
                user.tasks += 1
                allocator.close_offer(framework_id, agent_id, offered - task)
            else:
                allocator.close_offer(framework_id, agent_id, offered)
                allocator.add_filter(framework_id, agent_id, clock.now() + LONG)
        clock.advance(0.001)
    raise AssertionError("progressive filling did not converge")


def progressive_filling(users: list[User], capacity: dict[str, int],
                        weights: Mapping[str, float] | None = None) -> dict[str, int]:
    """The paper's DRF, discrete: repeatedly give the user with the lowest
    (weighted) dominant share one task; a user whose task no longer fits, or who
    has all it wants, drops out. Ties: fewer tasks, then name, like the sorter."""
    weights = weights or {}
    tasks = {user.name: 0 for user in users}
    used = dict.fromkeys(capacity, 0)
    active = {user.name: user for user in users}

    def key(user: User) -> tuple[float, int, str]:
        held = {k: v * tasks[user.name] for k, v in user.demand.items()}
        return (share(held, capacity) / weights.get(user.role, 1.0), tasks[user.name], user.name)

    while active:
        user = min(active.values(), key=key)
        fits = all(used[k] + v <= capacity[k] for k, v in user.demand.items())
        if not fits or (user.wants is not None and tasks[user.name] >= user.wants):
            del active[user.name]
            continue
        tasks[user.name] += 1
        for k, v in user.demand.items():
            used[k] += v
    return tasks


demands = st.fixed_dictionaries({k: st.integers(1, 8).map(lambda n: n * 500) for k in KINDS})
capacities = st.fixed_dictionaries({"cpus": st.integers(8, 40).map(lambda n: n * 1000),
                                    "mem": st.integers(8, 40).map(lambda n: n * 1000)})


@st.composite
def workloads(draw: st.DrawFn, max_users: int = 4) -> tuple[list[User], dict[str, int]]:
    n = draw(st.integers(2, max_users))
    users = [User(f"f{i}", draw(demands), draw(st.none() | st.integers(1, 12)))
             for i in range(n)]
    return users, draw(capacities)


# --------------------------------------------------------------- the paper


def test_paper_worked_example() -> None:
    """Section 4 of the paper: 9 CPUs and 18 GB; user A runs tasks of <1 CPU, 4 GB>,
    user B of <3 CPUs, 1 GB>. DRF gives A three tasks and B two, both ending with
    a dominant share of 2/3."""
    a = User("A", {"cpus": 1000, "mem": 4000})
    b = User("B", {"cpus": 3000, "mem": 1000})
    capacity = {"cpus": 9000, "mem": 18000}
    run_offers([a, b], capacity)
    assert (a.tasks, b.tasks) == (3, 2)
    assert share(allocation(a), capacity) == share(allocation(b), capacity) == 2 / 3
    assert progressive_filling([User("A", a.demand), User("B", b.demand)], capacity) == \
        {"A": 3, "B": 2}


@CI
@given(workloads())
def test_offers_reproduce_progressive_filling(workload: tuple[list[User], dict[str, int]]) -> None:
    users, capacity = workload
    expected = progressive_filling(users, capacity)
    run_offers(users, capacity)
    assert {user.name: user.tasks for user in users} == expected


@CI
@given(workloads())
def test_sharing_incentive_envy_freeness_and_pareto(
        workload: tuple[list[User], dict[str, int]]) -> None:
    users, capacity = workload
    run_offers(users, capacity)
    n = len(users)
    used = {k: sum(allocation(u).get(k, 0) for u in users) for k in capacity}
    free = {k: capacity[k] - used[k] for k in capacity}
    unsatisfied = [u for u in users if u.wants is None or u.tasks < u.wants]
    # One task's share, averaged over the users (at most the largest task).
    one_task = sum(share(u.demand, capacity) for u in users) / n
    for user in unsatisfied:
        # Sharing incentive, discrete: a user stops only when its task no longer
        # fits, so some kind is used up to within its task; every other user got
        # its last task while at most this user's share, so overshot by at most
        # its own task. Hence a 1/n slice less (on average) one task's share.
        assert share(allocation(user), capacity) >= 1 / n - one_task - 1e-12, user
        # Pareto efficiency: no unsatisfied user's task fits in what is left.
        assert any(free[k] < v for k, v in user.demand.items()), (user, free)
        # Envy-freeness within one task: take one task away from anyone else
        # and the rest does not hold more of this user's tasks than it has.
        for other in users:
            if other is user or not other.tasks:
                continue
            rest = {k: allocation(other).get(k, 0) - other.demand.get(k, 0) for k in capacity}
            fits = min(rest[k] // v for k, v in user.demand.items())
            assert fits <= user.tasks, (user, other)


@CI
@given(st.integers(1, 4), st.integers(1, 4), demands)
def test_weights_scale_shares_proportionally(w1: int, w2: int,
                                             demand: dict[str, int]) -> None:
    """Two roles of one framework each, same demand: the dominant shares come out
    in the ratio of the weights, within one task."""
    capacity = {"cpus": 60_000, "mem": 60_000}
    users = [User("x", demand, role="r1"), User("y", demand, role="r2")]
    weights = {"r1": float(w1), "r2": float(w2)}
    run_offers(users, capacity, weights)
    x, y = users
    assert {u.name: u.tasks for u in users} == progressive_filling(
        [User("x", demand, role="r1"), User("y", demand, role="r2")], capacity, weights)
    # Weighted shares equal within one task of either side.
    one = share(demand, capacity)
    sx, sy = share(allocation(x), capacity) / w1, share(allocation(y), capacity) / w2
    assert abs(sx - sy) <= one / min(w1, w2) + 1e-12


# ---------------------------------------------------------- state machine

ROLES = ("*", "eng", "eng/ml", "ops")
LIMIT = {"ops": {"cpus": 5000}}
GUARANTEE = {"eng": {"cpus": 3000}}


class AllocatorMachine(RuleBasedStateMachine):
    """The test plays the master: it keeps its own books of offers and tasks and
    checks the allocator against them after every step."""

    agents = Bundle("agents")
    frameworks = Bundle("frameworks")

    def __init__(self) -> None:
        super().__init__()
        self.allocator = HierarchicalAllocator({"cpus": 0.01, "mem": 32})
        self.clock = FakeClock(0.0)
        self.totals: dict[str, Resources] = {}
        self.roles: dict[str, tuple[str, ...]] = {}
        self.suppressed: set[str] = set()
        self.offers: dict[int, Allocation] = {}
        self.used: dict[tuple[str, str], Resources] = {}  # (agent, framework)
        self.tasks: list[tuple[str, str, Resources]] = []
        self.seq = 0

    @initialize()
    def policy(self) -> None:
        for role, limit in LIMIT.items():
            self.allocator.set_quota(role, Quota(limit=limit))
        for role, guarantee in GUARANTEE.items():
            self.allocator.set_quota(role, Quota(guarantee=guarantee))

    @rule(target=agents, cpus=st.integers(1, 4), reserved=st.sampled_from(ROLES))
    def add_agent(self, cpus: int, reserved: str) -> str:
        self.seq += 1
        agent_id = f"s{self.seq}"
        text = f"cpus:{cpus};mem:1024;ports:[1-9]"
        if reserved != "*":
            text += f";cpus({reserved}):1;mem({reserved}):256"
        self.totals[agent_id] = Resources.parse(text)
        self.allocator.add_agent(agent_id, self.totals[agent_id])
        return agent_id

    @rule(agent_id=consumes(agents))
    def remove_agent(self, agent_id: str) -> None:
        self.allocator.remove_agent(agent_id)
        del self.totals[agent_id]
        self.offers = {k: o for k, o in self.offers.items() if o.agent_id != agent_id}
        self.used = {k: r for k, r in self.used.items() if k[0] != agent_id}
        self.tasks = [t for t in self.tasks if t[0] != agent_id]

    @rule(target=frameworks, roles=st.lists(st.sampled_from(ROLES), min_size=1, max_size=2,
                                            unique=True))
    def add_framework(self, roles: list[str]) -> str:
        self.seq += 1
        framework_id = f"f{self.seq}"
        self.allocator.add_framework(framework_id, roles)
        self.roles[framework_id] = tuple(roles)
        return framework_id

    @rule(framework_id=consumes(frameworks))
    def remove_framework(self, framework_id: str) -> None:
        self.allocator.remove_framework(framework_id)
        del self.roles[framework_id]
        self.suppressed.discard(framework_id)
        self.offers = {k: o for k, o in self.offers.items() if o.framework_id != framework_id}
        self.used = {k: r for k, r in self.used.items() if k[1] != framework_id}
        self.tasks = [t for t in self.tasks if t[1] != framework_id]

    @rule(framework_id=frameworks, suppress=st.booleans())
    def suppress_or_revive(self, framework_id: str, suppress: bool) -> None:
        if framework_id not in self.roles:
            return
        if suppress:
            self.allocator.suppress(framework_id)
            self.suppressed.add(framework_id)
        else:
            self.allocator.revive(framework_id)
            self.suppressed.discard(framework_id)

    @rule(role=st.sampled_from(ROLES), weight=st.sampled_from([0.5, 1.0, 3.0]))
    def weigh(self, role: str, weight: float) -> None:
        self.allocator.set_weight(role, weight)

    @rule()
    def allocate(self) -> None:
        before = {role: self.allocator.role_allocation(role) for role in LIMIT}
        for offer in self.allocator.allocate(self.clock.now()):
            assert offer.agent_id in self.totals, "offer from a removed agent"
            assert offer.framework_id in self.roles, "offer to a removed framework"
            assert offer.framework_id not in self.suppressed, "offer to a suppressed framework"
            role = self.allocator.allocation_role(offer.agent_id, offer.framework_id)
            assert role in self.roles[offer.framework_id], "offer in a role it is not in"
            assert offer.resources.roles() <= set(allowed_roles(role)), \
                f"{offer.resources} reached role {role}"
            assert all(o.agent_id != offer.agent_id or o.framework_id != offer.framework_id
                       for o in self.offers.values()), "two offers for one agent"
            self.seq += 1
            self.offers[self.seq] = offer
        for role, limit in LIMIT.items():
            after = self.allocator.role_allocation(role)
            for kind, milli in limit.items():
                assert after.get(kind, 0) <= max(milli, before[role].get(kind, 0)), \
                    f"role {role} offered beyond its limit"

    @precondition(lambda self: self.offers)
    @rule(data=st.data(), refuse=st.sampled_from([0.0, 1.5, 30.0]))
    def accept_part(self, data: st.DataObject, refuse: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.offers)))
        offer = self.offers.pop(key)
        cpus = offer.resources.get("cpus")
        task = EMPTY
        if cpus >= 1:
            role = self.allocator.allocation_role(offer.agent_id, offer.framework_id)
            reserved = offer.resources.reserved(role) if role else EMPTY
            task = reserved if reserved.get("cpus") else Resources.parse("cpus:1;mem:64;ports:[2-3]")
            if not task <= offer.resources:
                task = EMPTY
        if task:
            self.tasks.append((offer.agent_id, offer.framework_id, task))
            key2 = (offer.agent_id, offer.framework_id)
            self.used[key2] = self.used.get(key2, EMPTY) + task
        self.allocator.close_offer(offer.framework_id, offer.agent_id, offer.resources - task)
        if refuse:
            self.allocator.add_filter(offer.framework_id, offer.agent_id, self.clock.now() + refuse)

    @precondition(lambda self: self.offers)
    @rule(data=st.data())
    def reserve_in_offer(self, data: st.DataObject) -> None:
        """A dynamic RESERVE of one unreserved cpu in an outstanding offer."""
        key = data.draw(st.sampled_from(sorted(self.offers)))
        offer = self.offers[key]
        role = self.allocator.allocation_role(offer.agent_id, offer.framework_id)
        one = Resources.parse("cpus:1")
        if role in (None, "*") or not one <= offer.resources:
            return
        produced = Resources.parse(f"cpus({role}):1")
        self.allocator.transform(offer.agent_id, offer.framework_id, one, produced)
        self.offers[key] = offer._replace(resources=offer.resources - one + produced)
        self.totals[offer.agent_id] = self.totals[offer.agent_id] - one + produced

    @precondition(lambda self: self.offers)
    @rule(data=st.data(), rescind=st.booleans())
    def decline_or_rescind(self, data: st.DataObject, rescind: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.offers)))
        offer = self.offers.pop(key)
        self.allocator.close_offer(offer.framework_id, offer.agent_id, offer.resources)
        self.allocator.add_filter(offer.framework_id, offer.agent_id,
                                  self.clock.now() + (5.0 if rescind else LONG))

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def finish_task(self, data: st.DataObject) -> None:
        agent_id, framework_id, task = self.tasks.pop(data.draw(st.integers(0, len(self.tasks) - 1)))
        self.used[(agent_id, framework_id)] = self.used[(agent_id, framework_id)] - task
        self.allocator.release(agent_id, framework_id, task)

    @rule(seconds=st.sampled_from([0.5, 2.0, 10.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def books_balance(self) -> None:
        """Per agent, free + offered + used == total exactly; the allocator's view
        of each framework matches ours. `+` raises if a port is held twice."""
        for agent_id, total in self.totals.items():
            held = EMPTY
            mine: dict[str, Resources] = {}
            for offer in self.offers.values():
                if offer.agent_id == agent_id:
                    held = held + offer.resources
                    mine[offer.framework_id] = mine.get(offer.framework_id, EMPTY) + offer.resources
            for (aid, fid), used in self.used.items():
                if aid == agent_id:
                    held = held + used
                    mine[fid] = mine.get(fid, EMPTY) + used
            assert self.allocator.free(agent_id) + held == total
            for framework_id in self.roles:
                assert self.allocator.allocated(agent_id, framework_id) == \
                    mine.get(framework_id, EMPTY)

    @invariant()
    def role_allocations_match_the_books(self) -> None:
        """What each role's subtree is charged (what quota and the role sorter
        see) is exactly what its frameworks hold on the agents."""
        expected: dict[str, Counter[str]] = {role: Counter() for role in ROLES}
        for agent_id in self.totals:
            for framework_id in self.roles:
                held = self.allocator.allocated(agent_id, framework_id)
                if held:
                    role = self.allocator.allocation_role(agent_id, framework_id)
                    assert role is not None
                    for counted in allowed_roles(role)[:-1] or [role]:
                        expected[counted].update(held.scalar_items())
        for role in ROLES:
            assert self.allocator.role_allocation(role) == {
                k: v for k, v in expected[role].items() if v}, role


AllocatorMachine.TestCase.settings = settings(
    CI, max_examples=60, stateful_step_count=40)
test_allocator_state_machine = AllocatorMachine.TestCase
