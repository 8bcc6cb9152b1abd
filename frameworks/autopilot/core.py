"""The autopilot: per app, recommend task limits from measured usage and, in `auto`
mode, decide when to apply them. A pure core: `handle(event, now) -> effects`.

Per app it runs two meta-recommenders (CPU and memory, see `meta`) and on a timer
every `Config.step` seconds turns their choice into a `Recommendation`. The rules
that make it safe to act on live here, and apply to every variant alike:

- evidence: no recommendation until `min_samples` samples over at least `warmup`
  seconds;
- bounds: each resource is clamped to the app's min/max, else the configured
  floor/cap; memory rounds up to whole MiB, CPU up to a thousandth of a core;
- hysteresis: in `auto`, CPU moves only by at least `min_change` of its current
  limit, memory is cut only by at least `mem_min_cut` (2%: a margin that narrows
  once an app is seen not to grow must be able to come down; None: `min_change`),
  and a raise is never held back (a
  memory limit under the recommended peak plus margin, the window's or the clock's,
  is a kill waiting to happen),
  and limits change at most once per `min_interval`...
- ...except after an OOM kill (`TaskOomKilled`): memory is raised at once to at
  least `oom_growth` times the limit the task died at, the kill counts as a
  memory sample at that limit, so no variant recommends below it while the kill is
  inside its window, and memory is not cut for `oom_hold` seconds after a kill
  (a raise cut back an hour later is a kill waiting for the next spike). A kill
  told twice (same task) counts once; one older than `oom_hold` (read back by a
  new leader) is evidence only, never a raise.

`Recommended` is emitted whenever the recommendation changes; `ApplyLimits` asks the
service framework to roll the app to new limits. The app's next `AppConfigured`
(its definition after the upgrade, or an operator's edit) sets what is current.

Apps with a `horizontal` spec also get an instance count (`horizontal`, whose
rule and damping apply) on every step, with its own evidence rule (no warmup: load
is read over a few minutes); in `auto` `ApplyInstances` scales the app, at most once
per `HorizontalConfig.interval`, and never in a step that applied limits (the
upgrade rolls first; the count follows at a later step). The count in force is the
one `AppConfigured.instances` last said. With a horizontal spec, `auto` applies
memory only: CPU stays at the app's limit (within its bounds), which utilization
is measured against; sizing both is a feedback loop.
"""

from __future__ import annotations

import math
import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerFired, TimerKey, UnknownTimer
from frameworks.autopilot.fleet import FleetJumps
from frameworks.autopilot.horizontal import HorizontalConfig, HorizontalSizer, InstancesAdvice
from frameworks.autopilot.meta import Costs, MetaRecommender, moved
from frameworks.autopilot.recommenders import (
    DEFAULT_CPU_VARIANTS, DEFAULT_MEMORY_VARIANTS, CpuVariant, MemoryVariant)
from frameworks.autopilot.spec import AUTO, MIB, OFF, AutopilotSpec, Limits

_MILLICORE = 0.001


@attrs.frozen
class Config:
    cpu_variants: tuple[CpuVariant, ...] = DEFAULT_CPU_VARIANTS
    memory_variants: tuple[MemoryVariant, ...] = DEFAULT_MEMORY_VARIANTS
    costs: Costs = Costs()
    step: float = attrs.field(default=300.0, validator=attrs.validators.gt(0.0))
    min_samples: int = attrs.field(default=30, validator=attrs.validators.ge(1))
    warmup: float = attrs.field(default=3600.0, validator=attrs.validators.ge(0.0))
    min_change: float = attrs.field(default=0.1, validator=attrs.validators.ge(0.0))
    mem_min_cut: float | None = 0.02  # memory cuts need this much (None: min_change)
    min_interval: float = attrs.field(default=3600.0, validator=attrs.validators.ge(0.0))
    oom_growth: float = attrs.field(default=1.5, validator=attrs.validators.gt(1.0))
    oom_hold: float = attrs.field(default=24 * 3600.0, validator=attrs.validators.ge(0.0))
    floor: Limits = Limits(cpus=0.01, mem_bytes=32 * MIB)
    cap: Limits = Limits(cpus=64.0, mem_bytes=256 * 1024 * MIB)
    horizontal: HorizontalConfig = HorizontalConfig()

    def __attrs_post_init__(self) -> None:
        if not self.cpu_variants or not self.memory_variants:
            raise ValueError("the autopilot needs at least one CPU and one memory variant")
        if self.floor.cpus > self.cap.cpus or self.floor.mem_bytes > self.cap.mem_bytes:
            raise ValueError(f"floor {self.floor} exceeds cap {self.cap}")


