"""Horizontal sizing (frameworks/autopilot/horizontal.py and its use in the
autopilot core): instances for a target CPU utilization, clamped to the app's
min/max, up at once, down only after the stabilization window, no change within
the tolerance band or on too few samples."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.effects import ArmTimer, TimerFired
from frameworks.autopilot import (
    AUTO, MIB, RECOMMEND, AppConfigured, ApplyInstances, ApplyLimits, Autopilot,
    AutopilotSpec, Config, Evaluate, HorizontalConfig, HorizontalSizer, HorizontalSpec,
    InstancesAdvice, Limits, Recommended, UsageSampled)

SPEC = HorizontalSpec(target=0.5, min=1, max=10)
CONFIG = HorizontalConfig(window=60, fresh=15, stabilization=300, min_samples=3, interval=0)


class Feed:
    """A sizer fed `tasks` tasks' usage every 10 s, stepped every minute."""

    def __init__(self, config: HorizontalConfig = CONFIG, spec: HorizontalSpec = SPEC) -> None:
        self.sizer, self.spec, self.now = HorizontalSizer(config), spec, 0.0

    def minute(self, tasks: int, load: float, limit: float = 1.0) -> int:
        """A minute of the app's total `load` cores spread over `tasks` tasks; the
        desired instances at its end."""
        for _ in range(6):
            self.now += 10
            for i in range(tasks):
                self.sizer.observe(f"t{i}", self.now, load / tasks)
        return self.sizer.step(self.now, tasks, limit, self.spec).instances


def test_load_doubling_scales_up_at_once() -> None:
    feed = Feed()
    assert feed.minute(2, 1.0) == 2  # 2 tasks at 50% of 1 core: on target
    advice = feed.sizer.step(feed.now, 2, 1.0, SPEC)
    assert advice.ready and "2 wanted" in advice.explain
    assert feed.minute(2, 2.0) == 4  # 2 cores at 0.5 per task: 4, in the next step


def test_load_halving_scales_down_only_after_the_stabilization_window() -> None:
    feed = Feed()
    for _ in range(6):
        assert feed.minute(4, 2.0) == 4
    answers = [feed.minute(4, 1.0) for _ in range(6)]
    # The high recommendations (4) leave the 300 s window only after five minutes.
    assert answers == [4, 4, 4, 4, 2, 2]
    advice = feed.sizer.step(feed.now, 4, 1.0, SPEC)
    assert "down to the highest in 300s, 2" in advice.explain


def test_no_scale_down_before_a_full_window_of_evidence() -> None:
    feed = Feed()
    answers = [feed.minute(4, 0.5) for _ in range(5)]
    assert answers == [4, 4, 4, 4, 4]  # 1 wanted from the first step on
    assert "fewer only after 300s of evidence" in feed.sizer.step(
        feed.now, 4, 1.0, SPEC).explain
    assert feed.minute(4, 0.5) == 2  # then at most halved per change


def test_within_the_tolerance_band_nothing_changes() -> None:
    feed = Feed()
    for _ in range(10):
        assert feed.minute(4, 2.15) == 4  # 54% against 50%: within 10%
        assert feed.minute(4, 1.85) == 4  # 46%


def test_the_answer_is_clamped_to_min_and_max_even_without_evidence() -> None:
    spec = HorizontalSpec(target=0.5, min=2, max=5)
    feed = Feed(spec=spec)
    assert feed.sizer.step(0, 1, 1.0, spec).instances == 2  # below the min, no samples
    assert feed.sizer.step(0, 8, 1.0, spec).instances == 5
    assert feed.minute(3, 30.0) == 5  # 60 wanted, at most 5
    for _ in range(10):
        last = feed.minute(3, 0.0)
    assert last == 2


def test_steps_are_bounded() -> None:
    feed = Feed(spec=HorizontalSpec(target=0.5, min=1, max=100))
    assert feed.minute(2, 20.0) == 4  # 40 wanted: at most double
    advice = feed.sizer.step(feed.now, 2, 1.0, feed.spec)
    assert "bounded to 4" in advice.explain


