"""Backpressure in the master (`master.inflow`): a reader that asks `room()` holds
at most `limit` frames however hard peers flood it, loses none, and is woken
exactly when room opens again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from master.inflow import Inflow


def test_room_closes_at_the_limit_and_reopens_with_one_handled() -> None:
    inflow = Inflow(limit=3)
    assert inflow.room() == 3
    inflow.taken(3)
    assert inflow.room() == 0 and inflow.full == 1
    assert inflow.handled() is True  # the reader stopped: wake it
    assert inflow.room() == 1
    assert inflow.handled() is False  # there was room already: nobody to wake
    assert (inflow.queued, inflow.most) == (1, 3)


def test_frames_released_from_a_standby_buffer_may_pass_the_limit() -> None:
    inflow = Inflow(limit=2)
    inflow.taken(5)  # already ours: they are queued, never dropped
    assert inflow.room() == 0 and inflow.queued == 5
    assert [inflow.handled() for _ in range(5)] == [False, False, False, True, False]


def test_bad_counts_are_errors() -> None:
    with pytest.raises(ValueError):
        Inflow(limit=0)
    with pytest.raises(ValueError):
        Inflow().taken(-1)
    with pytest.raises(ValueError):
        Inflow().handled()


@given(limit=st.integers(1, 50),
       steps=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), max_size=60))
def test_a_flood_never_grows_the_queue_past_the_limit(
        limit: int, steps: list[tuple[int, int]]) -> None:
    """Each step peers send `sent` frames (they wait in ZMQ, `pending`), the reader
    takes what `room()` allows, and the core handles up to `work` of them. However
    the two race, the queue stays within the limit, every frame sent is either
    queued, handled or still with ZMQ, and a stopped reader is always woken."""
    inflow = Inflow(limit=limit)
    pending = handled = 0
    reader_stopped = False
    for sent, work in steps:
        pending += sent
        if not reader_stopped:
            read = min(pending, inflow.room())
            inflow.taken(read)
            pending -= read
            reader_stopped = inflow.room() == 0
        for _ in range(min(work, inflow.queued)):
            if inflow.handled():
                assert reader_stopped
                reader_stopped = False
            handled += 1
        assert 0 <= inflow.queued <= limit
        assert inflow.most <= limit
        assert reader_stopped == (inflow.room() == 0)
    assert handled + inflow.queued + pending == sum(sent for sent, _ in steps)
