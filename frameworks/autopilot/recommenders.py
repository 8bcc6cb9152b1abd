"""Moving-window recommenders: one resource, one set of parameters, samples in, a
limit out.

- CPU (`CpuRecommender`): a high percentile of a decaying histogram of the cores
  used per sample, times ``1 + margin``. A short peak is cheap for CPU (the task is
  throttled a moment, not killed), so a percentile rather than the peak.
- Memory (`MemoryRecommender`): the peak seen within the window, times
  ``1 + margin``. Going over a memory limit kills the task, so only a peak is safe;
  the window lets an old peak stop counting once it is `window` seconds old. With
  `spike` room, the limit also gets ``spike × jump × peak``, where `jump` is the
  largest rise within the window of a sample over the level it rose from (a
  decaying average of the samples before it, half-life `LEVEL_HALF_LIFE`), beyond
  `jitter`: an app that has jumped 20% once may jump further next time, even if
  that jump came at a quiet hour and never neared the peak. Steady use, daily
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
    """Memory limit = peak over the last `window` s × (1 + margin + spike × jump),
    `jump` the largest rise in the window of a sample over its level, less `jitter`."""

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
        self._jumps = SlidingPeak(variant.window) if variant.spike else None
        self._level: float | None = None  # decaying average of the samples so far
        self._level_at = self._first_at = 0.0

    def add(self, at: float, value: float) -> None:
        self._peak.add(at, value)
        if self._jumps is None:
            return
        if self._level is None:
            self._level, self._level_at, self._first_at = value, at, at
            return
        # Not before the level has settled: a task's first minutes (its start-up
        # climb from nothing to its working set) are no jump.
        rise = value / self._level if self._level > 0 else math.inf
        if at - self._first_at >= LEVEL_SETTLE and math.isfinite(rise):
            self._jumps.add(at, max(0.0, rise - 1 - self.variant.jitter))
        keep = 2.0 ** (-max(0.0, at - self._level_at) / LEVEL_HALF_LIFE)
        self._level = keep * self._level + (1 - keep) * value
        self._level_at = max(self._level_at, at)

    def _jump(self, now: float) -> float:
        return 0.0 if self._jumps is None else self._jumps.peak(now) or 0.0

    def value(self, now: float) -> float | None:
        peak = self._peak.peak(now)
        if peak is None:
            return None
        v = self.variant
        return peak * (1 + v.margin + v.spike * self._jump(now))

    def explain(self, now: float) -> str:
        v = self.variant
        peak = self._peak.peak(now)
        shown = "none" if peak is None else f"{peak / 2**20:.1f} MiB"
        text = f"peak memory over {v.window:g}s = {shown}, margin {v.margin:.0%}"
        if self._jumps is not None:
            text += (f", plus {v.spike:g} x the largest jump over the usual level "
                     f"beyond {v.jitter:.0%} ({self._jump(now):.0%})")
        return text


DEFAULT_CPU_VARIANTS = (
    CpuVariant("cpu-p95-6h", half_life=6 * 3600.0, percentile=95.0, margin=0.1),
    CpuVariant("cpu-p98-12h", half_life=12 * 3600.0, percentile=98.0, margin=0.1),
    CpuVariant("cpu-p90-1h", half_life=3600.0, percentile=90.0, margin=0.15),
    CpuVariant("cpu-p99-24h", half_life=24 * 3600.0, percentile=99.0, margin=0.05),
)
DEFAULT_MEMORY_VARIANTS = (
    MemoryVariant("mem-peak-24h", window=24 * 3600.0, margin=0.1),
    MemoryVariant("mem-peak-72h", window=72 * 3600.0, margin=0.05),
    MemoryVariant("mem-peak-48h", window=48 * 3600.0, margin=0.15),
)
"""Variants the meta-recommender chooses among by default: fast CPU decay follows
change quickly (and pays more margin for it); slow decay is steadier. Memory
windows are at least a day: a shorter one follows the daily cycle down at night
and up by day (each move a rolling restart) and forgets yesterday's spike (the
1 h and 6 h windows were dropped for that, on the fleet benchmark's training seed:
docs/autopilot.md). A `spread` variant is not among the defaults: on that seed the
meta-recommender with it chose no better and left more slack (the benchmark shows
it alone)."""
