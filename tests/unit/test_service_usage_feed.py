"""The autopilot's usage feed (frameworks/service/usage_feed.py) against a real HTTP
server on loopback standing in for the master's `POST /usage/query`: a new leader
reads `history` back, samples and OOM kills in the order they happened, and a
backlog is read poll after poll, not one poll a step."""

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

    def recalled(self, kill: Any) -> None:
        self.fed.append(kill)


def master(rows: list[list[Any]], kills: list[list[Any]],
           asked: list[tuple[int, float]]) -> web.Application:
    """`POST /usage/query` answering the feed's two questions from these rows:
    samples (recording each poll's start and when it came) and OOM kills."""
    async def query(request: web.Request) -> web.Response:
        body = await request.json()
        after = int(re.search(r"epoch_us\(ts\) > (\d+)", body["sql"])[1])
        if "FROM task_events" in body["sql"]:
            assert "REASON_CONTAINER_LIMITATION_MEMORY" in body["sql"]
            return web.json_response({"columns": [], "rows": [k for k in kills if k[1] > after]})
        asked.append((after, asyncio.get_running_loop().time()))
        newer = [r for r in rows if r[1] > after][:body["max_rows"]]
        return web.json_response({"columns": [], "rows": newer})

    app = web.Application()
    app.router.add_post("/usage/query", query)
    return app


async def test_a_new_leader_reads_its_history_back_poll_after_poll() -> None:
    # Twelve thousand rows over the last half hour, one every 0.15 s.
    rows = [["/web", int((NOW - 1800 + i * 0.15) * 1e6), 0.1, 50e6, "t1", 0, 0]
            for i in range(12_000)]
    asked: list[tuple[int, float]] = []
    async with TestServer(master(rows, [], asked)) as server:
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


async def test_kills_are_read_back_and_fed_among_the_samples_at_their_time() -> None:
    # 12,000 samples over the last half hour; three kills: before the first sample,
    # amid the second poll's rows, and after the last sample.
    rows = [["/web", int((NOW - 1800 + i * 0.15) * 1e6), 0.1, 50e6, "t1", 0, 0]
            for i in range(12_000)]
    kills = [["/web", int((NOW - 1900) * 1e6), "t0", 128 * 2**20],
             ["/web", int((NOW - 1000) * 1e6), "t1", 192 * 2**20],
             ["/web", int((NOW - 0.05) * 1e6), "t2", 288 * 2**20]]
    async with TestServer(master(rows, kills, [])) as server:
        runtime = FakeRuntime(str(server.make_url("")).rstrip("/"))
        feed = usage_feed.UsageFeed(runtime, interval=0.5, history=HISTORY)  # type: ignore[arg-type]
        running = asyncio.create_task(feed.run())
        try:
            await wait_for(lambda: len(runtime.fed) == len(rows) + len(kills), 10,
                           "the history read")
        finally:
            running.cancel()
    fed = runtime.fed
    assert [f.at for f in fed] == sorted(f.at for f in fed)  # as they happened
    recalled = [f for f in fed if isinstance(f, usage_feed.Kill)]
    assert [(k.task_id, k.mem_limit_bytes) for k in recalled] == [
        ("t0", 128 * 2**20), ("t1", 192 * 2**20), ("t2", 288 * 2**20)]
    assert fed[0] is recalled[0] and fed[-1] is recalled[-1]
