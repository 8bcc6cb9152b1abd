"""The service framework asks the master for preemption for apps that wait
(frameworks/service/preemption_asks.py and its use in the core)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from dyad.resources import Resources
from frameworks.effects import AskPreemption
from frameworks.service.appdef import parse_app
from frameworks.service.core import PutApp, ServiceConfig
from frameworks.service.preemption_asks import PreemptionAsks
from frameworks.service.testing import ServiceSim

BIG = {"id": "/big", "cmd": "sleep 600", "instances": 2, "cpus": 8, "mem": 512,
       "priority": 250}


def asks(effects: list) -> list[AskPreemption]:
    return [e for e in effects if isinstance(e, AskPreemption)]


def test_an_app_waiting_is_asked_for_after_the_wait_and_again_every_wait() -> None:
    sim = ServiceSim(agents=2, config=ServiceConfig(preemption_ask_after=30.0))
    sim.register()
    outcome = sim.command(PutApp(parse_app(BIG), create_only=True))
    assert not asks(outcome.effects)
    assert not asks(sim.offer_all())  # 4 cpus an agent: nothing fits
    assert not asks(sim.advance(29.0))
    (ask,) = asks(sim.advance(1.0))  # the wake-up was armed for the ask
    assert ask == AskPreemption(Resources.parse("cpus:8;mem:512"), 250)
    assert not asks(sim.advance(29.0))
    assert asks(sim.advance(1.0)) == [ask]
    assert sim.core.counters["preemption_asks"] == 2


def test_a_placed_app_and_a_constrained_one_are_never_asked_for() -> None:
    config = ServiceConfig(preemption_ask_after=30.0)
    placed = ServiceSim(agents=2, config=config, resources="cpus:16;mem:4096;disk:1000")
    placed.register()
    placed.command(PutApp(parse_app(BIG), create_only=True))
    placed.offer_all()
    assert len(placed.launched()) == 2 and not asks(placed.advance(60.0))
    pinned = ServiceSim(agents=2, config=config)
    pinned.register()
    pinned.command(PutApp(parse_app({**BIG, "constraints": [["hostname", "UNIQUE"]]}),
                          create_only=True))
    pinned.offer_all()
    assert not asks(pinned.advance(60.0)) and not asks(pinned.advance(60.0))


def test_without_the_setting_nothing_is_asked() -> None:
    sim = ServiceSim(agents=2)
    sim.register()
    sim.command(PutApp(parse_app(BIG), create_only=True))
    sim.offer_all()
    effects = sim.advance(600.0)
    assert not asks(effects) and "preemption_asks" not in sim.core.counters


@given(st.lists(st.tuples(st.floats(0, 100), st.sets(st.sampled_from("abc"))), max_size=30))
def test_asks_come_only_after_a_whole_wait_and_never_twice_within_one(steps) -> None:
    asker, now, since, last = PreemptionAsks(10.0), 0.0, {}, {}
    for gap, waiting in steps:
        now += gap
        asker.waiting(set(waiting), now)
        for app in set(since) - waiting:
            del since[app]
            last.pop(app, None)
        for app in waiting:
            since.setdefault(app, now)
        for app in asker.due(now):
            assert now - since[app] >= 10.0 and now - last.get(app, -1e9) >= 10.0
            last[app] = now
        due_at = asker.next_at()
        assert (due_at is None) == (not waiting)
        assert due_at is None or due_at > now
