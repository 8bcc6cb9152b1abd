"""The autopilot's usage feed (frameworks/service/usage_feed.py) against a real HTTP
server on loopback standing in for the master's `POST /usage/query`: a new leader
reads `history` back, and a backlog is read poll after poll, not one poll a step."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from frameworks.service import usage_feed
from tests.helpers import wait_for

NOW = 1_000_000.0  # the service's clock, seconds
HISTORY = 3600.0


class FakeRuntime:
    """What the feed reads and feeds: the followed apps, the framework id, where the
    master is, a clock, and where the samples go."""

    def __init__(self, url: str) -> None:
        self.rightsizing = SimpleNamespace(followed=lambda: ["/web"], counters={
            "autopilot_poll_failures": 0})
        self.core = SimpleNamespace(framework_id="fw-1")
        self.master_url = url
        self.clock = SimpleNamespace(now=lambda: NOW)
        self.fed: list[Any] = []

    def sampled(self, samples: list[Any]) -> None:
        self.fed.extend(samples)


async def test_a_new_leader_reads_its_history_back_poll_after_poll() -> None:
    # Twelve thousand rows over the last half hour, one every 0.15 s.
    rows = [["/web", int((NOW - 1800 + i * 0.15) * 1e6), 0.1, 50e6, "t1", 0, 0]
            for i in range(12_000)]
    asked: list[tuple[int, float]] = []

    async def query(request: web.Request) -> web.Response:
        body = await request.json()
        after = int(re.search(r"epoch_us\(ts\) > (\d+)", body["sql"])[1])
        asked.append((after, asyncio.get_running_loop().time()))
        newer = [r for r in rows if r[1] > after][:body["max_rows"]]
        return web.json_response({"columns": [], "rows": newer})

    app = web.Application()
    app.router.add_post("/usage/query", query)
    async with TestServer(app) as server:
        runtime = FakeRuntime(str(server.make_url("")).rstrip("/"))
        feed = usage_feed.UsageFeed(runtime, interval=0.5, history=HISTORY)  # type: ignore[arg-type]
        running = asyncio.create_task(feed.run())
        try:
            await wait_for(lambda: len(runtime.fed) == len(rows), 10, "the history read")
            first_step = list(asked)
        finally:
            running.cancel()
    assert first_step[0][0] == int((NOW - HISTORY) * 1e6)  # from the history's start
    # 5,000 + 5,000 + 2,000 rows: three polls at once, not one a step.
    assert len(first_step) == 3 and first_step[-1][1] - first_step[0][1] < 0.5
    assert [s.at for s in runtime.fed] == sorted(s.at for s in runtime.fed)
    assert len({s.at for s in runtime.fed}) == len(rows)  # each row fed once


def test_without_history_a_leader_starts_from_one_step_ago() -> None:
    feed = usage_feed.UsageFeed(FakeRuntime("http://x"), interval=300.0)  # type: ignore[arg-type]
    assert feed.after_us == int((NOW - 300.0) * 1e6)
