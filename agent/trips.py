"""Blocking work done on worker threads in batches: one thread trip for many items.

A trip to a worker thread (`asyncio.to_thread`) costs the event loop about 50 us
of CPU (a future each side, a queue, a wake-up through the loop's self-pipe).
Under a flood -- 500 runs started, then ended, at once -- a trip per run was a
tenth of the loop's time. `Batches` queues the items and sends what is queued
in one trip, at most `chunk` items in each of at most `lanes` trips at a time:
a lane that blocks (a vfork waits for its child's exec) holds only its own
items. Each item's result, or what it raised, goes to its own caller.

The trips go to asyncio's default pool, first in, first out, with everything
else the agent sends there -- its checkpoints too, which is what the agent's
starts rely on (`agent.containerizer.START_LANES`).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batches(Generic[Item, Result]):
    """`await batches.run(item)` is `work(item)` on a worker thread, batched."""

    def __init__(self, work: Callable[[Item], Result], lanes: int = 1,
                 chunk: int = 0) -> None:
        self._work = work
        self._lanes = lanes
        self._chunk = chunk
        self._queued: list[tuple[Item, asyncio.Future[Result]]] = []
        self._running = 0  # lanes on their way

    async def run(self, item: Item) -> Result:
        done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queued.append((item, done))
        if self._running < self._lanes:
            self._running += 1
            asyncio.ensure_future(self._lane())
        return await done

    async def _lane(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._queued:
                take = self._chunk or len(self._queued)  # chunk 0: all that waits
                batch, self._queued = self._queued[:take], self._queued[take:]
                results = await asyncio.to_thread(self._all, [item for item, _ in batch])
                for (_, done), (result, error) in zip(batch, results):
                    if done.done():
                        continue
                    if error is not None:
                        done.set_exception(error)
                    else:
                        done.set_result(result)  # type: ignore[arg-type]
        finally:
            self._running -= 1
            for _, done in batch:  # cancelled on the way: no caller waits for ever
                done.cancel()

    def _all(self, items: list[Item]) -> list[tuple[Result | None, Exception | None]]:
        results: list[tuple[Result | None, Exception | None]] = []
        for item in items:
            try:
                results.append((self._work(item), None))
            except Exception as exc:  # its caller raises it; the others go on
                results.append((None, exc))
        return results


class Together:
    """`await together.run(work)`: `work` awaited, but its caller goes on only once
    no work run through here is still on its way, with all the others, or once
    the first of those waiting has waited `longest` seconds (a steady stream of
    work is never held for longer). Starts of a flood that are answered one by
    one (the holder's) then reach the agent's core in one batch, as starts on
    worker threads did: one checkpoint and one round of updates for all, not one
    for every few (measured: 225-346 checkpoints for 500 tasks at once, against
    16-30)."""

    def __init__(self, longest: float) -> None:
        self._longest = longest
        self._busy = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def run(self, work: Awaitable[Result]) -> Result:
        self._busy += 1
        try:
            return await work
        finally:
            self._busy -= 1
            if self._busy:
                loop = asyncio.get_running_loop()
                held: asyncio.Future[None] = loop.create_future()
                self._waiting.append(held)
                if self._timer is None:
                    self._timer = loop.call_later(self._longest, self._release)
                await held
            else:
                self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        for held in waiting:
            if not held.done():
                held.set_result(None)
