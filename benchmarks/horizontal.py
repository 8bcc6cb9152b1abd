"""Horizontal sizing over a simulated week: how closely the instance count follows
an app's load, and whether its damping keeps the count from flapping.

    python -m benchmarks.horizontal [--quick] [--apps 20] [--days 7] [--seed 1]

A seeded set of apps, each a service whose load (cores of work) follows a daily
cycle (±30-80%), with 0.5-2 bursts a day (x1.3-2 for 5-30 minutes) and noise
(5% a sample). The load spreads evenly over the app's running tasks; a task uses
its share up to its CPU limit (the rest is throttled: demand not served). A task
sampled every `SAMPLE` seconds reports what it used; a new task runs `STARTUP`
seconds after it is asked for; a task scaled away stops at once. Every app is
`"autopilot": {"mode": "auto", "horizontal": {"target": 0.6, ...}}` under one
`Autopilot` core, as the service framework drives it (an `ApplyInstances` is a
scale; the app's new count goes back as `AppConfigured`). Approaches, each over
the same week after a warm-in day:

- **fixed**: the count an operator would set, enough for the app's usual daily
  top (no burst) at the target, never changed;
- **default**: `dyad-service`'s defaults (a step every 5 minutes, a 5-minute
  window, the 10% band, 5 minutes' stabilization before a scale-down, at most
  2x a change);
- **default, 1-min step**: the same rule stepped every minute
  (`--autopilot-step 1min`);
- **undamped**: every minute, a 1-minute window, no band, no stabilization, no
  bound on the step: what the damping is measured against.

Printed per approach, over the scored week: instance-hours against the ideal
(each instant's ceil(load / (target x limit)), within the bounds), the mean
utilization of running tasks' limits, the share of demand throttled, and count
changes and reversals (a change against the direction of the one before,
within 30 minutes: flapping, or a burst followed up and then down) per app per
day. Deterministic: the same seed,
the same figures.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import attrs

from dyad.effects import ArmTimer, TimerFired
from frameworks.autopilot import (
    AUTO, MIB, AppConfigured, ApplyInstances, ApplyLimits, Autopilot, AutopilotSpec, Config,
    Evaluate, HorizontalConfig, HorizontalSpec, Limits, UsageSampled)

DAY = 86_400.0
SAMPLE = 30.0  # seconds between a task's usage samples
STARTUP = 30.0  # seconds from a scale-up to the new task running
WARM_IN = DAY
TARGET = 0.6
REVERSAL = 1800.0  # a change against the one before, within this long, is a reversal
MEM = 128 * MIB  # each task's memory use, constant: this benchmark is about CPU

APPROACHES: dict[str, Config | None] = {
    "fixed": None,
    "default": Config(),
    "default, 1-min step": Config(step=60.0),
    "undamped": Config(step=60.0, horizontal=HorizontalConfig(
        window=60.0, stabilization=0.0, tolerance=0.0, min_samples=1, max_factor=1e6,
        interval=0.0)),
}


@attrs.frozen
class Burst:
    start: float
    length: float
    factor: float


@attrs.frozen
class App:
    name: str
    base: float  # cores of work at the cycle's mean
    amp: float  # the daily cycle's relative amplitude
    phase: float
    bursts: tuple[Burst, ...]
    cpus: float  # each task's CPU limit
    spec: HorizontalSpec

    def load(self, t: float, rng: random.Random) -> float:
        cycle = 1.0 + self.amp * math.sin(2 * math.pi * t / DAY + self.phase)
        burst = max((b.factor for b in self.bursts if b.start <= t < b.start + b.length),
                    default=1.0)
        return self.base * cycle * burst * rng.lognormvariate(0.0, 0.05)

    def ideal(self, load: float) -> int:
        return min(max(math.ceil(load / (self.spec.target * self.cpus) - 1e-9),
                       self.spec.min), self.spec.max)


def apps(count: int, days: float, seed: int, warm_in: float = WARM_IN) -> list[App]:
    rng = random.Random(seed)
    made = []
    for i in range(count):
        base = math.exp(rng.uniform(math.log(0.5), math.log(20.0)))
        amp = rng.uniform(0.3, 0.8)
        cpus = rng.choice((0.5, 1.0, 2.0))
        bursts = []
        t = 0.0
        while True:
            t += rng.expovariate(rng.uniform(0.5, 2.0) / DAY)
            if t >= warm_in + days * DAY:
                break
            bursts.append(Burst(t, rng.uniform(300.0, 1800.0), rng.uniform(1.3, 2.0)))
        top = base * (1 + amp)
        spec = HorizontalSpec(target=TARGET, min=1,
                              max=math.ceil(3 * top / (TARGET * cpus)))
        made.append(App(f"/app{i}", base, amp, rng.uniform(0, 2 * math.pi), tuple(bursts),
                        cpus, spec))
    return made


@attrs.define
class Score:
    instance_seconds: float = 0.0
    ideal_seconds: float = 0.0
    served: float = 0.0
    capacity: float = 0.0
    demand: float = 0.0
    throttled: float = 0.0
    changes: int = 0
    reversals: int = 0


@attrs.define
class _Fleet:
    """One app's running tasks and the count asked for."""

    app: App
    asked: int
    running: list[str]
    limits: Limits
    starting: list[tuple[float, str]] = attrs.field(factory=list)
    made: int = 0
    due: float = math.inf
    last_change: tuple[float, int] = (-math.inf, 0)  # (when, direction)

    def new_task(self) -> str:
        self.made += 1
        return f"{self.app.name}.{self.made}"


