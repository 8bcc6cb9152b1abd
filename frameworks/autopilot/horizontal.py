"""Horizontal sizing: how many instances an app needs for its tasks to run at a
target CPU utilization (Autopilot's horizontal scaler, Kubernetes' HPA). Pure:
samples in, an answer out on each step, time passed in.

The rule: the app's load is the sum, over its live tasks, of each task's mean CPU
use over the last `window` seconds; it needs

    ceil(load / (target × cpu limit per task))

instances. Load, not utilization, is what is averaged: it is conserved when
tasks are added or removed (the same work spreads over more of them), so samples
taken before a change still say what the app needs after it. The mean (not a high
percentile) is right for a sum: spikes of different tasks do not line up, and the
way down is made conservative by the stabilization window below, which takes the
*highest* recommendation over several minutes.

Damping, so the count does not flap:

- evidence: no answer from fewer than `min_samples` samples in the window;
- tolerance: no change while load per instance is within `tolerance` of the
  target (HPA's 10% band);
- missing tasks (fewer live tasks than instances: some not started or not yet
  sampled) count as idle when the answer is up and as fully busy when it is
  down, as HPA does, so a task not yet seen never causes a change;
- up at once, down only to the highest recommendation of the last
  `stabilization` seconds (HPA's downscale stabilization);
- a bounded step: at most `max_factor` times (or 1/`max_factor` of) the current
  count per change, and at least one instance;
- bounds last: the answer is always within the app's [min, max], even without
  evidence (an app below its min is raised to it, as HPA does).
"""

from __future__ import annotations

import math
from collections import deque

import attrs

from frameworks.autopilot.spec import HorizontalSpec


@attrs.frozen
class HorizontalConfig:
    window: float = attrs.field(default=300.0, validator=attrs.validators.gt(0.0))
    fresh: float = attrs.field(default=30.0, validator=attrs.validators.gt(0.0))
    """A task is live when sampled within this long of the app's newest sample: a
    replaced task stops counting soon after its last sample, so a rolling upgrade
    counts its old and new tasks together only briefly."""
    stabilization: float = attrs.field(default=300.0, validator=attrs.validators.ge(0.0))
    tolerance: float = attrs.field(default=0.1, validator=attrs.validators.ge(0.0))
    min_samples: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    max_factor: float = attrs.field(default=2.0, validator=attrs.validators.gt(1.0))
    interval: float = attrs.field(default=60.0, validator=attrs.validators.ge(0.0))
    """Auto mode: at most one instance change per app this often (the core's rule)."""


@attrs.frozen
class InstancesAdvice:
    """The desired instance count and why; `ready` False: not enough evidence (the
    count is then the current one, brought within the bounds)."""

    instances: int
    current: int
    ready: bool
    explain: str


class HorizontalSizer:
    """One app's samples and its recent recommendations."""

    def __init__(self, config: HorizontalConfig = HorizontalConfig()) -> None:
        self.config = config
        self._samples: dict[str, deque[tuple[float, float]]] = {}  # task -> (at, cpus)
        self._history: deque[tuple[float, int]] = deque()  # (at, raw recommendation)
        # Since when every step had evidence: a scale-down needs a full window of
        # recommendations, not the few after a gap.
        self._ready_since: float | None = None

    def observe(self, task_id: str, at: float, cpus: float) -> None:
        """A task's mean cores used over its sample ending at `at` (checked finite
        and non-negative by the caller)."""
        self._samples.setdefault(task_id, deque()).append((at, cpus))

    def restart(self) -> None:
        """Forget the recommendations (not the samples): the spec they were made
        for changed."""
        self._history.clear()
        self._ready_since = None

    def step(self, now: float, current: int, cpu_limit: float,
             spec: HorizontalSpec) -> InstancesAdvice:
        """The desired instances now for an app running `current` tasks of
        `cpu_limit` cores each. Records the raw recommendation for stabilization,
        so call it once per step."""
        c = self.config
        self._prune(now)
        live = self._live()
        samples = sum(n for _, n in live)
        if current < 1 or cpu_limit <= 0 or samples < c.min_samples:
            self.restart()
        if current < 1 or cpu_limit <= 0:
            return _bounded(current, current, spec, False, "no running instances to measure")
        if samples < c.min_samples:
            return _bounded(current, current, spec, False, (
                f"waiting for evidence: {samples} of {c.min_samples} samples of live "
                f"tasks in {c.window:.0f}s"))
        per_task = spec.target * cpu_limit
        load = sum(mean for mean, _ in live)
        missing = max(0, current - len(live))
        seen = load / (len(live) * per_task)  # utilization over target, of tasks seen
        # Missing tasks count as idle when the tasks seen ask for more (they cannot
        # be what asks for more), fully busy when those allow fewer.
        need = load / per_task if seen > 1.0 else (load + missing * cpu_limit) / per_task
        ratio = need / current
        if abs(ratio - 1.0) <= c.tolerance or (ratio - 1.0) * (seen - 1.0) <= 0:
            raw = _clamp(current, spec)
        else:
            raw = _clamp(math.ceil(need - 1e-9), spec)
        if self._ready_since is None:
            self._ready_since = now
        self._history.append((now, raw))
        # Until a full window was seen, the current count stands in for the
        # recommendations not made.
        stable = max(max(r for _, r in self._history),
                     current if now - self._ready_since < c.stabilization else 0)
        why = (f"{load:.3f} cores over {len(live)} live task(s) ({missing} unseen): "
               f"{ratio * spec.target:.0%} of {current} x {cpu_limit:g} cores, target "
               f"{spec.target:.0%}: {raw} wanted")
        if raw > current:
            desired = min(raw, max(current + 1, math.floor(current * c.max_factor)))
            why += "; scale-up at once" + ("" if desired == raw else f", bounded to {desired}")
        elif stable < current:
            desired = max(stable, min(current - 1, math.ceil(current / c.max_factor)))
            why += (f"; down to the highest in {c.stabilization:.0f}s, {stable}"
                    + ("" if desired == stable else f", bounded to {desired}"))
        else:
            desired = current
            if raw < current and now - self._ready_since < c.stabilization:
                why += f"; held: fewer only after {c.stabilization:.0f}s of evidence"
            elif raw < current:
                why += f"; held: {stable} wanted within the last {c.stabilization:.0f}s"
        return _bounded(current, desired, spec, True, why)

    def _prune(self, now: float) -> None:
        c = self.config
        for task_id in list(self._samples):
            samples = self._samples[task_id]
            while samples and samples[0][0] <= now - c.window:
                samples.popleft()
            if not samples:
                del self._samples[task_id]
        while self._history and self._history[0][0] <= now - c.stabilization:
            self._history.popleft()

    def _live(self) -> list[tuple[float, int]]:
        """Each live task's mean cores over the window and its sample count, in
        task-id order (a fixed order keeps the float sum deterministic)."""
        if not self._samples:
            return []
        newest = max(s[-1][0] for s in self._samples.values())
        return [(sum(cpus for _, cpus in s) / len(s), len(s))
                for _, s in sorted(self._samples.items())
                if s[-1][0] >= newest - self.config.fresh]


def _bounded(current: int, desired: int, spec: HorizontalSpec, ready: bool,
             why: str) -> InstancesAdvice:
    """The advice, within the bounds whatever the evidence said."""
    bounded = _clamp(desired, spec)
    if bounded != desired:
        why += f"; {desired} is outside [{spec.min}, {spec.max}]: {bounded}"
    return InstancesAdvice(bounded, current, ready, why)


def _clamp(value: int, spec: HorizontalSpec) -> int:
    return min(max(value, spec.min), spec.max)
