"""Room for two jumps at once, bought from a fleet budget (`MemoryVariant.double`,
`fleet.FleetJumps.covered`): the apps that jump often get it, cheapest first, while
the room added sums to at most the budget's share of the fleet's calm peaks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.effects import ArmTimer, TimerFired
from frameworks.autopilot import (
    AUTO, MIB, AppConfigured, ApplyLimits, Autopilot, AutopilotSpec, Config, Evaluate,
    Limits, MemoryVariant, TaskOomKilled, UsageSampled)
from frameworks.autopilot.fleet import PRIOR_APPS, FleetJumps


def _doubler(budget: float, margin: float = 0.0) -> MemoryVariant:
    return MemoryVariant("double", window=86400.0, margin=margin, jitter=0.05, prior=0.75,
                         prior_from=0.10, double=budget, double_after=3)


def _spiky(recommender, mib: float, jumps: list[float], hours: int = 20) -> float:
    """Samples of `mib` every 5 minutes with a 10-minute jump every 2 h from hour 2
    (sizes from `jumps`, cycled); the time of the last sample."""
    t = 0.0
    for i in range(hours * 12):
        t = i * 300.0
        k, into = divmod(t - 7200.0, 7200.0)
        up = jumps[int(k) % len(jumps)] if t >= 7200.0 and into < 600 else 0.0
        recommender.add(t, mib * MIB * (1 + up))
    return t


def _fleet(budget: float, sizes: list[float], jumps: list[float]):
    fleet = FleetJumps()
    recs = [_doubler(budget).build(fleet, f"/a{i}") for i in range(len(sizes))]
    now = 0.0
    for rec, mib in zip(recs, sizes):
        now = _spiky(rec, mib, jumps)
    return recs, now


def test_the_budget_doubles_the_room_of_the_cheapest_apps_that_jump_often() -> None:
    sizes = [100.0] + [1000.0] * PRIOR_APPS
    # The small app's doubled room adds 0.4 x 1.4 x 100 MiB = 56 MiB, 1% of the
    # fleet's 5,100 MiB of calm peaks; a big one's would add 560 MiB.
    recs, now = _fleet(0.012, sizes, [0.4])
    small, big = recs[0], recs[1]
    assert small.value(now) == pytest.approx(100 * MIB * 1.4 ** 2, rel=0.02)
    assert "two jumps at once" in small.explain(now)
    assert big.value(now) == pytest.approx(1000 * MIB * 1.4, rel=0.02)
    assert "two jumps at once" not in big.explain(now)
    none, now = _fleet(0.0, sizes, [0.4])
    assert none[0].value(now) == pytest.approx(100 * MIB * 1.4, rel=0.02)


def test_no_double_room_without_enough_jumps_or_a_fleet() -> None:
    alone = _doubler(1.0).build()
    now = _spiky(alone, 100.0, [0.4])
    assert alone.value(now) == pytest.approx(100 * MIB * 1.4, rel=0.02)
    recs, now = _fleet(1.0, [100.0] * (PRIOR_APPS + 1), [0.4])
    few = _doubler(1.0).build(FleetJumps(), "/few")
    t = _spiky(few, 100.0, [0.4], hours=5)  # one jump (at hour 2) only: under 3
    assert few.value(t) == pytest.approx(100 * MIB * 1.4, rel=0.02)
    assert recs[0].value(now) == pytest.approx(100 * MIB * 1.4 ** 2, rel=0.02)


costs = st.dictionaries(st.sampled_from([f"/a{i}" for i in range(12)]),
                        st.tuples(st.floats(1.0, 1e4), st.sampled_from([0.0, 0.1, 0.5, 1.2])),
                        min_size=1)


@given(costs, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_cover_goes_cheapest_first_within_the_budget_and_grows_with_it(apps, a, b) -> None:
    low, high = sorted((a, b))
    fleet = FleetJumps()
    for app, (peak, room) in apps.items():
        fleet.calm(app, peak, room)
    total = sum(peak for peak, _ in apps.values())
    covered = {budget: {app for app in apps if fleet.covered(app, 0.0, budget)}
               for budget in (low, high)}
    assert covered[low] <= covered[high]  # monotone in the budget
    for budget, chosen in covered.items():
        assert all(apps[app][1] > 0 for app in chosen)  # only candidates
        assert sum(p * r for app, (p, r) in apps.items() if app in chosen) <= \
            budget * total * (1 + 1e-9)
        cost = {app: p * r for app, (p, r) in apps.items() if r > 0}
        left = [cost[app] for app in cost if app not in chosen]
        assert not chosen or not left or max(cost[app] for app in chosen) <= min(left)


jumps = st.lists(st.floats(0.0, 0.6), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(40.0, 3000.0), min_size=PRIOR_APPS, max_size=8), jumps,
       st.floats(0.0, 0.2), st.floats(0.0, 0.2), st.floats(0.0, 0.1))
def test_memory_is_monotone_in_the_budget_and_never_under_the_peak_plus_margin(
        sizes, sizes_of_jumps, a, b, margin) -> None:
    low, high = sorted((a, b))
    answers = {}
    for budget in (low, high):
        fleet = FleetJumps()
        recs = [_doubler(budget, margin).build(fleet, f"/a{i}") for i in range(len(sizes))]
        peaks = [MemoryVariant("peak", window=86400.0, margin=margin).build() for _ in sizes]
        now = 0.0
        for rec, peak, mib in zip(recs, peaks, sizes):
            now = _spiky(rec, mib, sizes_of_jumps)
            _spiky(peak, mib, sizes_of_jumps)
        answers[budget] = [rec.value(now) for rec in recs]
        for rec, peak in zip(recs, peaks):
            assert rec.value(now) >= peak.value(now) * (1 - 1e-12)
    assert all(x <= y * (1 + 1e-12) for x, y in zip(answers[low], answers[high]))


def test_the_policy_bounds_double_room_and_raises_it_at_once_on_an_oom_kill() -> None:
    """Through the whole policy: the doubled room is capped, and a kill still
    raises memory at once."""
    cap = Limits(64.0, 180 * MIB)
    pilot = Autopilot(Config(memory_variants=(_doubler(1.0),), warmup=0, min_samples=1,
                             cap=cap))
    apps = [f"/a{i}" for i in range(PRIOR_APPS + 1)]
    for app in apps:
        pilot.handle(AppConfigured(app, AutopilotSpec(AUTO), Limits(1.0, 512 * MIB)), 0.0)
    t, applied = 0.0, {}
    for i in range(20 * 12):
        t = i * 300.0
        k, into = divmod(t - 7200.0, 7200.0)
        up = 0.4 if t >= 7200.0 and into < 600 else 0.0
        for app in apps:
            pilot.handle(UsageSampled(app, t, 0.1, 100 * MIB * (1 + up)), t)
        if i % 12 == 0:
            for app in apps:
                for effect in pilot.handle(TimerFired(Evaluate(app)), t):
                    if isinstance(effect, ApplyLimits):
                        applied[app] = effect.limits
                        pilot.handle(AppConfigured(app, AutopilotSpec(AUTO), effect.limits), t)
                    assert not isinstance(effect, ArmTimer) or effect.at > t
    rec = pilot.recommendation(apps[0])
    assert rec is not None and rec.mem_bytes == 180 * MIB  # 196 MiB of room, capped
    assert applied[apps[0]].mem_bytes <= cap.mem_bytes
    # An operator set 120 MiB; the task is killed there: raised at once, within the cap.
    pilot.handle(AppConfigured(apps[0], AutopilotSpec(AUTO), Limits(1.0, 120 * MIB)), t)
    raised = pilot.handle(TaskOomKilled(apps[0], "t", t, 120 * MIB), t)
    oom = [e for e in raised if isinstance(e, ApplyLimits) and e.oom]
    assert oom and oom[0].limits.mem_bytes == 180 * MIB
