"""A driver's outgoing messages, waiting for its socket: nothing is ever dropped.

A driver's core decides to send from plain calls (`_apply`), which cannot wait, so
`put` always succeeds. The pressure goes elsewhere: when the socket's queue to the
master is full, the send loop waits for it (`Dealer.send_waiting`); and while the
outbox holds `limit` messages or more, the receive loop waits (`room`) before
reading the next frame. A flood of status updates therefore slows the master's
sends to this driver (ZMQ's queues fill, then the master's), instead of making
the driver drop acknowledgements -- each dropped one costs the agent a resend
and the master its messages twice over (issue 19).

The head stays in the outbox until it is on the socket (`peek`, `next_frame`,
then `pop`), so a send cut short by a stop is still there for the farewell flush.

To a master that honours `ACK_BATCH_CAPABILITY` (`merge_acks`), a run of
acknowledgements waiting one after another goes as one `Acknowledgements`
(issue 19): the order of everything sent is unchanged, only the envelopes are
fewer. The run is made when the frame is, so nothing already handed to the
socket is ever changed.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from itertools import groupby

from dyad.messages import (
    MAX_BATCH_BYTES, AckedUpdate, Acknowledge, Acknowledgements, Message, encode, encode_batch)

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
        self.merge_acks = False
        """The peer takes `Acknowledgements`: runs of acks are sent as one."""
        self.framed: Counter[str] = Counter()
        """Messages put in frames, by wire type (after merging: a counter)."""

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

    def next_frame(self, most: int, batch: bool) -> tuple[bytes, int, int]:
        """The frame for the oldest messages (there must be one): with `batch`, up
        to `most` of them in one `Batch` frame of about `MAX_BATCH_BYTES` at most,
        else one message. Returns the frame, how many queued messages it carries
        (`pop` that many once it is on the socket) and how many messages it holds."""
        queued = self.head(most) if batch or self.merge_acks else [self._queue[0]]
        units = merged_acks(queued) if self.merge_acks else [(m, 1) for m in queued]
        frames: list[bytes] = []
        carried = size = 0
        for message, count in units if batch else units[:1]:
            frame = encode(message)
            size += len(frame) + 1
            if frames and size > MAX_BATCH_BYTES:
                break
            frames.append(frame)
            carried += count
            self.framed[message.TYPE] += 1
        return (frames[0] if len(frames) == 1 else encode_batch(frames)), carried, len(frames)

    def pop(self) -> Message:
        """Remove the oldest message (it has been handed to the socket)."""
        message = self._queue.popleft()
        if len(self._queue) < self.limit:
            self._room.set()
        return message

    async def room(self) -> None:
        """Return once the outbox is below its limit."""
        await self._room.wait()


def merged_acks(messages: list[Message]) -> list[tuple[Message, int]]:
    """`messages` with each run of two or more `Acknowledge`s of one framework made
    one `Acknowledgements`, in order; each with how many of `messages` it stands for."""
    units: list[tuple[Message, int]] = []
    for framework_id, group in groupby(messages, key=_ack_framework):
        run = list(group)
        if framework_id is None or len(run) == 1:
            units += [(message, 1) for message in run]
        else:
            units.append((Acknowledgements(framework_id=framework_id, acks=[
                AckedUpdate(agent_id=a.agent_id, task_id=a.task_id, uuid=a.uuid)
                for a in run if isinstance(a, Acknowledge)]), len(run)))
    return units


def _ack_framework(message: Message) -> str | None:
    """Whose acknowledgement `message` is; None when it is none."""
    return message.framework_id if isinstance(message, Acknowledge) else None
