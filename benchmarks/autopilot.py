"""Autopilot over a synthetic fleet: slack and OOM kills of hand-set limits against
the pure recommender's, over a simulated week (issue 14, done-when 4).

    python -m benchmarks.autopilot [--quick] [--apps 200] [--days 7] [--seed 1] [--json]

A seeded fleet of apps (`fleet`), each one task with a usage pattern for cores and
memory: steady, daily cycles, spikes, slow growth, memory leaks. Each app's user
set its limits the way people do (`user_limits`): from the app's usual peak times
a factor that is mostly generous (log-normal, median 2x) and sometimes short
(0.75-1x), rounded to numbers people type. Every approach then lives through the
same week, sample by sample (one every `STEP` seconds: what the task wants at
that instant; a spike lasts at least `STEP`, so every spike is sampled, and memory
kills are judged at the same instants the policy sees):

- **user**: the hand-set limits, never changed;
- **each variant** of `DEFAULT_CPU_VARIANTS` alone, with the variants of
  `DEFAULT_MEMORY_VARIANTS`, then `SPIKE`, `LEARNED` and `PEAK_ONLY` (earlier
  memory rules, not defaults now) in turn, through the full policy
  (`Autopilot` in `auto`: evidence, bounds, hysteresis, the OOM raise);
- **meta+mem-fleet-7d, meta+mem-double-7d, meta+mem-first-7d,
  meta+mem-clock1-7d, meta+mem-clock2-7d, meta+mem-clock2s-7d,
  meta+mem-clock2x3-7d, meta+mem-clock2x6-7d, meta+mem-sizedprior-7d**: the
  meta-recommender's CPU variants with `FLEET`, `DOUBLE`, `FIRST`, `CLOCK1` (the
  default of sessions 29-34), `CLOCK2`, `CLOCK2S` (the default of session 35),
  `CLOCK2_3`, `CLOCK2_6` and `SIZED_PRIOR` as the memory rule (not defaults);
- **meta**: the policy with every variant, the meta-recommender choosing per app.

Each starts from the user's limits. Rules of the simulated world, the same for all:
memory over the limit is an OOM kill (the task restarts and a leak starts over;
the policy hears `TaskOomKilled`); CPU over the limit is throttled, and the policy
sees what the task got (measured CPU is capped by the limit) and for how much of
the step it was held (the cgroup's throttled time, as an agent reports it); an applied
change of limits is a rolling upgrade, so it restarts the task too.

Scores over the whole week (warmup included): memory and CPU slack (idle share of
the limits: sum(limit - used) / sum(limit) over all samples), OOM-affected apps
(at least one kill) and kills, the share of CPU demand throttled, and limit
changes. Goal (issue 14, after Autopilot, EuroSys'20): memory slack at most 20%,
and OOM-affected apps at most a tenth of the user-limit baseline. Beside it, read
from the generator (foresight, used by no rule): the spiky apps' slack with a
constant limit at their week's peak (`foresight`), and the first spikes in the
scored week that a rule keeping no room for apps yet to jump cannot avoid
(`first_spikes`): a seed's OOM figure is hard where that is over the allowance.
Deterministic: the same seed gives the same figures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from dyad.effects import ArmTimer, TimerFired
from frameworks.autopilot import (
    AUTO, DEFAULT_CPU_VARIANTS, DEFAULT_MEMORY_VARIANTS, FLAT_FIRST_ROOM_VARIANTS, MIB,
    AppConfigured, ApplyLimits, Autopilot, AutopilotSpec, Config, Evaluate, Limits,
    MemoryVariant, TaskOomKilled, UsageSampled)

DAY = 86_400.0
STEP = 300.0  # seconds between samples (and the policy's evaluation step)
WARM_IN = DAY  # lived before the scored week: the history a 24 h usage store holds
KINDS = ("steady", "daily", "spiky", "growth", "leak")
MIX = (0.30, 0.30, 0.15, 0.15, 0.10)  # shares of the fleet, in KINDS order
NICE_CPUS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
NICE_MEM_MIB = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                12288, 16384)
GOAL_SLACK = 0.20
GOAL_OOM_RATIO = 0.10


# -- the fleet --------------------------------------------------------------------------

@attrs.frozen
class Spike:
    at: float
    length: float
    cpu_factor: float
    mem_factor: float


@attrs.frozen
class AppModel:
    """One app's demand: base levels, a daily cycle, growth, a leak, spikes."""

    name: str
    kind: str
    cpu_base: float  # cores
    mem_base: float  # bytes
    cpu_amp: float  # daily cycle, fraction of base
    mem_amp: float
    phase: float  # seconds into the day of the cycle's top
    growth: float  # fraction of base per day, both resources
    leak: float  # bytes per second since the task started
    noise: float  # relative, per sample
    spikes: tuple[Spike, ...]
    user: Limits


