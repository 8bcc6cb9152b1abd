"""The autopilot's building blocks: decaying histograms, sliding peaks, the
moving-window recommenders, the meta-recommender and the app spec."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks.autopilot import (
    MIB, AutopilotSpec, Bounds, Costs, CpuVariant, DecayingHistogram, MemoryVariant,
    MetaRecommender, Scale, SlidingPeak, SpecInvalid, parse_spec, unparse_spec)
from frameworks.autopilot.jumps import LEVEL_SETTLE, JumpLog
from frameworks.autopilot.spec import HorizontalSpec

SCALE = Scale(low=0.001, high=1000.0, ratio=1.05)
values = st.floats(min_value=0.001, max_value=1000.0, allow_nan=False)
weights = st.floats(min_value=0.01, max_value=100.0)
samples = st.lists(st.tuples(values, weights), min_size=1, max_size=60)
percentiles = st.floats(min_value=0.5, max_value=100.0)


def exact_percentile(pairs: list[tuple[float, float]], p: float) -> float:
    """The smallest sample value with at least p% of the weight at or below it."""
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    running = 0.0
    for value, w in ordered:
        running += w
        if running >= total * p / 100 * (1 - 1e-12):
            return value
    return ordered[-1][0]


# -- histogram ------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(samples, percentiles)
def test_percentile_brackets_the_exact_weighted_percentile(pairs, p) -> None:
    h = DecayingHistogram(SCALE, half_life=3600)
    for value, w in pairs:
        h.add(0.0, value, w)  # one time: weights are as given
    answer = h.percentile(p)
    exact = exact_percentile(pairs, p)
    assert exact <= answer * (1 + 1e-9)
    assert answer <= exact * SCALE.ratio * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(values, min_size=1, max_size=30), st.floats(0, 1e6), percentiles)
def test_decay_halves_weight_per_half_life(vals, start, p) -> None:
    """A sample one half-life newer weighs exactly twice one that is older, whatever
    the absolute times (so percentiles never depend on "now")."""
    hl = 100.0
    old, new = DecayingHistogram(SCALE, hl), DecayingHistogram(SCALE, hl)
    for v in vals:
        old.add(start, v, 2.0)
        old.add(start + hl, v * 3, 1.0)
        new.add(start + 5 * hl, v, 1.0)
        new.add(start + 6 * hl, v * 3, 0.5)
    assert old.percentile(p) == pytest.approx(new.percentile(p))
    assert old.weight(start + hl) == pytest.approx(2 * len(vals))


def test_old_samples_fade_and_far_jumps_rebase() -> None:
    h = DecayingHistogram(SCALE, half_life=60)
    for _ in range(100):
        h.add(0.0, 10.0)
    assert h.percentile(50) == pytest.approx(10.0, rel=0.05)
    h.add(60 * 30, 1.0)  # 30 half-lives later one sample outweighs the 100 old ones
    assert h.percentile(50) == pytest.approx(1.0, rel=0.05)
    h.add(60 * 10_000, 5.0)  # far past the exponent limit: rebased, still answers
    assert h.percentile(99) == pytest.approx(5.0, rel=0.05)
    assert math.isfinite(h.weight(60 * 10_000))


def test_values_outside_the_scale() -> None:
    h = DecayingHistogram(SCALE, half_life=60)
    h.add(0.0, 0.0)
    assert h.percentile(100) == SCALE.low
    h.add(0.0, 5000.0)
    assert h.percentile(100) == 5000.0  # the last bucket answers the largest seen
    with pytest.raises(ValueError):
        h.add(0.0, float("nan"))
    with pytest.raises(ValueError):
        h.add(0.0, -1.0)
    with pytest.raises(ValueError):
        h.percentile(0)
    assert DecayingHistogram(SCALE, 60).percentile(50) is None


# -- sliding peak ---------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 1e9)), min_size=1, max_size=80),
       st.floats(1, 500))
def test_sliding_peak_is_the_window_maximum(raw, window) -> None:
    peak = SlidingPeak(window)
    seen: list[tuple[float, float]] = []
    clock = 0.0
    for gap, value in raw:
        clock += gap / 10
        peak.add(clock, value)
        seen.append((clock, value))
        expected = max(v for t, v in seen if t >= clock - window)
        assert peak.peak(clock) == expected
    assert peak.peak(clock + window + 1) is None


def test_late_sample_errs_towards_a_higher_peak() -> None:
    peak = SlidingPeak(10)
    peak.add(100.0, 1.0)
    peak.add(50.0, 7.0)  # late: filed at 100, so it lives until 110
    assert peak.peak(105.0) == 7.0
    assert peak.peak(111.0) is None


# -- recommenders ---------------------------------------------------------------------

usage_runs = st.lists(st.tuples(st.floats(0, 600), st.floats(0, 64)), min_size=1, max_size=50)


@settings(max_examples=150, deadline=None)
@given(usage_runs, st.floats(1, 100), st.floats(0, 1))
def test_memory_recommendation_covers_the_window_peak_plus_margin(raw, extra, margin) -> None:
    variant = MemoryVariant("m", window=3600, margin=margin)
    rec = variant.build()
    clock = 0.0
    for gap, value in raw:
        clock += gap
        rec.add(clock, value * MIB)
    in_window = max(v for t, v in _times(raw) if t >= clock - 3600) * MIB
    assert rec.value(clock) >= in_window * (1 + margin) * (1 - 1e-12)
    # A larger sample never lowers it (monotone in usage).
    before = rec.value(clock)
    rec.add(clock, in_window + extra * MIB)
    assert rec.value(clock) >= before


def _times(raw: list[tuple[float, float]]) -> list[tuple[float, float]]:
    clock, out = 0.0, []
    for gap, value in raw:
        clock += gap
        out.append((clock, value))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.001, 64), min_size=1, max_size=50), st.floats(1, 4), percentiles)
def test_cpu_recommendation_is_monotone_in_usage(vals, factor, p) -> None:
    """Scaling every sample up by a factor never lowers the CPU recommendation."""
    low, high = (CpuVariant("c", half_life=600, percentile=p).build() for _ in range(2))
    for i, v in enumerate(vals):
        low.add(i * 10.0, v)
        high.add(i * 10.0, min(v * factor, 1000.0))
    assert high.value(len(vals) * 10.0) >= low.value(len(vals) * 10.0)


def test_variant_parameters_are_validated() -> None:
    with pytest.raises(ValueError):
        CpuVariant("c", half_life=0, percentile=95)
    with pytest.raises(ValueError):
        CpuVariant("c", half_life=10, percentile=101)
    with pytest.raises(ValueError):
        MemoryVariant("m", window=-1)
    with pytest.raises(ValueError):
        Scale(low=1.0, high=1.0)


# -- meta-recommender -----------------------------------------------------------------

def _meta(*variants, fatal: bool) -> MetaRecommender:
    return MetaRecommender([v.build() for v in variants], Costs(half_life=3600),
                           min_change=0.1, fatal_overrun=fatal)


def test_meta_prefers_the_tight_memory_variant_for_steady_usage() -> None:
    meta = _meta(MemoryVariant("loose", window=600, margin=1.0),
                 MemoryVariant("tight", window=600, margin=0.1), fatal=True)
    for i in range(200):
        meta.observe(i * 10.0, 100.0)
        if i % 6 == 5:
            meta.decide(i * 10.0)
    choice = meta.choose(2000.0)
    assert choice.variant == "tight" and choice.value == pytest.approx(110.0)
    assert "tight" in choice.explanation and "loose" in choice.explanation


def test_meta_punishes_a_variant_that_would_have_been_oom_killed() -> None:
    """Usage with a spike every 15 minutes: a 5-minute window forgets the spike and
    would be killed by the next one; the hour window keeps it and wins."""
    meta = _meta(MemoryVariant("short", window=300, margin=0.1),
                 MemoryVariant("hour", window=3600, margin=0.1), fatal=True)
    for i in range(600):
        at = i * 10.0
        meta.observe(at, 400.0 if i % 90 == 0 else 100.0)
        if i % 6 == 5:
            meta.decide(at)
    assert meta.choose(6000.0).variant == "hour"


def test_meta_ties_go_to_the_first_variant_and_empty_means_none() -> None:
    meta = _meta(CpuVariant("a", 600, 95), CpuVariant("b", 600, 95), fatal=False)
    assert meta.choose(0.0) is None
    meta.observe(0.0, 1.0)
    assert meta.choose(0.0).variant == "a"
    with pytest.raises(ValueError):
        _meta(CpuVariant("a", 600, 95), CpuVariant("a", 60, 90), fatal=False)


# -- spec -----------------------------------------------------------------------------

def test_spec_parses_and_round_trips() -> None:
    spec = parse_spec({"mode": "auto", "min": {"mem": 64}, "max": {"cpus": 2, "mem": 1024}})
    assert spec == AutopilotSpec("auto", Bounds(None, 2.0, 64 * MIB, 1024 * MIB))
    assert parse_spec(unparse_spec(spec)) == spec
    assert parse_spec(None) == AutopilotSpec()


def test_spec_names_every_problem() -> None:
    with pytest.raises(SpecInvalid) as caught:
        parse_spec({"mode": "on", "min": {"mem": -1, "disk": 3}, "max": {"mem": "x"},
                    "extra": 1})
    paths = [path for path, _ in caught.value.details]
    assert paths == ["/autopilot/extra", "/autopilot/mode", "/autopilot/min/mem",
                     "/autopilot/min/disk", "/autopilot/max/mem"]
    with pytest.raises(SpecInvalid, match="exceeds max"):
        parse_spec({"mode": "auto", "min": {"cpus": 4}, "max": {"cpus": 1}})
    with pytest.raises(SpecInvalid):
        parse_spec([])
    with pytest.raises(SpecInvalid):
        parse_spec({"min": {"cpus": True}})


def test_a_horizontal_block_round_trips_and_defaults_to_none() -> None:
    spec = parse_spec({"mode": "auto", "horizontal": {"target": 0.6, "min": 1, "max": 10}})
    assert spec.horizontal == HorizontalSpec(0.6, 1, 10)
    assert parse_spec(unparse_spec(spec)) == spec
    assert unparse_spec(spec)["horizontal"] == {"target": 0.6, "min": 1, "max": 10}
    assert parse_spec({"mode": "auto"}).horizontal is None
    assert "horizontal" not in unparse_spec(parse_spec({"mode": "auto"}))


def test_a_horizontal_block_names_every_problem() -> None:
    def problems(horizontal: object) -> list[tuple[str, str]]:
        with pytest.raises(SpecInvalid) as caught:
            parse_spec({"mode": "auto", "horizontal": horizontal})
        return caught.value.details

    h = "/autopilot/horizontal"
    assert problems({"target": 0, "min": 0, "max": True, "step": 2}) == [
        (f"{h}/step", "unknown field (target, min and max are known)"),
        (f"{h}/target", "must be a number in (0, 1]"),
        (f"{h}/min", "must be an integer in [1, 10000]"),
        (f"{h}/max", "must be an integer in [1, 10000]")]
    assert problems({"target": 1.5, "min": 5, "max": 3}) == [
        (f"{h}/target", "must be a number in (0, 1]"), (f"{h}/min", "exceeds max (5 > 3)")]
    assert problems({"min": 1.5, "max": 10_001}) == [
        (f"{h}/target", "is required"), (f"{h}/min", "must be an integer in [1, 10000]"),
        (f"{h}/max", "must be an integer in [1, 10000]")]
    assert problems([1]) == [(h, "must be an object with target, min and max")]
    assert parse_spec({"horizontal": {"target": 1, "min": 3, "max": 3}}).horizontal == \
        HorizontalSpec(1.0, 3, 3)


def test_a_spike_variant_adds_room_after_a_jump_and_none_for_slow_moves() -> None:
    variant = MemoryVariant("spike", window=7 * 86400, margin=0.05, spike=2.5, jitter=0.05)
    steady, cycle, leak, spiky = (variant.build() for _ in range(4))
    day = 86400.0
    for i in range(2 * 288):  # two days, a sample every 5 minutes
        t = i * 300.0
        usual = 100 * (1 + 0.2 * math.cos(2 * math.pi * t / day))
        steady.add(t, 100 * MIB * (1 + 0.02 * (-1) ** i))  # ±2% noise
        cycle.add(t, usual * MIB)
        leak.add(t, (100 + 100 * t / day) * MIB)  # doubles in a day
        # One 10-minute jump of 25% at the quiet hour, far below the daily top.
        spiky.add(t, usual * (1.25 if 12 * 3600 <= t < 12 * 3600 + 600 else 1) * MIB)
    now = 2 * day - 300
    assert steady.value(now) == pytest.approx(102 * 1.05 * MIB)
    assert cycle.value(now) == pytest.approx(120 * 1.05 * MIB, rel=1e-3)
    assert leak.value(now) == pytest.approx(299.65 * 1.05 * MIB, rel=1e-3)
    # The jump (25% over its level, 20% beyond the jitter) buys 2.5 x 20% = 50% over
    # the usual top.
    assert spiky.value(now) == pytest.approx(120 * 1.5 * 1.05 * MIB, rel=0.01)
    assert "largest jump" in spiky.explain(now)
    # Once the jump leaves the window (the second day's samples are still in it), so
    # does its room.
    assert spiky.value(8 * day) == pytest.approx(120 * 1.05 * MIB, rel=1e-3)

def test_a_learned_spike_room_shrinks_as_the_app_shows_more_jumps() -> None:
    """Room beyond the largest jump is 1/n of it for n jumps in the window: one jump
    of 20% buys 20% x (1 + 2) over the calm top; four alike buy 20% x (1 + 2/4)."""
    variant = MemoryVariant("learned", window=4 * 86400, margin=0.0, spike=2.0,
                            jitter=0.05, learned=True)
    once, often = variant.build(), variant.build()
    for i in range(130 * 12):  # 130 hours, a sample every 5 minutes
        t = i * 300.0
        hour, minute = divmod(t / 60, 60)
        up = 1.2 if minute < 10 else 1.0  # a 10-minute jump of 20% at some hours
        once.add(t, 100 * MIB * (up if hour == 20 else 1))
        often.add(t, 100 * MIB * (up if hour in (20, 40, 60, 80) else 1))
        if t == 81 * 3600:
            assert once.value(t) == pytest.approx(100 * MIB * (1 + 0.2 * 3), rel=1e-3)
            assert often.value(t) == pytest.approx(100 * MIB * (1 + 0.2 * 1.5), rel=1e-3)
            assert "largest of 4 jumps" in often.explain(t)
    now = 130 * 3600.0 - 300
    # The first jump left the window: no room for the app that jumped once; for the
    # other, three jumps are left.
    assert once.value(now) == pytest.approx(100 * MIB, rel=1e-3)
    assert often.value(now) == pytest.approx(100 * MIB * (1 + 0.2 * (1 + 2 / 3)), rel=1e-3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 600), st.floats(0.5, 3.0)), min_size=1, max_size=80),
       st.floats(60, 3000))
def test_the_jump_log_keeps_the_two_largest_events_of_its_window(steps, window) -> None:
    """Against a brute force over every event: pruning never loses one of the two
    largest, and events are counted by when they began."""
    log, now, level_at = JumpLog(window, jitter=0.05), 0.0, 0.0
    log.add(0.0, 1.0)
    log.add(LEVEL_SETTLE, 1.0)  # settled: jumps count from here
    now = level_at = LEVEL_SETTLE
    events: list[list[float]] = []  # [start, latest, size]
    prev_jump = False
    for gap, value in steps:
        now += gap
        level = log._level
        assert level is not None
        rise = value / level - 1
        log.add(now, value)
        if rise > 0.05:
            if prev_jump:
                events[-1][1], events[-1][2] = now, max(events[-1][2], rise)
            else:
                events.append([now, now, rise])
        prev_jump = rise > 0.05
        live = sorted((e[2] for e in events if e[1] >= now - window), reverse=True)
        top, second = log.largest(now)
        assert top == pytest.approx((live + [0.0, 0.0])[0])
        assert second == pytest.approx((live + [0.0, 0.0])[1])
        assert log.count(now) == sum(e[0] >= now - window for e in events)
