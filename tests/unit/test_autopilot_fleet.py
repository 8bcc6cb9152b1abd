"""The fleet prior: what other apps' memory jumps say about one that has shown few
(frameworks/autopilot/fleet.py and `MemoryVariant.prior`)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, strategies as st

from dyad.effects import TimerFired
from frameworks.autopilot import (
    AUTO, DEFAULT_MEMORY_VARIANTS, MIB, AppConfigured, AppRemoved, Autopilot,
    AutopilotSpec, Config, Evaluate, Limits, MemoryVariant, UsageSampled)
from frameworks.autopilot.fleet import PRIOR_APPS, FleetJumps

FLEET = MemoryVariant("fleet", window=86400.0, margin=0.0, jitter=0.05, prior=0.75)


def test_the_prior_is_a_quantile_of_the_apps_largest_jumps_once_enough_jumped() -> None:
    fleet = FleetJumps()
    for i, size in enumerate([0.1, 0.2, 0.3, 0.4][:PRIOR_APPS - 1]):
        fleet.report(f"/a{i}", size)
    assert fleet.quantile(0.75) == 0.0  # too few apps: no evidence
    fleet.report("/a4", 0.5)
    assert len(fleet) == 5 and fleet.quantile(0.75) == 0.4 and fleet.quantile(1.0) == 0.5
    version = fleet.version
    fleet.report("/a4", 0.5)  # no change: answers kept
    assert fleet.version == version
    fleet.report("/a4", 0.0)  # its jump left its window
    assert len(fleet) == 4 and fleet.quantile(0.75) == 0.0 and fleet.version > version
    fleet.report("/a4", 0.45)
    fleet.forget("/a0")
    fleet.forget("/nobody")
    assert len(fleet) == 4


@given(st.lists(st.floats(0.01, 5.0), min_size=PRIOR_APPS, max_size=40),
       st.floats(0.01, 1.0))
def test_the_quantile_is_one_of_the_jumps_with_that_share_at_or_below_it(sizes, q) -> None:
    fleet = FleetJumps()
    for i, size in enumerate(sizes):
        fleet.report(f"/a{i}", size)
    answer = fleet.quantile(q)
    assert answer in sizes
    assert sum(s <= answer for s in sizes) >= q * len(sizes) - 1e-9
    assert sum(s < answer for s in sizes) < q * len(sizes)


def _feed(recommender, jump: float, hours: int = 20, size: float = 100 * MIB) -> float:
    """Samples of `size` every 5 minutes with one 10-minute jump at hour 10; the
    time of the last sample."""
    t = 0.0
    for i in range(hours * 12):
        t = i * 300.0
        up = 1 + jump if 10 * 3600 <= t < 10 * 3600 + 600 else 1.0
        recommender.add(t, size * up)
    return t


def test_an_app_that_jumped_a_little_gets_room_for_the_jumps_the_fleet_makes() -> None:
    fleet = FleetJumps()
    for i, jump in enumerate((0.3, 0.4, 0.45, 0.5, 0.5)):
        _feed(FLEET.build(fleet, f"/big{i}"), jump)
    assert fleet.quantile(0.75) == pytest.approx(0.5, rel=0.02)
    small, calm, alone = FLEET.build(fleet, "/small"), FLEET.build(fleet, "/calm"), FLEET.build()
    now = _feed(small, 0.15)
    _feed(calm, 0.0)
    _feed(alone, 0.15)
    # One jump of 15% buys room for the fleet's p75 jump over the calm top...
    assert small.value(now) == pytest.approx(100 * MIB * 1.5, rel=0.02)
    assert "p75 of the largest jumps of the 6 apps that jumped" in small.explain(now)
    # ...an app that never jumped gets none, and one alone only its own largest.
    assert calm.value(now) == pytest.approx(100 * MIB)
    assert "no jump in the window" in calm.explain(now)
    assert alone.value(now) == pytest.approx(100 * MIB * 1.15, rel=0.02)


def test_with_prior_size_a_small_app_gets_room_for_more_of_the_fleets_jumps() -> None:
    # Seven apps' largest jumps: 15% (the small and the large app), 20-50% (five of
    # 100 MiB, the median calm peak). The p75's share above, 25%, scaled by the square
    # root of calm / median: the p92 for 10 MiB (the largest, 50%), the p21 for 1000
    # MiB (15%, its own), the p75 at the median (45%).
    sized = attrs.evolve(FLEET, prior_size=0.5)
    fleet = FleetJumps()
    middle = []
    for i, jump in enumerate((0.2, 0.3, 0.4, 0.45, 0.5)):
        middle.append(sized.build(fleet, f"/mid{i}"))
        _feed(middle[-1], jump)
    small, large = sized.build(fleet, "/small"), sized.build(fleet, "/large")
    _feed(small, 0.15, size=10 * MIB)
    now = _feed(large, 0.15, size=1000 * MIB)
    assert small.value(now) == pytest.approx(10 * MIB * 1.5, rel=0.03)
    assert "the p92 (p75 moved by its calm peak" in small.explain(now)
    assert large.value(now) == pytest.approx(1000 * MIB * 1.15, rel=0.03)
    assert middle[0].value(now) == pytest.approx(100 * MIB * 1.45, rel=0.03)
    # Without it every app gets the p75.
    plain = FleetJumps()
    for i, jump in enumerate((0.2, 0.3, 0.4, 0.45, 0.5)):
        _feed(FLEET.build(plain, f"/mid{i}"), jump)
    small, large = FLEET.build(plain, "/small"), FLEET.build(plain, "/large")
    _feed(small, 0.15, size=10 * MIB)
    _feed(large, 0.15, size=1000 * MIB)
    assert small.value(now) == pytest.approx(10 * MIB * 1.45, rel=0.03)
    assert large.value(now) == pytest.approx(1000 * MIB * 1.45, rel=0.03)


def test_the_autopilot_learns_from_the_apps_it_follows_and_forgets_removed_ones() -> None:
    pilot = Autopilot(Config(memory_variants=(FLEET,), warmup=0, min_samples=1))
    apps = [f"/app{i}" for i in range(PRIOR_APPS + 1)]
    for app in apps:
        pilot.handle(AppConfigured(app, AutopilotSpec(AUTO), Limits(1.0, 512 * MIB)), 0.0)
    t = 0.0
    for i in range(20 * 12):
        t = i * 300.0
        for k, app in enumerate(apps):
            # Every app but the last jumps by 40% once; the last by 10%.
            jump = (0.4 if k < PRIOR_APPS else 0.1) if 36000 <= t < 36600 else 0.0
            pilot.handle(UsageSampled(app, t, 0.1, 100 * MIB * (1 + jump)), t)
    pilot.handle(TimerFired(Evaluate(apps[-1])), t)
    rec = pilot.recommendation(apps[-1])
    assert rec is not None and rec.mem_bytes == pytest.approx(140 * MIB, rel=0.02)
    assert any(f"of the {PRIOR_APPS + 1} apps that jumped" in r for r in rec.reasons)
    for app in apps[:2]:
        pilot.handle(AppRemoved(app), t)
    pilot.handle(TimerFired(Evaluate(apps[-1])), t)
    rec = pilot.recommendation(apps[-1])
    assert rec is not None and rec.mem_bytes == pytest.approx(110 * MIB, rel=0.02)
    assert any(f"of the {PRIOR_APPS - 1} apps that jumped" in r for r in rec.reasons)


def test_a_rise_barely_past_the_jitter_draws_no_prior() -> None:
    """The default draws the fleet's room for a jump only for one of at least 10%: a
    7% rise (a daily cycle's turn, noise) is no evidence of a spiky app. (Here
    without the default's room before a first jump, which a quiet app among apps
    like it that jump draws anyway, and without the clock, which needs a day.)"""
    assert DEFAULT_MEMORY_VARIANTS[0].prior_from == 0.10
    variant = attrs.evolve(DEFAULT_MEMORY_VARIANTS[0], first_rate=0.0, season=0.0)
    fleet = FleetJumps()
    for i in range(PRIOR_APPS):
        _feed(variant.build(fleet, f"/big{i}"), 0.5)
    barely, clearly = variant.build(fleet, "/barely"), variant.build(fleet, "/clearly")
    now = _feed(barely, 0.07)
    _feed(clearly, 0.12)
    assert barely.value(now) == pytest.approx(100 * MIB * 1.07 * 1.05, rel=0.02)
    assert "p75" not in barely.explain(now)
    assert clearly.value(now) == pytest.approx(100 * MIB * 1.5 * 1.05, rel=0.02)


def _quiet_and_jumpers(first_rate: float, jump: float = 0.4):
    """Five apps that jump once at hour 10 and one that never does, 20 h of samples;
    the quiet app's recommender and the time of the last sample."""
    variant = MemoryVariant("first", window=7 * 86400.0, margin=0.0, jitter=0.05,
                            prior=0.75, prior_from=0.10, first_rate=first_rate,
                            first_horizon=12 * 3600.0)
    fleet = FleetJumps()
    for i in range(PRIOR_APPS):
        _feed(variant.build(fleet, f"/jumper{i}"), jump)
    quiet = variant.build(fleet, "/quiet")
    return quiet, _feed(quiet, 0.0)


