"""Usage histograms whose samples fade: the recent past counts more than the old.

A sample added at time `t` carries weight ``w * 2 ** (t / half_life)``: relative to
any later sample its weight halves every `half_life` seconds. Because the decay is
exponential, the ratio between two samples' weights never changes as time passes,
so a percentile does not depend on "now" and nothing has to be rescanned to age the
histogram. Weights are kept relative to a reference time that moves forward (and
rescales every bucket) before the exponent could overflow a float.

Buckets are geometric (each bound `ratio` times the one below), so a percentile is
answered within a relative error of `ratio - 1` over a range of many decades with a
few hundred buckets. A percentile is the *upper* bound of the bucket it falls in,
never less than the exact weighted percentile of the samples: a limit taken from it
errs towards room, not towards throttling.
"""

from __future__ import annotations

import math

import attrs

_MAX_EXPONENT = 64.0
"""Rescale once the newest weight would exceed 2**64 times the reference weight."""


@attrs.frozen
class Scale:
    """Bucket layout: values up to `low` share bucket 0; above `high`, the last."""

    low: float = attrs.field(validator=attrs.validators.gt(0.0))
    high: float = attrs.field()
    ratio: float = attrs.field(default=1.05, validator=attrs.validators.gt(1.0))
    # Derived once, not per sample: index() runs for every sample of every variant.
    _log_ratio: float = attrs.field(init=False, eq=False, repr=False)
    _last: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_log_ratio", math.log(self.ratio))
        object.__setattr__(self, "_last", self.buckets - 1)

    @high.validator
    def _above_low(self, _attribute: attrs.Attribute, value: float) -> None:
        if not value > self.low:
            raise ValueError(f"high ({value}) must exceed low ({self.low})")

    @property
    def buckets(self) -> int:
        return math.ceil(math.log(self.high / self.low) / math.log(self.ratio)) + 2

    def index(self, value: float) -> int:
        if value <= self.low:
            return 0
        i = math.ceil(math.log(value / self.low) / self._log_ratio)
        # Float rounding can put a value just past its bucket's bound: nudge it up.
        while self.bound(i) < value:
            i += 1
        return min(i, self._last)

    def bound(self, index: int) -> float:
        """Upper bound of bucket `index` (the last bucket is unbounded)."""
        return self.low * self.ratio ** index


class DecayingHistogram:
    """A weighted histogram of non-negative values with exponentially decaying weights."""

    def __init__(self, scale: Scale, half_life: float) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be positive, not {half_life}")
        self.scale = scale
        self.half_life = half_life
        self._weights = [0.0] * scale.buckets
        self._last = len(self._weights) - 1  # the unbounded bucket
        self._reference: float | None = None
        self._maximum = 0.0  # what the unbounded last bucket answers
        self._lowest = scale.buckets  # no weight below this bucket: scans start here
        self._answers: dict[float, float | None] = {}  # percentiles since the last add
        self.samples = 0

    def add(self, at: float, value: float, weight: float = 1.0) -> None:
        if not (math.isfinite(value) and value >= 0 and math.isfinite(at)
                and weight > 0 and math.isfinite(weight)):
            raise ValueError(f"bad sample: value={value!r} at={at!r} weight={weight!r}")
        if self._reference is None:
            self._reference = at
        exponent = (at - self._reference) / self.half_life
        if exponent > _MAX_EXPONENT:
            self._rebase(at)
            exponent = 0.0
        index = self.scale.index(value)
        self._weights[index] += weight * 2.0 ** exponent
        self._lowest = min(self._lowest, index)
        self._answers.clear()
        if index == self._last:
            self._maximum = max(self._maximum, value)
        self.samples += 1

    def _rebase(self, at: float) -> None:
        assert self._reference is not None
        factor = 2.0 ** (-(at - self._reference) / self.half_life)
        # Weights that underflow to 0 are samples older than ~1000 half-lives: gone.
        self._weights = [w * factor for w in self._weights]
        self._reference = at
        self._answers.clear()

    def weight(self, now: float) -> float:
        """Total decayed weight seen from `now` (a sample of weight 1 at `now` adds 1)."""
        if self._reference is None:
            return 0.0
        return sum(self._weights) * 2.0 ** ((self._reference - now) / self.half_life)

    def percentile(self, p: float) -> float | None:
        """The smallest bucket bound at or below which lies `p` percent of the weight
        (None while empty). `p` is in (0, 100]."""
        if p in self._answers:  # a policy asks the same one several times per step
            return self._answers[p]
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], not {p}")
        answer = self._answers[p] = self._percentile(p)
        return answer

    def _percentile(self, p: float) -> float | None:
        total = sum(self._weights)
        if total <= 0:
            return None
        # A relative tolerance, so float sums never skip the bucket that holds it.
        threshold = total * p / 100.0 * (1 - 1e-12)
        running = 0.0
        weights, last = self._weights, self._last
        # Buckets below the lowest ever used hold 0: skipping them changes no sum.
        for index in range(self._lowest, last + 1):
            w = weights[index]
            running += w
            if running >= threshold and w > 0:
                return self._maximum if index == last else self.scale.bound(index)
        return self._maximum if weights[last] > 0 else self._top_bound()

    def _top_bound(self) -> float:
        top = max(i for i, w in enumerate(self._weights) if w > 0)
        return self.scale.bound(top)