def _draw(rng: random.Random) -> str:
    x, total = rng.random(), 0.0
    for kind, share in zip(KINDS, MIX):
        total += share
        if x < total:
            return kind
    return KINDS[-1]


def fleet(apps: int, days: float, seed: int) -> list[AppModel]:
    """`apps` apps with kinds in `MIX` proportions, deterministic for a seed; their
    patterns cover the warm-in day and `days` more."""
    rng = random.Random(seed)
    horizon = WARM_IN + days * DAY
    out = []
    for i in range(apps):
        kind = _draw(rng)
        cpu_base = math.exp(rng.uniform(math.log(0.02), math.log(2.0)))
        mem_base = math.exp(rng.uniform(math.log(40 * MIB), math.log(3000 * MIB)))
        cpu_amp = rng.uniform(0.3, 0.7) if kind in ("daily", "spiky", "growth") else 0.05
        mem_amp = rng.uniform(0.05, 0.2) if kind in ("daily", "spiky", "growth") else 0.01
        growth = rng.uniform(0.02, 0.10) if kind == "growth" else 0.0
        # A leak doubles the task's memory in 1-4 days if nothing restarts it.
        leak = mem_base / (rng.uniform(1.0, 4.0) * DAY) if kind == "leak" else 0.0
        spikes: list[Spike] = []
        if kind == "spiky":
            at = rng.expovariate(rng.uniform(0.5, 3.0) / DAY)
            while at < horizon:
                spikes.append(Spike(at, rng.uniform(300, 1800), rng.uniform(1.5, 4.0),
                                    rng.uniform(1.1, 1.5)))
                at += rng.expovariate(rng.uniform(0.5, 3.0) / DAY)
        model = AppModel(f"/app{i:04d}", kind, cpu_base, mem_base, cpu_amp, mem_amp,
                         rng.uniform(0, DAY), growth, leak, rng.uniform(0.02, 0.1),
                         tuple(spikes), Limits(0.0, 0))
        out.append(attrs.evolve(model, user=user_limits(model, rng)))
    return out


def user_limits(app: AppModel, rng: random.Random) -> Limits:
    """What a person would ask for: the app's usual peak (its daily top, no spike,
    no growth or leak yet) times a factor, rounded to a number people type. Mostly
    generous (log-normal, median 2x, at least 1.1x); one app in seven short."""
    short = rng.random() < 1 / 7
    factors = []
    for _ in range(2):
        factors.append(rng.uniform(0.75, 1.0) if short else
                       min(8.0, max(1.1, rng.lognormvariate(math.log(2.0), 0.4))))
    cpus = _nice(app.cpu_base * (1 + app.cpu_amp) * factors[0], NICE_CPUS, up=not short)
    mem_mib = _nice(app.mem_base * (1 + app.mem_amp) * factors[1] / MIB, NICE_MEM_MIB,
                    up=not short)
    return Limits(cpus, int(mem_mib * MIB))


def _nice(value: float, steps: Sequence[float], up: bool) -> float:
    """The next round number up (generous users) or the nearest (short ones)."""
    if up:
        return next((s for s in steps if s >= value), steps[-1])
    return min(steps, key=lambda s: abs(math.log(s / value)))


