"""`dyad.supervision` and the shells that use it: a dying loop is logged, counted
and restarted, one that keeps dying (or a failed one-shot task) is fatal, `down()`
names what is not running (the agent's `/health` answers 503 then), a noisy
peer's lines are rate-limited; and a framework driver's receive loop survives
whatever a master sends it, over a real socket."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.http import make_app
from dyad.clock import FakeClock
from dyad.messages import Rejected, Rescind
from dyad.supervision import LogLimiter, Supervisor
from frameworks import FrameworkInfo, Scheduler, SchedulerDriver
from frameworks.scheduler_core import SchedulerCore
from frameworks.testing import FakeMaster
from tests.helpers import running, wait_for

log = logging.getLogger("test")


async def test_a_dying_loop_is_counted_and_restarted() -> None:
    fatal: list[str] = []
    errors: list[int] = []
    runs = 0
    release = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise RuntimeError("boom")
        await release.wait()

    supervisor = Supervisor(fatal.append, lambda: errors.append(1), restart_delay=0.0)
    supervisor.loop("flaky", flaky)
    await wait_for(lambda: runs == 3, 5, "the third run")
    assert (len(errors), supervisor.restarts, fatal) == (2, 2, [])
    assert supervisor.down() == []
    release.set()
    await wait_for(lambda: supervisor.down() == ["flaky"], 5, "the loop to end")
    await supervisor.stop()


async def test_a_loop_that_keeps_dying_or_a_failed_one_shot_is_fatal() -> None:
    fatal: list[str] = []
    deaths: list[int] = []
    runs = Counter[str]()

    async def broken() -> None:
        runs["broken"] += 1
        raise ValueError("always")

    supervisor = Supervisor(fatal.append, lambda: deaths.append(1), restart_delay=0.0,
                            max_restarts=2)
    supervisor.loop("broken", broken)
    supervisor.once("setup", broken())
    await wait_for(lambda: len(fatal) == 2, 5, "both to be fatal")
    assert sorted(fatal) == ["broken failed 3 times in 60 s", "setup failed"]
    assert supervisor.down() == ["broken"]
    assert runs["broken"] == 3 + 1 and len(deaths) == 4
    await supervisor.stop()


async def test_deaths_outside_the_window_are_forgiven() -> None:
    clock = FakeClock(0.0)
    fatal: list[str] = []
    failures = iter(range(5))

    async def slowly_flaky() -> None:
        clock.advance(61.0)  # each death is a minute after the one before
        if next(failures, None) is not None:
            raise RuntimeError("now and then")
        await asyncio.Event().wait()

    supervisor = Supervisor(fatal.append, restart_delay=0.0, max_restarts=1, now=clock.now)
    supervisor.loop("slow", slowly_flaky)
    await wait_for(lambda: supervisor.restarts == 5 and not supervisor.down(), 5, "healed")
    assert fatal == []
    await supervisor.stop()


async def test_a_loop_waiting_to_restart_counts_as_down() -> None:
    supervisor = Supervisor(lambda reason: None, restart_delay=60.0)

    async def crash() -> None:
        raise RuntimeError("bug")

    supervisor.loop("crash", crash)
    await wait_for(lambda: supervisor.down() == ["crash"], 5, "the loop to be down")
    await supervisor.stop()


async def test_cancelled_loops_are_no_longer_expected() -> None:
    supervisor = Supervisor(lambda reason: None)
    supervisor.loop("forever", lambda: asyncio.sleep(3600))
    await asyncio.sleep(0)
    supervisor.cancel("forever")
    await asyncio.sleep(0)
    assert supervisor.down() == []
    await supervisor.stop()


def test_log_limiter_says_how_much_it_held_back() -> None:
    clock = FakeClock(0.0)
    limiter = LogLimiter(log, interval=10.0, max_keys=2, now=clock.now)
    assert limiter.allow("p1") == 0
    assert [limiter.allow("p1") for _ in range(3)] == [None, None, None]
    assert limiter.allow("p2") == 0
    clock.advance(10.0)
    assert limiter.allow("p1") == 3
    limiter.allow("p3")  # p2 is the oldest: forgotten
    assert limiter.allow("p2") == 0
    assert limiter.suppressed == 3


def test_the_same_failure_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(0.0)
    limiter = LogLimiter(log, interval=60.0, now=clock.now)
    with caplog.at_level(logging.ERROR, "test"):
        for _ in range(100):
            try:
                raise ValueError("boom")
            except ValueError:
                limiter.exception("peer-a", "bad frame")
        limiter.exception("peer-b", "bad frame")
        clock.advance(61.0)
        limiter.exception("peer-a", "bad frame")
    assert [r.getMessage() for r in caplog.records] == [
        "bad frame", "bad frame", "bad frame (99 more since the last report)"]
    assert all(r.exc_info for r in caplog.records) and limiter.suppressed == 99


class Source:
    """Only what the agent's `/health` and error middleware read."""

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


