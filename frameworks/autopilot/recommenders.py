"""Moving-window recommenders: one resource, one set of parameters, samples in, a
limit out.

- CPU (`CpuRecommender`): a high percentile of a decaying histogram of the cores
  used per sample, times ``1 + margin``. A short peak is cheap for CPU (the task is
  throttled a moment, not killed), so a percentile rather than the peak.
- Memory (`MemoryRecommender`): the peak seen within the window, times
  ``1 + margin``. Going over a memory limit kills the task, so only a peak is safe;
  the window lets an old peak stop counting once it is `window` seconds old. With
  `spike` room, the limit is at least ``calm × (1 + spike × jump)`` (times the
  margin), where `jump` is the largest rise within the window of a sample over
  the level it rose from (a decaying average of the samples before it, half-life
  `LEVEL_HALF_LIFE`) beyond `jitter`, and `calm` the peak of the samples that were
  not jumps: an app that jumped 20% once, even at a quiet hour far below its
  peak, may jump further next time, and at its usual top. Steady use, daily
  cycles, growth and leaks move slowly and never jump, so they pay nothing for it.

Both answer None until they have seen a sample. Bounds, evidence thresholds and
hysteresis are not theirs: they belong to the policy (`core.Autopilot`), which
treats every variant the same way.
"""

from __future__ import annotations

import math
from typing import Protocol

import attrs

from frameworks.autopilot.histogram import DecayingHistogram, Scale
from frameworks.autopilot.window import SlidingPeak

CPU_SCALE = Scale(low=0.001, high=1024.0, ratio=1.05)
"""Cores: a thousandth of a core up to a large machine, within 5%."""
LEVEL_HALF_LIFE = 900.0
"""Seconds: the level a memory jump is measured from halves the weight of samples
15 minutes old, so it keeps up with a daily cycle or a leak (a 20% daily swing
lags it by under 2%) while a jump within minutes stands out."""
LEVEL_SETTLE = 4 * LEVEL_HALF_LIFE
"""Jumps count from this long after the first sample, once the level has caught up
with the app's start (within 1/16 of a step up)."""

_positive = attrs.validators.gt(0.0)
_nonnegative = attrs.validators.ge(0.0)


@attrs.frozen
class CpuVariant:
    """CPU limit = `percentile` of usage (weights halving every `half_life` s), ×(1+margin)."""

    name: str
    half_life: float = attrs.field(validator=_positive)
    percentile: float = attrs.field(validator=[_positive, attrs.validators.le(100.0)])
    margin: float = attrs.field(default=0.0, validator=_nonnegative)

    def build(self) -> CpuRecommender:
        return CpuRecommender(self)


@attrs.frozen
class MemoryVariant:
    """Memory limit = max(peak, calm peak × (1 + spike × jump)) × (1 + margin) over the
    last `window` s, `jump` the largest rise of a sample over its level less `jitter`."""

    name: str
    window: float = attrs.field(validator=_positive)
    margin: float = attrs.field(default=0.1, validator=_nonnegative)
    spike: float = attrs.field(default=0.0, validator=_nonnegative)
    jitter: float = attrs.field(default=0.05, validator=_nonnegative)

    def build(self) -> MemoryRecommender:
        return MemoryRecommender(self)


class Recommender(Protocol):
    name: str

    def add(self, at: float, value: float) -> None: ...

    def value(self, now: float) -> float | None: ...

    def explain(self, now: float) -> str: ...


class CpuRecommender:
    def __init__(self, variant: CpuVariant) -> None:
        self.variant = variant
        self.name = variant.name
        self._histogram = DecayingHistogram(CPU_SCALE, variant.half_life)

    def add(self, at: float, value: float) -> None:
        self._histogram.add(at, value)

    def value(self, now: float) -> float | None:
        usage = self._histogram.percentile(self.variant.percentile)
        return None if usage is None else usage * (1 + self.variant.margin)

    def explain(self, now: float) -> str:
        v = self.variant
        usage = self._histogram.percentile(v.percentile)
        return (f"p{v.percentile:g} of cores used (half-life {v.half_life:g}s) = "
                f"{usage if usage is None else round(usage, 4)}, margin {v.margin:.0%}")


