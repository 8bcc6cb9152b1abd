"""The largest value seen in the last `window` seconds, in O(1) amortised per sample.

A deque holds only samples that could still become the peak: each is larger than
every sample after it, so the front is the peak and expired samples leave from the
front. A sample older than the newest one is filed at the newest one's time: it then
lives a little longer than it should, which errs on the side of a higher peak (more
memory), never a lower one.
"""

from __future__ import annotations

import math
from collections import deque


class SlidingPeak:
    def __init__(self, window: float) -> None:
        if not window > 0:
            raise ValueError(f"window must be positive, not {window}")
        self.window = window
        self._candidates: deque[tuple[float, float]] = deque()
        self._newest = -math.inf
        self.samples = 0

    def add(self, at: float, value: float) -> None:
        if not (math.isfinite(at) and math.isfinite(value) and value >= 0):
            raise ValueError(f"bad sample: value={value!r} at={at!r}")
        at = max(at, self._newest)
        self._newest = at
        while self._candidates and self._candidates[-1][1] <= value:
            self._candidates.pop()
        self._candidates.append((at, value))
        self.samples += 1

    def peak(self, now: float) -> float | None:
        """The largest value added within ``[now - window, now]`` (None if none)."""
        horizon = now - self.window
        while self._candidates and self._candidates[0][0] < horizon:
            self._candidates.popleft()
        return self._candidates[0][1] if self._candidates else None
