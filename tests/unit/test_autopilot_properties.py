"""Algebraic rules of the autopilot, checked by hypothesis over generated usage:
recommendations stay within floors and caps, are monotone in the percentile, the
margin and the spike room, an OOM kill never lowers the limit (and holds it up for
`oom_hold`), and the same events always give the same effects."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.effects import ArmTimer, TimerFired
from frameworks.autopilot import (
    AUTO, MIB, AppConfigured, ApplyLimits, Autopilot, AutopilotSpec, Bounds, Config,
    CpuVariant, Evaluate, Limits, MemoryVariant, Recommended, TaskOomKilled, UsageSampled)

CONFIG = Config(
    cpu_variants=(CpuVariant("cpu-p95", half_life=600, percentile=95, margin=0.1),
                  CpuVariant("cpu-p80", half_life=120, percentile=80, margin=0.2)),
    memory_variants=(MemoryVariant("mem-1h", window=3600, margin=0.1),
                     MemoryVariant("mem-spike", window=3600, margin=0.05, spike=2.5),
                     MemoryVariant("mem-learned", window=3600, margin=0.05, spike=2.0,
                                   learned=True)),
    step=60, min_samples=5, warmup=120, min_interval=300, oom_hold=1800)

# (seconds since the last sample, cores, MiB): a task's usage, however it moves.
usage = st.lists(st.tuples(st.floats(1, 300), st.floats(0, 16), st.floats(0, 8192)),
                 min_size=1, max_size=40)
bounds = st.builds(
    lambda lo, span, clo, cspan: Bounds(min_cpus=clo, max_cpus=clo + cspan,
                                        min_mem_bytes=lo * MIB, max_mem_bytes=(lo + span) * MIB),
    st.integers(1, 512), st.integers(0, 4096), st.floats(0.01, 2), st.floats(0, 8),
) | st.just(Bounds())


def drive(config: Config, spec: AutopilotSpec, samples: list[tuple[float, float, float]],
          kills: dict[int, float] | None = None) -> list[tuple[float, object]]:
    """Feed samples (and OOM kills before the samples at the given indices) to a
    fresh pilot, firing its timer as a shell would; every effect with its time."""
    pilot, now, due, out = Autopilot(config), 0.0, None, []
    limits = Limits(4.0, 4096 * MIB)

    def perform(effects: list[object]) -> None:
        nonlocal due, limits
        for effect in effects:
            out.append((now, effect))
            if isinstance(effect, ArmTimer):
                due = effect.at
            elif isinstance(effect, ApplyLimits):
                limits = effect.limits
                perform(pilot.handle(AppConfigured("/a", spec, limits), now))

    perform(pilot.handle(AppConfigured("/a", spec, limits), now))
    for i, (gap, cpus, mem) in enumerate(samples):
        now += gap
        while due is not None and due <= now:
            at, due = due, None
            perform(pilot.handle(TimerFired(Evaluate("/a")), at))
        if kills and i in kills:
            perform(pilot.handle(TaskOomKilled("/a", f"t{i}", now, limits.mem_bytes), now))
        perform(pilot.handle(UsageSampled("/a", now, cpus, mem * MIB), now))
    return out


def _within(value: float, low: float | None, high: float | None, floor: float,
            cap: float) -> bool:
    lo = floor if low is None else low
    hi = cap if high is None else high
    if lo > hi:
        return value == lo if low is not None else value == hi
    return lo - 1e-9 <= value <= hi + 1e-9


@settings(max_examples=60, deadline=None)
@given(usage, bounds)
def test_every_recommendation_and_applied_limit_is_within_the_bounds(samples, b) -> None:
    c = CONFIG
    for _, effect in drive(c, AutopilotSpec(AUTO, b), samples):
        if isinstance(effect, Recommended) and effect.recommendation.ready:
            limits = Limits(effect.recommendation.cpus, effect.recommendation.mem_bytes)
        elif isinstance(effect, ApplyLimits):
            limits = effect.limits
        else:
            continue
        assert _within(limits.cpus, b.min_cpus, b.max_cpus, c.floor.cpus, c.cap.cpus)
        assert _within(limits.mem_bytes, b.min_mem_bytes, b.max_mem_bytes,
                       c.floor.mem_bytes, c.cap.mem_bytes)
        assert limits.mem_bytes % MIB == 0 or b.min_mem_bytes or b.max_mem_bytes


def _fed(variant: MemoryVariant | CpuVariant, samples: list[tuple[float, float, float]],
         resource: int) -> float | None:
    rec, now = variant.build(), 0.0
    for gap, *values in samples:
        now += gap
        rec.add(now, values[resource])
    return rec.value(now)


@settings(max_examples=150, deadline=None)
@given(usage, st.floats(1, 100), st.floats(1, 100), st.floats(0, 1), st.floats(0, 1))
def test_cpu_recommendation_is_monotone_in_percentile_and_margin(samples, p, q, m, n) -> None:
    (p, q), (m, n) = sorted((p, q)), sorted((m, n))
    low = _fed(CpuVariant("low", half_life=600, percentile=p, margin=m), samples, 0)
    high = _fed(CpuVariant("high", half_life=600, percentile=q, margin=n), samples, 0)
    assert low is not None and high is not None and low <= high * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(usage, st.floats(0, 1), st.floats(0, 1), st.floats(0, 3), st.floats(0, 3),
       st.floats(0, 0.5), st.booleans())
def test_memory_recommendation_is_monotone_in_margin_and_spike(samples, m, n, s, t,
                                                               jitter, learned) -> None:
    (m, n), (s, t) = sorted((m, n)), sorted((s, t))
    low = _fed(MemoryVariant("low", window=3600, margin=m, spike=s, jitter=jitter,
                             learned=learned), samples, 1)
    high = _fed(MemoryVariant("high", window=3600, margin=n, spike=t, jitter=jitter,
                              learned=learned), samples, 1)
    assert low is not None and high is not None and low <= high * (1 + 1e-12)
    # And never below the window's peak plus margin.
    assert low >= _fed(MemoryVariant("peak", window=3600, margin=m), samples, 1) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(usage, st.sets(st.integers(0, 39), max_size=4))
def test_an_oom_kill_never_lowers_memory_and_holds_it_up(samples, at) -> None:
    config = attrs.evolve(CONFIG, cap=Limits(64.0, 64 * 1024 * MIB))
    kills = {i: 0.0 for i in at}
    effects = drive(config, AutopilotSpec(AUTO), samples, kills)
    floor, floor_until, limit = 0.0, -1.0, 4096 * MIB
    for when, effect in effects:
        if not isinstance(effect, ApplyLimits):
            continue
        if effect.oom:
            assert effect.limits.mem_bytes >= limit  # a raise, never a cut
            floor = max(floor if when < floor_until else 0.0,
                        min(config.cap.mem_bytes, config.oom_growth * limit))
            floor_until = when + config.oom_hold
        elif when < floor_until:
            assert effect.limits.mem_bytes >= floor - 1  # held up for the hold
        limit = effect.limits.mem_bytes


@settings(max_examples=30, deadline=None)
@given(usage, st.sets(st.integers(0, 39), max_size=3))
def test_the_same_events_give_the_same_effects(samples, at) -> None:
    kills = {i: 0.0 for i in at}
    assert drive(CONFIG, AutopilotSpec(AUTO), samples, kills) == \
        drive(CONFIG, AutopilotSpec(AUTO), samples, kills)


@settings(max_examples=150, deadline=None)
@given(usage, st.floats(0, 0.5), st.floats(0, 0.5), st.floats(0, 0.2), st.floats(0, 0.2))
def test_a_drifting_margin_is_monotone_and_stays_between_margin_and_margin_plus_cap(
        samples, m, n, c, d) -> None:
    (m, n), (c, d) = sorted((m, n)), sorted((c, d))
    low = _fed(MemoryVariant("low", window=3600, margin=m, drift=600, drift_cap=c),
               samples, 1)
    high = _fed(MemoryVariant("high", window=3600, margin=n, drift=600, drift_cap=d),
                samples, 1)
    peak = _fed(MemoryVariant("peak", window=3600, margin=0.0), samples, 1)
    assert low is not None and high is not None and peak is not None
    assert low <= high * (1 + 1e-12)
    assert peak * (1 + m) * (1 - 1e-12) <= low <= peak * (1 + m + c) * (1 + 1e-12)
