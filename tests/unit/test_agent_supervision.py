"""`agent.supervision` and `/health`: a dying loop is restarted, one that keeps
dying is given up on (the process then exits), and `/health` says 503 while any
loop is not running; repeated failures are logged once per interval."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent import supervision
from agent.http import make_app
from agent.supervision import LogLimiter, Supervisor
from tests.helpers import wait_for

log = logging.getLogger("test")


async def test_a_loop_that_dies_is_restarted_and_one_that_keeps_dying_is_given_up() -> None:
    counters: Counter[str] = Counter()
    loops = Supervisor(log, counters, restart_delay=0.0)
    runs = Counter[str]()
    healed = asyncio.Event()

    async def flaky() -> None:
        runs["flaky"] += 1
        if runs["flaky"] < 3:
            raise RuntimeError("bug")
        healed.set()
        await asyncio.Event().wait()

    async def doomed() -> None:
        runs["doomed"] += 1
        raise RuntimeError("always")

    loops.start("flaky", flaky)
    await asyncio.wait_for(healed.wait(), 5)
    assert loops.dead() == [] and not loops.failed.is_set()
    loops.start("doomed", doomed)
    await asyncio.wait_for(loops.failed.wait(), 5)
    assert loops.dead() == ["doomed"]
    assert runs["doomed"] == supervision.MAX_RESTARTS + 1
    assert counters["agent/loop_crashes"] == 2 + supervision.MAX_RESTARTS + 1
    for task in loops.tasks:
        task.cancel()
    await asyncio.gather(*loops.tasks, return_exceptions=True)


async def test_a_loop_waiting_to_restart_counts_as_dead() -> None:
    loops = Supervisor(log, Counter(), restart_delay=60.0)

    async def crash() -> None:
        raise RuntimeError("bug")

    loops.start("crash", crash)
    await wait_for(lambda: loops.dead() == ["crash"], 5, "the loop to be down")
    for task in loops.tasks:
        task.cancel()
    await asyncio.gather(*loops.tasks, return_exceptions=True)


def test_the_same_failure_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limiter = LogLimiter(log, interval=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, "test"):
        for _ in range(100):
            try:
                raise ValueError("boom")
            except ValueError:
                limiter.exception("peer-a", "bad frame")
        limiter.exception("peer-b", "bad frame")
        now[0] = 61.0
        limiter.exception("peer-a", "bad frame")
    assert len(caplog.records) == 3 and limiter.suppressed == 99


class Source:
    def __init__(self) -> None:
        self.dead: list[str] = []
        self.counters: Counter[str] = Counter()
        self.state: Any = None

    def metrics(self) -> dict[str, float]:
        return dict(self.counters)

    def drain(self) -> None:
        pass

    def dead_loops(self) -> list[str]:
        return self.dead

    def count(self, counter: str) -> None:
        self.counters[counter] += 1


async def test_health_is_503_while_a_loop_is_down_and_surprises_are_400(tmp_path: Any) -> None:
    source = Source()
    async with TestClient(TestServer(make_app(source, str(tmp_path)))) as client:
        assert (await client.get("/health")).status == 200
        source.dead = ["executor-socket"]
        resp = await client.get("/health")
        assert resp.status == 503
        assert await resp.json() == {"healthy": False, "dead_loops": ["executor-socket"]}
        # /state reads a state this source does not have: a bug, answered 400.
        resp = await client.get("/state")
        assert resp.status == 400 and (await resp.json())["error"]
        assert source.counters["agent/http_errors"] == 1