# events ------------------------------------------------------------------------------

@attrs.frozen
class AppConfigured:
    """An app's autopilot spec and its current task limits (on create and update).
    `instances`: the app's instance count, which horizontal sizing starts from
    (None: unknown, so no horizontal sizing)."""

    app_id: str
    spec: AutopilotSpec
    limits: Limits
    instances: int | None = None


@attrs.frozen
class AppRemoved:
    app_id: str


@attrs.frozen
class UsageSampled:
    """One task's measured usage at `at`: cores used over the sample, RSS bytes.

    `mem_allowance_bytes`: memory the agent lets the sampled run have beyond the
    app's `mem` (a Python command executor's 64 MiB), whose use the sample counts
    too. It is taken off, so samples, OOM kills (at the app's `mem`) and the limits
    set are all in the app's `mem` terms: the run may use `mem` plus its allowance."""

    app_id: str
    at: float
    cpus: float
    mem_bytes: float
    mem_allowance_bytes: float = 0.0
    task_id: str = ""  # horizontal sizing sums the tasks' loads
    cpus_throttled_secs: float = 0.0
    """Seconds the task was held at its CPU limit since its previous sample (the
    cgroup's throttled time): what it used is then less than it wanted."""


FORGET_TASK_AFTER = 3600.0
"""Seconds without a sample after which a task's last sample time is dropped."""
MAX_THROTTLED_SHARE = 0.9
"""The largest share of a sample's time counted as throttled: a task held at its
limit for longer is taken to want ten times what it got, not without bound."""


def cpu_demand(used: float, throttled_secs: float, elapsed: float | None) -> float:
    """The cores a task would have used unthrottled. Held for a share f of the
    `elapsed` seconds since its previous sample, it ran at used / (1 - f) the rest
    of the time (used is its average over all of it), and would have all along.
    A task's first sample (no `elapsed`) counts as what it used."""
    if throttled_secs <= 0 or elapsed is None or elapsed <= 0:
        return used
    return used / (1 - min(MAX_THROTTLED_SHARE, throttled_secs / elapsed))


@attrs.frozen
class TaskOomKilled:
    """A task of the app was killed for memory (REASON_CONTAINER_LIMITATION_MEMORY)."""

    app_id: str
    task_id: str
    at: float
    mem_limit_bytes: int


@attrs.frozen
class Evaluate(TimerKey):
    app_id: str


# effects -----------------------------------------------------------------------------

@attrs.frozen
class Recommendation:
    """What the autopilot would set, why, and on how much evidence."""

    app_id: str
    at: float
    ready: bool  # False: not enough evidence yet; the values are then the current ones
    cpus: float
    mem_bytes: int
    current: Limits
    cpu_variant: str
    mem_variant: str
    samples: int
    ooms: int
    reasons: tuple[str, ...]
    instances: InstancesAdvice | None = None  # apps with a horizontal spec, once stepped

    @property
    def slack_removed(self) -> Limits:
        """What the recommendation takes away from the current limits (negative: adds)."""
        return Limits(self.current.cpus - self.cpus, self.current.mem_bytes - self.mem_bytes)


@attrs.frozen
class Recommended:
    recommendation: Recommendation


@attrs.frozen
class ApplyLimits:
    """Auto mode: roll the app's tasks to these limits (a rolling upgrade). `oom`:
    memory raised after an OOM kill, which should not wait for a deployment in
    progress (one whose tasks die for memory cannot finish anyway)."""

    app_id: str
    limits: Limits
    reason: str
    oom: bool = False


