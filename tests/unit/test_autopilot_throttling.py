"""Throttled time as an input: a task held at its CPU limit used less than it
wanted, so its samples count what it wanted (`cpu_demand`), and an app starved of
CPU is recommended more than its limit instead of exactly it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frameworks.autopilot import AUTO, UsageSampled
from frameworks.autopilot.core import FORGET_TASK_AFTER, MAX_THROTTLED_SHARE, cpu_demand
from tests.unit.test_autopilot_core import Driver, applied, configure


def test_demand_is_the_rate_it_ran_at_while_not_held() -> None:
    assert cpu_demand(0.5, 150.0, 300.0) == pytest.approx(1.0)  # held half the time
    assert cpu_demand(0.5, 0.0, 300.0) == 0.5
    assert cpu_demand(0.5, 150.0, None) == 0.5  # a first sample: nothing to divide by
    assert cpu_demand(0.5, 900.0, 300.0) == pytest.approx(0.5 / (1 - MAX_THROTTLED_SHARE))


@given(st.floats(0, 64), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6))
def test_demand_grows_with_the_time_held_within_bounds(used, a, b, elapsed) -> None:
    low, high = sorted((a, b))
    d_low, d_high = cpu_demand(used, low, elapsed), cpu_demand(used, high, elapsed)
    assert used <= d_low <= d_high <= used / (1 - MAX_THROTTLED_SHARE) * (1 + 1e-12)
    assert math.isfinite(d_high)


def _starved(d: Driver, throttled: float, seconds: float = 400, every: float = 10) -> list:
    """An app using all of its 0.5-core limit, each sample held `throttled` s."""
    out = []
    for _ in range(int(seconds / every)):
        out += d.advance(every)
        d.send(UsageSampled("/web", d.now, 0.5, 30e6, task_id="web.1",
                            cpus_throttled_secs=throttled))
    return out


def test_a_throttled_app_is_raised_past_its_limit_and_an_unthrottled_one_is_not() -> None:
    held, free = Driver(), Driver()
    for d in (held, free):
        configure(d, mode=AUTO, cpus=0.5)
    raised = applied(_starved(held, throttled=5.0))  # held half of every 10 s
    kept = applied(_starved(free, throttled=0.0))
    assert raised and raised[-1].limits.cpus >= 0.95  # it wanted a core
    assert all(change.limits.cpus <= 0.6 for change in kept)


def test_bad_throttled_times_are_rejected_and_counted() -> None:
    d = Driver()
    configure(d)
    for bad in (-1.0, math.nan, math.inf):
        d.send(UsageSampled("/web", 1.0, 0.5, 30e6, task_id="web.1", cpus_throttled_secs=bad))
    assert d.pilot.rejected == 3


def test_a_task_not_sampled_for_an_hour_is_forgotten() -> None:
    d = Driver()
    configure(d)
    d.send(UsageSampled("/web", 0.0, 0.5, 30e6, task_id="web.1"))
    d.advance(FORGET_TASK_AFTER + 120)
    assert "web.1" not in d.pilot._apps["/web"].last_sampled
