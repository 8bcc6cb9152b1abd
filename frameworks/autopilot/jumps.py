"""Jumps in a memory series: samples that rise quickly over the level before them.

The level is a decaying average of the samples so far (half-life `LEVEL_HALF_LIFE`):
a daily cycle or a leak moves it along, a jump within minutes stands out. A sample
more than `jitter` over its level is a jump; consecutive jump samples are one
*event* (one spike lasts several samples), whose size is its largest rise. Samples
that are no jump are *calm*: their peak is the app's usual top.

`JumpLog` keeps, within a sliding window, the calm peak and the two largest events,
which is what the memory recommenders size spike room from (`recommenders`): the
largest alone (one factor for every app), or the largest and the runner-up, whose
gap says how much bigger the next one may plausibly be (per app, from its own
jumps). Jumps count from `LEVEL_SETTLE` after the first sample, so a task's start-up
climb is none.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from frameworks.autopilot.window import SlidingPeak

LEVEL_HALF_LIFE = 900.0
"""Seconds: the level a memory jump is measured from halves the weight of samples
15 minutes old, so it keeps up with a daily cycle or a leak (a 20% daily swing
lags it by under 2%) while a jump within minutes stands out."""
LEVEL_SETTLE = 4 * LEVEL_HALF_LIFE
"""Jumps count from this long after the first sample, once the level has caught up
with the app's start (within 1/16 of a step up)."""


class JumpLog:
    def __init__(self, window: float, jitter: float) -> None:
        self.window = window
        self.jitter = jitter
        self._calm = SlidingPeak(window)
        # Events oldest first, as [time of its latest sample, size]; only those that
        # could still be among the two largest of some window are kept.
        self._events: list[list[float]] = []
        self._starts: deque[float] = deque()  # when each event in the window began
        self._open = False  # the latest sample was a jump: its event goes on
        self._level: float | None = None
        self._level_at = self._first_at = 0.0

    def add(self, at: float, value: float) -> None:
        if self._level is None:
            self._level, self._level_at, self._first_at = value, at, at
        rise = value / self._level - 1 if self._level > 0 else math.inf
        settled = at - self._first_at >= LEVEL_SETTLE
        if settled and math.isfinite(rise) and rise > self.jitter:
            self._jump(max(at, self._events[-1][0]) if self._events else at, rise)
        else:
            self._calm.add(at, value)
            self._open = False
        keep = 2.0 ** (-max(0.0, at - self._level_at) / LEVEL_HALF_LIFE)
        self._level = keep * self._level + (1 - keep) * value
        self._level_at = max(self._level_at, at)

    def _jump(self, at: float, rise: float) -> None:
        if self._open:
            event = self._events[-1]
            event[0], event[1] = at, max(event[1], rise)
            return
        self._open = True
        self._starts.append(at)
        self._events.append([at, rise])
        # An event with two later ones at least as large is never again among the
        # two largest of a window (the later ones leave it after it does).
        kept: list[list[float]] = []
        later: list[float] = []  # the two largest sizes of the events after
        for event in reversed(self._events):
            if len(later) < 2 or event[1] > later[-1]:
                kept.append(event)
                later = heapq.nlargest(2, (*later, event[1]))
        self._events = kept[::-1]

    @property
    def jumping(self) -> bool:
        """Whether the latest sample was a jump."""
        return self._open

    def calm(self, now: float) -> float:
        """The peak of the calm samples in the window (0 if none)."""
        return self._calm.peak(now) or 0.0

    def count(self, now: float) -> int:
        """How many events began within the window."""
        horizon = now - self.window
        while self._starts and self._starts[0] < horizon:
            self._starts.popleft()
        return len(self._starts)

    def largest(self, now: float) -> tuple[float, float]:
        """The two largest events' sizes in the window, largest first (0 if none)."""
        horizon = now - self.window
        while self._events and self._events[0][0] < horizon:
            self._events.pop(0)
        top = second = 0.0  # sizes are rises beyond the jitter: all above 0
        for _, size in self._events:
            if size > second:
                top, second = (size, top) if size > top else (top, size)
        return top, second
