"""Feeding the autopilot: read the usage samples of the apps it follows from the
master's usage store (`POST /usage/query`, docs/usage-store.md), every step.

The service framework and the master meet only over the network: this asks the
leading master (the one the driver is subscribed to) the same SQL an operator
could. Each poll asks for the rows after the newest one already read, so a sample
is fed once; a poll that hits its row limit is followed at once by the next, until
the feed has caught up. A new leader first reads back `history` seconds of
samples (what the store still holds of them): the autopilot's evidence lives in
memory, and without them a failover would start every app's warmup afresh and
forget the peaks of the last day. A failed poll (no master, store off, a timeout) is
logged, counted and retried at the next step: the autopilot then simply has
fewer samples, and never acts on stale ones.

Limit: rows that reach the store out of time order by more than a poll (a
backlog in its writer) can be skipped. Samples are the master's, so times are
the master's clock.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from frameworks.service.rightsizing import Sample
from frameworks.service.runtime import ServiceRuntime
from frameworks.service.store import StoreError

log = logging.getLogger(__name__)

ROWS_PER_POLL = 5000
TIMEOUT = 10.0


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def samples_sql(framework_id: str, app_ids: list[str], after_us: int) -> str:
    """The usage rows of these apps of this framework newer than `after_us`
    (microseconds since the epoch: exact, so the last row read is never read again)."""
    apps = ", ".join(_quoted(a) for a in app_ids)
    return ("SELECT app, epoch_us(ts) AS at_us, cpus_used, mem_rss_bytes, task_id, "
            "mem_limit_bytes, cpus_throttled_secs FROM task_usage "
            f"WHERE framework_id = {_quoted(framework_id)} AND app IN ({apps}) "
            f"AND epoch_us(ts) > {int(after_us)} ORDER BY ts")


class UsageFeed:
    """Polls the master for the runtime's followed apps while it runs."""

    def __init__(self, runtime: ServiceRuntime, interval: float, history: float = 0.0) -> None:
        self.runtime = runtime
        self.interval = interval
        self.after_us = int((runtime.clock.now() - max(interval, history)) * 1e6)

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    while await self.poll(http) >= ROWS_PER_POLL:
                        await asyncio.sleep(0)  # a backlog (the history): on, letting others run
                except StoreError:
                    return  # the runtime stopped; on_fatal has reported it
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    self._failed("reading usage from the master failed: %s",
                                 exc or type(exc).__name__)
                except Exception:  # the shell boundary: a bug here must not stop polling
                    self._failed("a usage poll failed", exc_info=True)

    def _failed(self, text: str, *args: Any, exc_info: bool = False) -> None:
        self.runtime.rightsizing.counters["autopilot_poll_failures"] += 1
        log.warning("autopilot: " + text, *args, exc_info=exc_info)

    async def poll(self, http: aiohttp.ClientSession) -> int:
        """One poll; returns how many samples it fed."""
        runtime = self.runtime
        apps = runtime.rightsizing.followed()
        framework_id = runtime.core.framework_id
        if not apps or not framework_id or runtime.master_url is None:
            return 0
        body = {"sql": samples_sql(framework_id, apps, self.after_us),
                "max_rows": ROWS_PER_POLL}
        async with http.post(f"{runtime.master_url}/usage/query", json=body) as response:
            answer: Any = await response.json()
            if response.status != 200:
                raise ValueError(f"{response.status}: {answer.get('error', answer)}")
        rows = answer["rows"]
        if rows:
            self.after_us = max(self.after_us, int(rows[-1][1]))
            runtime.sampled([Sample(app, at_us / 1e6, float(cpus), float(mem), task,
                                    float(limit or 0), float(throttled or 0))
                             for app, at_us, cpus, mem, task, limit, throttled in rows])
        return len(rows)