def demand(app: AppModel, t: float, started: float, rng: random.Random) -> tuple[float, float]:
    """Cores and bytes the task wants at `t` (it started at `started`)."""
    cycle = math.cos(2 * math.pi * (t - app.phase) / DAY)
    grown = 1 + app.growth * t / DAY
    cpu = app.cpu_base * grown * (1 + app.cpu_amp * cycle)
    mem = app.mem_base * grown * (1 + app.mem_amp * cycle) + app.leak * (t - started)
    for spike in app.spikes:
        if spike.at <= t < spike.at + spike.length:
            cpu, mem = cpu * spike.cpu_factor, mem * spike.mem_factor
    cpu *= 1 + rng.uniform(-app.noise, app.noise)
    mem *= 1 + rng.uniform(-app.noise, app.noise) / 4  # memory is steadier than CPU
    return max(cpu, 0.0), max(mem, 0.0)


# -- scoring ----------------------------------------------------------------------------

@attrs.define
class Score:
    """One approach over the fleet; sums over all apps' samples."""

    mem_limit: float = 0.0
    mem_idle: float = 0.0
    cpu_limit: float = 0.0
    cpu_idle: float = 0.0
    cpu_demand: float = 0.0
    cpu_throttled: float = 0.0
    ooms: int = 0
    oom_apps: int = 0
    changes: int = 0
    apps: int = 0
    warm_in_oom_apps: int = 0  # killed during the warm-in day (not scored)
    oom_kinds: dict[str, int] = attrs.Factory(dict)  # OOM-affected apps per kind
    mem_kinds: dict[str, tuple[float, float]] = attrs.Factory(dict)  # (limit, idle) per kind

    def merge(self, other: Score) -> None:
        """Add another share of the fleet's figures (from another worker)."""
        for field in ("mem_limit", "mem_idle", "cpu_limit", "cpu_idle", "cpu_demand",
                      "cpu_throttled", "ooms", "oom_apps", "changes", "apps",
                      "warm_in_oom_apps"):
            setattr(self, field, getattr(self, field) + getattr(other, field))
        for kind, n in other.oom_kinds.items():
            self.oom_kinds[kind] = self.oom_kinds.get(kind, 0) + n
        for kind, (limit, idle) in other.mem_kinds.items():
            mine = self.mem_kinds.get(kind, (0.0, 0.0))
            self.mem_kinds[kind] = (mine[0] + limit, mine[1] + idle)

    def kind_slack(self, kind: str) -> float:
        limit, idle = self.mem_kinds.get(kind, (0.0, 0.0))
        return idle / limit if limit else 0.0

    @property
    def mem_slack(self) -> float:
        return self.mem_idle / self.mem_limit if self.mem_limit else 0.0

    @property
    def cpu_slack(self) -> float:
        return self.cpu_idle / self.cpu_limit if self.cpu_limit else 0.0

    @property
    def throttled(self) -> float:
        return self.cpu_throttled / self.cpu_demand if self.cpu_demand else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"mem_slack": round(self.mem_slack, 4), "cpu_slack": round(self.cpu_slack, 4),
                "oom_apps": self.oom_apps, "ooms": self.ooms,
                "cpu_throttled": round(self.throttled, 4), "changes": self.changes,
                "apps": self.apps, "warm_in_oom_apps": self.warm_in_oom_apps,
                "oom_apps_by_kind": dict(sorted(self.oom_kinds.items())),
                "mem_slack_by_kind": {k: round(self.kind_slack(k), 4)
                                      for k in sorted(self.mem_kinds)}}


Approach = Callable[[], Config | None]  # None: the user's limits, never changed


class _Task:
    """One app's task living through the replay with one approach: its limits, its
    start (a leak starts over), its kills, its memory figures."""

    def __init__(self, app: AppModel, seed: int) -> None:
        self.app = app
        self.rng = random.Random(f"{seed}:{app.name}")  # every approach, the same week
        self.limits, self.started = app.user, 0.0
        self.run = 0  # a kill or an upgrade restarts the task: a new task id
        self.ooms = self.warm_in_ooms = 0
        self.mem_limit = self.mem_idle = 0.0
        self.due = math.inf  # the autopilot's next evaluation of the app


def replay(app: AppModel, days: float, config: Config | None, score: Score,
           seed: int) -> None:
    """`replay_fleet` for one app."""
    replay_fleet([app], days, config, score, seed)