def test_too_few_samples_change_nothing() -> None:
    sizer = HorizontalSizer(CONFIG)
    sizer.observe("t0", 10, 5.0)
    sizer.observe("t1", 10, 5.0)
    advice = sizer.step(10, 2, 1.0, SPEC)
    assert (advice.instances, advice.ready) == (2, False)
    assert "2 of 3 samples" in advice.explain
    # Samples older than the window do not count.
    sizer.observe("t0", 11, 5.0)
    assert not sizer.step(200, 2, 1.0, SPEC).ready


def test_unseen_tasks_never_cause_a_change() -> None:
    feed = Feed()
    # 4 instances, only 2 sampled (the other 2 not started): idle when scaling up...
    assert feed.minute(2, 1.0) == 2
    sizer = feed.sizer
    assert sizer.step(feed.now, 4, 1.0, SPEC).instances == 4  # busy when scaling down
    # ... and the 2 seen at 100% of a core ask for 4: counted as idle, no more.
    assert feed.minute(2, 2.0) == 4
    assert sizer.step(feed.now, 4, 1.0, SPEC).instances == 4


def test_a_replaced_task_stops_counting_after_fresh() -> None:
    sizer = HorizontalSizer(CONFIG)
    for at in range(10, 70, 10):
        sizer.observe("old", at, 0.5)
    for at in range(70, 130, 10):
        sizer.observe("new", at, 0.5)
    advice = sizer.step(130, 1, 1.0, SPEC)
    assert advice.instances == 1 and "over 1 live task" in advice.explain


# -- in the autopilot core ------------------------------------------------------------

PILOT = Config(step=60, warmup=3600, min_samples=30, min_interval=0,
               horizontal=HorizontalConfig(window=60, fresh=15, stabilization=300,
                                           min_samples=3, interval=120))
APP = AutopilotSpec(AUTO, horizontal=SPEC)
LIMITS = Limits(1.0, 512 * MIB)


class Shell:
    """What the service framework does with the pilot's effects: arms its timer and
    applies every `ApplyInstances` at once, telling the pilot the new count."""

    def __init__(self, spec: AutopilotSpec, instances: int, config: Config) -> None:
        self.pilot, self.spec, self.instances = Autopilot(config), spec, instances
        self.out: list[tuple[float, object]] = []
        self.due: float | None = None
        self.perform(self.configured(0.0), 0.0)

    def configured(self, now: float) -> list[object]:
        return self.pilot.handle(AppConfigured("/a", self.spec, LIMITS, self.instances), now)

    def perform(self, effects: list[object], now: float) -> None:
        for effect in effects:
            self.out.append((now, effect))
            if isinstance(effect, ArmTimer):
                self.due = effect.at
            elif isinstance(effect, ApplyInstances):
                self.instances = effect.instances
                self.perform(self.configured(now), now)

    def advance(self, now: float) -> None:
        if self.due is not None and self.due <= now:
            at, self.due = self.due, None
            self.perform(self.pilot.handle(TimerFired(Evaluate("/a")), at), at)


def drive(spec: AutopilotSpec, minutes: list[float], instances: int = 2,
          config: Config = PILOT) -> list[tuple[float, object]]:
    """Every minute the app's total load, spread over its tasks sampled every 10 s;
    every effect with its time."""
    shell, now = Shell(spec, instances, config), 0.0
    for load in minutes:
        for _ in range(6):
            now += 10
            tasks = shell.instances
            for i in range(tasks):
                shell.pilot.handle(UsageSampled("/a", now, load / tasks, 100 * MIB,
                                                task_id=f"t{i}"), now)
            shell.advance(now)
    return shell.out


def scales(effects: list[tuple[float, object]]) -> list[tuple[float, int]]:
    return [(at, e.instances) for at, e in effects if isinstance(e, ApplyInstances)]


def test_auto_scales_the_app_and_the_recommendation_says_why() -> None:
    effects = drive(APP, [1.0] * 3 + [4.0] * 6 + [1.0] * 12)
    # Up at once (doubling at most, then the 120 s interval); the load drops at
    # 540 s and the last high recommendation (at 540) leaves the 300 s window at 840.
    assert scales(effects) == [(240, 4), (360, 8), (840, 4), (960, 2)]
    last = [e.recommendation for _, e in effects if isinstance(e, Recommended)][-1]
    assert last.instances is not None and last.instances.instances == 2
    # Vertical sizing waits for its own warmup meanwhile: no limits changed.
    assert not any(isinstance(e, ApplyLimits) for _, e in effects)


