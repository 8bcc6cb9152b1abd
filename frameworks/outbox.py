"""A driver's outgoing messages, waiting for its socket: nothing is ever dropped.

A driver's core decides to send from plain calls (`_apply`), which cannot wait, so
`put` always succeeds. The pressure goes elsewhere: when the socket's queue to the
master is full, the send loop waits for it (`Dealer.send_waiting`); and while the
outbox holds `limit` messages or more, the receive loop waits (`room`) before
reading the next frame. A flood of status updates therefore slows the master's
sends to this driver (ZMQ's queues fill, then the master's), instead of making
the driver drop acknowledgements -- each dropped one costs the agent a resend
and the master its messages twice over (issue 19).

The head stays in the outbox until it is on the socket (`peek`, then `pop`), so a
send cut short by a stop is still there for the farewell flush.
"""

from __future__ import annotations

import asyncio
from collections import deque

from dyad.messages import Message

DEFAULT_LIMIT = 10_000


class Outbox:
    """FIFO of messages for one socket; unbounded `put`, a `room` gate at `limit`."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("an outbox needs room for at least one message")
        self.limit = limit
        self._queue: deque[Message] = deque()
        self._queued = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.most = 0
        """The longest the outbox has been (a gauge for tests and metrics)."""

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, message: Message) -> None:
        self._queue.append(message)
        self.most = max(self.most, len(self._queue))
        self._queued.set()
        if len(self._queue) >= self.limit:
            self._room.clear()

    async def peek(self) -> Message:
        """The oldest message, once there is one; it stays queued until `pop`."""
        while not self._queue:
            self._queued.clear()
            await self._queued.wait()
        return self._queue[0]

    def head(self, most: int) -> list[Message]:
        """Up to `most` of the oldest messages, oldest first; they stay queued."""
        return [self._queue[i] for i in range(min(most, len(self._queue)))]

    def pop(self) -> Message:
        """Remove the oldest message (it has been handed to the socket)."""
        message = self._queue.popleft()
        if len(self._queue) < self.limit:
            self._room.set()
        return message

    async def room(self) -> None:
        """Return once the outbox is below its limit."""
        await self._room.wait()