def replay_fleet(apps: Sequence[AppModel], days: float, config: Config | None,
                 score: Score, seed: int) -> None:
    """Live through the warm-in day and the week with one approach, every app in
    step under one autopilot (as a service framework follows all its apps); add the
    apps' figures over the week to `score`. The demand's noise is seeded per app,
    so every approach sees the same week."""
    tasks = {app.name: _Task(app, seed) for app in apps}
    pilot = None if config is None else Autopilot(config)
    spec = AutopilotSpec(AUTO)

    def perform(effects: list[Any], t: float) -> None:
        for effect in effects:
            if isinstance(effect, ArmTimer):
                tasks[effect.key.app_id].due = effect.at
            elif isinstance(effect, ApplyLimits):
                # A rolling upgrade: the task restarts with the new limits, and the
                # service framework tells the autopilot the app's new definition.
                task = tasks[effect.app_id]
                task.limits, task.started = effect.limits, t
                task.run += 1
                score.changes += t > WARM_IN
                assert pilot is not None
                perform(pilot.handle(AppConfigured(effect.app_id, spec, task.limits), t), t)

    if pilot is not None:
        for task in tasks.values():
            perform(pilot.handle(AppConfigured(task.app.name, spec, task.limits), 0.0), 0.0)
    for i in range(1, int((WARM_IN + days * DAY) / STEP) + 1):
        t = i * STEP
        scored = t > WARM_IN
        for task in tasks.values():
            app, limits = task.app, task.limits
            cpu, mem = demand(app, t, task.started, task.rng)
            got_cpu = min(cpu, limits.cpus)
            if scored:
                score.cpu_limit += limits.cpus
                score.cpu_idle += limits.cpus - got_cpu
                score.cpu_demand += cpu
                score.cpu_throttled += cpu - got_cpu
                task.mem_limit += limits.mem_bytes
            if mem > limits.mem_bytes:
                # Died at its limit: no idle memory in this sample.
                task.ooms += scored
                task.warm_in_ooms += not scored
                task.started = t
                task.run += 1
                if pilot is not None:
                    perform(pilot.handle(TaskOomKilled(app.name, f"{app.name}.{task.run - 1}",
                                                       t, limits.mem_bytes), t), t)
            else:
                task.mem_idle += (limits.mem_bytes - mem) * scored
                if pilot is not None:
                    # Held at its limit for the share of the step it wanted more: the
                    # cgroup's throttled time, as an agent reports it.
                    held = STEP * (1 - got_cpu / cpu) if cpu > got_cpu else 0.0
                    pilot.handle(UsageSampled(app.name, t, got_cpu, mem,
                                              task_id=f"{app.name}.{task.run}",
                                              cpus_throttled_secs=held), t)
            if pilot is not None and t >= task.due:
                task.due = math.inf
                perform(pilot.handle(TimerFired(Evaluate(app.name)), t), t)
    for task in tasks.values():
        score.apps += 1
        score.mem_limit += task.mem_limit
        score.mem_idle += task.mem_idle
        kind = score.mem_kinds.get(task.app.kind, (0.0, 0.0))
        score.mem_kinds[task.app.kind] = (kind[0] + task.mem_limit, kind[1] + task.mem_idle)
        score.ooms += task.ooms
        score.oom_apps += task.ooms > 0
        if task.ooms:
            score.oom_kinds[task.app.kind] = score.oom_kinds.get(task.app.kind, 0) + 1
        score.warm_in_oom_apps += task.warm_in_ooms > 0


SPIKE = MemoryVariant("mem-spike-7d", window=7 * 86400.0, margin=0.05, spike=2.5,
                      jitter=0.05)
"""Not a default (the default before the fleet prior): room for 2.5 x the largest jump
beyond the jitter, one factor for every app, shown alone for comparison."""
PEAK_ONLY = MemoryVariant("mem-peak-24h", window=24 * 3600.0, margin=0.1)
"""Not a default: the memory rule without room for spikes, shown alone for comparison."""
LEARNED = MemoryVariant("mem-learned-7d", window=7 * 86400.0, margin=0.05, spike=2.0,
                        jitter=0.05, learned=True)
"""Not a default: spike room learned per app (the largest jump x (1 + 2/n) for n
jumps in the week), shown alone for comparison (docs/autopilot-journal.md, "Spike
room learned per app")."""