def replay(models: Sequence[App], days: float, config: Config | None, seed: int,
           warm_in: float = WARM_IN) -> Score:
    """Live through `warm_in` seconds and `days` scored days with one approach."""
    score = Score()
    pilot = None if config is None else Autopilot(config)
    fleets = {}
    for app in models:
        fixed = app.ideal(app.base * (1 + app.amp))
        fleet = fleets[app.name] = _Fleet(app, fixed, [], Limits(app.cpus, 2 * MEM))
        fleet.running = [fleet.new_task() for _ in range(fixed)]
    noise = {app.name: random.Random(f"{seed}{app.name}") for app in models}

    def spec(app: App) -> AutopilotSpec:
        return AutopilotSpec(AUTO, horizontal=app.spec)

    def perform(effects: list[Any], t: float) -> None:
        assert pilot is not None
        for effect in effects:
            if isinstance(effect, ArmTimer):
                fleets[effect.key.app_id].due = effect.at
            elif isinstance(effect, ApplyLimits):  # memory only, with a horizontal spec
                fleet = fleets[effect.app_id]
                fleet.limits = effect.limits
                configured(fleet, t)
            elif isinstance(effect, ApplyInstances):
                scale(fleets[effect.app_id], effect.instances, t)

    def scale(fleet: _Fleet, instances: int, t: float) -> None:
        assert pilot is not None
        direction = 1 if instances > fleet.asked else -1
        if t > warm_in:
            score.changes += 1
            when, before = fleet.last_change
            score.reversals += before == -direction and t - when <= REVERSAL
        fleet.last_change = (t, direction)
        while len(fleet.running) + len(fleet.starting) < instances:
            fleet.starting.append((t + STARTUP, fleet.new_task()))
        while len(fleet.running) + len(fleet.starting) > instances:
            if fleet.starting:
                fleet.starting.pop()
            else:
                fleet.running.pop()
        fleet.asked = instances
        configured(fleet, t)

    def configured(fleet: _Fleet, t: float) -> None:
        """Tell the autopilot the app's definition now, as the service framework does."""
        assert pilot is not None
        perform(pilot.handle(AppConfigured(fleet.app.name, spec(fleet.app), fleet.limits,
                                           fleet.asked), t), t)

    if pilot is not None:
        for fleet in fleets.values():
            configured(fleet, 0.0)
    for i in range(1, int((warm_in + days * DAY) / SAMPLE) + 1):
        t = i * SAMPLE
        scored = t > warm_in
        for fleet in fleets.values():
            app = fleet.app
            while fleet.starting and fleet.starting[0][0] <= t:
                fleet.running.append(fleet.starting.pop(0)[1])
            load = app.load(t, noise[app.name])
            share = load / len(fleet.running) if fleet.running else 0.0
            used = min(share, app.cpus)
            if scored:
                score.instance_seconds += len(fleet.running) * SAMPLE
                score.ideal_seconds += app.ideal(load) * SAMPLE
                score.served += used * len(fleet.running)
                score.capacity += app.cpus * len(fleet.running)
                score.demand += load
                score.throttled += max(0.0, load - used * len(fleet.running))
            if pilot is None:
                continue
            held = SAMPLE * (1 - used / share) if share > used else 0.0
            for task_id in fleet.running:
                pilot.handle(UsageSampled(app.name, t, used, MEM, task_id=task_id,
                                          cpus_throttled_secs=held), t)
            if t >= fleet.due:
                fleet.due = math.inf
                perform(pilot.handle(TimerFired(Evaluate(app.name)), t), t)
    return score


def report(name: str, score: Score, apps_count: int, days: float) -> str:
    per_day = apps_count * days
    return (f"{name:<22} {score.instance_seconds / score.ideal_seconds:9.2f}x "
            f"{score.served / score.capacity:11.1%} {score.throttled / score.demand:10.2%} "
            f"{score.changes / per_day:9.1f} {score.reversals / per_day:11.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=20)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="5 apps over 1 day")
    args = parser.parse_args(argv)
    if args.quick:
        args.apps, args.days = 5, 1.0
    models = apps(args.apps, args.days, args.seed)
    print(f"{args.apps} apps over {args.days:g} days after a warm-in day, seed {args.seed}; "
          f"target {TARGET:.0%} of each task's CPU limit, a sample every {SAMPLE:g}s, "
          f"new tasks run {STARTUP:g}s after a scale-up")
    print(f"{'approach':<22} {'inst-hours':>10} {'utilization':>11} {'throttled':>10} "
          f"{'changes/d':>9} {'reversals/d':>11}   (instance-hours x ideal; per app a day)")
    for name, config in APPROACHES.items():
        started = time.process_time()
        score = replay(models, args.days, config, args.seed)
        print(report(name, score, args.apps, args.days)
              + f"   ({time.process_time() - started:.0f} CPU s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
