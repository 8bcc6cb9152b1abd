"""What the master has read and not yet handled (`master.inflow`): frameworks'
frames first but agents never starved, each peer's frames in order, copies of a
waiting status update coalesced, and a reader that asks `room()` bounded however
hard peers flood it, losing nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyad.effects import TimerFired
from dyad.messages import (
    Acknowledge, MessageError, Pong, Source, StatusUpdate, TaskState, TaskStatus)
from master.inflow import Inflow
from master.model import Event, InvalidFrame, Received


def ack(peer: str = "fw", n: int = 0) -> Received:
    return Received(peer, Acknowledge(framework_id="F", agent_id="A", task_id=f"t{n}",
                                      uuid=f"u{n}"))


def update(peer: str = "agent", uuid: str = "u0") -> Received:
    return Received(peer, StatusUpdate(framework_id="F", status=TaskStatus(
        task_id="t0", state=TaskState.TASK_RUNNING, source=Source.EXECUTOR, uuid=uuid)))


def drain(inflow: Inflow) -> list[Event]:
    taken = []
    while (event := inflow.take()) is not None:
        taken.append(event)
    return taken


def test_frameworks_get_their_turns_and_agents_theirs() -> None:
    inflow = Inflow(turns=2)
    agents = [Received(f"a{i}", Pong(agent_id=f"a{i}")) for i in range(3)]
    acks = [ack(n=i) for i in range(5)]
    for event in [*agents, *acks]:
        inflow.put(event)
    assert drain(inflow) == [acks[0], acks[1], agents[0], acks[2], acks[3], agents[1],
                             acks[4], agents[2]]


def test_a_timer_never_overtakes_an_agent_frame_but_a_framework_frame_may_pass_it() -> None:
    """A ping timeout handled before the pong that came first would call a live
    agent unreachable; an accept handled before an offer's timeout saves it."""
    inflow = Inflow()
    pong, timer, accept = Received("a", Pong(agent_id="a")), TimerFired("k"), ack()
    for event in (pong, timer, accept):
        inflow.put(event)
    assert drain(inflow) == [accept, pong, timer]


def test_bad_frames_and_agent_frames_share_the_other_lane_in_order() -> None:
    inflow = Inflow()
    bad = InvalidFrame("a", MessageError("not JSON"))
    events = [update("a", "u1"), bad, Received("a", Pong(agent_id="a"))]
    for event in events:
        inflow.put(event)
    assert drain(inflow) == events


def test_a_copy_of_a_waiting_update_is_coalesced_until_it_is_taken() -> None:
    inflow = Inflow()
    inflow.put(update("a", "u1"))
    inflow.put(update("a", "u1"))  # the agent resent it: one is enough
    inflow.put(update("b", "u1"))  # another peer's: not a copy
    inflow.put(update("a", ""))
    inflow.put(update("a", ""))  # no uuid: never taken for a copy
    assert (len(inflow), inflow.coalesced) == (4, 1)
    assert inflow.take() == update("a", "u1")
    inflow.put(update("a", "u1"))  # once handled, a resend is handled again
    assert (len(inflow), inflow.coalesced) == (4, 1)


def test_room_closes_at_the_limit_and_reopens_with_one_taken() -> None:
    inflow = Inflow(limit=2)
    inflow.put(ack(n=0))
    inflow.put(ack(n=1))
    assert inflow.room() == 0 and inflow.full == 1
    inflow.put(ack(n=2))  # released from a standby's buffer: already ours, kept
    assert len(inflow) == 3 and inflow.room() == 0
    drain(inflow)
    assert inflow.room() == 2 and inflow.most == 3


def test_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError):
        Inflow(limit=0)
    with pytest.raises(ValueError):
        Inflow(turns=0)


frames = st.one_of(
    st.builds(ack, st.sampled_from(["f1", "f2"]), st.integers(0, 5)),
    st.builds(update, st.sampled_from(["a1", "a2", "a3"]), st.sampled_from(["u1", "u2", ""])),
    st.builds(lambda peer: Received(peer, Pong(agent_id=peer)), st.sampled_from(["a1", "a2"])))


@given(limit=st.integers(1, 30), turns=st.integers(1, 5),
       steps=st.lists(st.tuples(st.lists(frames, max_size=40), st.integers(0, 40)),
                      max_size=30))
def test_a_flood_is_bounded_ordered_per_peer_and_loses_nothing(
        limit: int, turns: int, steps: list[tuple[list[Received], int]]) -> None:
    """Each step peers send frames (they wait in ZMQ while there is no room), the
    reader takes what `room()` allows, and the core handles up to `work` of them.
    However the two race, against a model of the rules: the queue stays within
    the limit; each peer's frames are handled in the order sent, less exactly the
    copies of an update still waiting; and while agent frames wait, frameworks get
    at most `turns` in a row."""
    inflow = Inflow(limit=limit, turns=turns)
    in_zmq: list[Received] = []
    expected: list[Received] = []  # what must be handled: reads less coalesced copies
    waiting: set[tuple[str, str]] = set()
    agents_waiting = streak = 0
    handled: list[Event] = []

    def key(event: Event) -> tuple[str, str] | None:
        if isinstance(event, Received) and isinstance(event.message, StatusUpdate):
            return (event.peer, event.message.status.uuid) if event.message.status.uuid else None
        return None

    def take() -> bool:
        nonlocal agents_waiting, streak
        event = inflow.take()
        if event is None:
            return False
        handled.append(event)
        waiting.discard(key(event))  # type: ignore[arg-type]
        if isinstance(event, Received) and isinstance(event.message, Acknowledge):
            streak = streak + 1 if agents_waiting else 0
            assert streak <= turns
        else:
            agents_waiting -= 1
            streak = 0
        return True

    for sent, work in steps:
        in_zmq += sent
        room = inflow.room()
        for event in in_zmq[:room]:
            if (k := key(event)) is not None and k in waiting:
                continue  # the model's copy: must be coalesced
            if k is not None:
                waiting.add(k)
            expected.append(event)
            agents_waiting += not isinstance(event.message, Acknowledge)
            inflow.put(event)
        del in_zmq[:room]
        assert len(inflow) <= limit
        for _ in range(work):
            if not take():
                break
    while take():
        pass
    for peer in {e.peer for e in expected}:
        assert [e for e in handled if e.peer == peer] == [e for e in expected if e.peer == peer]
    assert len(handled) == len(expected)