FLEET = MemoryVariant("mem-fleet-7d", window=7 * 86400.0, margin=0.02, jitter=0.05,
                      prior=0.75, prior_from=0.10, drift=86400.0, drift_cap=0.03)
"""Not a default (the default before the clock, session 29): the window's peak, room
from the fleet's jumps, a narrowing margin; the memory rule of `DOUBLE` and `FIRST`."""
DOUBLE = attrs.evolve(FLEET, name="mem-double-7d", double=0.01, double_after=6)
"""Not a default: `FLEET` with room for two jumps at once for the apps with 6
jumps in the window that fit 1% of the fleet's calm peaks, cheapest first."""
FIRST = attrs.evolve(DOUBLE, name="mem-first-7d", first_rate=0.05,
                     first_horizon=12 * 3600.0, first_alike=True)
"""Not a default: `DOUBLE` with room before a first jump while 5% of the apps of a
swing class first jump per 12 h."""

CLOCK1 = attrs.evolve(DEFAULT_MEMORY_VARIANTS[0], name="mem-clock1-7d", season_double=False,
                      season_once=False)
"""Not a default (the default from session 29 to 34): the clock's room for one jump,
and the calm peak's rise counted in its growth and again in its margin."""

CLOCK2 = attrs.evolve(CLOCK1, name="mem-clock2-7d", season_double=True)
"""Not a default: `CLOCK1` with room for two jumps at once in the clock's rule
for an app that has jumped (at most the window's rule); the default is this with
`season_once` (docs/autopilot-journal.md, sessions 32, 33 and 35)."""

CLOCK2S = attrs.evolve(FLAT_FIRST_ROOM_VARIANTS[0], name="mem-clock2s-7d")
"""Not a default (the default of session 35): the room before a first jump while 5%
of the apps like it first jump within a day, whatever the app's size."""

SIZED_PRIOR = attrs.evolve(DEFAULT_MEMORY_VARIANTS[0], name="mem-sizedprior-7d",
                           prior_size=0.5)
"""Not a default: the fleet's room after a jump from a quantile moved by the app's
size too (`prior_size` 0.5: the p92 for an app a tenth of the median, the p50 for
one four times it); less slack, more OOM-affected apps on the unseen seeds
(docs/autopilot-journal.md, session 36)."""

CLOCK2_3 = attrs.evolve(CLOCK2, name="mem-clock2x3-7d", season_double_after=3)
"""Not a default: `CLOCK2`'s clock room for two jumps only for an app with at least
3 jumps in the window (docs/autopilot-journal.md, "Only for apps that jump often")."""

CLOCK2_6 = attrs.evolve(CLOCK2, name="mem-clock2x6-7d", season_double_after=6)
"""Not a default: as `CLOCK2_3` with 6 jumps (the default's `double_after`)."""



def approaches() -> dict[str, Config | None]:
    """The user's limits, each default CPU variant alone with a memory variant (the
    defaults, then `LEARNED` and `PEAK_ONLY`, in turn), and the meta-recommender over
    the defaults."""
    out: dict[str, Config | None] = {"user": None}
    base = Config(step=STEP)
    memory = (*DEFAULT_MEMORY_VARIANTS, SPIKE, LEARNED, PEAK_ONLY)
    for k, cpu in enumerate(DEFAULT_CPU_VARIANTS):
        mem = memory[k % len(memory)]
        out[f"{cpu.name}+{mem.name}"] = attrs.evolve(base, cpu_variants=(cpu,),
                                                     memory_variants=(mem,))
    # The meta-recommender's CPU, another memory rule.
    for mem in (FLEET, DOUBLE, FIRST, CLOCK1, CLOCK2, CLOCK2S, CLOCK2_3, CLOCK2_6, SIZED_PRIOR):
        out[f"meta+{mem.name}"] = attrs.evolve(base, memory_variants=(mem,))
    out["meta"] = base
    return out


