"""The election's pure core (master/election.py): when a standby may call the
leader dead, when it may act, and when a leader stands down. Deterministic:
a FakeClock, no sockets, no ZooKeeper."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from dyad.clock import FakeClock
from dyad.effects import ArmTimer, CancelTimer, TimerFired, TimerKey, UnknownTimer
from master.election import (
    DYING, RECHECK, RETRY_FIRST, CheckPorts, Closed, Connect, ConnectFailed, Connected,
    Contenders, DeleteLeader, Deleted, Disconnect, Election, Lead, LeaderRead,
    LeaderUnreadable, Note, PortsChecked, ReadLeader, Recheck, RetryWatch, StandDown,
)

LEADER, ME, THIRD = "/dyad/json.info_0000000001", "/dyad/json.info_0000000002", \
    "/dyad/json.info_0000000003"
LIVENESS = ("10.0.0.1", 4000)
PORTS = (LIVENESS, ("10.0.0.1", 5055), ("10.0.0.1", 5050))
LEASE = 1.0
READ = LeaderRead(path=LEADER, owner=0x77, version=0, liveness=LIVENESS, ports=PORTS,
                  lease=LEASE)


def kinds(effects: list[object]) -> list[type]:
    return [type(e) for e in effects if not isinstance(e, Note)]


def leads(effects: list[object]) -> list[object]:
    return [e for e in effects if isinstance(e, Lead)]


class Standby:
    """An `Election` for ME, next in line behind LEADER, driven by a FakeClock."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.core = Election(me=ME)

    def feed(self, event: object) -> list[object]:
        return list(self.core.handle(event, self.clock.now()))  # type: ignore[arg-type]

    def holding(self) -> None:
        assert self.feed(Contenders((LEADER, ME))) == [ReadLeader(LEADER)]
        assert kinds(self.feed(READ)) == [Connect]
        assert self.feed(Connected(LEADER)) == []

    def proven(self) -> list[object]:
        self.holding()
        assert self.feed(Closed(LEADER, by_peer=True, reason="eof")) == [
            CheckPorts(LEADER, PORTS)]
        return self.feed(PortsChecked(LEADER, refused=True, reason="all refused"))


def test_a_leader_closed_by_its_peer_and_refused_everywhere_is_deleted_conditionally() -> None:
    standby = Standby()
    effects = standby.proven()
    assert DeleteLeader(LEADER, owner=0x77, version=0) in effects
    # Deleted: the election proceeds, but we act only once its lease is over.
    standby.clock.advance(0.05)
    assert kinds(standby.feed(Deleted(LEADER, done=True, reason=""))) == []
    standby.clock.advance(0.01)
    assert leads(standby.feed(Contenders((ME,)))) == [
        Lead(not_before=standby.clock.now() - 0.01 + LEASE)]


def test_the_watch_may_come_before_the_answer_to_our_delete() -> None:
    """ZooKeeper may notify the children change before it answers the delete:
    the lead waits for the answer, whose time starts the fence."""
    standby = Standby()
    standby.proven()
    assert leads(standby.feed(Contenders((ME,)))) == []
    standby.clock.advance(0.2)
    effects = standby.feed(Deleted(LEADER, done=True, reason=""))
    assert Lead(not_before=standby.clock.now() + LEASE) in effects


def test_a_failed_delete_still_fences_it_may_have_happened() -> None:
    standby = Standby()
    standby.proven()
    standby.feed(Deleted(LEADER, done=False, reason="connection loss"))
    assert leads(standby.feed(Contenders((ME,)))) == [
        Lead(not_before=standby.clock.now() + LEASE)]


