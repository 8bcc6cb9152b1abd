"""The shape of an app's calm memory (frameworks/autopilot/shape.py) and the fleet's
first-jump rate (fleet.FleetJumps.first_jump_rate): the signals that size a
memory margin and room for an app that has not jumped yet."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from frameworks.autopilot.fleet import PRIOR_APPS, FleetJumps
from frameworks.autopilot.shape import SWING_UNIT, Drift, Swing, swing_class

HOUR = 3600.0


def test_drift_is_the_rise_of_the_peak_over_one_span_once_it_rests_on_a_span() -> None:
    drift = Drift(span=HOUR)
    drift.add(0.0, 100.0)
    drift.add(1800.0, 104.0)
    assert drift.rise() is None  # not yet a span seen
    drift.add(HOUR, 105.0)
    assert drift.rise() is None  # the peak a span ago is the first sample's: no trend
    drift.add(2 * HOUR, 105.0)
    assert drift.rise() == 0.0  # the peak a span ago was 105 too
    drift.add(2.5 * HOUR, 110.0)
    assert drift.rise() == pytest.approx(110 / 105 - 1)
    drift.add(4 * HOUR, 90.0)  # the peak fell (an old one left the window)
    assert drift.rise() == 0.0


@given(st.lists(st.tuples(st.floats(1, 7200), st.floats(1, 1e12)), min_size=1, max_size=60))
def test_drift_is_never_negative_and_zero_for_a_peak_that_never_rises(steps) -> None:
    rising, flat, t = Drift(HOUR), Drift(HOUR), 0.0
    for gap, value in steps:
        t += gap
        rising.add(t, value)
        flat.add(t, 5.0)
        assert (rising.rise() or 0.0) >= 0.0 and flat.rise() in (0.0, None)
        assert (flat.rise() is None) == (rising.rise() is None)


def test_swing_is_the_days_calm_high_over_its_low() -> None:
    swing = Swing()
    assert swing.swing(0.0) == 0.0
    for i, value in enumerate((100.0, 120.0, 90.0, 0.0)):
        swing.add(i * HOUR, value)  # a 0 (no usage) is no low to divide by
    assert swing.swing(3 * HOUR) == pytest.approx(120 / 90 - 1)
    assert swing.swing(2 * HOUR + 86_400.0) == 0.0  # all left the window


@given(st.lists(st.floats(0, 2.0 ** 60), min_size=1, max_size=20))
def test_any_byte_counts_give_a_finite_swing_and_a_class(values) -> None:
    """Found by a hypothesis test in session 32: a sample far under a byte
    (5e-324) had an infinite inverse, which the window refused, and the recommender
    raised on input it had accepted."""
    swing = Swing()
    for i, value in enumerate(values):
        swing.add(i * 60.0, value)
    found = swing.swing(len(values) * 60.0)
    assert 0.0 <= found < float("inf")
    assert swing_class(found) >= 0


@given(st.floats(0, 100), st.floats(0, 100))
def test_swing_classes_double_and_never_go_down_as_the_swing_grows(a, b) -> None:
    low, high = sorted((a, b))
    assert swing_class(low) <= swing_class(high)
    assert swing_class(SWING_UNIT / 2) == 0 and swing_class(SWING_UNIT) == 1
    assert swing_class(2 * SWING_UNIT) == 2 and swing_class(0.079) == 3 and swing_class(0.08) == 4


def test_the_first_jump_rate_is_the_share_of_apps_at_risk_that_jumped() -> None:
    fleet = FleetJumps()
    for i in range(10):
        fleet.seen(f"/a{i}", 0.0, alike=1 if i < 8 else 2)
    fleet.jumped("/a0", 2 * HOUR)  # before the horizon: not at risk any more
    fleet.jumped("/a1", 20 * HOUR)
    fleet.jumped("/a2", 23 * HOUR)
    fleet.jumped("/a2", 30 * HOUR)  # only its first jump counts
    fleet.jumped("/nobody", 1.0)  # never seen: ignored
    now = 30 * HOUR
    # At age 24 h over a 12 h horizon: 9 apps at risk (a0 jumped at 2 h), 2 jumped.
    assert fleet.first_jump_rate(now, 24 * HOUR, 12 * HOUR) == pytest.approx(2 / 9)
    assert fleet.first_jump_rate(now, 24 * HOUR, 12 * HOUR, alike=1) == pytest.approx(2 / 7)
    assert fleet.first_jump_rate(now, 24 * HOUR, 12 * HOUR, alike=2) == 0.0  # too few
    assert fleet.first_jump_rate(now, 31 * HOUR, 12 * HOUR) == 0.0  # none seen that long
    fleet.forget("/a1")
    assert fleet.first_jump_rate(now, 24 * HOUR, 12 * HOUR) == pytest.approx(1 / 8)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100) | st.none()),
                min_size=0, max_size=30),
       st.floats(0, 200), st.floats(1, 100))
def test_the_first_jump_rate_is_a_share(apps, age, horizon) -> None:
    fleet = FleetJumps()
    for i, (seen, jump) in enumerate(apps):
        fleet.seen(f"/a{i}", seen)
        if jump is not None:
            fleet.jumped(f"/a{i}", seen + jump)
    rate = fleet.first_jump_rate(250.0, age, horizon)
    assert 0.0 <= rate <= 1.0
    if len(apps) < PRIOR_APPS:
        assert rate == 0.0