@attrs.frozen
class ApplyInstances:
    """Auto mode with a horizontal spec: scale the app to `instances` tasks."""

    app_id: str
    instances: int
    reason: str


Event = AppConfigured | AppRemoved | UsageSampled | TaskOomKilled | TimerFired
Effect = Recommended | ApplyLimits | ApplyInstances | ArmTimer | CancelTimer


class _App:
    def __init__(self, app_id: str, spec: AutopilotSpec, limits: Limits,
                 pilot: Autopilot) -> None:
        config = pilot.config
        self.app_id = app_id
        self.spec = spec
        self.current = limits
        self.instances: int | None = None
        self.sizer: HorizontalSizer | None = None
        self.advice: InstancesAdvice | None = None
        self.last_scaled: float | None = None
        # Bounds are read at each use, so an edit of the app's min/max applies to
        # the evidence already gathered.
        self.cpu = MetaRecommender([v.build() for v in config.cpu_variants], config.costs,
                                   config.min_change, fatal_overrun=False,
                                   bound=self._bound_cpus)
        self.mem_recommenders = [v.build(pilot._fleets.get(v.name), app_id)
                                 for v in config.memory_variants]
        self.mem = MetaRecommender(self.mem_recommenders, config.costs,
                                   config.min_change, fatal_overrun=True,
                                   bound=lambda v: pilot._bound_mem(self.spec, v))
        self._pilot = pilot
        # CPU proposals repeat (percentiles are bucket bounds): their bounded values
        # are kept for the spec they were bounded by.
        self._cpu_bounds: dict[float, float] = {}
        self._cpu_bounds_spec = spec
        self.first_sample: float | None = None
        self.last_applied: float | None = None
        self.ooms = 0
        self.last_oom = ""  # what the latest OOM kill did, for every reason list after it
        self.last_oom_at: float | None = None
        self.oom_tasks: dict[str, float] = {}  # task id -> its kill's time, for `oom_hold`
        self.published: Recommendation | None = None
        self.last_sampled: dict[str, float] = {}  # task id -> its latest sample's time
        self.task_mem: dict[str, tuple[float, float]] = {}  # task id -> (at, mem) latest

    def task_peak(self, task_id: str, at: float, mem: float, previous: float | None) -> float:
        """The memory the app's limit must hold at `at`: the largest of its tasks'
        latest samples, of those since the sampled task's `previous` sample (at a
        task's first sample, its own alone). Every instance runs under the same
        limit, and fed one after the other, instances using different amounts
        would look to the jump detector like jumps."""
        self.task_mem[task_id] = (at, mem)
        since = at if previous is None else min(previous, at)
        return max(m for t, m in self.task_mem.values() if t >= since)

    def configure(self, spec: AutopilotSpec, instances: int | None,
                  config: HorizontalConfig) -> None:
        """Horizontal state follows the spec: made when asked for, dropped (with its
        samples) when the spec no longer asks; an edited target or bound starts the
        stabilization afresh (its recommendations were for the old one)."""
        edited = spec.horizontal != self.spec.horizontal
        self.spec, self.instances = spec, instances
        if spec.horizontal is None or instances is None:
            self.sizer = self.advice = None
        elif self.sizer is None:
            self.sizer = HorizontalSizer(config)
        elif edited:
            self.sizer.restart()

    def _bound_cpus(self, value: float) -> float:
        if self.spec is not self._cpu_bounds_spec:
            self._cpu_bounds.clear()
            self._cpu_bounds_spec = self.spec
        bounded = self._cpu_bounds.get(value)
        if bounded is None:
            bounded = self._cpu_bounds[value] = self._pilot._bound_cpus(self.spec, value)
        return bounded