def test_silence_and_a_lost_connection_prove_nothing() -> None:
    """A paused leader keeps its sockets open: nothing happens at all. A timeout
    or an unreachable host is not the peer's doing: retry, never delete."""
    standby = Standby()
    standby.holding()
    standby.clock.advance(3600)  # an hour of silence (SIGSTOP, partition)
    effects = standby.feed(Closed(LEADER, by_peer=False, reason="timed out"))
    assert kinds(effects) == [ArmTimer]
    assert not any(isinstance(e, (CheckPorts, DeleteLeader)) for e in effects)
    standby.clock.advance(RETRY_FIRST)
    assert kinds(standby.feed(TimerFired(RetryWatch(LEADER)))) == [Connect]


def test_a_refused_first_connection_is_no_proof() -> None:
    """Never seen alive on this connection: a refusal may be a firewall, or a
    leader that is starting. Retry with backoff; the expiry stays the fallback."""
    standby = Standby()
    standby.feed(Contenders((LEADER, ME)))
    standby.feed(READ)
    delays = []
    for _ in range(6):
        effects = standby.feed(ConnectFailed(LEADER, "refused"))
        (timer,) = [e for e in effects if isinstance(e, ArmTimer)]
        delays.append(timer.at - standby.clock.now())
        assert not any(isinstance(e, (CheckPorts, DeleteLeader)) for e in effects)
        standby.clock.advance(delays[-1])
        assert kinds(standby.feed(TimerFired(timer.key))) == [Connect]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_port_that_still_answers_is_checked_again_while_the_leader_may_be_dying() -> None:
    standby = Standby()
    standby.holding()
    standby.feed(Closed(LEADER, by_peer=True, reason="eof"))
    for _ in range(3):
        effects = standby.feed(PortsChecked(LEADER, refused=False, reason="zmq accepted"))
        assert effects == [ArmTimer(Recheck(LEADER), standby.clock.now() + RECHECK)]
        standby.clock.advance(RECHECK)
        assert standby.feed(TimerFired(Recheck(LEADER))) == [CheckPorts(LEADER, PORTS)]
    effects = standby.feed(PortsChecked(LEADER, refused=True, reason=""))
    assert DeleteLeader(LEADER, 0x77, 0) in effects


def test_closed_but_alive_after_the_dying_window_is_no_proof() -> None:
    standby = Standby()
    standby.holding()
    standby.feed(Closed(LEADER, by_peer=True, reason="eof"))
    standby.clock.advance(DYING)
    effects = standby.feed(PortsChecked(LEADER, refused=False, reason="accepted"))
    assert kinds(effects) == [ArmTimer]
    assert isinstance(effects[-1], ArmTimer) and effects[-1].key == RetryWatch(LEADER)
    # Watched anew: only a later close and refusal could prove anything.
    standby.clock.advance(RETRY_FIRST)
    assert kinds(standby.feed(TimerFired(RetryWatch(LEADER)))) == [Connect]


def test_only_the_next_in_line_watches_and_a_leader_change_drops_the_watch() -> None:
    core = Election(me=THIRD)
    assert core.handle(Contenders((LEADER, ME, THIRD)), 0.0) == []
    standby = Standby()
    standby.holding()
    # The leader's session expired by itself: a new contender leads; stop watching.
    effects = standby.feed(Contenders(("/dyad/json.info_0000000000", ME)))
    assert Disconnect() in effects and CancelTimer(RetryWatch(LEADER)) in effects
    assert ReadLeader("/dyad/json.info_0000000000") in effects
    # What arrives about the old leader is ignored.
    assert standby.feed(Closed(LEADER, by_peer=True, reason="eof")) == []
    assert standby.feed(PortsChecked(LEADER, refused=True, reason="")) == []


def test_a_leader_without_a_trusted_liveness_record_waits_for_zookeeper() -> None:
    standby = Standby()
    standby.feed(Contenders((LEADER, ME)))
    effects = standby.feed(LeaderRead(path=LEADER, owner=1, version=0, liveness=None,
                                      ports=PORTS[1:], lease=LEASE))
    assert kinds(effects) == []
    assert [e.counter for e in effects if isinstance(e, Note)] == ["unwatchable"]
    assert standby.feed(Closed(LEADER, by_peer=True, reason="eof")) == []