def test_an_app_that_has_not_jumped_gets_the_fleets_room_while_first_jumps_are_common() -> None:
    # At 20 h, of the 6 apps that had not jumped by 8 h, 5 first jumped since: 83%.
    quiet, now = _quiet_and_jumpers(first_rate=0.5)
    assert quiet.value(now) == pytest.approx(100 * MIB * 1.4, rel=0.02)
    assert "not jumped" in quiet.explain(now)
    strict, now = _quiet_and_jumpers(first_rate=0.9)
    assert strict.value(now) == pytest.approx(100 * MIB, rel=0.01)
    off, now = _quiet_and_jumpers(first_rate=0.0)
    assert off.value(now) == pytest.approx(100 * MIB, rel=0.01)


def test_with_first_size_a_small_quiet_app_keeps_the_room_a_large_one_loses() -> None:
    # The rate is 83% (as above); the threshold, 50% at the fleet's median calm peak
    # (100 MiB), scales by the square root of the app's own: 16% at 10 MiB, 158% at
    # 1000 MiB (never met).
    variant = MemoryVariant("first", window=7 * 86400.0, margin=0.0, jitter=0.05,
                            prior=0.75, prior_from=0.10, first_rate=0.5,
                            first_horizon=12 * 3600.0, first_size=0.5)
    fleet = FleetJumps()
    for i in range(PRIOR_APPS):
        _feed(variant.build(fleet, f"/jumper{i}"), 0.4)
    small, large = variant.build(fleet, "/small"), variant.build(fleet, "/large")
    _feed(small, 0.0, size=10 * MIB)
    now = _feed(large, 0.0, size=1000 * MIB)
    assert fleet.typical_calm(now) == pytest.approx(100 * MIB, rel=0.01)
    assert small.value(now) == pytest.approx(10 * MIB * 1.4, rel=0.02)
    assert "the fleet's median)^0.5" in small.explain(now)
    assert large.value(now) == pytest.approx(1000 * MIB, rel=0.01)
    assert "not jumped" not in large.explain(now)


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.11, 0.9))
def test_room_for_apps_that_have_not_jumped_never_shrinks_as_the_threshold_falls(a, b, jump) -> None:
    low, high = sorted((a, b))
    eager, now = _quiet_and_jumpers(first_rate=low or 1e-9, jump=jump)
    wary, _ = _quiet_and_jumpers(first_rate=high or 1e-9, jump=jump)
    assert eager.value(now) >= wary.value(now) >= 100 * MIB * 0.99
