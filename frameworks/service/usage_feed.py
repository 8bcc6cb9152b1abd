"""Feeding the autopilot: read the usage samples of the apps it follows from the
master's usage store (`POST /usage/query`, docs/usage-store.md), every step.

The service framework and the master meet only over the network: this asks the
leading master (the one the driver is subscribed to) the same SQL an operator
could. Each poll asks for the rows after the newest one already read, so a sample
is fed once; a poll that hits its row limit is followed at once by the next, until
the feed has caught up. A new leader first reads back `history` seconds of
samples (what the store still holds of them), and the OOM kills among the
apps' `task_events` since then, each fed among the samples at its time, as the
old leader heard it: the autopilot's evidence lives in memory, and without them a
failover would start every app's warmup afresh, forget the peaks of the last day,
and let a memory limit raised after a kill be cut before its hold ends. A failed
poll (no master, store off, a timeout) is
logged, counted and retried at the next step: the autopilot then simply has
fewer samples, and never acts on stale ones.

Limit: rows that reach the store out of time order by more than a poll (a
backlog in its writer) can be skipped. Samples are the master's, so times are
the master's clock.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from typing import Any

import aiohttp

from dyad.messages import Reason
from frameworks.service.rightsizing import Kill, Sample
from frameworks.service.runtime import ServiceRuntime
from frameworks.service.store import StoreError

log = logging.getLogger(__name__)

ROWS_PER_POLL = 5000
TIMEOUT = 10.0


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _of_apps(framework_id: str, app_ids: list[str], after_us: int) -> str:
    """The WHERE clause both questions share: these apps of this framework, rows
    newer than `after_us` (microseconds since the epoch: exact, so the last row
    read is never read again)."""
    apps = ", ".join(_quoted(a) for a in app_ids)
    return (f"WHERE framework_id = {_quoted(framework_id)} AND app IN ({apps}) "
            f"AND epoch_us(ts) > {int(after_us)}")


def samples_sql(framework_id: str, app_ids: list[str], after_us: int) -> str:
    """The usage rows of these apps of this framework newer than `after_us`."""
    return ("SELECT app, epoch_us(ts) AS at_us, cpus_used, mem_rss_bytes, task_id, "
            "mem_limit_bytes, cpus_throttled_secs FROM task_usage "
            f"{_of_apps(framework_id, app_ids, after_us)} ORDER BY ts")


def kills_sql(framework_id: str, app_ids: list[str], after_us: int) -> str:
    """The OOM kills of these apps of this framework since `after_us`."""
    return ("SELECT app, epoch_us(ts) AS at_us, task_id, mem_bytes FROM task_events "
            f"{_of_apps(framework_id, app_ids, after_us)} "
            f"AND reason = {_quoted(Reason.CONTAINER_LIMITATION_MEMORY)} ORDER BY ts")


class UsageFeed:
    """Polls the master for the runtime's followed apps while it runs."""

    def __init__(self, runtime: ServiceRuntime, interval: float, history: float = 0.0) -> None:
        self.runtime = runtime
        self.interval = interval
        self.after_us = int((runtime.clock.now() - max(interval, history)) * 1e6)
        self.kills: list[Kill] | None = None  # read back, not yet fed (None: not read)

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
        url = f"{runtime.master_url}/usage/query"
        if self.kills is None:  # a new leader: first the kills since the history's start
            rows = await _ask(http, url, kills_sql(framework_id, apps, self.after_us))
            self.kills = [Kill(app, at_us / 1e6, task, int(mem or 0))
                          for app, at_us, task, mem in rows]
        rows = await _ask(http, url, samples_sql(framework_id, apps, self.after_us))
        samples = [Sample(app, at_us / 1e6, float(cpus), float(mem), task,
                          float(limit or 0), float(throttled or 0))
                   for app, at_us, cpus, mem, task, limit, throttled in rows]
        if rows:
            self.after_us = max(self.after_us, int(rows[-1][1]))
        self._feed(samples, caught_up=len(rows) < ROWS_PER_POLL)
        return len(rows)

    def _feed(self, samples: list[Sample], caught_up: bool) -> None:
        """The samples, with each kill read back among them at its time (the kills
        after the last sample once the feed has caught up)."""
        kills = self.kills or []
        start = 0
        while kills and (caught_up or (samples and kills[0].at <= samples[-1].at)):
            kill = kills.pop(0)
            end = bisect.bisect_right(samples, kill.at, lo=start, key=lambda s: s.at)
            if end > start:
                self.runtime.sampled(samples[start:end])
            self.runtime.recalled(kill)
            start = end
        if start < len(samples):
            self.runtime.sampled(samples[start:])


async def _ask(http: aiohttp.ClientSession, url: str, sql: str) -> list[list[Any]]:
    async with http.post(url, json={"sql": sql, "max_rows": ROWS_PER_POLL}) as response:
        answer: Any = await response.json()
        if response.status != 200:
            raise ValueError(f"{response.status}: {answer.get('error', answer)}")
    return answer["rows"]
