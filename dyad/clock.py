"""Injected time. Cores take `now` as an argument; shells read it from a Clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    """Wall-clock seconds: timestamps in status updates must mean something to users,
    and our timeouts are seconds long, so the rare NTP step is tolerable."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to; for deterministic tests of timeouts."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._now += seconds
        return self._now
