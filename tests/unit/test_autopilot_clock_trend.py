"""The clock's growth counted once (`MemoryVariant.season_once`): the previous days'
peaks are grown by the calm peak's rise over a day, and the clock's margin is the
variant's own, without that rise again; only ever a cut from the window's rule and
from the clock without the option, never under the recent peak plus margin, and a
cycle that grows steadily is held through the block and its lead."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks.autopilot import MIB, MemoryVariant
from frameworks.autopilot.seasonal import BIN, DAY, Seasonal
from tests.unit.test_autopilot_seasonal import HOUR, _cycle, _fed, _times, _variant, usage

CAP = 0.03


def _once(margin: float = 0.02, block: float = 4 * HOUR, **more) -> MemoryVariant:
    return _variant(margin, block, drift=DAY, drift_cap=CAP, season_once=True, **more)


def _lived(variant: MemoryVariant, until: float, growth: float = 0.0):
    """Fed every 5 minutes until `until` the daily cycle (100 MiB ± 10%, top at
    midnight), grown by `growth` of it a day; and the window's peak after each."""
    rec, t, peaks, top = variant.build(), 0.0, {}, 0.0
    while t < until:
        t += 300.0
        used = _cycle(t) * (1 + growth * t / DAY)
        rec.add(t, used)
        top = peaks[t] = max(top, used)
    return rec, t, peaks


def test_once_the_rise_is_known_it_is_counted_once() -> None:
    """Day 4's trough, a cycle growing 5% a day: the clock sets the limit, and with
    the option it is the limit without it less the rise in the margin."""
    on = _once()
    off = attrs.evolve(on, season_once=False)
    with_once, t, peaks = _lived(on, 4 * DAY + 12 * HOUR, growth=0.05)
    without, _, _ = _lived(off, t, growth=0.05)
    window = _lived(attrs.evolve(off, season=0.0), t, growth=0.05)[0].value(t)
    rise = peaks[t] / peaks[t - DAY] - 1
    assert 0.02 < rise < CAP * 2
    one, two = with_once.value(t), without.value(t)
    assert one is not None and two is not None and window is not None
    assert two < window  # the clock's limit, not the window's
    assert one == pytest.approx(two * 1.02 / (1.02 + min(CAP, rise)), rel=1e-9)
    assert "the calm peak's rise, counted once (a margin of 2% here)" in with_once.explain(t)
    assert "grown by the calm peak's rise, at least" in without.explain(t)


def test_before_the_rise_is_known_the_clock_waits_as_without_the_option() -> None:
    """Noon of day 1: every quarter hour was seen a day before, the trend not yet
    (it needs a day's peak that rests on a day of samples): the window's rule."""
    on = _once()
    rec, t, _ = _lived(on, DAY + 12 * HOUR, growth=0.05)
    without, _, _ = _lived(attrs.evolve(on, season_once=False), t, growth=0.05)
    window = _lived(attrs.evolve(on, season=0.0), t, growth=0.05)[0].value(t)
    assert rec.value(t) == without.value(t) == window
    assert rec.explain(t) == without.explain(t)


def test_without_drift_the_option_changes_nothing() -> None:
    """No trend is kept: no growth, and the margin is the variant's either way."""
    on = _variant(season_once=True)
    rec, t, _ = _lived(on, 2 * DAY + 12 * HOUR, growth=0.05)
    other, _, _ = _lived(attrs.evolve(on, season_once=False), t, growth=0.05)
    assert rec.value(t) == other.value(t)


@settings(max_examples=150, deadline=None)
@given(usage, st.floats(0, 0.5), st.sampled_from([HOUR, 4 * HOUR, 6 * HOUR]),
       st.floats(0, HOUR), st.booleans(), st.floats(0, 0.1))
def test_only_cuts_and_never_under_the_recent_peak_plus_margin(
        samples, margin, block, lead, spike, cap) -> None:
    """At most the window's rule and the clock without the option, at least the peak
    of the last `season_lead` seconds plus margin, and at least the clock without
    the option less the cap's share of its margin."""
    more = {"spike": 2.5} if spike else {}
    variant = _variant(margin, block, DAY, drift_cap=cap, season_lead=lead,
                       season_once=True, **more)
    value, now = _fed(variant, samples)
    without, _ = _fed(attrs.evolve(variant, season_once=False), samples)
    window, _ = _fed(attrs.evolve(variant, season=0.0), samples)
    recent = max((mib for (_, mib), at in zip(samples, _times(samples))
                  if at >= now - (lead or 1.0)), default=0.0) * MIB
    assert value is not None and without is not None and window is not None
    assert value <= min(window, without) * (1 + 1e-12)
    assert value >= recent * (1 + margin) * (1 - 1e-12)
    assert value >= without * (1 + margin) / (1 + margin + cap) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1, 4096), min_size=96, max_size=96), st.floats(0.01, 0.2),
       st.sampled_from([HOUR, 4 * HOUR, 8 * HOUR]), st.integers(0, 95),
       st.floats(0, 0.02), st.integers(2, 5))
def test_a_cycle_growing_steadily_is_held_through_the_block_and_its_lead(
        profile, margin, block, at, growth, day) -> None:
    """An app whose memory repeats every day (a quarter hour at a time), grown by
    `growth` of it a day (at most 2%: under the cap, so the window's rule holds it
    too), is never over the limit for the rest of the block and the lead after it:
    the rise grows the previous days' peaks, and the margin is not needed for it."""
    variant = _once(margin, block)

    def used(t: float) -> float:
        return profile[int(t % DAY // BIN)] * MIB * (1 + growth * t / DAY)

    rec, now = variant.build(), 0.0
    while now < day * DAY + at * BIN:
        now += 300.0
        rec.add(now, used(now))
    value = rec.value(now)
    _, end = Seasonal(variant.window, block, variant.season_lead).span(now)
    assert value is not None
    t = now + 300.0
    while t < end:  # the samples within the span (one at its end is in the next bin)
        assert value >= used(t)
        t += 300.0
