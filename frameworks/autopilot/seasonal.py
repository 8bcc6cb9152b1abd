"""Memory by the clock: what an app used at the same time of day on previous days.

A window's peak holds a memory limit at the top of an app's daily cycle all day,
so an app whose memory swings by a tenth over the day leaves about a tenth of its
limit idle at the trough. `Seasonal` keeps the peak of each `BIN` of the window
(of all samples and of the calm ones, those that were no jump) and answers, for
the *block* of the day that holds `now` (blocks of `block` seconds from midnight,
UTC) and `lead` seconds after it, the peak of the same clock times on the
previous days. A limit set from it holds for the whole block and past its end
while a raise may wait (`Config.min_interval`), and moves at most about once a
block: each move is a rolling restart of the app's tasks.

Only samples already seen are read (the bins a day or more before the block's
clock times), never a model of the app: a cycle it has not shown yet is no room.
"""

from __future__ import annotations

import math
from collections import deque

DAY = 86_400.0
BIN = 900.0
"""Seconds: the clock is kept in quarter hours."""
_BINS_A_DAY = int(DAY / BIN)


class Seasonal:
    def __init__(self, window: float, block: float, lead: float) -> None:
        if not (BIN <= block and lead >= 0 and block + lead <= DAY):
            raise ValueError(f"block {block} and lead {lead} must fit in a day, block "
                             f"at least {BIN}")
        self.window, self.block, self.lead = window, block, lead
        self._bins: dict[int, list[float]] = {}  # bin -> [peak, calm peak]
        self._order: deque[int] = deque()  # the bins held, oldest first
        self._newest = -math.inf
        self._late = 0  # samples filed under a bin before the newest: answers move
        self._answer: tuple[tuple[float, int, int], tuple[float, float] | None] | None = None

    def add(self, at: float, value: float, calm: bool) -> None:
        index = math.floor(at / BIN)
        if index < self._newest:
            self._late += 1
        self._newest = max(self._newest, index)
        peaks = self._bins.get(index)
        if peaks is None:
            peaks = self._bins[index] = [0.0, 0.0]
            self._order.append(index)
        peaks[0] = max(peaks[0], value)
        if calm:
            peaks[1] = max(peaks[1], value)
        oldest = math.floor((at - self.window) / BIN)
        while self._order and self._order[0] < oldest:
            del self._bins[self._order.popleft()]

    def span(self, now: float) -> tuple[float, float]:
        """The block holding `now`, from its start to its end plus the lead."""
        midnight = math.floor(now / DAY) * DAY
        start = midnight + math.floor((now - midnight) / self.block) * self.block
        return start, min(start + self.block, midnight + DAY) + self.lead

    def ahead(self, now: float) -> tuple[float, float] | None:
        """(peak, calm peak) of the previous days' samples within the window at the
        clock times of `span(now)`; None while some quarter hour of it has no sample
        on any previous day (no evidence: the caller keeps its window's peak)."""
        start, end = self.span(now)
        key = (start, math.floor(now / BIN), self._late)  # bins leave the window by the bin
        if self._answer is not None and self._answer[0] == key:
            return self._answer[1]
        oldest = math.floor((now - self.window) / BIN)
        peak = calm = 0.0
        answer: tuple[float, float] | None = None
        for index in range(math.floor(start / BIN), math.ceil(end / BIN)):
            seen = False
            past = index - _BINS_A_DAY
            while past >= oldest:
                peaks = self._bins.get(past)
                if peaks is not None:
                    seen = True
                    peak, calm = max(peak, peaks[0]), max(calm, peaks[1])
                past -= _BINS_A_DAY
            if not seen:
                break
        else:
            answer = (peak, calm)
        self._answer = (key, answer)
        return answer
