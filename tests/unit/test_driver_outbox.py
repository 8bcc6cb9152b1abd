"""A driver never drops what it sends: against a real socket whose peer stops
reading, acknowledgements wait for room and the driver stops reading instead."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import zmq
import zmq.asyncio

from dyad.effects import Send
from dyad.messages import Acknowledge, TaskState, TaskStatus, Update, decode, encode
from frameworks._callbacks import DriverRuntime
from frameworks.driver_core import Received
from frameworks.outbox import Outbox
from tests.helpers import wait_for

UPDATES = 3000
PAD = "x" * 2000  # big frames, so the socket buffers fill long before the end


class AcknowledgingCore:
    """Acknowledges every update, as a scheduler with implicit acknowledgements does."""

    def handle(self, event: Any, now: float) -> list[Any]:
        if isinstance(event, Received) and isinstance(event.message, Update):
            status = event.message.status
            return [Send("master", Acknowledge(framework_id="F", agent_id="A",
                                               task_id=status.task_id, uuid=status.uuid))]
        return []


class AcknowledgingDriver(DriverRuntime[AcknowledgingCore]):
    OUTBOX_LIMIT = 50

    def __init__(self, endpoint: str) -> None:
        super().__init__(object(), logging.getLogger("test.outbox"), AcknowledgingCore())
        self.endpoint = endpoint

    async def _open(self) -> None:
        assert self._dealer is not None
        self._dealer.connect(self.endpoint)


def update(n: int) -> bytes:
    status = TaskStatus(task_id=f"t{n}", state=TaskState.TASK_RUNNING, uuid=f"{n}-{PAD}")
    return encode(Update(status=status))


async def test_acknowledgements_wait_for_a_peer_that_stopped_reading() -> None:
    ctx = zmq.asyncio.Context.instance()
    peer = ctx.socket(zmq.ROUTER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.ROUTER_MANDATORY, 1)  # block (not drop) when the driver is full
    peer.setsockopt(zmq.RCVHWM, 10)
    peer.setsockopt(zmq.RCVBUF, 8192)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    driver = AcknowledgingDriver(f"tcp://127.0.0.1:{port}")
    running = asyncio.create_task(driver.run_async())
    try:
        await wait_for(lambda: driver._dealer is not None)
        identity = driver._dealer.identity

        async def connected() -> bool:
            try:
                await peer.send_multipart([identity, update(0)], flags=zmq.NOBLOCK)
                return True
            except zmq.ZMQError:  # not routable yet
                return False

        await wait_for(connected, timeout=10, what="the driver to connect")

        async def flood() -> None:
            for n in range(1, UPDATES):
                await peer.send_multipart([identity, update(n)])  # waits when full

        flooding = asyncio.create_task(flood())
        # The peer reads nothing: the driver's socket fills, its sends wait, its
        # outbox reaches the limit, and there it stops reading the flood (had it
        # read on, the outbox would hold thousands).
        await wait_for(lambda: driver.send_waits > 0 and len(driver._outbox) >= 50,
                       timeout=30, what="the driver's sends to back up")
        # The peer reads again: every acknowledgement arrives, once, in order.
        seen: list[int] = []
        while len(seen) < UPDATES:
            _, frame = await asyncio.wait_for(peer.recv_multipart(), timeout=30)
            ack = decode(frame)
            assert isinstance(ack, Acknowledge)
            seen.append(int(ack.uuid.split("-")[0]))
        assert seen == list(range(UPDATES))
        await flooding
        assert driver._outbox.most <= AcknowledgingDriver.OUTBOX_LIMIT
    finally:
        driver.abort()
        await asyncio.wait_for(running, timeout=10)
        peer.close()


async def test_the_outbox_gates_readers_at_its_limit_and_keeps_the_head_until_popped() -> None:
    outbox = Outbox(limit=2)
    first, second = (Acknowledge(framework_id="F", agent_id="A", task_id="t", uuid=u)
                     for u in ("1", "2"))
    outbox.put(first)
    await asyncio.wait_for(outbox.room(), 1)
    outbox.put(second)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(outbox.room(), 0.05)
    assert await outbox.peek() is first and len(outbox) == 2  # still queued
    assert outbox.pop() is first
    await asyncio.wait_for(outbox.room(), 1)
    with pytest.raises(ValueError):
        Outbox(limit=0)