def test_an_unreadable_leader_is_read_again() -> None:
    standby = Standby()
    standby.feed(Contenders((LEADER, ME)))
    effects = standby.feed(LeaderUnreadable(LEADER))
    (timer,) = [e for e in effects if isinstance(e, ArmTimer)]
    assert standby.feed(TimerFired(timer.key)) == [ReadLeader(LEADER)]


def test_a_master_leads_at_once_when_nobody_was_proven_dead() -> None:
    core = Election(me=ME)
    assert core.handle(Contenders((ME, THIRD)), 5.0) == [Lead(not_before=5.0)]
    assert core.handle(Contenders((ME, THIRD)), 6.0) == []  # once


def test_a_leader_whose_znode_goes_stands_down_at_once_and_for_good() -> None:
    core = Election(me=ME)
    core.handle(Contenders((ME,)), 0.0)
    effects = core.handle(Contenders((THIRD,)), 1.0)
    assert [e for e in effects if isinstance(e, StandDown)]
    assert core.handle(Contenders((ME, THIRD)), 2.0) == []  # no coming back


def test_a_lower_znode_under_a_leader_deposes_it() -> None:
    core = Election(me=ME)
    core.handle(Contenders((ME,)), 0.0)
    effects = core.handle(Contenders((LEADER, ME)), 1.0)
    assert [e for e in effects if isinstance(e, StandDown)]


def test_an_unknown_timer_is_a_bug() -> None:
    class Stray(TimerKey):
        pass

    with pytest.raises(UnknownTimer):
        Election(me=ME).handle(TimerFired(Stray()), 0.0)


def test_stale_timers_of_known_kinds_are_ignored() -> None:
    core = Election(me=ME)
    assert core.handle(TimerFired(RetryWatch(LEADER)), 0.0) == []
    assert core.handle(TimerFired(Recheck(LEADER)), 0.0) == []


EVENTS = st.sampled_from([
    Contenders((LEADER, ME)), Contenders((ME,)), Contenders((LEADER, ME, THIRD)),
    READ, LeaderUnreadable(LEADER), Connected(LEADER), ConnectFailed(LEADER, "x"),
    Closed(LEADER, True, "eof"), Closed(LEADER, False, "timeout"),
    PortsChecked(LEADER, True, ""), PortsChecked(LEADER, False, ""),
    Deleted(LEADER, True, ""), Deleted(LEADER, False, "x"),
    TimerFired(RetryWatch(LEADER)), TimerFired(Recheck(LEADER)),
])


@given(st.lists(st.tuples(EVENTS, st.floats(0, 3)), max_size=40))
def test_whatever_happens_a_delete_needs_the_full_proof_and_a_lead_the_fence(
        steps: list[tuple[object, float]]) -> None:
    """Over any sequence of events: a DeleteLeader is only ever the answer to a
    refusal after a close by the peer of a held connection; and no Lead comes
    before a lease has passed since the answer to any delete we sent."""
    core, now = Election(me=ME), 0.0
    held = closed = False
    answered_at: float | None = None
    deletes_out = 0
    for event, step in steps:
        now += step
        effects = core.handle(event, now)  # type: ignore[arg-type]
        match event:
            case Connected():
                held, closed = True, False
            case Closed(by_peer=True) if held:
                closed = True
            case Deleted() if deletes_out:
                deletes_out -= 1
                answered_at = now
        for effect in effects:
            if isinstance(effect, DeleteLeader):
                assert closed and isinstance(event, PortsChecked) and event.refused
                deletes_out += 1
            if isinstance(effect, Lead):
                assert deletes_out == 0
                if answered_at is not None:
                    assert effect.not_before >= answered_at + LEASE
        if isinstance(event, (Connect, Disconnect)) or any(
                isinstance(e, (Connect, Disconnect)) for e in effects):
            held = closed = False
