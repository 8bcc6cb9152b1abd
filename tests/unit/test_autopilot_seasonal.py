"""Memory that follows the daily cycle (`season`): the same clock times on previous
days, only ever a cut from the window's rule, never under the recent peak plus
margin, and holding a cycle that repeats; through the policy, raised at once on an
OOM kill."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks.autopilot import (
    AUTO, MIB, AppConfigured, ApplyLimits, Autopilot, AutopilotSpec, Config, Evaluate,
    Limits, MemoryVariant, TaskOomKilled, UsageSampled)
from frameworks.autopilot.seasonal import BIN, DAY, Seasonal
from dyad.effects import TimerFired

HOUR = 3600.0


def _variant(margin: float = 0.02, block: float = 4 * HOUR, drift: float = 0.0,
             **more: float) -> MemoryVariant:
    return MemoryVariant("mem-season", window=7 * DAY, margin=margin, jitter=0.05,
                         drift=drift, season=block, **more)


def _cycle(t: float, amp: float = 0.1) -> float:
    return 100 * MIB * (1 + amp * math.cos(2 * math.pi * t / DAY))


def test_no_answer_until_every_quarter_hour_of_the_block_was_seen_a_day_before() -> None:
    season = Seasonal(7 * DAY, 4 * HOUR, HOUR)
    assert season.span(DAY + 5 * HOUR) == (DAY + 4 * HOUR, DAY + 9 * HOUR)
    for t in range(0, int(DAY + 6 * HOUR), 300):
        season.add(float(t), 1.0 + t / DAY, calm=True)
    # Day 1's block 04:00-08:00 and the hour after: as on day 0, none of day 1.
    assert season.ahead(DAY + 5 * HOUR) == (pytest.approx(1 + (9 * HOUR - 300) / DAY),) * 2
    # Day 2's 08:00-13:00: seen on day 0 only (day 1's stops at 06:00), which counts.
    assert season.ahead(2 * DAY + 9 * HOUR) is not None
    # Day 8's: day 0 has left the week's window, and day 1 never saw those hours.
    assert season.ahead(8 * DAY + 9 * HOUR) is None
    empty = Seasonal(7 * DAY, 4 * HOUR, HOUR)
    empty.add(0.0, 1.0, calm=True)
    assert empty.ahead(0.0) is None and empty.ahead(DAY) is None


def test_a_block_and_its_lead_must_fit_in_a_day() -> None:
    with pytest.raises(ValueError):
        Seasonal(7 * DAY, 23.5 * HOUR, HOUR)
    with pytest.raises(ValueError):
        _variant(block=BIN / 2)


def test_a_daily_cycle_gets_a_lower_limit_at_its_trough_and_the_top_at_its_top() -> None:
    season, window = _variant().build(), attrs.evolve(_variant(), season=0.0).build()
    t = 0.0
    while t < 2 * DAY + 12 * HOUR:  # noon of day 2: the trough
        t += 300.0
        season.add(t, _cycle(t))
        window.add(t, _cycle(t))
    assert window.value(t) == pytest.approx(110 * MIB * 1.02)
    trough = season.value(t)
    assert trough is not None and trough < 100 * MIB  # the block 12:00-16:00 and an hour
    while t < 3 * DAY:
        t += 300.0
        season.add(t, _cycle(t))
    assert season.value(t) == pytest.approx(window.value(t), rel=1e-3)


# (seconds since the last sample, MiB): usage however it moves, over days.
usage = st.lists(st.tuples(st.floats(60, 4 * HOUR), st.floats(0, 8192)), min_size=1,
                 max_size=60)


def _fed(variant: MemoryVariant, samples: list[tuple[float, float]]) -> tuple[float | None, float]:
    rec, now = variant.build(), 0.0
    for gap, mib in samples:
        now += gap
        rec.add(now, mib * MIB)
    return rec.value(now), now


@settings(max_examples=150, deadline=None)
@given(usage, st.floats(0, 0.5), st.sampled_from([HOUR, 4 * HOUR, 6 * HOUR, 12 * HOUR]),
       st.floats(0, HOUR), st.booleans(), st.booleans())
def test_the_clock_only_cuts_and_never_under_the_recent_peak_plus_margin(
        samples, margin, block, lead, spike, drift) -> None:
    """The documented property for `season` only: the limit is at most the window's
    rule's (the same variant without `season`), and at least the peak of the last
    `season_lead` seconds plus margin (not the window's peak: that is the point)."""
    more = {"spike": 2.5} if spike else {}
    variant = _variant(margin, block, DAY if drift else 0.0, season_lead=lead, **more)
    value, now = _fed(variant, samples)
    window, _ = _fed(attrs.evolve(variant, season=0.0), samples)
    recent = max((mib for (_, mib), at in zip(samples, _times(samples))
                  if at >= now - (lead or 1.0)), default=0.0) * MIB
    assert value is not None and window is not None
    assert value <= window * (1 + 1e-12)
    assert value >= recent * (1 + margin) * (1 - 1e-12)


def _times(samples: list[tuple[float, float]]) -> list[float]:
    out, now = [], 0.0
    for gap, _ in samples:
        now += gap
        out.append(now)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1, 4096), min_size=96, max_size=96), st.floats(0, 0.2),
       st.sampled_from([HOUR, 4 * HOUR, 8 * HOUR]), st.integers(0, 95))
