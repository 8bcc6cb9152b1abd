"""What the master has not yet handled (`master.inflow`): frameworks' frames first
but the rest never starved, timers never ahead of the agent frames before them,
each peer's frames in order, an agent's exact resends coalesced, and a reader that
asks `room()` bounded however hard peers flood it, losing nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyad.effects import TimerFired
from dyad.messages import (
    Acknowledge, Message, Pong, RegisterAgent, SchedulerHeartbeat, Source, StatusUpdate,
    TaskState, TaskStatus, encode)
from dyad.messages import AgentInfo
from dyad.resources import Resources
from master.inflow import Inflow
from master.model import FailoverTimeout, HeartbeatDue, PingDue, Received

Frame = tuple[bytes, bytes]
"""What the shell would put: (peer identity, the frame's bytes)."""


def frame(peer: str, message: Message) -> Frame:
    return peer.encode(), encode(message)


def ack(peer: str = "fw", n: int = 0) -> Frame:
    return frame(peer, Acknowledge(framework_id="F", agent_id="A", task_id=f"t{n}",
                                   uuid=f"u{n}"))


def update(peer: str = "agent", uuid: str = "u0") -> Frame:
    return frame(peer, StatusUpdate(framework_id="F", status=TaskStatus(
        task_id="t0", state=TaskState.TASK_RUNNING, source=Source.EXECUTOR, uuid=uuid)))


def pong(peer: str = "agent") -> Frame:
    return frame(peer, Pong(agent_id=peer))


def put(inflow: Inflow, item: Frame) -> None:
    inflow.put_frame(item, item[0], item[1])


def drain(inflow: Inflow) -> list[object]:
    taken = []
    while (item := inflow.take()) is not None:
        taken.append(item)
    return taken


def is_framework(item: object) -> bool:
    return isinstance(item, tuple) and item[1].startswith(b'{"type":"acknowledge"')


def test_frameworks_get_their_turns_and_the_rest_theirs() -> None:
    inflow = Inflow(turns=2)
    agents = [pong(f"a{i}") for i in range(3)]
    acks = [ack(n=i) for i in range(5)]
    for item in [*agents, *acks]:
        put(inflow, item)
    assert drain(inflow) == [acks[0], acks[1], agents[0], acks[2], acks[3], agents[1],
                             acks[4], agents[2]]


def test_a_timer_never_overtakes_an_agent_frame_but_a_framework_frame_may_pass_it() -> None:
    """A ping timeout handled before the pong that came first would call a live
    agent unreachable; an accept handled before an offer's timeout saves it."""
    inflow = Inflow()
    timer = TimerFired("k")
    put(inflow, pong())
    inflow.put(timer)
    put(inflow, ack())
    assert drain(inflow) == [ack(), pong(), timer]


def test_a_framework_timer_waits_behind_framework_frames_not_agent_frames() -> None:
    """A failover timeout must see the re-subscription that came first, and must
    not wait behind a flood of agents' frames (heartbeats: the liveness lane)."""
    inflow = Inflow()
    failover, ping = TimerFired(FailoverTimeout("F")), TimerFired(PingDue("A"))
    put(inflow, pong())
    inflow.put(ping)
    put(inflow, ack())
    inflow.put(failover)
    assert drain(inflow) == [ack(), failover, pong(), ping]


def test_events_a_standby_kept_take_their_lane_by_type() -> None:
    inflow = Inflow(turns=1)
    kept_pong = Received("a", Pong(agent_id="a"))
    kept_ack = Received("fw", Acknowledge(framework_id="F", agent_id="A", task_id="t",
                                          uuid="u"))
    inflow.put(kept_pong)
    inflow.put(kept_ack)
    assert drain(inflow) == [kept_ack, kept_pong]


def test_a_frame_in_several_parts_waits_in_the_other_lane_uncoalesced() -> None:
    inflow = Inflow()
    for _ in range(2):
        inflow.put_frame("parts", b"peer", None)
    put(inflow, ack())
    assert drain(inflow) == [ack(), "parts", "parts"]


def test_an_exact_resend_is_coalesced_while_the_first_waits() -> None:
    inflow = Inflow()
    registration = frame("a", RegisterAgent(agent=AgentInfo(
        hostname="h", port=5051, resources=Resources.parse("cpus:1"))))
    for item in (update("a", "u1"), update("a", "u1"), update("b", "u1"), update("a", "u2"),
                 registration, registration, pong("a"), pong("a")):
        put(inflow, item)
    # One copy each of the update and the registration coalesced; pongs never are.
    assert (len(inflow), inflow.coalesced) == (6, 2)
    assert inflow.take() == update("a", "u1")
    put(inflow, update("a", "u1"))  # once taken, a resend is handled again
    assert (len(inflow), inflow.coalesced) == (6, 2)


def test_room_closes_at_the_limit_and_events_may_pass_it() -> None:
    inflow = Inflow(limit=2)
    put(inflow, ack(n=0))
    put(inflow, ack(n=1))
    assert inflow.room() == 0 and inflow.full == 1
    inflow.put(TimerFired("k"))  # a timer is never refused
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
    st.builds(update, st.sampled_from(["a1", "a2", "a3"]), st.sampled_from(["u1", "u2"])),
    st.builds(pong, st.sampled_from(["a1", "a2"])))