class Autopilot:
    def __init__(self, config: Config = Config()) -> None:
        self.config = config
        self._apps: dict[str, _App] = {}
        # Per memory variant with a prior: the jumps of every app followed.
        self._fleets = {v.name: FleetJumps() for v in config.memory_variants if v.prior > 0}
        self.rejected = 0  # samples that were not numbers we could use
        self.ignored = 0  # events for apps the autopilot does not follow
        self.repeated = 0  # OOM kills of a task already told

    # -- the one way in ---------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Effect]:
        match event:
            case AppConfigured():
                return self._configured(event, now)
            case AppRemoved(app_id):
                if app_id not in self._apps:
                    return []
                self._forget(app_id)
                return [CancelTimer(Evaluate(app_id))]
            case UsageSampled():
                self._sampled(event)
                return []
            case TaskOomKilled():
                return self._oom(event, now)
            case TimerFired(key=Evaluate(app_id)):
                app = self._apps.get(app_id)
                return [] if app is None else self._evaluate(app, now)  # stale: removed
            case TimerFired(key=key):
                raise UnknownTimer("Autopilot", key)
        raise TypeError(f"Autopilot cannot handle {event!r}")

    def recommendation(self, app_id: str) -> Recommendation | None:
        """The latest recommendation for a followed app (None: not followed)."""
        app = self._apps.get(app_id)
        return None if app is None else app.published

    def followed(self) -> list[str]:
        return sorted(self._apps)

    # -- events -----------------------------------------------------------------------

    def _forget(self, app_id: str) -> None:
        for recommender in self._apps.pop(app_id).mem_recommenders:
            recommender.forget()

    def _configured(self, event: AppConfigured, now: float) -> list[Effect]:
        app = self._apps.get(event.app_id)
        if event.spec.mode == OFF:
            if app is None:
                return []
            self._forget(event.app_id)
            return [CancelTimer(Evaluate(event.app_id))]
        if app is None:
            app = self._apps[event.app_id] = _App(event.app_id, event.spec, event.limits, self)
            app.configure(event.spec, event.instances, self.config.horizontal)
            app.published = self._recommend(app, now)
            return [Recommended(app.published),
                    ArmTimer(Evaluate(event.app_id), now + self.config.step)]
        app.current = event.limits
        app.configure(event.spec, event.instances, self.config.horizontal)
        return self._publish(app, self._recommend(app, now))

    def _sampled(self, event: UsageSampled) -> None:
        app = self._apps.get(event.app_id)
        if app is None:
            self.ignored += 1
            return
        at, cpus, mem, allowance, throttled = (event.at, event.cpus, event.mem_bytes,
                                               event.mem_allowance_bytes,
                                               event.cpus_throttled_secs)
        isfinite = math.isfinite
        if not (isfinite(at) and isfinite(cpus) and isfinite(mem) and isfinite(allowance)
                and isfinite(throttled) and cpus >= 0 and mem >= 0 and allowance >= 0
                and throttled >= 0):
            self.rejected += 1
            return
        mem = max(0.0, mem - allowance)
        if event.task_id:
            previous = app.last_sampled.get(event.task_id)
            app.last_sampled[event.task_id] = max(at, previous or at)
            cpus = cpu_demand(cpus, throttled, None if previous is None else at - previous)
            mem = app.task_peak(event.task_id, at, mem, previous)
        app.cpu.observe(at, cpus)
        app.mem.observe(at, mem)
        if app.sizer is not None:
            app.sizer.observe(event.task_id, at, cpus)
        if app.first_sample is None or event.at < app.first_sample:
            app.first_sample = event.at

    def _oom(self, event: TaskOomKilled, now: float) -> list[Effect]:
        app = self._apps.get(event.app_id)
        if app is None:
            self.ignored += 1
            return []
        if not (math.isfinite(event.at) and event.mem_limit_bytes > 0):
            self.rejected += 1
            return []
        # A kill told twice (a status update redelivered to a new leader, a kill
        # also read back from the usage store) counts once.
        hold = self.config.oom_hold
        for task_id in [t for t, at in app.oom_tasks.items() if at < now - hold]:
            del app.oom_tasks[task_id]
        if event.task_id in app.oom_tasks:
            self.repeated += 1
            return []
        app.oom_tasks[event.task_id] = event.at
        app.ooms += 1
        app.last_oom_at = max(event.at, app.last_oom_at or event.at)
        # The kill is evidence that usage reached the limit the task had.
        app.mem.observe(event.at, float(event.mem_limit_bytes))
        effects: list[Effect] = []
        recommendation = self._recommend(app, now)
        raised = self._bound_mem(app.spec, max(event.mem_limit_bytes * self.config.oom_growth,
                                               float(recommendation.mem_bytes)))
        app.last_oom = (f"task {event.task_id} was OOM-killed at "
                        f"{event.mem_limit_bytes / MIB:.0f} MiB")
        # A kill older than the hold (read back after a failover) is evidence only:
        # its raise was applied then, and the hold since let memory come down.
        recent = now - event.at <= hold
        if app.spec.mode == AUTO and recent and raised > app.current.mem_bytes:
            app.current = Limits(app.current.cpus, raised)
            app.last_applied = now
            app.last_oom += f": memory raised at once to {raised / MIB:.0f} MiB"
            effects.append(ApplyLimits(app.app_id, app.current, app.last_oom, oom=True))
            recommendation = self._recommend(app, now)
        effects.extend(self._publish(app, recommendation))
        return effects

    def _evaluate(self, app: _App, now: float) -> list[Effect]:
        # Tasks not sampled for a while are gone (a replaced one's id never returns).
        stale = [t for t, at in app.last_sampled.items() if at < now - FORGET_TASK_AFTER]
        for task_id in stale:
            del app.last_sampled[task_id]
            app.task_mem.pop(task_id, None)
        app.cpu.decide(now)
        app.mem.decide(now)
        recommendation = self._recommend(app, now)
        effects: list[Effect] = []
        target = self._target(app, recommendation, now)
        if target is not None:
            reason = "; ".join(recommendation.reasons)
            app.current, app.last_applied = target, now
            effects.append(ApplyLimits(app.app_id, target, reason))
            recommendation = attrs.evolve(recommendation, current=target)
        if app.sizer is not None:
            scale = self._size(app, now, resized=target is not None)
            if scale is not None:
                effects.append(scale)
            recommendation = attrs.evolve(recommendation, instances=app.advice)
        effects.extend(self._publish(app, recommendation))
        effects.append(ArmTimer(Evaluate(app.app_id), now + self.config.step))
        return effects

    # -- rules ------------------------------------------------------------------------

    def _size(self, app: _App, now: float, resized: bool) -> ApplyInstances | None:
        """Step the app's sizer; in auto, the scale to apply now, if any."""
        assert app.sizer is not None and app.spec.horizontal is not None
        assert app.instances is not None
        advice = app.advice = app.sizer.step(now, app.instances, app.current.cpus,
                                             app.spec.horizontal)
        interval = self.config.horizontal.interval
        if (app.spec.mode != AUTO or resized or advice.instances == app.instances
                or (app.last_scaled is not None and now - app.last_scaled < interval)):
            return None
        app.last_scaled = now
        return ApplyInstances(app.app_id, advice.instances, advice.explain)

    def _target(self, app: _App, rec: Recommendation, now: float) -> Limits | None:
        """The limits to apply now in auto mode, or None to leave them."""
        if app.spec.mode != AUTO or not rec.ready:
            return None
        if app.last_applied is not None and now - app.last_applied < self.config.min_interval:
            return None
        step = self.config.min_change
        # What is kept is the current limit brought within the app's bounds, so an
        # applied limit is always within them, even after the bounds were edited.
        keep_cpus = self._bound_cpus(app.spec, app.current.cpus)
        keep_mem = self._bound_mem(app.spec, app.current.mem_bytes)
        # With horizontal sizing the CPU limit is what utilization is measured
        # against: sizing it too would chase the count (lower limit, higher
        # utilization, more instances, lower use per task, lower limit...).
        cpus = (rec.cpus if moved(keep_cpus, rec.cpus, step)
                and app.spec.horizontal is None else keep_cpus)
        # Memory below the recommendation is below the peak it expects plus margin: a
        # kill waiting to happen, so any raise goes ahead; cuts need min_change.
        held = app.last_oom_at is not None and now - app.last_oom_at < self.config.oom_hold
        cut = step if self.config.mem_min_cut is None else self.config.mem_min_cut
        mem = (rec.mem_bytes if rec.mem_bytes > keep_mem or (
            moved(keep_mem, rec.mem_bytes, cut) and not held) else keep_mem)
        target = Limits(cpus, mem)
        return None if target == app.current else target

    def _recommend(self, app: _App, now: float) -> Recommendation:
        config = self.config
        samples = app.mem.samples
        span = 0.0 if app.first_sample is None else now - app.first_sample
        cpu, mem = app.cpu.choose(now), app.mem.choose(now)
        if samples < config.min_samples or span < config.warmup or cpu is None or mem is None:
            reason = (f"waiting for evidence: {samples} of {config.min_samples} samples, "
                      f"{span:.0f}s of {config.warmup:.0f}s")
            return Recommendation(app.app_id, now, False, app.current.cpus,
                                  app.current.mem_bytes, app.current, "", "", samples,
                                  app.ooms, (reason, *self._oom_reasons(app)), app.advice)
        reasons = [f"cpus {cpu.value:.3f}: {cpu.explanation}",
                   f"mem {mem.value / MIB:.0f} MiB: {mem.explanation}"]
        if app.spec.horizontal is not None:
            reasons.append("cpus not applied: horizontal sizing measures utilization "
                           "against the current limit")
        reasons += self._oom_reasons(app)
        return Recommendation(app.app_id, now, True, cpu.value, int(mem.value),
                              app.current, cpu.variant, mem.variant, samples, app.ooms,
                              tuple(reasons), app.advice)

    @staticmethod
    def _oom_reasons(app: _App) -> list[str]:
        if not app.ooms:
            return []
        return [f"{app.ooms} OOM kill(s) seen, each counted as a memory sample at the "
                f"limit the task died at; latest: {app.last_oom}"]

    def _publish(self, app: _App, rec: Recommendation) -> list[Effect]:
        last = app.published
        app.published = rec
        if last is not None and _gist(last) == _gist(rec):
            return []
        return [Recommended(rec)]

    def _bound_cpus(self, spec: AutopilotSpec, value: float) -> float:
        b, c = spec.bounds, self.config
        # Rounded before the clamp, so an app's own bound is kept exactly.
        rounded = round(math.ceil(value / _MILLICORE - 1e-9) * _MILLICORE, 6)
        return _clamp(rounded, b.min_cpus, b.max_cpus, c.floor.cpus, c.cap.cpus)

    def _bound_mem(self, spec: AutopilotSpec, value: float) -> int:
        b, c = spec.bounds, self.config
        rounded = math.ceil(value / MIB - 1e-9) * MIB  # 100 MiB × 1.1 is 110 MiB, not 111
        return int(_clamp(rounded, b.min_mem_bytes, b.max_mem_bytes, c.floor.mem_bytes,
                          c.cap.mem_bytes))


def _gist(rec: Recommendation) -> tuple:
    """What makes a recommendation news (not its time, sample count or wording)."""
    advice = rec.instances
    return (rec.ready, rec.cpus, rec.mem_bytes, rec.current, rec.cpu_variant,
            rec.mem_variant, rec.ooms,
            None if advice is None else (advice.ready, advice.instances, advice.current))


def _clamp(value: float, low: float | None, high: float | None, default_low: float,
           default_high: float) -> float:
    """Clamp to the app's bounds, else the defaults. An app's own bound wins over a
    default it contradicts (an app min above the default cap raises the cap)."""
    lo = default_low if low is None else low
    hi = default_high if high is None else high
    if lo > hi:
        lo, hi = (lo, lo) if low is not None else (hi, hi)
    return min(max(value, lo), hi)
