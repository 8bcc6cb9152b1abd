"""master.supervision: the shell's loops are restarted when they die, a loop that
keeps dying is fatal, and a noisy peer's log lines are rate-limited."""

from __future__ import annotations

import asyncio

import pytest

from dyad.clock import FakeClock
from master import supervision
from master.supervision import LogLimiter, Supervisor
from tests.helpers import wait_for


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


async def test_a_loop_that_keeps_dying_or_a_failed_one_shot_is_fatal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "MAX_RESTARTS", 2)
    fatal: list[str] = []

    async def broken() -> None:
        raise ValueError("always")

    supervisor = Supervisor(fatal.append, lambda: None, restart_delay=0.0)
    supervisor.loop("broken", broken)
    supervisor.once("setup", broken())
    await wait_for(lambda: len(fatal) == 2, 5, "both to be fatal")
    assert sorted(fatal) == ["broken failed 3 times in 60 s", "setup failed"]
    assert supervisor.down() == ["broken"]
    await supervisor.stop()


async def test_cancelled_loops_are_no_longer_expected() -> None:
    supervisor = Supervisor(lambda reason: None, lambda: None)
    supervisor.loop("forever", lambda: asyncio.sleep(3600))
    await asyncio.sleep(0)
    supervisor.cancel("forever")
    await asyncio.sleep(0)
    assert supervisor.down() == []
    await supervisor.stop()


def test_log_limiter_says_how_much_it_held_back() -> None:
    clock = FakeClock(0.0)
    limiter = LogLimiter(interval=10.0, max_keys=2, now=clock.now)
    assert limiter.allow("p1") == 0
    assert [limiter.allow("p1") for _ in range(3)] == [None, None, None]
    assert limiter.allow("p2") == 0
    clock.advance(10.0)
    assert limiter.allow("p1") == 3
    limiter.allow("p3")  # p2 is the oldest: forgotten
    assert limiter.allow("p2") == 0