def run(apps: int, days: float, seed: int,
        chosen: dict[str, Config | None] | None = None, jobs: int = 1) -> dict[str, Score]:
    """Every approach over the same fleet. `jobs` > 1 replays in that many processes:
    the approaches side by side, and each approach whose apps are independent (no
    memory variant learns from the fleet, `MemoryVariant.prior`) split by app, which
    gives the same figures (every app's noise is seeded by its name)."""
    models = fleet(apps, days, seed)
    approaches_ = chosen or approaches()
    if jobs <= 1:
        return {name: _replay_all(models, days, config, seed)
                for name, config in approaches_.items()}
    with ProcessPoolExecutor(jobs) as pool:
        futures = {}
        for name, config in approaches_.items():
            shares = [models] if learns_from_fleet(config) else [
                models[k::jobs] for k in range(jobs)]
            futures[name] = [pool.submit(_replay_all, share, days, config, seed)
                             for share in shares]
        scores = {}
        for name, parts in futures.items():
            scores[name] = Score()
            for part in parts:
                scores[name].merge(part.result())
    return scores


def learns_from_fleet(config: Config | None) -> bool:
    """Whether an app's limits depend on the other apps' (a memory prior)."""
    return config is not None and any(v.prior > 0 for v in config.memory_variants)


def _replay_all(models: list[AppModel], days: float, config: Config | None,
                seed: int) -> Score:
    score = Score()
    replay_fleet(models, days, config, score, seed)
    return score


def select(names: str | None) -> dict[str, Config | None]:
    """The approaches named (comma-separated), with the user's limits always first."""
    every = approaches()
    if not names:
        return every
    wanted = {"user", *(n.strip() for n in names.split(",") if n.strip())}
    unknown = wanted - set(every)
    if unknown:
        raise SystemExit(f"unknown approach(es) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(every)}")
    return {name: config for name, config in every.items() if name in wanted}


def foresight(models: list[AppModel], days: float, seed: int,
              kind: str = "spiky") -> tuple[float, float]:
    """(limit, idle) summed over the scored week for the apps of `kind` if each had
    a constant limit at its own peak demand of the week: foresight, never killed,
    the least slack a constant limit can have. (Not for leaks: their demand depends
    on restarts.) The noise is drawn as in `replay`, so it is the same week."""
    limit = idle = 0.0
    for app in models:
        if app.kind != kind:
            continue
        rng = random.Random(f"{seed}:{app.name}")
        mems = []
        for i in range(1, int((WARM_IN + days * DAY) / STEP) + 1):
            mem = demand(app, i * STEP, 0.0, rng)[1]
            if i * STEP > WARM_IN:
                mems.append(mem)
        limit += max(mems) * len(mems)
        idle += max(mems) * len(mems) - sum(mems)
    return limit, idle


FIRST_SPIKE_MARGIN = 0.02
"""The default memory variant's margin: an app held this far over what it has shown."""


def first_spikes(models: list[AppModel], days: float, seed: int) -> tuple[int, int]:
    """(spiky apps whose first spike ever falls in the scored week, how many of those
    spikes go over the app's peak demand before it plus `FIRST_SPIKE_MARGIN`): the
    kills a rule that keeps no room for an app yet to jump cannot avoid, whatever
    else it does. Nothing in an app's samples before its first spike tells it from a
    daily app (the generator draws both cycles alike), so this many OOM-affected apps
    are the price of not paying room for every app that looks calm. The noise is
    drawn as in `replay`: the same week."""
    first = over = 0
    for app in models:
        if app.kind != "spiky" or not app.spikes:
            continue
        spike = app.spikes[0]
        if not WARM_IN < spike.at <= WARM_IN + days * DAY:
            continue
        first += 1
        rng = random.Random(f"{seed}:{app.name}")
        shown = 0.0
        for i in range(1, int((spike.at + spike.length) / STEP) + 1):
            mem = demand(app, i * STEP, 0.0, rng)[1]
            if i * STEP < spike.at:
                shown = max(shown, mem)
            elif mem > shown * (1 + FIRST_SPIKE_MARGIN):
                over += 1
                break
    return first, over