def test_a_cycle_that_repeats_is_held_through_the_block_and_its_lead(
        profile, margin, block, at) -> None:
    """An app whose memory repeats every day (a quarter hour at a time) is never
    over the limit for the rest of the block and the lead after it."""
    variant = _variant(margin, block)
    rec = variant.build()
    now = 0.0
    while now < 2 * DAY + at * BIN:
        now += 300.0
        rec.add(now, profile[int(now % DAY // BIN)] * MIB)
    value = rec.value(now)
    _, end = Seasonal(variant.window, block, variant.season_lead).span(now)
    assert value is not None
    for k in range(int(now // BIN), math.ceil(end / BIN)):
        assert value >= profile[k % len(profile)] * MIB * (1 + margin) * (1 - 1e-12)


def test_through_the_policy_an_oom_kill_still_raises_memory_at_once() -> None:
    pilot = Autopilot(Config(memory_variants=(_variant(),), warmup=0, min_samples=1))
    spec = AutopilotSpec(AUTO)
    pilot.handle(AppConfigured("/a", spec, Limits(1.0, 512 * MIB)), 0.0)
    limits, t = Limits(1.0, 512 * MIB), 0.0
    while t < 2 * DAY + 12 * HOUR:
        t += 300.0
        pilot.handle(UsageSampled("/a", t, 0.1, _cycle(t)), t)
        if t % 1200 == 0:
            for effect in pilot.handle(TimerFired(Evaluate("/a")), t):
                if isinstance(effect, ApplyLimits):
                    limits = effect.limits
                    pilot.handle(AppConfigured("/a", spec, limits), t)
    assert limits.mem_bytes <= 100 * MIB  # following the cycle down (its top: 113 MiB)
    raised = pilot.handle(TaskOomKilled("/a", "t", t, limits.mem_bytes), t)
    oom = [e for e in raised if isinstance(e, ApplyLimits) and e.oom]
    assert oom and oom[0].limits.mem_bytes >= 1.5 * limits.mem_bytes - MIB


def test_the_explanation_names_the_clock_times_and_the_limit_they_give() -> None:
    rec = _variant().build()
    assert "previous days (00.00h-05.00h UTC): not seen yet" in rec.explain(0.0)
    t = 0.0
    while t < 2 * DAY + 12 * HOUR:
        t += 300.0
        rec.add(t, _cycle(t))
    value = rec.value(t)
    assert value is not None
    assert "(12.00h-17.00h UTC)" in rec.explain(t)
    assert f"{value / MIB:.1f} MiB with the margin" in rec.explain(t)