class MemoryRecommender:
    def __init__(self, variant: MemoryVariant) -> None:
        self.variant = variant
        self.name = variant.name
        self._peak = SlidingPeak(variant.window)
        spiky = variant.spike > 0
        self._jumps = SlidingPeak(variant.window) if spiky else None
        self._calm = SlidingPeak(variant.window) if spiky else None  # peak of non-jumps
        self._level: float | None = None  # decaying average of the samples so far
        self._level_at = self._first_at = 0.0

    def add(self, at: float, value: float) -> None:
        self._peak.add(at, value)
        if self._jumps is None or self._calm is None:
            return
        if self._level is None:
            self._level, self._level_at, self._first_at = value, at, at
        # Not before the level has settled: a task's first minutes (its start-up
        # climb from nothing to its working set) are no jump.
        rise = value / self._level - 1 if self._level > 0 else math.inf
        jump = max(0.0, rise - self.variant.jitter)
        if at - self._first_at < LEVEL_SETTLE or not math.isfinite(jump) or jump == 0:
            self._calm.add(at, value)
        else:
            self._jumps.add(at, jump)
        keep = 2.0 ** (-max(0.0, at - self._level_at) / LEVEL_HALF_LIFE)
        self._level = keep * self._level + (1 - keep) * value
        self._level_at = max(self._level_at, at)

    def _room(self, now: float) -> tuple[float, float]:
        """The largest jump in the window and the peak of the samples that were not
        jumps (0, 0 without spike room or jumps)."""
        if self._jumps is None or self._calm is None:
            return 0.0, 0.0
        return self._jumps.peak(now) or 0.0, self._calm.peak(now) or 0.0

    def value(self, now: float) -> float | None:
        peak = self._peak.peak(now)
        if peak is None:
            return None
        v = self.variant
        jump, calm = self._room(now)
        # A jump multiplies the usual level: room for a bigger one on the usual top.
        return max(peak, calm * (1 + v.spike * jump)) * (1 + v.margin)

    def explain(self, now: float) -> str:
        v = self.variant
        peak = self._peak.peak(now)
        shown = "none" if peak is None else f"{peak / 2**20:.1f} MiB"
        text = f"peak memory over {v.window:g}s = {shown}"
        if self._jumps is not None:
            jump, calm = self._room(now)
            text += (f", or the peak of calm use {calm / 2**20:.1f} MiB x (1 + {v.spike:g} x "
                     f"the largest jump over the usual level beyond {v.jitter:.0%}, "
                     f"{jump:.0%}), whichever is more")
        return text + f"; margin {v.margin:.0%}"


DEFAULT_CPU_VARIANTS = (
    CpuVariant("cpu-p95-6h", half_life=6 * 3600.0, percentile=95.0, margin=0.1),
    CpuVariant("cpu-p98-12h", half_life=12 * 3600.0, percentile=98.0, margin=0.1),
    CpuVariant("cpu-p90-1h", half_life=3600.0, percentile=90.0, margin=0.15),
    CpuVariant("cpu-p99-24h", half_life=24 * 3600.0, percentile=99.0, margin=0.05),
)
DEFAULT_MEMORY_VARIANTS = (
    MemoryVariant("mem-spike-7d", window=7 * 86400.0, margin=0.05, spike=2.5, jitter=0.05),
)
"""Variants the meta-recommender chooses among by default: fast CPU decay follows
change quickly (and pays more margin for it); slow decay is steadier. Memory has one
variant: a week's peak, so a spike is remembered for a week (a day's window forgot
Tuesday's spike by Thursday, and the next one killed), with room for a spike bigger
than the largest jump seen. Without that room the meta-recommender cannot protect
an app whose jumps so far stayed below its limit: no variant is charged for them,
so the tightest wins until the first bigger jump kills (docs/autopilot.md, the
fleet benchmark, where these were chosen on its training seed 2)."""
