"""dyad/gc_pauses.py: survivors of a full collection are frozen; once the frozen
heap has doubled, the next full collection walks everything, so garbage cycles
among frozen objects are freed after all."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dyad import gc_pauses


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def policy() -> Iterator[gc_pauses._Policy]:
    gc.collect()
    yield gc_pauses._Policy()
    gc.unfreeze()


def full(policy: gc_pauses._Policy) -> None:
    """A full collection, as the policy hears of it."""
    gc.collect()
    policy("stop", {"generation": 2, "collected": 0, "uncollectable": 0})


def test_survivors_are_frozen_and_young_collections_change_nothing(
        policy: gc_pauses._Policy) -> None:
    policy("stop", {"generation": 1, "collected": 0, "uncollectable": 0})
    assert gc.get_freeze_count() == 0
    full(policy)
    assert gc.get_freeze_count() > 0


def test_a_frozen_cycle_is_freed_by_the_complete_walk_after_a_doubling(
        policy: gc_pauses._Policy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_pauses, "FLOOR", 0)
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    full(policy)  # frozen with everything else
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: a full collection does not walk it
    policy.base = gc.get_freeze_count() // 3  # the heap has doubled since the last walk
    full(policy)  # unfreezes: the next one walks everything
    assert policy.complete_next and gc.get_freeze_count() == 0
    full(policy)
    assert gone() is None
    assert policy.complete_walks == 1 and policy.base > 0 and not policy.complete_next


def test_settle_collects_and_freezes_once() -> None:
    try:
        gc_pauses.settle()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_install_collects_the_young_generation_less_often(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_pauses, "_installed", None)
    monkeypatch.setattr(gc, "callbacks", [])  # the policy stays out of other tests
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        gc_pauses.install()
        assert gc.get_threshold() == (gc_pauses.YOUNG, *before[1:])
        gc.set_threshold(50_000, *before[1:])
        gc_pauses.install()  # a higher one is kept
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)
