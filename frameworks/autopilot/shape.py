"""The shape of an app's calm memory (its samples that were no jump): how fast it
climbs (`Drift`) and how far it swings in a day (`Swing`).

`Drift`: how much the window's peak rose over the last `span` seconds (the time a
limit set now must hold before it may change again, `Config.min_interval`). A
limit at the window's peak plus a small margin holds an app whose usage stays
under its old peak (a daily cycle below yesterday's top, steady use): its peak
does not rise. One that is setting new peaks (growth, a leak, a cycle higher than
yesterday's) may climb past a small margin before the limit may move again; it
gets room for one more span's rise.

`Swing`: the ratio of the day's highest calm sample to its lowest, less 1, put in
a doubling class (`swing_class`): apps whose memory swings alike, a daily cycle of
some size or steady use, are alike enough to share what the fleet says about the
first jumps of apps like them (`fleet.FleetJumps.first_jump_rate`).
"""

from __future__ import annotations

import math
from collections import deque

from frameworks.autopilot.window import SlidingPeak


class Drift:
    def __init__(self, span: float) -> None:
        self.span = span
        self._peaks: deque[tuple[float, float]] = deque()  # (at, the window's peak then)
        self._first: float | None = None

    def add(self, at: float, peak: float) -> None:
        """The window's peak after a sample at `at`."""
        if self._first is None:
            self._first = at
        peaks = self._peaks
        # Keep one entry at or before `at - span`: the peak a span ago.
        while len(peaks) > 1 and peaks[1][0] <= at - self.span:
            peaks.popleft()
        peaks.append((at, peak))

    def rise(self) -> float | None:
        """How much the peak rose over the last span (0 if it did not); None until
        the peak a span ago rests on a span of samples itself (an app's first span
        is its climb from nothing: no trend)."""
        if len(self._peaks) < 2 or self._first is None:
            return None
        (then, old), (now, new) = self._peaks[0], self._peaks[-1]
        if now - then < self.span or then - self._first < self.span:
            return None
        return max(0.0, new / old - 1) if old > 0 else None


SWING_WINDOW = 86_400.0
"""A day: the swing of a daily cycle."""
SWING_UNIT = 0.01
"""Swing classes double from here: under 1%, 1-2%, 2-4%, 4-8%, ..."""


def swing_class(swing: float) -> int:
    """0 for a swing under `SWING_UNIT`, then one class per doubling."""
    if not swing >= SWING_UNIT:
        return 0
    return 1 + int(math.floor(math.log2(swing / SWING_UNIT)))


class Swing:
    def __init__(self, window: float = SWING_WINDOW) -> None:
        self._high = SlidingPeak(window)
        self._inverse_low = SlidingPeak(window)  # 1 / the lowest sample of a byte or more

    def add(self, at: float, value: float) -> None:
        """A calm sample, in bytes. One under a byte is no evidence of a low (memory
        comes in whole bytes), and its inverse could overflow."""
        if value >= 1:
            self._high.add(at, value)
            self._inverse_low.add(at, 1.0 / value)

    def swing(self, now: float) -> float:
        """The window's highest calm sample over its lowest, less 1 (0 if none)."""
        high, inverse_low = self._high.peak(now), self._inverse_low.peak(now)
        if high is None or inverse_low is None:
            return 0.0
        return max(0.0, high * inverse_low - 1)  # one sample: x * (1/x) may round under 1
