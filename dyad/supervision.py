"""Keeping a shell's long-running asyncio tasks alive, and its log readable under abuse.

A receive loop that dies silently cuts every peer off while the process looks
healthy. So the shells (master, agent, framework drivers) run their long-running
tasks under a `Supervisor`: a task that raises is logged with its traceback and
counted; a loop is started again after a short pause, while a loop that dies more
than `max_restarts` times within `window` seconds (a bug that hits every input
will not go away by restarting), or a one-shot task that fails, is fatal: the
owner's `on_fatal(reason)` decides (the master steps down, the agent and a driver
exit non-zero, so whatever supervises the process starts a fresh one). `down()`
names the loops not running, which `/health` reports.

`LogLimiter` keeps one noisy peer (a fuzzer, a broken agent) from flooding the
log: at most one line per key per interval, saying how many were held back, and
remembering a bounded number of keys so a flood of identities cannot grow it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine, Hashable
from typing import Any

log = logging.getLogger(__name__)

RESTART_DELAY = 0.1
"""Seconds before a dead loop runs again: long enough not to spin on a bug that
fires at once, short enough that peers barely notice."""
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
"""More than `MAX_RESTARTS` deaths of one loop within this many seconds is fatal."""

Factory = Callable[[], Coroutine[Any, Any, None]]


class Supervisor:
    """A shell's tasks. `count()` is called once per death (the owner's error
    counter); `on_fatal(reason)` once per task that cannot go on."""

    def __init__(self, on_fatal: Callable[[str], None], count: Callable[[], None] = lambda: None,
                 *, logger: logging.Logger = log, restart_delay: float = RESTART_DELAY,
                 max_restarts: int = MAX_RESTARTS, window: float = RESTART_WINDOW,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._on_fatal = on_fatal
        self._count = count
        self._log = logger
        self._restart_delay = restart_delay
        self._max_restarts = max_restarts
        self._window = window
        self._now = now
        self._tasks: list[asyncio.Task[None]] = []
        self._loops: set[str] = set()  # names that must keep running
        self._running: set[str] = set()
        self.restarts = 0

    def loop(self, name: str, factory: Factory) -> None:
        """Run `factory()` until it returns (the loop is then done, and down if
        still expected); start it again whenever it raises."""
        self._loops.add(name)
        self._start(name, factory, restart=True)

    def once(self, name: str, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run `coroutine` once; if it raises, that is fatal."""
        self._start(name, lambda: coroutine, restart=False)

    def down(self) -> list[str]:
        """The loops that should be running and are not (ended, given up on, or
        pausing before a restart)."""
        return sorted(self._loops - self._running)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    def cancel(self, *names: str) -> None:
        """Cancel the tasks called `names` (all tasks if none is given), except
        the one calling; they are no longer expected to run."""
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current and (not names or task.get_name() in names):
                task.cancel()
        self._loops -= set(names) if names else self._loops

    async def stop(self) -> None:
        """Cancel every task and wait until they are gone."""
        self.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _start(self, name: str, factory: Factory, restart: bool) -> None:
        task = asyncio.create_task(self._run(name, factory, restart), name=name)
        self._tasks.append(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    async def _run(self, name: str, factory: Factory, restart: bool) -> None:
        deaths: collections.deque[float] = collections.deque()
        while True:
            self._running.add(name)
            try:
                await factory()
                return
            except Exception:
                self._log.exception("%s died", name)
                self._count()
            finally:
                self._running.discard(name)
            now = self._now()
            deaths.append(now)
            while deaths[0] < now - self._window:
                deaths.popleft()
            if not restart or len(deaths) > self._max_restarts:
                reason = f"{name} failed" + (
                    f" {len(deaths)} times in {self._window:g} s" if restart else "")
                self._log.critical("giving up: %s", reason)
                self._on_fatal(reason)
                return
            self.restarts += 1
            self._log.warning("restarting %s in %g s", name, self._restart_delay)
            await asyncio.sleep(self._restart_delay)


class LogLimiter:
    """At most one log line per key (a peer, a route) per `interval` seconds.
    Remembers at most `max_keys` keys (the oldest are forgotten)."""

    def __init__(self, logger: logging.Logger = log, interval: float = 10.0,
                 max_keys: int = 10_000, now: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._interval = interval
        self._max_keys = max_keys
        self._now = now
        self._last: collections.OrderedDict[Hashable, tuple[float, int]] = \
            collections.OrderedDict()
        self.suppressed = 0

    def allow(self, key: Hashable) -> int | None:
        """None: stay quiet. Otherwise log now; the number is how many lines for
        `key` were held back since the last one."""
        now = self._now()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._interval:
            self._last[key] = (last[0], last[1] + 1)
            self.suppressed += 1
            return None
        self._last.pop(key, None)
        self._last[key] = (now, 0)
        while len(self._last) > self._max_keys:
            self._last.popitem(last=False)
        return last[1] if last is not None else 0

    def log(self, key: Hashable, level: int, text: str, *args: Any,
            exc_info: bool = False) -> None:
        """`logger.log(level, text, *args)` unless `key` was logged lately; the
        line says how many were held back."""
        held = self.allow(key)
        if held is not None:
            suffix = f" ({held} more since the last report)" if held else ""
            self._log.log(level, text + suffix, *args, exc_info=exc_info)

    def exception(self, key: Hashable, text: str, *args: Any) -> None:
        """`logger.exception(text, *args)`, limited as `log`."""
        self.log(key, logging.ERROR, text, *args, exc_info=True)
