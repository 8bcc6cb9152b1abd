"""Admission (master/admission.py): offers wait while too much is in flight, and
how much may be is learnt from how long launches take. Pure: a fake clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant

from dyad.messages import (
    Decline,
    Filters,
    Offer,
    Offers,
    Rescind,
    StatusUpdate,
    TaskState,
    Teardown,
)
from dyad.resources import Resources
from master.admission import CUT, INITIAL, LEAST, Admission
from master.model import MasterConfig, OfferTimeout
from tests.unit.test_master_state import (
    Harness,
    MasterMachine,
    launch,
    messages,
    status,
    task,
)


def offer(n: int, framework: str = "F1", cpus: int = 4) -> Offer:
    return Offer(id=f"O-{framework}-{n}", framework_id=framework, agent_id=f"A-{n}",
                 hostname="h", resources=Resources.parse(f"cpus:{cpus};mem:1024"))


def test_off_lets_everything_out_at_once() -> None:
    admission = Admission(limit=0)
    offers = [offer(i) for i in range(1000)]
    assert admission.admit([offers], 0.0) == offers
    assert len(admission) == 0 and admission.held == 0


def test_offers_out_count_as_the_tasks_they_may_become() -> None:
    admission = Admission(limit=100)
    out = admission.admit([[offer(i) for i in range(100)]], 0.0)
    # before any accept an offer counts its cpus: 4 tasks each
    assert len(out) == INITIAL // 4 and len(admission) == 100 - len(out)
    assert admission.in_flight(0.0) == INITIAL
    assert admission.release(0.0) == []


def test_frameworks_take_turns_in_what_goes_out() -> None:
    admission = Admission(limit=100)
    out = admission.admit([[offer(i, "F1") for i in range(50)],
                           [offer(i, "F2") for i in range(50)]], 0.0)
    assert [o.framework_id for o in out[:4]] == ["F1", "F2", "F1", "F2"]


def test_room_comes_back_in_batches_as_launches_are_heard_of() -> None:
    admission = Admission(limit=100)
    out = admission.admit([[offer(i) for i in range(100)]], 0.0)
    for n, o in enumerate(out):  # each accepted, four tasks launched
        admission.closed(o.id)
        admission.accepted("F1", 1, 4)
        for t in range(4):
            admission.launched((n, t), 0.0)
    assert admission.in_flight(0.0) == INITIAL
    admission.started((0, 0), 0.01)
    assert admission.release(0.01) == []  # one slot back is not a batch
    for n in range(5):
        for t in range(4):
            admission.started((n, t), 0.01)
    again = admission.release(0.01)  # a quarter back: a batch goes out
    assert again and admission.in_flight(0.01) <= admission.allowed


def _round(admission: Admission, at: float, took: float, late: int = 0) -> None:
    """One round of launches heard of after `took` seconds, `late` of them after 1 s."""
    count = max(16, int(admission.allowed))
    for n in range(count):
        admission.launched((at, n), at)
    for n in range(count):
        admission.started((at, n), at + (1.0 if n < late else took))


def test_a_round_with_late_launches_cuts_and_rounds_in_time_grow() -> None:
    admission = Admission(limit=1000, target=0.05)
    admission.admit([[offer(i, cpus=1) for i in range(1000)]], 0.0)  # offers wait
    start = admission.allowed
    _round(admission, 1.0, 0.01)
    assert admission.allowed == 2 * start  # no cut yet: doubling
    late = int(admission.allowed) // 3
    _round(admission, 2.0, 0.01, late=late)  # a third late: the median is in time
    assert admission.allowed == 4 * start
    before = admission.allowed
    _round(admission, 3.0, 0.01, late=int(before) * 2 // 3)
    assert admission.allowed == before * CUT and admission.cuts == 1
    # launched before the cut, heard of after it: not samples
    admission.launched("old", 3.5)
    admission._cut_at = 3.6
    admission.started("old", 5.0)
    assert admission.cuts == 1
    before = admission.allowed
    _round(admission, 4.0, 0.01)
    assert admission.allowed == before * 1.125  # after a cut: by an eighth
    for n in range(40):  # most late, the fastest quick: cut down to LEAST, no further
        _round(admission, 10.0 + n, 0.01, late=int(admission.allowed) * 2 // 3 + 1)
    assert admission.allowed == LEAST


def test_a_target_even_the_fastest_launch_misses_stops_cutting() -> None:
    """A machine that is slow today: every launch takes 0.3 s, whatever is in
    flight. One cut, then the rounds are judged by their fastest launch."""
    admission = Admission(limit=1000, target=0.05)
    admission.admit([[offer(i, cpus=1) for i in range(1000)]], 0.0)
    for n in range(10):
        _round(admission, 10.0 + n, 0.3)
    assert admission.cuts == 1


def test_a_silent_framework_or_a_stuck_launch_holds_nothing_up_for_long() -> None:
    admission = Admission(limit=100, launch_seconds=5.0, offer_seconds=1.0)
    admission.admit([[offer(i) for i in range(100)]], 0.0)
    assert admission.release(0.5) == []
    assert admission.release(1.0) != []  # the offers out lapsed: room again
    admission.launched("stuck", 1.0)
    assert admission.in_flight(5.9) >= 1
    assert admission.in_flight(6.0) < admission.allowed


def test_limit_and_target_are_checked() -> None:
    with pytest.raises(ValueError):
        Admission(limit=-1)
    with pytest.raises(ValueError):
        Admission(target=0)


# ------------------------------------------------------------------ in the core


def flood(limit: int = 64) -> tuple[Harness, str, list[str]]:
    h = Harness(MasterConfig(admission_limit=limit))
    fid = h.subscribe("f1")
    agents = [h.register(f"a{i}", hostname=f"h{i}") for i in range(64)]
    return h, fid, agents


def test_a_pass_offers_what_fits_and_the_rest_waits_unseen_and_untimed() -> None:
    h, _, _ = flood()
    first = h.offers_to(h.allocate(), "f1")
    assert len(first) == INITIAL // 4  # 4 cpus each
    assert h.metric("master/offers_waiting") == 64 - len(first)
    assert h.metric("master/outstanding_offers") == 64
    groups = [key.offer_id for key in h.timers if isinstance(key, OfferTimeout)]
    assert len(groups) == 1  # the offers that went out together share one timeout
    timed = set(h.state.offer_groups[groups[0]])
    assert timed == {o.id for o in first}  # a waiting offer's clock has not started


def test_waiting_offers_go_out_as_launches_start_and_none_is_lost() -> None:
    h, fid, agents = flood()
    seen: list = h.offers_to(h.allocate(), "f1")
    launched = 0
    for _ in range(100):
        if not seen:
            break
        o = seen.pop(0)
        tasks = [task(f"t{launched + i}", o.agent_id) for i in range(4)]
        launched += 4
        sends = h.recv("f1", launch(fid, [o], *tasks))
        seen += h.offers_to(sends, "f1")
        peer = f"a{agents.index(o.agent_id)}"
        h.clock.advance(0.01)
        for t in tasks:
            sends = h.recv(peer, StatusUpdate(framework_id=fid, status=status(
                t.task_id, TaskState.TASK_RUNNING, uuid="r-" + t.task_id)))
            seen += h.offers_to(sends, "f1")
    assert launched == 64 * 4  # every agent's offer came out, in time
    assert h.metric("master/offers_waiting") == 0
    assert h.metric("master/offers_held") > 0


def test_a_waiting_offer_rescinded_is_never_announced() -> None:
    h, fid, _ = flood()
    sent = {o.id for o in h.offers_to(h.allocate(), "f1")}
    # declining what it saw lets the waiting ones out, announcing nothing
    sends = h.recv("f1", Decline(framework_id=fid, offer_ids=sorted(sent),
                                 filters=Filters(refuse_seconds=60)))
    assert not messages(sends, Rescind)
    out = {o.id for o in h.offers_to(sends, "f1")}
    assert out and not out & sent
    assert h.metric("master/offers_waiting") > 0
    # torn down: only offers it was sent are rescinded to it
    sends = h.recv("f1", Teardown(framework_id=fid))
    assert {r.offer_id for r in messages(sends, Rescind)} == out
    assert h.metric("master/offers_waiting") == 0


class AdmittingMachine(MasterMachine):
    """The master's state machine with admission on and tight (4 tasks in
    flight): the books stay valid, and a framework is never sent an offer that
    still waits, nor told of one it never saw."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(MasterConfig(offer_timeout=7.0, agent_ping_timeout=3.0,
                                      max_agent_ping_timeouts=2, heartbeat_interval=2.0,
                                      admission_limit=4))
        self.sent: set[str] = set()

    def feed(self, sends: list) -> None:
        for send in sends:
            if isinstance(send.message, Offers):
                self.sent.update(o.id for o in send.message.offers)
            elif isinstance(send.message, Rescind):
                assert send.message.offer_id in self.sent, "rescinded an offer never sent"
        super().feed(sends)

    @invariant()
    def nothing_seen_still_waits(self) -> None:
        for offers in self.held.values():
            assert not any(self.h.state.admission.waiting(o) for o in offers)


AdmittingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_admitting_master_state_machine = AdmittingMachine.TestCase


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "launch", "start", "close", "release",
                                           "look", "accept"]),
                          st.integers(0, 30), st.sampled_from([0.0, 0.0, 0.01, 0.3, 1.5])), max_size=80))
def test_a_look_remembered_full_answers_as_a_fresh_look_would(steps) -> None:
    """`release` skips its sums while nothing changed since a look that let
    nothing out; a twin that forgets that look each time must agree throughout."""
    fast, fresh = Admission(limit=64), Admission(limit=64)
    now, made = 0.0, 0
    for op, n, dt in steps:
        now += dt
        outs = []
        for admission in (fast, fresh):
            if admission is fresh:
                admission._full_until = -math.inf
            if op == "admit":
                outs.append([o.id for o in admission.admit(
                    [[offer(made + i) for i in range(n)]], now)])
            elif op == "launch":
                admission.launched(("F1", n), now)
            elif op == "start":
                admission.started(("F1", n), now)
            elif op == "close":
                admission.closed(f"O-F1-{n}")
            elif op == "accept":
                admission.accepted("F1", 1 + n % 3, n % 9)
            elif op == "look":
                outs.append(admission.in_flight(now))
            else:
                outs.append([o.id for o in admission.release(now)])
        if op == "admit":
            made += n
        assert outs[:1] == outs[1:]
        assert (fast.allowed, len(fast), fast.cuts) == (fresh.allowed, len(fresh), fresh.cuts)


def test_room_made_right_after_a_full_look_is_seen_at_once() -> None:
    admission = Admission(limit=64)
    out = admission.admit([[offer(i) for i in range(30)]], 0.0)
    assert len(out) == 16 and admission.release(0.0) == []  # full: remembered
    for gone in out[:5]:
        admission.closed(gone.id)
    assert [o.id for o in admission.release(0.0)] == [offer(i).id for i in range(16, 21)]
    assert admission.release(0.5) == []
    assert len(admission.release(1.0)) == 9  # everything out so far lapsed
