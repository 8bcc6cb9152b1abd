"""Keeping the master shell's loops alive, and its logs readable under abuse.

A receive loop that dies silently cuts every agent and framework off while the
process looks healthy. So every long-running task of the shell runs under a
`Supervisor`: an exception is logged with its traceback and counted; a loop is
restarted after a short pause, and a loop that keeps dying (or a one-shot task
that fails) is fatal -- the owner's `on_fatal` steps the master down, and
`dyad-master` exits non-zero for a supervisor and a standby to take over.
`down()` names the loops not running, which `/health` reports.

`LogLimiter` keeps one noisy peer (a fuzzer, a broken agent) from flooding the
log: at most one line per key per interval, saying how many were held back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

RESTART_DELAY = 0.1
"""Seconds before a dead loop runs again: long enough not to spin on a bug that
fires at once, short enough that peers barely notice."""
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
"""More than `MAX_RESTARTS` deaths of one loop within this many seconds is fatal:
a bug that hits every input will not go away by restarting."""


class Supervisor:
    """The shell's tasks. `count()` is called once per failure (the owner's
    internal-error counter); `on_fatal(reason)` when a task cannot go on."""

    def __init__(self, on_fatal: Callable[[str], None], count: Callable[[], None],
                 restart_delay: float = RESTART_DELAY) -> None:
        self._on_fatal = on_fatal
        self._count = count
        self._restart_delay = restart_delay
        self._tasks: list[asyncio.Task[None]] = []
        self._loops: set[str] = set()  # names that must keep running
        self._running: set[str] = set()
        self.restarts = 0

    def loop(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `factory()` until it returns; restart it whenever it raises."""
        self._loops.add(name)
        self._start(name, factory, restart=True)

    def once(self, name: str, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run `coroutine` once; if it raises, that is fatal."""
        self._start(name, lambda: coroutine, restart=False)

    def down(self) -> list[str]:
        """The loops that should be running and are not (dead, or pausing before
        a restart)."""
        return sorted(self._loops - self._running)

    def cancel(self, *names: str) -> None:
        """Cancel the tasks called `names` (all tasks if none is given), except
        the one calling; they are no longer expected to run."""
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current and (not names or task.get_name() in names):
                task.cancel()
        self._loops -= set(names) if names else self._loops

    async def stop(self) -> None:
        self.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _start(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]],
               restart: bool) -> None:
        self._tasks.append(asyncio.create_task(self._run(name, factory, restart), name=name))

    async def _run(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]],
                   restart: bool) -> None:
        deaths: collections.deque[float] = collections.deque()
        while True:
            self._running.add(name)
            try:
                await factory()
                return
            except Exception:
                log.exception("%s died", name)
                self._count()
            finally:
                self._running.discard(name)
            now = time.monotonic()
            deaths.append(now)
            while deaths[0] < now - RESTART_WINDOW:
                deaths.popleft()
            if not restart or len(deaths) > MAX_RESTARTS:
                self._on_fatal(f"{name} failed" + (f" {len(deaths)} times in "
                                                   f"{RESTART_WINDOW:g} s" if restart else ""))
                return
            self.restarts += 1
            log.warning("restarting %s in %g s", name, self._restart_delay)
            await asyncio.sleep(self._restart_delay)


class LogLimiter:
    """At most one log line per key (a peer) per `interval` seconds. Remembers at
    most `max_keys` keys (the oldest are forgotten), so a flood of identities
    cannot grow it without bound."""

    def __init__(self, interval: float = 10.0, max_keys: int = 10_000,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._max_keys = max_keys
        self._now = now
        self._last: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    def allow(self, key: str) -> int | None:
        """None: stay quiet. Otherwise log now; the number is how many lines for
        `key` were held back since the last one."""
        now = self._now()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._interval:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last.pop(key, None)
        self._last[key] = (now, 0)
        while len(self._last) > self._max_keys:
            self._last.popitem(last=False)
        return last[1] if last is not None else 0
