"""Counters and a sliding-window percentile, kept by the master's pure core.

Counters only go up (operators compute rates from them); gauges are not stored at
all -- `MasterState.metrics()` derives them from its records at read time, so they
can never drift from the truth. The window keeps the last N samples of something
timed (an allocation run) and answers percentiles by nearest rank, which is exact
for the samples it holds and cheap enough to compute on every `/metrics/snapshot`.
"""

from __future__ import annotations

import math
from collections import Counter, deque


class Counters:
    """Named monotonic counters; unknown names read as 0."""

    def __init__(self) -> None:
        self._values: Counter[str] = Counter()

    def inc(self, name: str, amount: int = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._values[name] += amount

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def items(self) -> dict[str, int]:
        return dict(self._values)


class Window:
    """The last `size` samples of a measurement, with its percentiles."""

    def __init__(self, size: int = 1000) -> None:
        if size <= 0:
            raise ValueError("window size must be positive")
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self._samples.append(value)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def last(self) -> float:
        return self._samples[-1] if self._samples else 0.0

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile (0 < p <= 100); 0.0 when there are no samples."""
        if not 0 < p <= 100:
            raise ValueError("percentile must be in (0, 100]")
        if not self._samples:
            return 0.0
        ordered = sorted(self._samples)
        rank = math.ceil(p / 100 * len(ordered))
        return ordered[rank - 1]