@given(limit=st.integers(1, 30), turns=st.integers(1, 5),
       steps=st.lists(st.tuples(st.lists(frames, max_size=40), st.integers(0, 40)),
                      max_size=30))
def test_a_flood_is_bounded_ordered_per_peer_and_loses_nothing(
        limit: int, turns: int, steps: list[tuple[list[Frame], int]]) -> None:
    """Each step peers send frames (they wait in ZMQ while there is no room), the
    reader takes what `room()` allows, and the core handles up to `work` of them.
    However the two race, against a model of the rules: the queue stays within
    the limit; each peer's frames are handled in the order sent, less exactly the
    copies of an update still waiting; and while other frames wait, frameworks get
    at most `turns` in a row."""
    inflow = Inflow(limit=limit, turns=turns)
    in_zmq: list[Frame] = []
    expected: list[Frame] = []  # what must be handled: reads less coalesced copies
    waiting: set[Frame] = set()
    others_waiting = streak = 0
    handled: list[Frame] = []

    def take() -> bool:
        nonlocal others_waiting, streak
        item = inflow.take()
        if item is None:
            return False
        assert isinstance(item, tuple)
        handled.append(item)
        waiting.discard(item)
        if is_framework(item):
            streak = streak + 1 if others_waiting else 0
            assert streak <= turns
        else:
            others_waiting -= 1
            streak = 0
        return True

    for sent, work in steps:
        in_zmq += sent
        room = inflow.room()
        for item in in_zmq[:room]:
            coalescible = item[1].startswith(b'{"type":"status_update"')
            if coalescible and item in waiting:
                continue  # the model's copy: must be coalesced
            if coalescible:
                waiting.add(item)
            expected.append(item)
            others_waiting += not is_framework(item)
            put(inflow, item)
        del in_zmq[:room]
        assert len(inflow) <= limit
        for _ in range(work):
            if not take():
                break
    while take():
        pass
    for peer in {peer for peer, _ in expected}:
        assert [f for f in handled if f[0] == peer] == [f for f in expected if f[0] == peer]
    assert len(handled) == len(expected)


def test_heartbeats_and_their_checks_overtake_both_lanes_in_their_own_order() -> None:
    """Queued behind a backlog, a framework's heartbeat and the master's
    heartbeat timer made both sides call the other lost (issue 19)."""
    inflow = Inflow(turns=2)
    backlog = [ack(n=i) for i in range(3)] + [pong(f"a{i}") for i in range(3)]
    for item in backlog:
        put(inflow, item)
    due = TimerFired(HeartbeatDue("F"))
    beat = frame("fw", SchedulerHeartbeat(framework_id="F"))
    inflow.put(due)
    put(inflow, beat)
    kept = Received("fw", SchedulerHeartbeat(framework_id="F"))
    inflow.put(kept)
    taken = drain(inflow)
    assert taken[:3] == [due, beat, kept]
    assert sorted(map(str, taken[3:])) == sorted(map(str, backlog))
