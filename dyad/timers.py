"""One timer table for every shell.

A pure core asks for time with `ArmTimer(key, at)` / `CancelTimer(key)` and hears
back `TimerFired(key)`; this table is the shell's half of that contract, written
once so that the master, the agent, the drivers and the framework shells agree on
what re-arming and cancelling mean:

- arming a key that is armed replaces it (one pending timer per key);
- cancelling a key that is not armed is a no-op (a core may cancel defensively);
- a key fires at most once, and is forgotten before `fire` is called, so the
  core may re-arm the same key from inside its handling of `TimerFired`.

`at` is in the injected clock's seconds; only its distance from `now()` turns into
loop time, so a wall clock and a monotonic loop never need to agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

from dyad.effects import ArmTimer, CancelTimer


class TimerTable:
    """The armed timers of one shell. `fire(key)` runs on the event loop when a
    timer comes due; `now()` reads the clock the core's `at` values come from."""

    def __init__(self, now: Callable[[], float], fire: Callable[[Hashable], None],
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._now = now
        self._fire = fire
        self._loop = loop
        self._armed: dict[Hashable, asyncio.TimerHandle] = {}

    def perform(self, effect: ArmTimer | CancelTimer) -> None:
        if isinstance(effect, ArmTimer):
            self.arm(effect.key, effect.at)
        else:
            self.cancel(effect.key)

    def arm(self, key: Hashable, at: float) -> None:
        self.cancel(key)
        loop = self._loop or asyncio.get_running_loop()
        delay = max(0.0, at - self._now())
        self._armed[key] = loop.call_later(delay, self._due, key)

    def cancel(self, key: Hashable) -> None:
        handle = self._armed.pop(key, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        for handle in self._armed.values():
            handle.cancel()
        self._armed.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._armed

    def __len__(self) -> int:
        return len(self._armed)

    def _due(self, key: Hashable) -> None:
        self._armed.pop(key, None)
        self._fire(key)
