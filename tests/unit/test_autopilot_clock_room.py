"""Room for two jumps at once in the clock's rule (`MemoryVariant.season_double`):
for an app that has jumped, a quiet block's limit keeps room for two spikes
meeting, as the window's rule does; it only ever raises the clock's limit, never
above the window's rule, and an app that never jumped is unchanged."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks.autopilot import DEFAULT_MEMORY_VARIANTS, MIB, MemoryVariant
from frameworks.autopilot.fleet import PRIOR_APPS, FleetJumps
from frameworks.autopilot.seasonal import DAY
from tests.unit.test_autopilot_seasonal import HOUR, _cycle, _fed, _variant, usage


def _lived(variant: MemoryVariant, jump: float, until: float = 2 * DAY + 12 * HOUR,
           days: tuple[int, ...] = (1,), fleet: FleetJumps | None = None, app: str = ""):
    """A recommender fed the daily cycle (100 MiB ± 10%, top at midnight) every
    5 minutes until `until` (noon of day 2: the trough), with a 10-minute jump by
    `jump` at 00:30 on each of `days` (at the top: no quiet block saw it)."""
    rec, t = variant.build(fleet, app), 0.0
    while t < until:
        t += 300.0
        up = jump if t // DAY in days and 1800 <= t % DAY < 2400 else 0.0
        rec.add(t, _cycle(t) * (1 + up))
    return rec, t


@pytest.mark.parametrize("spike", [1.0, 2.5])
def test_a_quiet_block_keeps_room_for_two_jumps_at_most_the_windows_rule(spike) -> None:
    """spike 1.0: the rise is small, two jumps over the trough's calm peak stay under
    the window's rule; 2.5: they would not, and the window's rule holds."""
    off = _variant(spike=spike)
    on, window = attrs.evolve(off, season_double=True), attrs.evolve(off, season=0.0)
    without, t = _lived(off, 0.15)
    with_two, _ = _lived(on, 0.15)
    held = _lived(window, 0.15)[0].value(t)
    one, two = without.value(t), with_two.value(t)
    assert one is not None and two is not None and held is not None
    assert one < two <= held
    # The block 12:00-16:00 and the hour after: its calm top is the last sample
    # before 17:00 on the previous days (the same cycle each day). Without the
    # option the clock's limit is that × (1 + rise) × the margin, so with it,
    # that × (1 + rise)² × the margin, unless the window's is less.
    usual = _cycle(17 * HOUR - 300.0)
    assert one < held  # the clock's rule, not the window's, set it
    assert two == pytest.approx(min(held, one ** 2 / (usual * 1.02)), rel=1e-9)
    assert "with the room for two jumps at once)" in with_two.explain(t)
    assert "with the room)" in without.explain(t)


@pytest.mark.parametrize("jump, prior_from", [(0.0, 0.0), (0.15, 0.2)])
def test_an_app_that_never_jumped_by_prior_from_is_unchanged(jump, prior_from) -> None:
    off = _variant(spike=2.5, prior_from=prior_from)
    on = attrs.evolve(off, season_double=True)
    for until in (DAY + 6 * HOUR, 2 * DAY + 12 * HOUR, 3 * DAY + 2 * HOUR):
        without, t = _lived(off, jump, until)
        with_two, _ = _lived(on, jump, until)
        assert with_two.value(t) == without.value(t)
        assert with_two.explain(t) == without.explain(t)


def test_an_app_that_double_gave_two_jumps_keeps_the_clocks_formula() -> None:
    """`double` made its rise room for two already: squared again, four."""
    off = _variant(prior=0.75, prior_from=0.1, double=1.0, double_after=2)
    apps = []
    for variant in (off, attrs.evolve(off, season_double=True)):
        fleet = FleetJumps()
        apps.append([_lived(variant, 0.3, days=(1, 2), fleet=fleet, app=f"/a{i}")
                     for i in range(PRIOR_APPS + 1)])
    t = apps[0][0][1]
    for (without, _), (with_two, _) in zip(*apps):
        assert "doubled for two jumps at once" in with_two.explain(t)
        assert "with the room)" in with_two.explain(t)
        assert with_two.value(t) == without.value(t)


def _window(variant: MemoryVariant) -> MemoryVariant:
    return attrs.evolve(variant, season=0.0, season_double=False)


@st.composite
def days_with_jumps(draw) -> list[tuple[float, float]]:
    """(seconds since the last sample, MiB): a day's profile by the hour repeated
    every 5 minutes for 1.5-4 days, with 10-60-minute jumps of 6-100% that may
    overlap (their factors multiply). `usage` (whatever moves, seldom a day of
    clock times seen) rarely reaches the clock's rule; this does."""
    profile = draw(st.lists(st.floats(1, 4096), min_size=24, max_size=24))
    end = draw(st.floats(1.5 * DAY, 4 * DAY))
    jumps = draw(st.lists(st.tuples(st.floats(0, end), st.floats(0.06, 1.0),
                                    st.integers(2, 12)), max_size=10))
    out, t = [], 0.0
    while t < end:
        t += 300.0
        mib = profile[int(t % DAY // HOUR)]
        for at, size, steps in jumps:
            if at <= t < at + steps * 300.0:
                mib *= 1 + size
        out.append((300.0, mib))
    return out


@settings(max_examples=100, deadline=None)
@given(st.one_of(usage, days_with_jumps()), st.floats(0, 0.5),
       st.sampled_from([HOUR, 4 * HOUR, 12 * HOUR]), st.sampled_from([0.0, 0.1]),
       st.booleans(), st.booleans())
def test_the_option_only_raises_and_never_over_the_windows_rule(
        samples, margin, block, prior_from, drift, prior) -> None:
    more = {"prior": 0.75} if prior else {"spike": 2.5}
    off = _variant(margin, block, DAY if drift else 0.0, prior_from=prior_from, **more)
    on, _ = _fed(attrs.evolve(off, season_double=True), samples)
    without, _ = _fed(off, samples)
    window, _ = _fed(_window(off), samples)
    assert on is not None and without is not None and window is not None
    assert without <= on <= window * (1 + 1e-12)


@settings(max_examples=20, deadline=None)
@given(st.lists(days_with_jumps(), min_size=6, max_size=7), st.floats(0, 0.05))
def test_in_a_fleet_the_default_with_the_option_lies_between_it_and_the_window(
        apps, double) -> None:
    """The default variant (fleet prior, first-jump room, two jumps at once from a
    budget) over a fleet of generated apps, every app's limit."""
    default = attrs.evolve(DEFAULT_MEMORY_VARIANTS[0], double=double)
    values = [_fleet_values(v, apps) for v in
              (default, attrs.evolve(default, season_double=True), _window(default))]
    for without, on, window in zip(*values):
        assert without is not None and on is not None and window is not None
        assert without <= on <= window * (1 + 1e-12)


def _fleet_values(variant: MemoryVariant, apps: list[list[tuple[float, float]]]):
    """Every app's limit at the end, the apps fed in step (sample k of each in turn)
    into one fleet, each app's clock its own sum of gaps."""
    fleet = FleetJumps()
    recs = [variant.build(fleet, f"/a{i}") for i in range(len(apps))]
    clocks = [0.0] * len(apps)
    for k in range(max(map(len, apps))):
        for i, samples in enumerate(apps):
            if k < len(samples):
                clocks[i] += samples[k][0]
                recs[i].add(clocks[i], samples[k][1] * MIB)
    now = max(clocks)
    return [rec.value(now) for rec in recs]


@pytest.mark.parametrize("days, after, doubled", [
    ((1,), 2, False), ((1, 2), 2, True), ((1, 2), 3, False), ((1, 2), 1, True)])
def test_with_season_double_after_only_an_app_that_jumped_that_often_gets_two(
        days, after, doubled) -> None:
    """`season_double_after` k: fewer than k jumps in the window, the clock's room is
    for one jump (as without the option); k or more, for two (as with k = 1)."""
    off = _variant(spike=1.0)
    on = attrs.evolve(off, season_double=True)
    narrow, t = _lived(attrs.evolve(on, season_double_after=after), 0.15, days=days)
    without, with_two = _lived(off, 0.15, days=days)[0], _lived(on, 0.15, days=days)[0]
    one, two = without.value(t), with_two.value(t)
    assert one is not None and two is not None and one < two
    assert narrow.value(t) == (two if doubled else one)
    shown = f"room for two jumps at once (at least {after} jumps in the window))"
    assert (shown in narrow.explain(t)) == (doubled and after > 1)
    assert ("with the room)" in narrow.explain(t)) == (not doubled)


def test_season_double_after_is_at_least_one() -> None:
    with pytest.raises(ValueError):
        attrs.evolve(_variant(spike=1.0), season_double_after=0)


@settings(max_examples=100, deadline=None)
@given(st.one_of(usage, days_with_jumps()), st.floats(0, 0.5),
       st.sampled_from([HOUR, 4 * HOUR, 12 * HOUR]), st.sampled_from([0.0, 0.1]),
       st.booleans(), st.integers(2, 8))
def test_a_bound_on_jumps_lies_between_no_option_and_the_option_for_all(
        samples, margin, block, prior_from, prior, after) -> None:
    more = {"prior": 0.75} if prior else {"spike": 2.5}
    off = _variant(margin, block, prior_from=prior_from, **more)
    on = attrs.evolve(off, season_double=True)
    without, _ = _fed(off, samples)
    narrow, _ = _fed(attrs.evolve(on, season_double_after=after), samples)
    every, _ = _fed(on, samples)
    assert without is not None and narrow is not None and every is not None
    assert without <= narrow <= every
