"""`dyad.transport` on real sockets: `recv` never raises for what a peer sends --
wrong frame counts, bad bytes, even a decoder bug -- it returns an `Inbound`
carrying the error, so a receive loop cannot be ended by one packet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from dyad import messages as m
from dyad import transport
from dyad.transport import Dealer, Inbound, Router

pytestmark = pytest.mark.integration


@pytest.fixture
async def router() -> AsyncIterator[tuple[Router, zmq.asyncio.Socket]]:
    """A Router and a raw DEALER connected to it, free to send anything."""
    ours = Router()
    port = ours.bind("127.0.0.1", 0)
    raw = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.IDENTITY, b"raw-peer")
    raw.connect(f"tcp://127.0.0.1:{port}")
    yield ours, raw
    raw.close()
    ours.close()


async def _received(ours: Router, raw: zmq.asyncio.Socket, frames: list[bytes]) -> Inbound:
    await raw.send_multipart(frames)
    return await ours.recv()


@pytest.mark.parametrize("frames, fragment", [
    ([b"one", b"two"], "expected 1 frame, got 2"),
    ([b""], "not JSON"),
    ([b"[" * 1000 + b"]" * 1000], "nested deeper"),
    ([b'{"type":"acknowledge","v":' + b"1" * 4301 + b',"body":{}}'], "digits"),
    ([b'{"type":"heartbeat","v":true,"body":{}}'], "unsupported version true"),
])
async def test_router_turns_bad_frames_into_errors(router: tuple[Router, zmq.asyncio.Socket],
                                                   frames: list[bytes], fragment: str) -> None:
    ours, raw = router
    inbound = await _received(ours, raw, frames)
    assert inbound.identity == b"raw-peer" and inbound.message is None
    assert inbound.error is not None and fragment in inbound.error.reason
    # ...and the socket goes on: the next good frame arrives.
    good = await _received(ours, raw, [m.encode(m.Heartbeat())])
    assert good.message == m.Heartbeat() and good.error is None


async def test_a_decoder_bug_is_an_error_not_an_exception(
        router: tuple[Router, zmq.asyncio.Socket], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    ours, raw = router

    def broken(frame: bytes) -> m.Message:
        raise RuntimeError("bug")

    monkeypatch.setattr(transport, "decode", broken)
    inbound = await _received(ours, raw, [m.encode(m.Heartbeat())])
    assert inbound.error is not None and "RuntimeError" in inbound.error.reason
    assert "decode raised RuntimeError" in caplog.text


async def test_dealer_turns_bad_frames_into_errors() -> None:
    raw = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    raw.setsockopt(zmq.LINGER, 0)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    ours = Dealer(identity="ours")
    ours.connect(f"tcp://127.0.0.1:{port}")
    try:
        await ours.send(m.Heartbeat())
        identity, _ = await raw.recv_multipart()
        await raw.send_multipart([identity, b"a", b"b", b"c"])
        await raw.send_multipart([identity, b"\xff\xfe"])
        first, second = await ours.recv(), await ours.recv()
        assert first.error is not None and "expected 1 frame, got 3" in first.error.reason
        assert second.error is not None and "not UTF-8" in second.error.reason
    finally:
        ours.close()
        raw.close()


def test_a_frame_without_identity_is_an_error() -> None:
    assert "identity" in transport._parse_routed([]).error.reason
    assert "identity" in transport._parse_routed([b"", b"{}"]).error.reason


async def test_recv_undecoded_takes_what_is_there_up_to_most(
        router: tuple[Router, zmq.asyncio.Socket]) -> None:
    ours, raw = router
    for _ in range(5):
        await raw.send_multipart([m.encode(m.Heartbeat())])
    await raw.send_multipart([b"a", b"b"])  # decodes to an error, as `recv` gives it
    got: list[Inbound] = []
    while len(got) < 6:
        batch = await ours.recv_undecoded(4)
        assert 1 <= len(batch) <= 4 and {r.identity for r in batch} == {b"raw-peer"}
        got += [r.decode() for r in batch]
    assert [i.message for i in got[:5]] == [m.Heartbeat()] * 5
    assert got[5].error is not None and "expected 1 frame" in got[5].error.reason


async def test_mandatory_sends_report_unknown_peers_and_full_queues() -> None:
    ours = Router(send_queue=2)
    # Small fixed kernel buffers on both ends: loopback autotuning otherwise grows
    # them to tens of megabytes while the sends run, and under load the queue could
    # still be draining into them at the last send (CI saw it once).
    ours.socket.setsockopt(zmq.SNDBUF, 64 * 1024)
    port = ours.bind("127.0.0.1", 0)
    peer = Dealer(identity="slow")
    peer.socket.setsockopt(zmq.RCVHWM, 1)
    peer.socket.setsockopt(zmq.RCVBUF, 64 * 1024)
    peer.connect(f"tcp://127.0.0.1:{port}")
    try:
        assert await ours.send(b"nobody", m.Heartbeat()) is False
        assert ours.sends_unroutable == 1
        await peer.send(m.Heartbeat())
        assert (await ours.recv()).identity == b"slow"  # now the peer is routable
        # Frames of 64 KiB: a few fill those buffers, and 2,000 overflow them surely.
        frame = bytes(64 * 1024)
        results = [await ours.send_raw(b"slow", frame) for _ in range(2_000)]
        assert results[0] is True and results[-1] is False  # the peer never reads
        assert ours.sends_full == results.count(False) > 0
    finally:
        peer.close()
        ours.close()


async def test_a_waiting_receive_survives_a_signal_someone_else_consumed() -> None:
    """ZeroMQ's FD is edge-triggered and any call on the socket can take the
    signal: a waiter that missed it looks again within `RECHECK`, and our own
    sends wake it at once (`_Ready.poke`)."""
    server = Router()
    port = server.bind("127.0.0.1", 0)
    client = Dealer()
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        assert await client.send(m.Heartbeat())
        identity = (await server.recv()).identity
        waiting = asyncio.ensure_future(client.recv())
        await asyncio.sleep(0.05)  # asleep on the FD
        assert await server.send(identity, m.Heartbeat())
        for _ in range(50):  # take the signal the way any other call would
            client._now.get(zmq.EVENTS)
            await asyncio.sleep(0.001)
        inbound = await asyncio.wait_for(waiting, transport.RECHECK + 1.0)
        assert inbound.message == m.Heartbeat()
        # and a receive that waits while we send is woken by our own send
        waiting = asyncio.ensure_future(client.recv())
        await asyncio.sleep(0.05)
        assert await server.send(identity, m.Heartbeat())
        await asyncio.sleep(0.05)
        assert client.send_frame(m.encode(m.Heartbeat()))
        assert (await asyncio.wait_for(waiting, 1.0)).message == m.Heartbeat()
    finally:
        client.close()
        server.close()


async def test_a_private_dealer_needs_no_rechecks_and_misses_nothing() -> None:
    """A `private` Dealer is never looked at by the rechecks (a process of
    thousands of them paid a fifth of its CPU for that); with only its own
    calls on the socket, every frame still arrives, sent before or while it
    waits and while it sends itself."""
    server = Router()
    port = server.bind("127.0.0.1", 0)
    client = Dealer(private=True)
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        assert await client.send(m.Heartbeat())
        identity = (await server.recv()).identity
        for round_ in range(20):
            waiting = asyncio.ensure_future(client.recv())
            await asyncio.sleep(0.005 * (round_ % 3))  # asleep on the FD, or not yet
            assert client._ready not in transport._rechecks(asyncio.get_running_loop())._waiters
            assert await server.send(identity, m.Heartbeat())
            if round_ % 2:
                assert client.send_frame(m.encode(m.Heartbeat()))  # our own call, meanwhile
            assert (await asyncio.wait_for(waiting, 1.0)).message == m.Heartbeat()
    finally:
        client.close()
        server.close()
