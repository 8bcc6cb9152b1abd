"""Tests for master.allocator.hierarchical: DRF order over roles and frameworks,
filters, suppression, reservations, quota, weights, incremental passes and
bookkeeping. The allocator is driven directly, playing the master. Last, the
operator API that sets weights and quota (`PUT /weights`, `/quota`) over real
HTTP on loopback."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dyad.resources import Resources
from master.allocator import (
    Allocation, AllocatorError, HierarchicalAllocator, PolicyError, Quota, RandomSorter,
    check_quotas, parse_quota, parse_weights,
)
from master.http import make_app
from tests.unit.test_events import HttpView
from tests.unit.test_master_state import Harness

AGENT = Resources.parse("cpus:4;mem:4096;ports:[31000-31099]")
MIN = {"cpus": 0.01, "mem": 32}


def make(*agents: str, frameworks: tuple[str, ...] = ("a", "b"), role: str = "*",
         total: Resources = AGENT) -> HierarchicalAllocator:
    allocator = HierarchicalAllocator(MIN)
    for agent_id in agents:
        allocator.add_agent(agent_id, total)
    for framework_id in frameworks:
        allocator.add_framework(framework_id, [role])
    return allocator


def pairs(allocations: list[Allocation]) -> list[tuple[str, str]]:
    return [(a.framework_id, a.agent_id) for a in allocations]


def quota(guarantee: dict[str, float] | None = None,
          limit: dict[str, float] | None = None) -> Quota:
    return Quota(guarantee={k: round(v * 1000) for k, v in (guarantee or {}).items()},
                 limit={k: round(v * 1000) for k, v in (limit or {}).items()})


# ------------------------------------------------------------ framework level


def test_whole_agent_offered_to_first_in_order() -> None:
    allocator = make("s1")
    (allocation,) = allocator.allocate(0.0)
    assert allocation == Allocation("a", "s1", AGENT)  # tie on share and count: id
    assert allocator.free("s1").is_empty()
    assert allocator.allocate(1.0) == []


def test_equal_frameworks_alternate_within_a_pass() -> None:
    allocator = make("s1", "s2", "s3", "s4")
    assert pairs(allocator.allocate(0.0)) == [("a", "s1"), ("b", "s2"), ("a", "s3"), ("b", "s4")]
    assert allocator.share("a") == allocator.share("b") == 0.5


def test_lowest_dominant_share_first() -> None:
    allocator = make("s1", "s2")
    allocator.update_used("s1", "b", Resources.parse("mem:1024"))  # b: 1024/8192 mem
    allocator.update_used("s1", "a", Resources.parse("cpus:2"))    # a: 2/8 cpus
    first, second = allocator.allocate(0.0)
    assert first.framework_id == "b"
    assert first.resources == AGENT - Resources.parse("cpus:2;mem:1024")
    assert second == Allocation("a", "s2", AGENT)


def test_fewer_allocations_breaks_share_ties() -> None:
    allocator = make("s1")
    allocator.allocate(0.0)  # a gets s1 (one allocation)
    allocator.close_offer("a", "s1", AGENT)
    assert pairs(allocator.allocate(1.0)) == [("b", "s1")]


def test_no_second_offer_while_one_is_outstanding() -> None:
    allocator = make("s1", frameworks=("a",))
    allocator.allocate(0.0)
    allocator.close_offer("a", "s1", Resources())  # all of it used
    allocator.release("s1", "a", Resources.parse("cpus:1;mem:100"))
    assert pairs(allocator.allocate(1.0)) == [("a", "s1")]
    allocator.release("s1", "a", Resources.parse("cpus:1"))
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


def test_a_longer_filter_wins_and_the_earlier_expiry_is_ignored() -> None:
    allocator = make("s1", frameworks=("a",))
    allocator.add_filter("a", "s1", until=5.0)
    allocator.add_filter("a", "s1", until=50.0)
    allocator.add_filter("a", "s1", until=1.0)  # never shortens a filter
    assert allocator.allocate(6.0) == []
    assert pairs(allocator.allocate(50.0)) == [("a", "s1")]


def test_suppress_and_revive() -> None:
    allocator = make("s1", frameworks=("a",))
    allocator.suppress("a")
    allocator.add_filter("a", "s1", until=100.0)
    assert allocator.allocate(0.0) == []
    allocator.revive("a")  # also clears filters
    assert pairs(allocator.allocate(0.0)) == [("a", "s1")]


def test_revive_of_an_unsuppressed_framework_clears_its_filters() -> None:
    allocator = make("s1", "s2", frameworks=("a",))
    offers = allocator.allocate(0.0)
    for offer in offers:
        allocator.close_offer("a", offer.agent_id, offer.resources)
        allocator.add_filter("a", offer.agent_id, 1e9)
    assert allocator.allocate(1.0) == []
    allocator.revive("a")
    assert sorted(pairs(allocator.allocate(2.0))) == [("a", "s1"), ("a", "s2")]


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
        allocator.release("s1", "a", Resources.parse("cpus:1"))
    with pytest.raises(AllocatorError):
        allocator.update_used("s1", "a", Resources.parse("cpus:5"))
    with pytest.raises(AllocatorError):
        allocator.add_agent("s1", AGENT)
    with pytest.raises(AllocatorError):
        allocator.add_filter("nobody", "s1", 1.0)
    with pytest.raises(AllocatorError):
        allocator.add_framework("c", [])
    with pytest.raises(AllocatorError):
        allocator.free("nowhere")


# ------------------------------------------------------------------ roles


def test_roles_are_sorted_before_frameworks() -> None:
    """DRF between roles first: role 'big' has two frameworks, 'small' one; the
    roles alternate, so 'small's framework gets as much as both of 'big's."""
    allocator = make("s1", "s2", "s3", "s4", frameworks=())
    allocator.add_framework("b1", ["big"])
    allocator.add_framework("b2", ["big"])
    allocator.add_framework("s1", ["small"])
    got = pairs(allocator.allocate(0.0))
    assert got == [("b1", "s1"), ("s1", "s2"), ("b2", "s3"), ("s1", "s4")]
    assert allocator.role_shares() == {"big": 0.5, "small": 0.5}


def test_hierarchical_roles_share_as_subtrees() -> None:
    """eng/ml and eng/web together count as eng against ops."""
    allocator = make("s1", "s2", "s3", "s4", frameworks=())
    allocator.add_framework("ml", ["eng/ml"])
    allocator.add_framework("web", ["eng/web"])
    allocator.add_framework("ops", ["ops"])
    got = pairs(allocator.allocate(0.0))
    assert got == [("ml", "s1"), ("ops", "s2"), ("web", "s3"), ("ops", "s4")]
    assert allocator.role_allocation("eng") == {"cpus": 8000, "mem": 8192000}


def test_weights_scale_role_shares() -> None:
    allocator = make(*(f"s{i}" for i in range(6)), frameworks=())
    allocator.add_framework("x", ["heavy"])
    allocator.add_framework("y", ["light"])
    allocator.set_weight("heavy", 2.0)
    got = [a.framework_id for a in allocator.allocate(0.0)]
    assert got.count("x") == 4 and got.count("y") == 2


def test_reserved_resources_go_only_to_their_role() -> None:
    allocator = HierarchicalAllocator(MIN)
    allocator.add_agent("s1", Resources.parse("cpus:1;mem:64;cpus(eng):2;mem(eng/ml):128"))
    allocator.add_framework("ops", ["ops"])
    allocator.add_framework("ml", ["eng/ml"])
    got = {a.framework_id: a.resources for a in allocator.allocate(0.0)}
    # Roles tie at 0: eng/ml sorts first and may take '*', 'eng' and 'eng/ml'.
    assert got == {"ml": Resources.parse("cpus:1;mem:64;cpus(eng):2;mem(eng/ml):128")}
    allocator.close_offer("ml", "s1", Resources.parse("cpus(eng):2;mem(eng/ml):128;cpus:1;mem:64"))
    allocator.add_filter("ml", "s1", 100.0)
    got = {a.framework_id: a.resources for a in allocator.allocate(1.0)}
    assert got == {"ops": Resources.parse("cpus:1;mem:64")}  # never the reservations


def test_multi_role_framework_is_charged_to_one_role_per_agent() -> None:
    allocator = HierarchicalAllocator(MIN)
    allocator.add_agent("s1", Resources.parse("cpus:2;mem:256;cpus(eng):2"))
    allocator.add_agent("s2", Resources.parse("cpus:2;mem:256;cpus(ops):2"))
    allocator.add_framework("multi", ["eng", "ops"])
    got = allocator.allocate(0.0)
    assert [(a.agent_id, str(a.resources)) for a in got] == [
        ("s1", "cpus:2;cpus(eng):2;mem:256"), ("s2", "cpus:2;cpus(ops):2;mem:256")]
    assert allocator.allocation_role("s1", "multi") == "eng"
    assert allocator.allocation_role("s2", "multi") == "ops"
    assert allocator.role_allocation("eng") == {"cpus": 4000, "mem": 256000}


def test_changing_roles_keeps_charges_until_released() -> None:
    allocator = make("s1", "s2", frameworks=())
    allocator.add_framework("f", ["old"])
    allocator.allocate(0.0)
    allocator.close_offer("f", "s2", AGENT)  # keeps s1
    allocator.add_framework("f", ["new"])
    assert allocator.role_allocation("old")["cpus"] == 4000
    assert pairs(allocator.allocate(1.0)) == [("f", "s2")]
    assert allocator.allocation_role("s2", "f") == "new"
    allocator.close_offer("f", "s1", AGENT)
    assert set(allocator.role_shares()) == {"new"}  # 'old' is gone with its last charge


def test_random_sorter_allocator_still_allocates_everything() -> None:
    allocator = HierarchicalAllocator(MIN, sorter=lambda: RandomSorter(1))
    for i in range(6):
        allocator.add_agent(f"s{i}", AGENT)
    for fid in "abc":
        allocator.add_framework(fid, ["*"])
    got = allocator.allocate(0.0)
    assert len(got) == 6 and {a.framework_id for a in got} <= set("abc")


# ---------------------------------------------------------- reservations


def test_transform_reserves_and_unreserves_within_an_allocation() -> None:
    allocator = make("s1", frameworks=("a",), role="eng")
    allocator.allocate(0.0)
    reserved = Resources.parse("cpus(eng):1;mem(eng):512")
    allocator.transform("s1", "a", reserved.flatten(), reserved)
    assert allocator.allocated("s1", "a") == AGENT - reserved.flatten() + reserved
    allocator.close_offer("a", "s1", allocator.allocated("s1", "a"))
    assert allocator.free("s1") == AGENT - reserved.flatten() + reserved
    allocator.add_framework("other", ["ops"])
    allocator.add_filter("a", "s1", 100.0)
    (offer,) = allocator.allocate(1.0)
    assert offer.framework_id == "other" and offer.resources == AGENT - reserved.flatten()
    allocator.close_offer("other", "s1", offer.resources)
    allocator.revive("a")
    (offer,) = allocator.allocate(2.0)
    allocator.transform("s1", "a", reserved, reserved.flatten())
    assert allocator.allocated("s1", "a") == AGENT


def test_transform_checks() -> None:
    allocator = make("s1", frameworks=("a",), role="eng")
    with pytest.raises(AllocatorError):  # holds nothing yet
        allocator.transform("s1", "a", Resources.parse("cpus:1"), Resources.parse("cpus(eng):1"))
    allocator.allocate(0.0)
    with pytest.raises(AllocatorError):  # amounts differ
        allocator.transform("s1", "a", Resources.parse("cpus:1"), Resources.parse("cpus(eng):2"))
    with pytest.raises(AllocatorError):  # not the allocation's role
        allocator.transform("s1", "a", Resources.parse("cpus:1"), Resources.parse("cpus(ops):1"))


# ------------------------------------------------------------------ quota


def test_quota_limit_caps_offers() -> None:
    allocator = make("s1", "s2", frameworks=("a",), role="eng")
    allocator.set_quota("eng", quota(limit={"cpus": 6}))
    got = allocator.allocate(0.0)
    assert [str(a.resources) for a in got] == [str(AGENT), "cpus:2;mem:4096;ports:[31000-31099]"]
    assert allocator.role_allocation("eng")["cpus"] == 6000
    allocator.release("s1", "a", Resources.parse("cpus:1"))
    assert allocator.allocate(1.0) == []  # holds offers on both agents
    allocator.close_offer("a", "s2", got[1].resources)
    (again,) = allocator.allocate(2.0)
    assert again.resources == Resources.parse("cpus:3;mem:4096;ports:[31000-31099]")
    allocator.set_quota("eng", None)


def test_quota_limit_counts_the_subtree() -> None:
    allocator = make("s1", "s2", frameworks=(), role="eng")
    allocator.add_framework("ml", ["eng/ml"])
    allocator.add_framework("web", ["eng/web"])
    allocator.set_quota("eng", quota(limit={"cpus": 5}))
    got = allocator.allocate(0.0)
    assert sum(a.resources.get("cpus") for a in got) == 5


def test_quota_guarantee_is_offered_first_and_headroom_held_back() -> None:
    """'prod' is guaranteed 6 cpus; 'dev' sorts first (name), but the guarantee
    stage goes first, and dev may not eat into the 6 cpus prod still needs."""
    allocator = make("s1", "s2", "s3", frameworks=())
    allocator.add_framework("dev", ["dev"])
    allocator.add_framework("prod", ["prod"])
    allocator.set_quota("prod", quota(guarantee={"cpus": 6}))
    got = allocator.allocate(0.0)
    cpus = {fid: sum(a.resources.get("cpus") for a in got if a.framework_id == fid)
            for fid in ("dev", "prod")}
    assert cpus["prod"] >= 6
    assert cpus["dev"] + cpus["prod"] == 12


def test_guarantee_without_frameworks_holds_back_headroom() -> None:
    allocator = make("s1", "s2", frameworks=("dev",), role="dev")
    allocator.set_quota("prod", quota(guarantee={"cpus": 3}))
    got = allocator.allocate(0.0)
    assert sum(a.resources.get("cpus") for a in got) == 5  # 8 - 3 held back
    allocator.set_quota("prod", None)  # released: the held-back agents are looked at again
    got = allocator.allocate(1.0)
    assert sum(a.resources.get("cpus") for a in got) == 0  # dev holds offers on both
    for agent_id in ("s1", "s2"):
        allocator.close_offer("dev", agent_id, allocator.allocated(agent_id, "dev"))
    got = allocator.allocate(2.0)
    assert sum(a.resources.get("cpus") for a in got) == 8


def test_quota_policy_parsing_and_coherence() -> None:
    assert parse_weights([{"role": "eng", "weight": 2}]) == {"eng": 2.0}
    assert parse_weights({"role": "*", "weight": 0.5}) == {"*": 0.5}
    for bad in ([], [{"role": "eng"}], [{"role": "eng", "weight": 0}],
                [{"role": "bad role", "weight": 1}], [{"role": "e", "weight": float("inf")}],
                [{"role": "e", "weight": 1}, {"role": "e", "weight": 2}], "x",
                [{"role": "e", "weight": True}]):
        with pytest.raises(PolicyError):
            parse_weights(bad)
    parsed = parse_quota({"role": "eng", "guarantee": {"cpus": 2}, "limit": {"cpus": 4.5}})
    assert parsed == {"eng": quota({"cpus": 2}, {"cpus": 4.5})}
    assert parsed["eng"].to_json() == {"guarantee": {"cpus": 2.0}, "limit": {"cpus": 4.5}}
    assert parse_quota({"role": "eng"})["eng"].is_empty()
    bad_quotas: list[Any] = [
        {"role": "*", "limit": {"cpus": 1}}, {"role": "eng", "limit": {"ports": 1}},
        {"role": "eng", "limit": {"cpus": -1}}, {"role": "eng", "oops": {}},
        {"role": "eng", "limit": [1]}, [], {"guarantee": {}}]
    for body in bad_quotas:
        with pytest.raises(PolicyError):
            parse_quota(body)
    with pytest.raises(PolicyError):  # guarantee above own limit
        check_quotas({"eng": quota({"cpus": 5}, {"cpus": 4})})
    with pytest.raises(PolicyError):  # above an ancestor's limit
        check_quotas({"eng": quota(limit={"cpus": 4}), "eng/ml": quota({"cpus": 5})})
    with pytest.raises(PolicyError):  # children guaranteed more than the parent
        check_quotas({"eng": quota({"cpus": 4}), "eng/ml": quota({"cpus": 3}),
                      "eng/web": quota({"cpus": 2})})
    check_quotas({"eng": quota({"cpus": 5}), "eng/ml": quota({"cpus": 3}),
                  "eng/web": quota({"cpus": 2})})


# ---------------------------------------------------- incremental passes


def test_steady_cluster_passes_look_at_no_agent() -> None:
    allocator = make(*(f"s{i}" for i in range(50)))
    first = allocator.allocate(0.0)
    assert allocator.last_considered == 50 and len(first) == 50
    for offer in first:  # everybody declines for a long time
        allocator.close_offer(offer.framework_id, offer.agent_id, offer.resources)
        allocator.add_filter(offer.framework_id, offer.agent_id, 1e9)
    second = allocator.allocate(1.0)
    assert len(second) == 50 and allocator.last_considered == 50
    for offer in second:
        allocator.close_offer(offer.framework_id, offer.agent_id, offer.resources)
        allocator.add_filter(offer.framework_id, offer.agent_id, 1e9)
    assert allocator.allocate(2.0) == [] and allocator.last_considered == 50
    assert allocator.allocate(3.0) == [] and allocator.last_considered == 0
    allocator.update_used("s7", "a", Resources.parse("cpus:1"))
    allocator.release("s7", "a", Resources.parse("cpus:1"))  # something freed on s7
    allocator.allocate(4.0)
    assert allocator.last_considered == 1
    allocator.add_framework("c", ["*"])  # a new taker: every agent again
    assert len(allocator.allocate(5.0)) == 50 and allocator.last_considered == 50


def test_expired_filters_wake_only_their_agent() -> None:
    allocator = make("s1", "s2", frameworks=("a",))
    for offer in allocator.allocate(0.0):
        allocator.close_offer("a", offer.agent_id, offer.resources)
        allocator.add_filter("a", offer.agent_id, 5.0 if offer.agent_id == "s1" else 1e9)
    assert allocator.allocate(1.0) == []
    assert pairs(allocator.allocate(5.0)) == [("a", "s1")]
    assert allocator.last_considered == 1


# ------------------------------------------------- operator API over HTTP


async def test_weights_and_quota_over_http() -> None:
    view = HttpView(Harness())
    async with TestClient(TestServer(make_app(view))) as client:
        assert await (await client.get("/weights")).json() == []
        response = await client.put("/weights", json=[{"role": "eng", "weight": 3}])
        assert response.status == 200
        assert await response.json() == [{"role": "eng", "weight": 3.0}]
        assert view.state.weights == {"eng": 3.0}

        response = await client.put("/quota", json={"role": "eng", "guarantee": {"cpus": 1},
                                                    "limit": {"cpus": 4, "mem": 1024}})
        assert response.status == 200
        assert await response.json() == {"quota": [{
            "role": "eng", "guarantee": {"cpus": 1.0}, "limit": {"cpus": 4.0, "mem": 1024.0},
            "allocated": {}}]}
        assert view.state.quota["eng"].limit == {"cpus": 4000, "mem": 1024000}

        for path, body in [("/weights", [{"role": "eng", "weight": 0}]),
                           ("/weights", {"role": "no good", "weight": 1}),
                           ("/quota", {"role": "eng/ml", "guarantee": {"cpus": 9}}),  # > eng's limit
                           ("/quota", {"role": "eng", "limit": {"ports": 2}}),
                           ("/quota", [])]:
            response = await client.put(path, json=body)
            assert response.status == 400, (path, body)
            assert "error" in await response.json()
        response = await client.put("/quota", data=b"{not json", headers={
            "Content-Type": "application/json"})
        assert response.status == 400
        assert (await response.json())["error"].startswith("the body must be JSON: not JSON")
        assert view.state.metrics()["master/operator_calls_invalid"] == 6
        assert view.state.weights == {"eng": 3.0}  # refused calls changed nothing
        assert (await client.post("/weights", json=[])).status == 405

        response = await client.put("/quota", json={"role": "eng"})  # removes it
        assert await response.json() == {"quota": []}


@pytest.mark.parametrize("huge", [10**309, 10**5000, float("inf")], ids=["309 digits", "5001 digits", "inf"])
def test_policy_refuses_numbers_too_large_to_convert(huge: float) -> None:
    with pytest.raises(PolicyError, match="must be a number"):
        parse_weights([{"role": "eng", "weight": huge}])
    with pytest.raises(PolicyError, match="must be a number"):
        parse_quota({"role": "eng", "guarantee": {"cpus": huge}})