async def test_agent_health_is_503_while_a_loop_is_down_and_surprises_are_400(
        tmp_path: Any) -> None:
    source = Source()
    async with TestClient(TestServer(make_app(source, str(tmp_path)))) as client:  # type: ignore[arg-type]
        assert (await client.get("/health")).status == 200
        source.dead = ["executor-socket"]
        resp = await client.get("/health")
        assert resp.status == 503
        assert await resp.json() == {"healthy": False, "dead_loops": ["executor-socket"]}
        # /state reads a state this source does not have: a bug, answered 400.
        resp = await client.get("/state")
        assert resp.status == 400 and (await resp.json())["error"]
        assert source.counters["agent/http_errors"] == 1


class Errors(Scheduler):
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.rescinded: list[str] = []
        self.registered_ = asyncio.Event()

    def registered(self, driver: Any, framework_id: str, master_info: Any) -> None:
        self.registered_.set()

    def offer_rescinded(self, driver: Any, offer_id: str) -> None:
        self.rescinded.append(offer_id)

    def error(self, driver: Any, message: str) -> None:
        self.errors.append(message)


async def test_no_frame_from_the_master_ends_the_drivers_receive_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a real socket: undecodable frames are answered Rejected, a message the
    core fails on costs that message only, and the driver still hears the next."""
    handle = SchedulerCore.handle

    def fragile(core: SchedulerCore, event: Any, now: float) -> list[Any]:
        message = getattr(event, "message", None)
        if isinstance(message, Rescind) and message.offer_id == "poison":
            raise RuntimeError("a core bug")
        return handle(core, event, now)

    monkeypatch.setattr(SchedulerCore, "handle", fragile)
    scheduler = Errors()
    async with FakeMaster(heartbeat_interval=0.2) as master:
        driver = SchedulerDriver(scheduler, FrameworkInfo(name="fragile"), master=master.address)
        async with running(driver) as task:
            await asyncio.wait_for(scheduler.registered_.wait(), 5)
            assert master.framework_identity is not None and master._router is not None
            for frame in (b"[" * 1000 + b"]" * 1000, b"not json",
                          b'{"type":"rescind","v":' + b"1" * 4301 + b',"body":{}}'):
                await master._router.send_raw(master.framework_identity, frame)
            for _ in range(3):
                await master.send(Rescind(offer_id="poison"))
            await master.send(Rescind(offer_id="o-1"))
            await wait_for(lambda: scheduler.rescinded == ["o-1"], 5, "the next message")
            await wait_for(lambda: len(master.of(Rejected)) == 3, 5, "three Rejected")
            assert driver.messages_invalid == 3 and driver.internal_errors == 3
            assert driver.down() == [] and not task.done() and scheduler.errors == []


async def test_a_driver_loop_that_keeps_dying_aborts_the_driver_through_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = Errors()
    async with FakeMaster(heartbeat_interval=0.2) as master:
        driver = SchedulerDriver(scheduler, FrameworkInfo(name="doomed"), master=master.address)
        monkeypatch.setattr(driver._loops, "_restart_delay", 0.0)
        async with running(driver) as task:
            await asyncio.wait_for(scheduler.registered_.wait(), 5)

            async def broken_recv() -> Any:
                raise RuntimeError("the socket layer broke")
            assert driver._dealer is not None
            monkeypatch.setattr(driver._dealer, "recv", broken_recv)
            await master.send(Rescind(offer_id="wake"))  # the pending recv returns first
            await asyncio.wait_for(task, 5)
        assert [e for e in scheduler.errors if "driver-receive failed" in e]
        assert driver.internal_errors > 5
