"""What the agent's log says of runs starting and ending.

Each launch and each end is a DEBUG line (the run's executor, framework, pid,
sandbox, exit status), and every `SUMMARY_INTERVAL` in which any happened an INFO
line counts them. An end that is not a clean exit (a non-zero status, a signal,
an unknown status) stays an INFO line of its own. A line per launch and per end
at INFO cost the agent's event loop about 22 us each (12% of it under a flood
of 500 tasks). What a task did is still found without DEBUG: its status updates
(`TASK_RUNNING`, then its end with the command's exit status) go to the master
and its framework, and the agent's ``/state`` shows each executor's sandbox,
pid and exit status.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

from agent.model import RunKey

SUMMARY_INTERVAL = 10.0  # seconds

CallLater = Callable[[float, Callable[[], None]], Any]


class RunLog:
    """`call_later(delay, callback)` arms the summary (the loop's, in the shell)."""

    def __init__(self, log: logging.Logger, call_later: CallLater,
                 interval: float = SUMMARY_INTERVAL) -> None:
        self._log = log
        self._call_later = call_later
        self._interval = interval
        self._counts: Counter[str] = Counter()
        self._armed = False

    def launched(self, key: RunKey, pid: int, directory: str, isolation: str) -> None:
        self._log.debug("launched executor %s of framework %s: pid %d in %s (%s)", key[1],
                        key[0], pid, directory, isolation)
        self._count("launched")

    def ended(self, key: RunKey, pid: int, status: int) -> None:
        level = logging.DEBUG if status == 0 else logging.INFO
        self._log.log(level, "executor %s of framework %s (pid %d) ended with status %d",
                      key[1], key[0], pid, status)
        self._count("ended" if status == 0 else "ended otherwise")

    def _count(self, what: str) -> None:
        self._counts[what] += 1
        if not self._armed:
            self._armed = True
            self._call_later(self._interval, self.flush)

    def flush(self) -> None:
        """Log what was counted since the last summary (also at the agent's stop)."""
        self._armed = False
        counts, self._counts = self._counts, Counter()
        if counts:
            self._log.info("runs in the last %gs: %d launched, %d ended with status 0, %d "
                           "otherwise", self._interval, counts["launched"], counts["ended"],
                           counts["ended otherwise"])
