"""Keeping the agent shell's loops alive, and its logs readable under bad input.

`LogLimiter` logs a failure at most once per key (a peer, a route) per interval
and counts the rest, so a sender repeating one bad frame cannot flood the log.

`Supervisor` runs the shell's long-running tasks (the core loop, the two receive
loops, the usage and disk watchers). A loop that ends by an exception -- a bug,
since each loop already catches what one input can throw -- is logged with its
traceback, counted, and started again after a short pause; one that dies
`MAX_RESTARTS` times within `RESTART_WINDOW` seconds is given up on, and
`failed` is set so the process exits non-zero and whatever supervises the agent
(systemd, a container runtime) starts a fresh one. While a loop is not running,
`dead()` names it, and the agent's `/health` answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from typing import Any, Callable, Coroutine, Hashable

MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
RESTART_DELAY = 0.5
LOG_INTERVAL = 60.0


class LogLimiter:
    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 10_000) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock
        self._max_keys = max_keys
        self._last: dict[Hashable, float] = {}
        self.suppressed = 0

    def exception(self, key: Hashable, message: str, *args: Any) -> None:
        """`logger.exception(message, *args)` unless `key` was logged lately."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self.suppressed += 1
            return
        if len(self._last) >= self._max_keys:  # many peers: forget who was logged
            self._last.clear()
        self._last[key] = now
        self._log.exception(message, *args)


class Supervisor:
    def __init__(self, logger: logging.Logger, counters: Counter[str],
                 restart_delay: float = RESTART_DELAY) -> None:
        self._log = logger
        self._counters = counters
        self._restart_delay = restart_delay
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restarts: dict[str, deque[float]] = {}
        self._waiting: set[str] = set()  # crashed, pausing before the restart
        self.failed = asyncio.Event()

    def start(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._tasks[name] = asyncio.create_task(self._keep(name, loop), name=name)

    def dead(self) -> list[str]:
        """Loops not running right now (crashed and waiting, or given up)."""
        return sorted(name for name, task in self._tasks.items()
                      if task.done() or name in self._waiting)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    async def _keep(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        restarts = self._restarts.setdefault(name, deque())
        while True:
            try:
                await loop()
                self._log.error("agent loop %s returned; it should run until stopped", name)
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception("agent loop %s died", name)
            self._counters["agent/loop_crashes"] += 1
            now = time.monotonic()
            restarts.append(now)
            while restarts and now - restarts[0] > RESTART_WINDOW:
                restarts.popleft()
            if len(restarts) > MAX_RESTARTS:
                self._log.critical("agent loop %s died %d times within %.0fs; giving up",
                                   name, len(restarts), RESTART_WINDOW)
                self.failed.set()
                return
            self._waiting.add(name)
            try:
                await asyncio.sleep(self._restart_delay)
            finally:
                self._waiting.discard(name)
