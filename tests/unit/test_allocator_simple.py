"""Tests for master.allocator.simple: DRF order, alternation, filters, suppression,
roles and bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyad.resources import Resources
from master.allocator import Allocation, AllocatorError, SimpleAllocator

AGENT = Resources.parse("cpus:4;mem:4096;ports:[31000-31099]")


def make(*agents: str, frameworks: tuple[str, ...] = ("a", "b")) -> SimpleAllocator:
    allocator = SimpleAllocator({"cpus": 0.01, "mem": 32})
    for agent_id in agents:
        allocator.add_agent(agent_id, AGENT)
    for framework_id in frameworks:
        allocator.add_framework(framework_id, ["*"])
    return allocator


def pairs(allocations: list[Allocation]) -> list[tuple[str, str]]:
    return [(a.framework_id, a.agent_id) for a in allocations]


def test_whole_agent_offered_to_first_in_order() -> None:
    allocator = make("s1")
    (allocation,) = allocator.allocate(0.0)
    assert allocation == Allocation("a", "s1", AGENT)  # tie on share and count: id
    assert allocator.free("s1").is_empty()
    assert allocator.allocate(1.0) == []


def test_equal_frameworks_alternate_within_a_cycle() -> None:
    allocator = make("s1", "s2", "s3", "s4")
    assert pairs(allocator.allocate(0.0)) == [("a", "s1"), ("b", "s2"), ("a", "s3"), ("b", "s4")]
    assert allocator.share("a") == allocator.share("b") == 0.5


def test_lowest_dominant_share_first() -> None:
    allocator = make("s1", "s2")
    allocator.update_used("s1", "b", Resources.parse("mem:1024"))  # b: 1024/8192 mem
    allocator.update_used("s1", "a", Resources.parse("cpus:2"))    # a: 2/8 cpus
    (first, second) = allocator.allocate(0.0)
    assert first.framework_id == "b"
    assert first.resources == AGENT - Resources.parse("cpus:2;mem:1024")
    assert second == Allocation("a", "s2", AGENT)


def test_fewer_allocations_breaks_share_ties() -> None:
    allocator = make("s1", frameworks=("a", "b"))
    allocator.allocate(0.0)  # a gets s1 (one allocation)
    allocator.close_offer("a", "s1", AGENT)
    assert pairs(allocator.allocate(1.0)) == [("b", "s1")]


def test_no_second_offer_while_one_is_outstanding() -> None:
    allocator = make("s1", frameworks=("a",))
    allocator.allocate(0.0)
    allocator.close_offer("a", "s1", Resources())  # all of it used
    allocator.recover("s1", "a", Resources.parse("cpus:1;mem:100"))
    assert pairs(allocator.allocate(1.0)) == [("a", "s1")]
    allocator.recover("s1", "a", Resources.parse("cpus:1"))
    assert allocator.allocate(2.0) == []  # a still holds an offer there


def test_filters_expire() -> None:
    allocator = make("s1", frameworks=("a",))
    allocator.add_filter("a", "s1", until=10.0)
    assert allocator.allocate(9.99) == []
    assert pairs(allocator.allocate(10.0)) == [("a", "s1")]


def test_filter_skips_to_next_framework() -> None:
    allocator = make("s1")
    allocator.add_filter("a", "s1", until=5.0)
    assert pairs(allocator.allocate(0.0)) == [("b", "s1")]


def test_suppress_and_revive() -> None:
    allocator = make("s1", frameworks=("a",))
    allocator.suppress("a")
    allocator.add_filter("a", "s1", until=100.0)
    assert allocator.allocate(0.0) == []
    allocator.revive("a")  # also clears filters
    assert pairs(allocator.allocate(0.0)) == [("a", "s1")]


def test_inactive_frameworks_get_nothing() -> None:
    allocator = make("s1", frameworks=())
    allocator.add_framework("a", ["*"], active=False)
    assert allocator.allocate(0.0) == []
    allocator.activate("a")
    assert pairs(allocator.allocate(0.0)) == [("a", "s1")]
    allocator.close_offer("a", "s1", AGENT)
    allocator.deactivate("a")
    assert allocator.allocate(1.0) == []


def test_minimum_allocatable() -> None:
    allocator = make(frameworks=("a",))
    allocator.add_agent("tiny", Resources.parse("cpus:0.005;mem:16;ports:[1-5]"))
    allocator.add_agent("mem-only", Resources.parse("mem:64"))
    assert pairs(allocator.allocate(0.0)) == [("a", "mem-only")]


def test_reserved_resources_go_only_to_their_role() -> None:
    allocator = SimpleAllocator({"cpus": 0.01, "mem": 32})
    allocator.add_agent("s1", Resources.parse("cpus:1;mem:64;cpus(eng):2;mem(eng/ml):128"))
    allocator.add_framework("ops", ["ops"])
    allocator.add_framework("ml", ["eng/ml"])
    allocator.add_framework("multi", ["eng", "ops"])
    by_framework = {a.framework_id: a.resources for a in allocator.allocate(0.0)}
    # 'ml' sorts first (all shares 0, no allocations): gets '*', 'eng' and 'eng/ml'.
    assert by_framework == {"ml": Resources.parse("cpus:1;mem:64;cpus(eng):2;mem(eng/ml):128")}
    allocator.close_offer("ml", "s1", Resources.parse("cpus(eng):2;mem(eng/ml):128"))
    # Only reservations are left: 'ops' may take none; 'multi' (share 0) takes
    # 'cpus(eng)' first, then 'ml' (share 1/3) its 'mem(eng/ml)' back.
    assert [(a.framework_id, str(a.resources)) for a in allocator.allocate(1.0)] == [
        ("multi", "cpus(eng):2"), ("ml", "mem(eng/ml):128")]


def test_remove_framework_frees_its_allocation() -> None:
    allocator = make("s1")
    allocator.allocate(0.0)
    allocator.remove_framework("a")
    assert allocator.free("s1") == AGENT
    assert pairs(allocator.allocate(1.0)) == [("b", "s1")]


def test_remove_agent_drops_its_share() -> None:
    allocator = make("s1", "s2", frameworks=("a",))
    allocator.allocate(0.0)
    assert allocator.share("a") == 1.0
    allocator.remove_agent("s1")
    assert allocator.share("a") == 1.0  # s2 only, fully allocated
    allocator.add_agent("s3", AGENT)
    assert allocator.share("a") == 0.5


def test_inconsistent_reports_raise() -> None:
    allocator = make("s1")
    with pytest.raises(AllocatorError):
        allocator.recover("s1", "a", Resources.parse("cpus:1"))
    with pytest.raises(AllocatorError):
        allocator.update_used("s1", "a", Resources.parse("cpus:5"))
    with pytest.raises(AllocatorError):
        allocator.add_agent("s1", AGENT)
    with pytest.raises(AllocatorError):
        allocator.add_filter("nobody", "s1", 1.0)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 4)), max_size=12),
       st.integers(1, 6))
def test_deterministic_and_conserving(uses: list[tuple[str, int]], n_agents: int) -> None:
    """Two allocators fed the same history decide the same; nothing is lost."""
    def run() -> tuple[list[Allocation], SimpleAllocator]:
        allocator = make(*(f"s{i}" for i in range(n_agents)), frameworks=("a", "b", "c"))
        for i, (framework_id, cpus) in enumerate(uses):
            agent_id = f"s{i % n_agents}"
            if Resources.of(cpus=cpus) <= allocator.free(agent_id):
                allocator.update_used(agent_id, framework_id, Resources.of(cpus=cpus))
        return allocator.allocate(0.0), allocator

    first, allocator = run()
    assert first == run()[0]
    for i in range(n_agents):
        agent_id = f"s{i}"
        held = allocator.free(agent_id)
        for framework_id in "abc":
            held = held + allocator.allocated(agent_id, framework_id)
        assert held == AGENT
    seen = pairs(first)
    assert len(seen) == len(set(seen))
