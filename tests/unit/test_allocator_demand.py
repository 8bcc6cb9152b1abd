"""Declared demand (master.allocator.demand): offers stop once they cover what a
framework declared, with headroom; nobody with unmet demand is starved; a
framework that declares nothing is offered as before. The allocator is driven
directly, playing the master; last, the driver core and the master's door."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from dyad.effects import Send
from dyad.messages import (
    FrameworkInfo, RequestResources, ResourceRequest, Subscribe, Subscribed, Suppress,
)
from dyad.resources import Resources
from frameworks.driver_core import Received, Started
from frameworks.scheduler_core import MasterDetected, RequestCall, SchedulerCore, SuppressCall
from master.allocator import Allocation, HierarchicalAllocator
from master.allocator.demand import FRAGMENTS, HEADROOM, MIN_AGENTS
from frameworks.testing import make_master_info
from frameworks.batch.core import OffersMade
from frameworks.effects import LaunchTasks, RequestResources as Declare, SuppressOffers
from tests.unit.test_batch_core import EXECUTOR, TASK as SHAPE, Run, config
from tests.unit.test_master_state import Harness, messages

AGENT = Resources.parse("cpus:4;mem:4096")
TASK = Resources.parse("cpus:1;mem:512")
MIN = {"cpus": 0.01, "mem": 32}


def make(agents: int, frameworks: tuple[str, ...] = ("a",)) -> HierarchicalAllocator:
    allocator = HierarchicalAllocator(MIN)
    for index in range(agents):
        allocator.add_agent(f"s{index:02d}", AGENT)
    for framework_id in frameworks:
        allocator.add_framework(framework_id, ["*"])
    return allocator


def offered_to(allocations: list[Allocation], framework_id: str) -> list[str]:
    return [a.agent_id for a in allocations if a.framework_id == framework_id]


# ------------------------------------------------------------------ examples


def test_a_framework_without_demand_is_offered_every_agent() -> None:
    allocator = make(20)
    assert len(allocator.allocate(0.0)) == 20


def test_offers_stop_once_they_cover_the_demand_with_headroom() -> None:
    allocator = make(20, ("a", "b"))
    allocator.request("a", [(TASK, 10)])  # 10 cpus: covered by 20 cpus on >= 8 agents
    allocations = allocator.allocate(0.0)
    assert len(offered_to(allocations, "a")) == 8  # 32 cpus: the agent floor decides
    assert len(offered_to(allocations, "b")) == 12  # the rest, in DRF order


def test_the_headroom_decides_for_a_large_demand() -> None:
    allocator = make(100, ("a", "b"))
    allocator.request("a", [(TASK, 40)])  # 2 x 40 cpus = 20 agents of 4
    allocations = allocator.allocate(0.0)
    assert len(offered_to(allocations, "a")) == 40 * HEADROOM // 4
    assert len(offered_to(allocations, "b")) == 100 - 20


def test_a_small_demand_is_still_spread_over_a_few_agents() -> None:
    allocator = make(20)
    allocator.request("a", [(TASK, 3)])
    assert len(allocator.allocate(0.0)) == 3  # one agent would hold 2x, but 3 tasks: 3 agents


def test_a_closed_offer_lets_the_skipped_agents_be_offered_again() -> None:
    allocator = make(20)
    allocator.request("a", [(TASK, 10)])
    first = offered_to(allocator.allocate(0.0), "a")
    assert allocator.allocate(1.0) == []  # covered: nothing more, the rest stays clean
    allocator.add_filter("a", first[0], 100.0)  # declined, refused for a while
    allocator.close_offer("a", first[0], AGENT)
    second = offered_to(allocator.allocate(2.0), "a")
    assert len(second) == 1 and second[0] not in first


def test_a_new_declaration_replaces_the_old_and_an_empty_one_clears_it() -> None:
    allocator = make(20)
    allocator.request("a", [(TASK, 2)])
    assert len(allocator.allocate(0.0)) == 2
    allocator.request("a", [(TASK, 12)])  # 24 cpus: 6 agents, floor 8 agents
    assert len(allocator.allocate(1.0)) == 6  # 8 in all, its 2 offers still count
    allocator.request("a", [])
    assert len(allocator.allocate(2.0)) == 12  # no bound: the rest of the cell


def test_suppress_clears_the_demand() -> None:
    allocator = make(20)
    allocator.request("a", [(TASK, 1)])
    assert len(allocator.allocate(0.0)) == 1
    allocator.suppress("a")
    allocator.revive("a")
    assert len(allocator.allocate(1.0)) == 19


def test_fragments_are_offered_but_do_not_count() -> None:
    allocator = make(12, ("a", "b"))
    for index in range(8):  # 8 of 12 agents keep only a fragment free
        allocator.update_used(f"s{index:02d}", "b", Resources.parse("cpus:3.5;mem:3000"))
    allocator.request("a", [(TASK, 2)])  # 4 tasks' room on 2 agents
    allocations = allocator.allocate(0.0)
    # s00-s07 hold no task: offered, not counted; s08 and s09 cover it.
    assert offered_to(allocations, "a") == [f"s{index:02d}" for index in range(10)]
    assert offered_to(allocations, "b") == ["s10", "s11"]


def test_a_demand_no_agent_holds_is_never_covered_and_sees_a_few_fragments() -> None:
    allocator = make(12)
    allocator.request("a", [(Resources.parse("cpus:1;gpus:1"), 1)])
    # Every agent is a fragment for "a": it is offered FRAGMENTS of them (it learns
    # that nothing fits); the rest are spared for it.
    assert offered_to(allocator.allocate(0.0), "a") == [f"s{i:02d}" for i in range(FRAGMENTS)]
    allocator.add_framework("b", ["*"])
    assert offered_to(allocator.allocate(1.0), "b") == [f"s{i:02d}" for i in range(8, 12)]


def busy(frameworks: tuple[str, ...]) -> HierarchicalAllocator:
    """12 agents on which "x" (suppressed) leaves only a fragment for TASK free."""
    allocator = make(12, ("x",))
    for index in range(12):
        allocator.update_used(f"s{index:02d}", "x", Resources.parse("cpus:3.5;mem:3000"))
    allocator.suppress("x")
    for framework_id in frameworks:
        allocator.add_framework(framework_id, ["*"])
    return allocator


def test_spared_fragments_wait_for_a_new_declaration_or_a_change_on_the_agent() -> None:
    allocator = busy(("b",))
    allocator.request("b", [(TASK, 1)])
    first = offered_to(allocator.allocate(0.0), "b")
    assert first == [f"s{index:02d}" for index in range(FRAGMENTS)]
    assert allocator.allocate(1.0) == []  # s08-s11 stay spared: nothing changed there
    allocator.release("s09", "x", Resources.parse("cpus:1;mem:512"))  # room for a task now
    assert offered_to(allocator.allocate(2.0), "b") == ["s09"]
    for agent_id in first:  # declined, and refused for a while
        allocator.close_offer("b", agent_id, allocator.allocated(agent_id, "b"))
        allocator.add_filter("b", agent_id, 100.0)
    allocator.request("b", [(TASK, 2)])  # a fresh budget: the spared ones, in order
    assert offered_to(allocator.allocate(3.0), "b") == ["s08", "s10", "s11"]


def test_a_fragment_where_the_framework_holds_something_is_always_offered() -> None:
    allocator = busy(("b",))
    for index in range(12):  # "b" runs an executor everywhere, say: less may do there
        allocator.update_used(f"s{index:02d}", "b", Resources.parse("cpus:0.1;mem:32"))
    allocator.request("b", [(TASK, 4)])
    assert len(offered_to(allocator.allocate(0.0), "b")) == 12


def test_a_removed_agent_takes_its_offer_out_of_the_count() -> None:
    allocator = make(10)
    allocator.request("a", [(TASK, 1)])
    (first,) = allocator.allocate(0.0)
    allocator.remove_agent(first.agent_id)
    (second,) = allocator.allocate(1.0)
    assert second.agent_id != first.agent_id


# ----------------------------------------------------------------- properties

FRAMEWORKS = ("a", "b", "c")
SHAPES = [Resources.parse(text) for text in ("cpus:1;mem:512", "cpus:2;mem:256", "cpus:0.5;mem:2048")]
agent_sizes = st.lists(st.sampled_from(["cpus:4;mem:4096", "cpus:8;mem:2048", "cpus:1;mem:8192",
                                        "cpus:16;mem:16384"]), min_size=1, max_size=14)
framework_ids = st.sampled_from(("a", "a", "a", "b", "c"))  # "a" most, so it is often alone
ops = st.lists(st.one_of(
    st.tuples(st.just("allocate")),
    st.tuples(st.just("declare"), framework_ids,
              st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.integers(0, 12)),
                       max_size=2)),
    st.tuples(st.just("decline"), framework_ids, st.integers(0, 20),
              st.sampled_from([0.0, 0.5, 3.0])),
    st.tuples(st.just("launch"), framework_ids, st.integers(0, 20)),
    st.tuples(st.just("finish"), st.integers(0, 20)),
    st.tuples(st.just("suppress"), framework_ids),
    st.tuples(st.just("revive"), framework_ids),
), max_size=40)


def holds(shape: dict[str, int], resources: Resources) -> int:
    """How many tasks of `shape` fit in `resources`."""
    have = resources.scalar_items()
    return min(have.get(kind, 0) // milli for kind, milli in shape.items())


class Model:
    """What the test knows of offers and declared demand, kept from the outside."""

    def __init__(self, allocator: HierarchicalAllocator) -> None:
        self.allocator = allocator
        self.offers: dict[str, dict[str, Resources]] = {f: {} for f in FRAMEWORKS}
        # Per framework: its declared shapes (scalar milli) with the tasks of each its
        # offers must hold, and how many offers must hold a task; None: no demand.
        self.need: dict[str, tuple[list[tuple[dict[str, int], int]], int] | None] = \
            dict.fromkeys(FRAMEWORKS)
        self.counted: dict[str, dict[str, Resources]] = {f: {} for f in FRAMEWORKS}
        self.fragments = dict.fromkeys(FRAMEWORKS, 0)  # made since the declaration
        self.suppressed: set[str] = set()
        self.used: list[tuple[str, str, Resources]] = []
        self.now = 0.0

    def covered(self, framework_id: str, counted: dict[str, Resources]) -> bool:
        declared = self.need[framework_id]
        if declared is None:
            return False
        shapes, floor = declared
        if sum(1 for r in counted.values() if self.fits(framework_id, r)) < floor:
            return False
        return all(sum(holds(shape, r) for r in counted.values()) >= wanted
                   for shape, wanted in shapes)

    def holds_on(self, framework_id: str, agent_id: str) -> bool:
        return any(a == agent_id and f == framework_id for a, f, _ in self.used)

    def fits(self, framework_id: str, resources: Resources) -> bool:
        declared = self.need[framework_id]
        return declared is None or any(holds(shape, resources) for shape, _ in declared[0])

    def apply(self, op: tuple[Any, ...], also_empty: bool = False) -> list[Allocation]:
        allocator, name = self.allocator, op[0]
        if name == "allocate":
            self.now += 1.0
            return allocator.allocate(self.now)
        if name == "declare":
            framework_id, requests = op[1], [(SHAPES[i], n) for i, n in op[2]]
            allocator.request(framework_id, requests)
            counts: dict[tuple[tuple[str, int], ...], int] = {}
            for shape, count in requests:  # a shape named twice wants both counts
                key = tuple(sorted(shape.scalar_items().items()))
                counts[key] = counts.get(key, 0) + count
            shapes = [(dict(key), HEADROOM * count) for key, count in counts.items() if count]
            tasks = sum(count for _, count in requests)
            if tasks:
                if self.need[framework_id] is None:
                    self.counted[framework_id] = {}
                self.need[framework_id] = (shapes, min(MIN_AGENTS, tasks))
                self.fragments[framework_id] = 0
            else:
                self.need[framework_id], self.counted[framework_id] = None, {}
        elif name in ("decline", "launch"):
            framework_id, index = op[1], op[2]
            offers = self.offers[framework_id]
            if offers:
                agent_id = sorted(offers)[index % len(offers)]
                resources = offers.pop(agent_id)
                self.counted[framework_id].pop(agent_id, None)
                if name == "decline":
                    if op[3]:
                        allocator.add_filter(framework_id, agent_id, self.now + op[3])
                    allocator.close_offer(framework_id, agent_id, resources)
                else:  # one task of the first shape if it fits, else the whole offer
                    used = SHAPES[0] if SHAPES[0] <= resources else resources
                    allocator.close_offer(framework_id, agent_id, resources - used)
                    self.used.append((agent_id, framework_id, used))
        elif name == "finish":
            if self.used:
                agent_id, framework_id, resources = self.used.pop(op[1] % len(self.used))
                allocator.release(agent_id, framework_id, resources)
        elif name == "suppress":
            allocator.suppress(op[1])
            self.suppressed.add(op[1])
            self.need[op[1]], self.counted[op[1]] = None, {}
        elif name == "revive":
            allocator.revive(op[1])
            self.suppressed.discard(op[1])
        return []


@settings(max_examples=300, deadline=None)
@given(agent_sizes, ops, st.sets(st.sampled_from(FRAMEWORKS[1:])))
# A decline uncovers a framework alone in the cell: the agents it was skipped on
# must be offered to it again (caught a missed dirtying while this was written).
@example(["cpus:4;mem:4096"] * 12, [("declare", "a", [(0, 2)]), ("allocate",),
                                    ("decline", "a", 0, 3.0), ("allocate",)], {"b", "c"})
# Every agent a fragment for shape 1: the budget runs out, a declaration renews it.
@example(["cpus:1;mem:8192"] * 11 + ["cpus:4;mem:4096"],
         [("declare", "a", [(1, 3)]), ("allocate",), ("decline", "a", 0, 0.0),
          ("launch", "a", 1), ("declare", "a", [(1, 2)]), ("allocate",),
          ("declare", "a", [(0, 2)]), ("finish", 0)], {"b", "c"})
# A declaration naming one shape twice wants both counts (found by this test: the
# model had checked each count alone).
@example(["cpus:4;mem:4096"] * 9, [("declare", "a", [(0, 1)]),
                                   ("declare", "a", [(1, 1), (1, 8)])], {"b", "c"})
def test_offers_never_pass_demand_and_headroom_by_more_than_one_agent_and_nobody_starves(
        sizes: list[str], steps: list[tuple[Any, ...]], quiet: set[str]) -> None:
    allocator = HierarchicalAllocator(MIN)
    agents = [f"s{index:02d}" for index in range(len(sizes))]
    for agent_id, size in zip(agents, sizes):
        allocator.add_agent(agent_id, Resources.parse(size))
    for framework_id in FRAMEWORKS:
        allocator.add_framework(framework_id, ["*"])
    model = Model(allocator)
    for framework_id in sorted(quiet):  # often the only framework wanting offers
        model.apply(("suppress", framework_id))
    for step in [x for s in steps for x in (s, ("allocate",))]:  # a pass after each step
        allocations = model.apply(step)
        for allocation in allocations:
            framework_id = allocation.framework_id
            # Before each offer its framework was not yet covered: the offers in a
            # pass pass demand + headroom by one agent's offer at most.
            assert not model.covered(framework_id, model.counted[framework_id]), allocation
            if not model.fits(framework_id, allocation.resources):
                # A fragment: within the budget, or where it holds something.
                assert (model.fragments[framework_id] < FRAGMENTS
                        or model.holds_on(framework_id, allocation.agent_id)), allocation
                model.fragments[framework_id] += 1
            model.offers[framework_id][allocation.agent_id] = allocation.resources
            if model.need[framework_id] is not None:
                model.counted[framework_id][allocation.agent_id] = allocation.resources
        if step[0] != "allocate":
            continue
        # No starvation: a framework that may take offers and is not covered has
        # been offered every agent with anything worth offering that it could take,
        # but fragments beyond its budget on agents where it holds nothing.
        for framework_id in FRAMEWORKS:
            if framework_id in model.suppressed or model.covered(
                    framework_id, model.counted[framework_id]):
                continue
            for agent_id in agents:
                free = allocator.free(agent_id)
                worth = free.get("cpus") >= 0.01 or free.get("mem") >= 32
                filtered = allocator._agents[agent_id].filtered.get(framework_id, -1.0)
                spared = (not model.fits(framework_id, free)
                          and model.fragments[framework_id] >= FRAGMENTS
                          and not model.holds_on(framework_id, agent_id))
                assert not (worth and agent_id not in model.offers[framework_id]
                            and filtered <= model.now and not spared), (framework_id, agent_id,
                                                                       free)


@settings(max_examples=100, deadline=None)
@given(agent_sizes, ops, st.lists(framework_ids, max_size=5))
def test_without_demand_offers_are_as_before(sizes: list[str], steps: list[tuple[Any, ...]],
                                              empties: list[str]) -> None:
    """Two allocators, one also told empty declarations now and then: the same
    offers, step by step."""
    steps = [s for s in steps if s[0] != "declare"]
    twins = []
    for _ in range(2):
        allocator = HierarchicalAllocator(MIN)
        for index, size in enumerate(sizes):
            allocator.add_agent(f"s{index:02d}", Resources.parse(size))
        for framework_id in FRAMEWORKS:
            allocator.add_framework(framework_id, ["*"])
        twins.append(Model(allocator))
    plain, told = twins
    for at, step in enumerate([*steps, ("allocate",)]):
        if at < len(empties):
            told.allocator.request(empties[at], [])
        got = [model.apply(step) for model in twins]
        assert got[0] == got[1]
        for model in twins:
            for allocation in got[0]:
                model.offers[allocation.framework_id][allocation.agent_id] = allocation.resources
    assert plain.allocator.role_shares() == told.allocator.role_shares()


# ------------------------------------------------------------ driver and master


def test_the_driver_sends_its_demand_with_the_subscribe_and_then_as_requests() -> None:
    shape = [ResourceRequest(resources=TASK, count=5)]
    core = SchedulerCore(FrameworkInfo(name="f", roles=["*"]))
    core.handle(Started(), 0.0)
    assert core.handle(RequestCall(shape), 0.0) == []  # noted: sent with the Subscribe
    (subscribe,) = [m for m in sent(core.handle(MasterDetected(make_master_info()), 0.0))]
    assert isinstance(subscribe, Subscribe) and subscribe.requests == shape
    after = core.handle(Received(Subscribed(framework_id="F1", heartbeat_interval=0.0,
                                            master_info=make_master_info())), 1.0)
    assert not [m for m in sent(after) if isinstance(m, RequestResources)]  # it had it
    smaller = [ResourceRequest(resources=TASK, count=2)]
    assert sent(core.handle(RequestCall(smaller), 2.0)) == [
        RequestResources(framework_id="F1", requests=smaller)]
    assert [type(m) for m in sent(core.handle(SuppressCall(), 3.0))] == [Suppress]


def test_the_master_bounds_offers_by_the_demand_subscribed_with_and_requested() -> None:
    harness = Harness()
    for index in range(20):
        harness.register(f"agent-{index}", resources="cpus:4;mem:4096", hostname=f"h{index}")
    sends = harness.recv("driver", Subscribe(
        framework=FrameworkInfo(name="f", roles=["*"]),
        requests=[ResourceRequest(resources=TASK, count=10)]))
    (subscribed,) = messages(sends, Subscribed)
    offers = harness.offers_to(sends + harness.allocate(), "driver")
    assert len(offers) == MIN_AGENTS  # not the 20 agents
    harness.recv("driver", RequestResources(framework_id=subscribed.framework_id))
    assert len(harness.offers_to(harness.allocate(), "driver")) == 20 - MIN_AGENTS


def sent(effects: list[Any]) -> list[Any]:
    return [e.message for e in effects if isinstance(e, Send)]


# ------------------------------------------------------------------ batch core


def test_the_batch_core_declares_its_eligible_tasks_and_redeclares_as_they_launch() -> None:
    run = Run(config([()] * 4))  # four maps without preferred hosts, two reduces
    need = SHAPE + EXECUTOR.resources
    assert run.core.declare() == [Declare(((need, 4),))]  # before subscribing
    effects = run.do(OffersMade((run.make_offer("a", "cpus:1.1;mem:4096"),)))  # two maps fit
    assert len([t for e in effects if isinstance(e, LaunchTasks) for t in e.tasks]) == 2
    assert Declare(((need, 2),)) in effects  # what is left
    effects = run.do(OffersMade((run.make_offer("b"),)))  # the rest launch: nothing eligible
    assert SuppressOffers() in effects and not [e for e in effects if isinstance(e, Declare)]


def test_the_batch_core_declares_nothing_while_maps_prefer_hosts() -> None:
    assert Run(config([("h1",), ()])).core.declare() == []
