"""`agent.trips`: blocking work in batched worker-thread trips (`Batches`), and
work answered one by one whose callers go on together (`Together`)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.trips import Batches, Together
from tests.helpers import wait_for


def counted(batches: Batches[int, int]) -> list[int]:
    """The size of each trip `batches` makes from now on."""
    trips: list[int] = []
    each = batches._all

    def counting(items: list[int]) -> list[tuple[int | None, Exception | None]]:
        trips.append(len(items))
        return each(items)

    batches._all = counting  # type: ignore[method-assign]
    return trips


async def test_each_caller_gets_its_own_result_and_items_share_trips() -> None:
    batches: Batches[int, int] = Batches(lambda n: n * n)
    trips = counted(batches)
    assert await asyncio.gather(*(batches.run(n) for n in range(50))) == [
        n * n for n in range(50)]
    assert trips == [50]  # all were queued before the lane's first trip


async def test_an_error_reaches_only_its_own_caller() -> None:
    def check(n: int) -> int:
        if n == 3:
            raise ValueError("three")
        return n

    batches: Batches[int, int] = Batches(check)
    results = await asyncio.gather(*(batches.run(n) for n in range(6)),
                                   return_exceptions=True)
    assert results[:3] == [0, 1, 2] and results[4:] == [4, 5]
    assert isinstance(results[3], ValueError)


async def test_lanes_and_chunks_bound_what_runs_at_once() -> None:
    lock = threading.Lock()
    running = peak = 0
    release = threading.Event()

    def hold(n: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(5)
        with lock:
            running -= 1
        return n

    batches: Batches[int, int] = Batches(hold, lanes=2, chunk=3)
    trips = counted(batches)
    jobs = asyncio.gather(*(batches.run(n) for n in range(12)))
    await wait_for(lambda: running == 2, timeout=10)  # both lanes busy, held
    release.set()
    assert await asyncio.wait_for(jobs, 10) == list(range(12))
    assert peak <= 2  # items of one chunk run one after another
    assert sum(trips) == 12 and max(trips) == 3


async def test_a_cancelled_caller_leaves_the_rest_served() -> None:
    release = threading.Event()
    batches: Batches[int, int] = Batches(lambda n: release.wait(5) and n)
    first = asyncio.ensure_future(batches.run(1))
    second = asyncio.ensure_future(batches.run(2))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await asyncio.wait_for(second, 10) == 2
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_callers_go_on_together_once_no_work_is_on_its_way() -> None:
    together = Together(longest=60)
    answers = [asyncio.get_running_loop().create_future() for _ in range(3)]
    went: list[int] = []

    async def caller(n: int) -> None:
        went.append(await together.run(answers[n]))

    callers = [asyncio.ensure_future(caller(n)) for n in range(3)]
    await asyncio.sleep(0)
    answers[0].set_result(0)
    answers[2].set_exception(OSError("refused"))  # a failure also waits for the rest
    for _ in range(5):
        await asyncio.sleep(0)
    assert not went and not any(c.done() for c in callers)
    answers[1].set_result(1)
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert sorted(went) == [0, 1] and isinstance(results[2], OSError)
    # Nothing on its way: the next caller is not held.
    assert await asyncio.wait_for(together.run(asyncio.sleep(0, 7)), 1) == 7


async def test_a_steady_stream_of_work_is_never_held_longer_than_the_longest() -> None:
    together = Together(longest=0.05)
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    stream = asyncio.ensure_future(together.run(never))  # always something on its way
    assert await asyncio.wait_for(together.run(asyncio.sleep(0, 3)), 5) == 3
    stream.cancel()