def report(scores: dict[str, Score], models: list[AppModel], elapsed: float,
           args: argparse.Namespace) -> str:
    user = scores["user"]
    kinds = {k: sum(m.kind == k for m in models) for k in KINDS}
    short = sum(m.user.mem_bytes < m.mem_base * (1 + m.mem_amp) for m in models)
    lines = [f"fleet: {len(models)} apps over {args.days:g} days after a warm-in day, seed "
             f"{args.seed}, one sample per {STEP:.0f}s; " + ", ".join(f"{n} {k}" for k, n in kinds.items())
             + f"; {short} with memory set below their usual peak",
             f"{'approach':<26}{'mem slack':>10}{'x user':>8}{'cpu slack':>11}"
             f"{'oom apps':>10}{'x user':>8}{'kills':>7}{'throttled':>11}{'changes':>9}"
             f"{'warm-in oom apps':>18}"]
    for name, s in scores.items():
        lines.append(f"{name:<26}{s.mem_slack:>10.1%}{_ratio(s.mem_slack, user.mem_slack):>8}"
                     f"{s.cpu_slack:>11.1%}{s.oom_apps:>10}{_ratio(s.oom_apps, user.oom_apps):>8}"
                     f"{s.ooms:>7}{s.throttled:>11.2%}{s.changes:>9}{s.warm_in_oom_apps:>18}")
    lines.append("memory slack by kind: " + "; ".join(
        f"{name} " + ", ".join(f"{k} {s.kind_slack(k):.0%}" for k in KINDS if k in s.mem_kinds)
        for name, s in scores.items()))
    lines.append("OOM-affected apps by kind: " + "; ".join(
        f"{name} " + (", ".join(f"{k} {n}" for k, n in sorted(s.oom_kinds.items())) or "none")
        for name, s in scores.items()))
    if "meta" in scores:
        meta = scores["meta"]
        limit, idle = foresight(models, args.days, args.seed)
        spiky_limit, spiky_idle = meta.mem_kinds.get("spiky", (0.0, 0.0))
        bound = (meta.mem_idle - spiky_idle + idle) / (meta.mem_limit - spiky_limit + limit)
        lines.append(f"with foresight for spiky apps (each a constant limit at its week's "
                     f"peak demand: {idle / limit if limit else 0:.0%} of it idle, never "
                     f"killed), meta's memory slack would be {bound:.1%}")
        first, over = first_spikes(models, args.days, args.seed)
        lines.append(f"first spikes in the scored week: {first} spiky apps, {over} of them over "
                     f"the peak shown before + {FIRST_SPIKE_MARGIN:.0%} (OOM-affected apps a "
                     f"rule without room for apps yet to jump cannot avoid; allowed "
                     f"{GOAL_OOM_RATIO * user.oom_apps:.1f})")
        lines.append(_goal(meta, user))
    lines.append(f"replayed in {elapsed:.1f}s (wall clock, shared machine)")
    return "\n".join(lines)


def goals_met(meta: Score, user: Score) -> tuple[bool, bool]:
    """(memory slack goal met, OOM goal met) for `meta` against the hand-set limits."""
    return meta.mem_slack <= GOAL_SLACK, meta.oom_apps <= GOAL_OOM_RATIO * user.oom_apps


def _goal(meta: Score, user: Score) -> str:
    slack_ok, oom_ok = goals_met(meta, user)
    return (f"goal (meta): memory slack <= {GOAL_SLACK:.0%}: {meta.mem_slack:.1%} "
            f"{'met' if slack_ok else 'MISSED'}; OOM-affected apps <= "
            f"{GOAL_OOM_RATIO:.0%} of user's {user.oom_apps}: {meta.oom_apps} "
            f"{'met' if oom_ok else 'MISSED'}")


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}" if reference else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.autopilot",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="60 apps over 2 days")
    p.add_argument("--apps", type=int, default=200)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", metavar="A,B",
                   help="replay only these approaches (and the user's limits), for development")
    p.add_argument("--jobs", type=int, default=1,
                   help="replay in this many processes (the same figures, sooner)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    chosen = select(args.only)
    if args.quick:
        args.apps, args.days = 60, 2.0
    started = time.perf_counter()
    scores = run(args.apps, args.days, args.seed, chosen, args.jobs)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({"apps": args.apps, "days": args.days, "seed": args.seed,
                          "scores": {n: s.as_json() for n, s in scores.items()}}, indent=2))
    else:
        print(report(scores, fleet(args.apps, args.days, args.seed), elapsed, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