def test_recommend_mode_and_apps_without_horizontal_do_not_scale() -> None:
    effects = drive(AutopilotSpec(RECOMMEND, horizontal=SPEC), [4.0] * 6)
    assert scales(effects) == []
    recs = [e.recommendation for _, e in effects if isinstance(e, Recommended)]
    advice = recs[-1].instances
    assert advice is not None and advice.instances == 4 and "8 wanted" in advice.explain
    effects = drive(AutopilotSpec(AUTO), [4.0] * 6)
    assert scales(effects) == [] and all(
        e.recommendation.instances is None for _, e in effects if isinstance(e, Recommended))


loads = st.lists(st.floats(0, 20), min_size=1, max_size=30)
specs = st.builds(lambda lo, span, t: HorizontalSpec(t, lo, lo + span),
                  st.integers(1, 5), st.integers(0, 10), st.floats(0.05, 1.0))


@settings(max_examples=60, deadline=None)
@given(loads, specs, st.integers(1, 12))
def test_any_usage_stays_within_bounds_and_never_scales_down_before_the_window(
        minutes, spec, start) -> None:
    effects = drive(AutopilotSpec(AUTO, horizontal=spec), minutes, instances=start)
    window, interval = PILOT.horizontal.stabilization, PILOT.horizontal.interval
    current, ready_at, last = start, None, None
    last_up = float("-inf")
    for at, effect in effects:
        if isinstance(effect, Recommended) and effect.recommendation.instances is not None:
            advice = effect.recommendation.instances
            assert spec.min <= advice.instances <= spec.max
            if advice.ready and ready_at is None:
                ready_at = at
        if not isinstance(effect, ApplyInstances):
            continue
        assert spec.min <= effect.instances <= spec.max
        assert last is None or at - last >= interval
        if effect.instances < current and spec.min <= current <= spec.max:
            # A scale-down needs a full window of evidence, none of it asking for more.
            assert ready_at is not None and at - ready_at >= window
            assert at - last_up >= window
        elif effect.instances > current:
            last_up = at
        current, last = effect.instances, at


@settings(max_examples=30, deadline=None)
@given(loads, specs)
def test_the_same_events_give_the_same_effects(minutes, spec) -> None:
    app = AutopilotSpec(AUTO, horizontal=spec)
    assert drive(app, minutes) == drive(app, minutes)


def test_an_edited_horizontal_block_restarts_the_stabilization() -> None:
    pilot, now = Autopilot(PILOT), 0.0

    def minute() -> None:  # 4 tasks at 0.25 cores each, then a step
        nonlocal now
        for _ in range(6):
            now += 10
            for i in range(4):
                pilot.handle(UsageSampled("/a", now, 0.25, 100 * MIB, task_id=f"t{i}"), now)
        pilot.handle(TimerFired(Evaluate("/a")), now)

    def advice() -> InstancesAdvice:
        rec = pilot.recommendation("/a")
        assert rec is not None and rec.instances is not None
        return rec.instances

    pilot.handle(AppConfigured("/a", AutopilotSpec(RECOMMEND, horizontal=SPEC), LIMITS, 4), 0)
    for _ in range(6):
        minute()
    assert advice().instances == 2  # 1 core at 50%: 2, after the window
    edited = AutopilotSpec(RECOMMEND, horizontal=HorizontalSpec(target=0.4, min=1, max=10))
    pilot.handle(AppConfigured("/a", edited, LIMITS, 4), now)
    minute()
    assert advice().instances == 4 and "fewer only after 300s" in advice().explain
    for _ in range(5):
        minute()
    assert advice().instances == 3  # 1 core at 40%: 3


def test_with_horizontal_sizing_auto_sizes_memory_and_holds_cpu() -> None:
    config = attrs.evolve(PILOT, warmup=120, min_samples=5)
    effects = drive(APP, [1.0] * 10, config=config)
    limits = [e.limits for _, e in effects if isinstance(e, ApplyLimits)]
    assert limits and all(lim.cpus == LIMITS.cpus for lim in limits)
    assert limits[0].mem_bytes < LIMITS.mem_bytes  # 100 MiB used of 512
    rec = [e.recommendation for _, e in effects if isinstance(e, Recommended)][-1]
    assert any("cpus not applied" in reason for reason in rec.reasons)
