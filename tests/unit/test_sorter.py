"""Tests for master.allocator.sorter: one suite over every sorter (membership,
bookkeeping, hierarchy, activity), then the DRF order itself."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from master.allocator.sorter import DRFSorter, RandomSorter, Sorter, SorterError

SORTERS: dict[str, Callable[[], Sorter]] = {"drf": DRFSorter, "random": lambda: RandomSorter(7)}
TOTAL = {"cpus": 10_000, "mem": 100_000}  # 10 cpus, 100 MB, in milli


def cpus(n: float) -> dict[str, int]:
    return {"cpus": round(n * 1000)}


def make(kind: str, *clients: str) -> Sorter:
    sorter = SORTERS[kind]()
    sorter.add_total(TOTAL)
    for client in clients:
        sorter.add(client)
        sorter.activate(client)
    return sorter


@pytest.fixture(params=sorted(SORTERS))
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


# ------------------------------------------------------------ every sorter


def test_sort_lists_exactly_the_active_clients(kind: str) -> None:
    sorter = make(kind, "a", "b", "c")
    assert sorted(sorter.sort()) == ["a", "b", "c"]
    sorter.deactivate("b")
    assert sorted(sorter.sort()) == ["a", "c"]
    sorter.activate("b")
    sorter.remove("c")
    assert sorted(sorter.sort()) == ["a", "b"]
    assert not sorter.contains("c")


def test_added_clients_start_inactive(kind: str) -> None:
    sorter = make(kind)
    sorter.add("x")
    assert sorter.sort() == [] and not sorter.any_active()


def test_any_active_says_whether_sort_is_empty(kind: str) -> None:
    sorter = make(kind, "eng/ml", "ops")
    assert sorter.any_active()
    sorter.deactivate("eng/ml")
    assert sorter.any_active()
    sorter.deactivate("ops")
    assert not sorter.any_active() and sorter.sort() == []
    sorter.activate("eng/ml")
    assert sorter.any_active()


def test_allocation_sums_up_the_tree(kind: str) -> None:
    sorter = make(kind, "eng", "eng/ml", "eng/web", "ops")
    sorter.allocated("eng/ml", cpus(2))
    sorter.allocated("eng", cpus(1))
    sorter.allocated("ops", {"mem": 50_000})
    assert sorter.allocation("eng") == cpus(3)
    assert sorter.allocation("eng/ml") == cpus(2)
    assert sorter.client_allocation("eng") == cpus(1)
    assert sorter.share("eng") == pytest.approx(0.3)
    assert sorter.share("ops") == pytest.approx(0.5)
    sorter.unallocated("eng/ml", cpus(2))
    assert sorter.allocation("eng") == cpus(1)
    assert sorter.allocation("nowhere") == {}


def test_subtrees_come_out_together(kind: str) -> None:
    sorter = make(kind, "a/x", "b", "a/y", "a", "b/z")
    order = sorter.sort()
    assert sorted(order) == ["a", "a/x", "a/y", "b", "b/z"]
    a_side = [i for i, c in enumerate(order) if c == "a" or c.startswith("a/")]
    assert a_side == list(range(a_side[0], a_side[0] + 3))


def test_remove_prunes_empty_nodes_and_releases_allocation(kind: str) -> None:
    sorter = make(kind, "eng/ml", "eng/web")
    sorter.allocated("eng/ml", cpus(4))
    sorter.remove("eng/ml")
    assert sorter.allocation("eng") == {}
    sorter.remove("eng/web")
    assert sorter.allocation("eng") == {}
    with pytest.raises(SorterError):
        sorter.share("eng")
    sorter.add("eng")  # the path is free again
    assert sorter.contains("eng")


def test_bad_calls_raise(kind: str) -> None:
    sorter = make(kind, "a")
    for bad in ("", "/a", "a/", "a//b"):
        with pytest.raises(SorterError):
            sorter.add(bad)
    with pytest.raises(SorterError):
        sorter.add("a")
    with pytest.raises(SorterError):
        sorter.activate("nobody")
    with pytest.raises(SorterError):
        sorter.unallocated("a", cpus(1))  # nothing allocated
    for weight in (0, -1, float("nan"), float("inf"), True, "2"):
        with pytest.raises(SorterError):
            sorter.update_weight("a", weight)  # type: ignore[arg-type]
    with pytest.raises(SorterError):
        sorter.remove_total({"cpus": 10**9})


def test_iter_sorted_is_lazy_and_matches_sort(kind: str) -> None:
    sorter = make(kind, *(f"c{i}" for i in range(50)))
    if kind == "drf":
        assert list(sorter.iter_sorted()) == sorter.sort()
    first = next(iter(sorter.iter_sorted()))
    assert first.startswith("c")


# ------------------------------------------------------------------ DRF


def test_lower_share_first_then_fewer_allocations_then_name() -> None:
    sorter = make("drf", "b", "a", "c")
    assert sorter.sort() == ["a", "b", "c"]  # all equal: by name
    sorter.allocated("a", cpus(1))
    assert sorter.sort() == ["b", "c", "a"]
    sorter.allocated("b", {"mem": 10_000})  # 0.1 mem == a's 0.1 cpus
    assert sorter.sort() == ["c", "a", "b"]  # a and b tie on share; both 1 allocation
    sorter.unallocated("a", cpus(1))
    assert sorter.sort() == ["c", "a", "b"]  # a: share 0 like c, but one allocation


def test_dominant_kind_decides() -> None:
    sorter = make("drf", "cpu_heavy", "mem_heavy")
    sorter.allocated("cpu_heavy", {"cpus": 3000, "mem": 1000})   # 0.3 dominant
    sorter.allocated("mem_heavy", {"cpus": 1000, "mem": 20_000})  # 0.2 dominant
    assert sorter.sort() == ["mem_heavy", "cpu_heavy"]


def test_kinds_without_total_and_ports_do_not_count() -> None:
    sorter = make("drf", "a", "b")
    sorter.allocated("a", {"gpus": 1000, "ports": 5000})
    assert sorter.share("a") == 0.0


def test_weights_divide_shares_of_subtrees() -> None:
    sorter = make("drf", "eng/ml", "ops")
    sorter.allocated("eng/ml", cpus(4))
    sorter.allocated("ops", cpus(3))
    assert sorter.sort() == ["ops", "eng/ml"]
    sorter.update_weight("eng", 2.0)  # eng subtree: 0.4 / 2 = 0.2 < 0.3
    assert sorter.share("eng") == pytest.approx(0.2)
    assert sorter.sort() == ["eng/ml", "ops"]
    sorter.update_weight("eng", 1.0)
    assert sorter.sort() == ["ops", "eng/ml"]


def test_weight_set_before_the_client_exists_applies() -> None:
    sorter = make("drf")
    sorter.update_weight("late", 4.0)
    sorter.add("late")
    sorter.allocated("late", cpus(4))
    assert sorter.share("late") == pytest.approx(0.1)


def test_internal_node_share_is_its_subtree() -> None:
    sorter = make("drf", "eng", "eng/ml", "ops")
    sorter.allocated("eng/ml", cpus(2))
    sorter.allocated("ops", cpus(3))
    # eng's own client has nothing, but its subtree (0.2) is below ops (0.3):
    # eng and eng/ml both come before ops, eng first inside the subtree.
    assert sorter.sort() == ["eng", "eng/ml", "ops"]
    sorter.allocated("eng", cpus(3))  # subtree 0.5 > 0.3; eng itself 0.3 > 0.2
    assert sorter.sort() == ["ops", "eng/ml", "eng"]


def test_total_changes_reorder() -> None:
    sorter = make("drf", "a", "b")
    sorter.allocated("a", cpus(5))       # 0.5 of cpus
    sorter.allocated("b", {"mem": 40_000})  # 0.4 of mem
    assert sorter.sort() == ["b", "a"]
    sorter.add_total({"cpus": 10_000})   # a: 0.25
    assert sorter.sort() == ["a", "b"]


def test_random_sorter_is_reproducible_and_respects_weights() -> None:
    def firsts(seed: int) -> list[str]:
        sorter = RandomSorter(seed)
        for client in ("heavy", "light"):
            sorter.add(client)
            sorter.activate(client)
        sorter.update_weight("heavy", 9.0)
        return [sorter.sort()[0] for _ in range(400)]

    assert firsts(3) == firsts(3)
    heavy = firsts(3).count("heavy")
    assert 320 < heavy < 400  # expected 360 (9 in 10)


NESTED = {"a": "a", "b": "b", "c": "c", "a/x": "a/x", "a/y": "a/y", "b/z": "b/z"}
FLAT = {"a": "a", "b": "b", "c": "c", "a/x": "d", "a/y": "e", "b/z": "f"}  # no subtrees


@pytest.mark.parametrize("names", [NESTED, FLAT], ids=["nested", "flat"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "a/x", "a/y", "b/z"]),
                          st.integers(0, 3000), st.booleans()), max_size=30))
def test_incremental_order_equals_a_fresh_sort(names: dict[str, str],
                                               steps: list[tuple[str, int, bool]]) -> None:
    """The DRF sorter keeps siblings sorted as allocations move, and the order it
    read last until it changes; the result must equal sorting from scratch by
    (share, allocations, path) at every level, after every step (with subtrees,
    and without, where the order is read off the top level)."""
    sorter = make("drf", *names.values())
    held = {c: 0 for c in names.values()}
    steps = [(names[client], milli, give) for client, milli, give in steps]
    counts = dict.fromkeys(held, 0)

    def subtree(path: str) -> tuple[int, int]:
        members = [c for c in held if c == path or c.startswith(path + "/")]
        return sum(held[c] for c in members), sum(counts[c] for c in members)

    def key(path: str, leaf: bool) -> tuple[float, int, str]:
        milli, count = (held[path], counts[path]) if leaf else subtree(path)
        return (milli / TOTAL["cpus"], count, path)

    def expected(node: str) -> list[str]:
        """Depth first over structural nodes: a node's children are its own
        client's leaf and the structural nodes one level down."""
        depth = node.count("/") + 1 if node else 0
        entries = [(key(node, leaf=True), True, node)] if node in held else []
        below = {"/".join(c.split("/")[:depth + 1]) for c in held
                 if (not node or c.startswith(node + "/"))}
        entries += [(key(child, leaf=False), False, child) for child in below]
        entries.sort()
        out: list[str] = []
        for _, leaf, path in entries:
            out.extend([path] if leaf else expected(path))
        return out

    for client, milli, give in steps:
        if give:
            sorter.allocated(client, {"cpus": milli})
            held[client] += milli
            counts[client] += 1
        elif held[client] >= milli:
            sorter.unallocated(client, {"cpus": milli})
            held[client] -= milli
        assert list(sorter.iter_sorted()) == expected("")
    assert sorter.sort() == expected("")
