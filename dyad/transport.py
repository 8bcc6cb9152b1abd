"""Thin asyncio wrappers over ZeroMQ sockets; all policy lives in the callers.

The master and each agent bind a ROUTER; agents, scheduler drivers and executors
connect a DEALER. A ROUTER sees each peer's identity as the first frame, which is
how a shell maps a reply to the peer that asked. One Dyad message is one frame.

`recv` returns `Inbound`: either a decoded message or the `MessageError` that the
frame earned, so the caller decides what a bad frame costs (reply `Rejected`,
count it) and a bad frame can never raise out of the receive loop.

With `curve` keys a Router is a CURVE server (the ZAP handler of its context,
`dyad.auth.ZapAuthenticator`, decides who gets in) and puts the principal libzmq
stamped on each frame on `Inbound.principal`; a Dealer with `curve` keys and the
server's public key is a CURVE client. An identity keeps the principal it first
came with: a frame from the same identity under another principal (someone
reusing a peer's identity to take over its route) is dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import zmq
import zmq.asyncio

from dyad.messages import MAX_FRAME_BYTES, Message, MessageError, decode, encode

if TYPE_CHECKING:
    from dyad.client_auth import CurveKeys

# CURVE helpers are imported only when CURVE is asked for (dyad.auth, which
# imports aiohttp, only by servers): every executor process imports this module.

# Frames above this are dropped by libzmq itself (the peer is disconnected); frames
# between MAX_FRAME_BYTES and this reach `decode`, which rejects them with a reason.
_HARD_FRAME_LIMIT = 4 * MAX_FRAME_BYTES
LISTEN_BACKLOG = 4096
MAX_REMEMBERED_IDENTITIES = 100_000
RECHECK = 0.25
"""Seconds a waiter sleeps at most before it looks at the socket again (`_Ready`),
right after an event; a socket that stays quiet is looked at ever less often, at
last every `RECHECK * 2 ** QUIET_MOST` seconds."""
QUIET_MOST = 3
log = logging.getLogger(__name__)


@attrs.frozen
class Inbound:
    identity: bytes
    message: Message | None
    error: MessageError | None
    principal: str | None = None  # who ZAP said sent it; None without CURVE


class Undecoded(NamedTuple):
    """What a ROUTER read from one peer, before decoding: cheap to hold (a
    tuple: a frozen attrs class cost the master 3% of its time in `__init__`
    alone), and `frames` can be compared byte for byte (a resend is an exact
    copy)."""

    identity: bytes
    frames: list[bytes]
    principal: str | None = None

    def decode(self) -> Inbound:
        """Never raises: a message, or the error the frames earned."""
        inbound = _parse_routed([self.identity, *self.frames])
        return inbound if self.principal is None else attrs.evolve(
            inbound, principal=self.principal)


def _configure(sock: zmq.asyncio.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, _HARD_FRAME_LIMIT)


def _parse(identity: bytes, frames: list[bytes]) -> Inbound:
    """Never raises: whatever arrived becomes a message or an error with a reason."""
    if len(frames) != 1:
        return Inbound(identity, None, MessageError(f"expected 1 frame, got {len(frames)}"))
    try:
        return Inbound(identity, decode(frames[0]), None)
    except MessageError as exc:
        return Inbound(identity, None, exc)
    except Exception as exc:  # a bug in decode; the property tests hunt for these
        log.exception("decode raised %s instead of MessageError", type(exc).__name__)
        return Inbound(identity, None, MessageError(
            f"frame could not be decoded ({type(exc).__name__})"))


def _parse_routed(frames: list[bytes]) -> Inbound:
    """A ROUTER's frames: the peer's identity first (libzmq never leaves it empty,
    but a frame we cannot route a reply to is still only an error)."""
    if not frames or not frames[0]:
        return Inbound(b"", None, MessageError("frame without a peer identity"))
    return _parse(frames[0], frames[1:])


class _Ready:
    """Waits until a socket can be read or written, on the running loop, without
    pyzmq's future and timer per call (issue 19: a third of the master's time
    went to that bookkeeping). Every send and receive itself is a non-blocking
    call on the plain socket `sock`.

    ZeroMQ's FD is edge-triggered: it signals that the socket's state *may*
    have changed, and any call on the socket can consume that signal. So a
    waiter always checks `EVENTS` before it sleeps, the FD's callback wakes
    every waiter to check again, and `poke` (after a send of our own, which may
    have consumed a signal meant for a waiting receive) checks for them. Other
    calls on the socket (connect, options, a monitor) can consume one too, so a
    sleeping waiter is also looked at every `RECHECK` seconds (`_Rechecks`), less
    often while it stays quiet: a missed signal costs at most 2 s, never a
    socket that stays deaf."""

    def __init__(self, sock: zmq.Socket, rechecked: bool = True) -> None:
        self._sock = sock
        self._rechecked = rechecked
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._quiet = 0  # rechecks since the last event that found nothing

    async def wait(self, flag: int) -> None:
        """Return once `EVENTS` has `flag` (zmq.POLLIN or zmq.POLLOUT)."""
        flag = int(flag)  # plain ints: IntFlag arithmetic is slow Python
        while not self._sock.get(_EVENTS) & flag:
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                self._watch(loop)
            future = self._waiting[flag] = loop.create_future()
            rechecks = _rechecks(loop) if self._rechecked else None
            if rechecks is not None:
                rechecks.add(self)
            try:
                await future
            finally:
                if self._waiting.get(flag) is future:
                    del self._waiting[flag]
                if not self._waiting and rechecks is not None:
                    rechecks.discard(self)
        self._quiet = 0

    def poke(self) -> None:
        """Wake a waiter whose event our own call may have consumed."""
        if self._waiting and self._sock.get(_EVENTS) & sum(self._waiting):
            self._wake()

    def recheck(self, tick: int) -> None:
        """Wake a waiter whose event is here though no signal said so: at every
        `tick` at first, then every 2nd, 4th, 8th while the socket stays quiet."""
        if tick % (1 << min(self._quiet, QUIET_MOST)) or not self._waiting:
            return
        self._quiet += 1
        if not self._sock.closed:
            self.poke()

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self.forget()
        self._fd = self._sock.get(zmq.FD)
        loop.add_reader(self._fd, self._wake)
        self._loop = loop

    def _wake(self) -> None:
        if not self._waiting:
            if not self._sock.closed:
                self._sock.get(_EVENTS)  # takes the signal, so the FD goes quiet
            return
        for future in self._waiting.values():
            if not future.done():
                future.set_result(None)

    def forget(self) -> None:
        """Stop watching the FD (before the socket closes)."""
        if self._loop is not None and self._fd is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
            _rechecks(self._loop).discard(self)
        self._loop = self._fd = None


_EVENTS = int(zmq.EVENTS)


class _Rechecks:
    """One timer per loop that looks at the sleeping waiters every `RECHECK`
    seconds. A timer and a wake-up per wait cost a process of 5,000 idle
    sockets (a worker of `benchmarks.master`'s simulated agents) a fifth of its
    CPU. A look at `EVENTS` wakes only a waiter whose event is there, but it is
    a system call (ZeroMQ reads the socket's command mailbox): looking at 5,000
    quiet sockets four times a second still took two fifths of that worker's
    CPU, so a quiet socket is looked at ever less often (`_Ready.recheck`). A
    signal is lost only to a call on the socket, and our calls look themselves
    (`poke`), so a quiet socket has none to lose but a stranger's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[_Ready, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._ticks = 0

    def add(self, ready: _Ready) -> None:
        self._waiters[ready] = None
        if self._timer is None:
            self._timer = self._loop.call_later(RECHECK, self._tick)

    def discard(self, ready: _Ready) -> None:
        self._waiters.pop(ready, None)

    def _tick(self) -> None:
        self._timer = None
        self._ticks += 1
        for ready in list(self._waiters):
            ready.recheck(self._ticks)
        if self._waiters:
            self._timer = self._loop.call_later(RECHECK, self._tick)


_RECHECKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Rechecks] = (
    weakref.WeakKeyDictionary())


def _rechecks(loop: asyncio.AbstractEventLoop) -> _Rechecks:
    found = _RECHECKS.get(loop)
    if found is None:
        found = _RECHECKS[loop] = _Rechecks(loop)
    return found


# The Cython calls themselves, without pyzmq's Python layers over them: for the
# master's frames of a few hundred bytes, `send_multipart` cost 5 us a frame where
# these cost 1.4, and `recv_multipart` 2.9 where these cost 1.6 (issue 19).
_raw_send = zmq.backend.Socket.send
_raw_recv = zmq.backend.Socket.recv
_raw_get = zmq.backend.Socket.get
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE) | _NOBLOCK
_RCVMORE = int(zmq.RCVMORE)


def _send_nowait(sock: zmq.Socket, ready: _Ready, frames: list[bytes]) -> bool:
    """Send one message (`frames`: its parts, all bytes) or nothing. Only the
    first part can fail for want of room (ZeroMQ queues a message whole: the
    rest go with it), as in pyzmq's `send_multipart`."""
    try:
        for part in frames[:-1]:
            _raw_send(sock, part, _MORE)
        _raw_send(sock, frames[-1], _NOBLOCK)
    except zmq.Again:
        return False
    finally:
        ready.poke()
    return True


def _recv_nowait(sock: zmq.Socket, copy: bool = True) -> list[Any]:
    """`recv_multipart(NOBLOCK)`: the parts of one message (zmq.Again: none here)."""
    parts = [_raw_recv(sock, _NOBLOCK, copy)]
    while _raw_get(sock, _RCVMORE):
        parts.append(_raw_recv(sock, _NOBLOCK, copy))
    return parts


class Router:
    """A bound ROUTER socket: many peers, addressed by identity. With `curve`
    (this server's key pair) only clients the context's ZAP handler admits get in.

    `send_queue` > 0 makes sends *mandatory*: each peer's outgoing queue holds that
    many frames, and a send to a full queue or to an unknown peer returns False
    (counted in `sends_full` / `sends_unroutable`) instead of vanishing as it does
    by ZMQ's default."""

    def __init__(self, context: zmq.asyncio.Context | None = None, *,
                 curve: CurveKeys | None = None, send_queue: int = 0) -> None:
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        _configure(self._sock)
        # Every call is non-blocking on this plain view of the socket; `_ready`
        # waits when one would block.
        self._now = zmq.Socket.shadow(self._sock.underlying)
        self._ready = _Ready(self._now)
        self.sends_full = 0
        self.sends_unroutable = 0
        if send_queue > 0:
            self._sock.setsockopt(zmq.SNDHWM, send_queue)
            self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.curve = curve is not None
        self._principals: dict[bytes, str | None] = {}
        self.principal_changes = 0  # frames dropped: their identity came as someone else
        if curve is not None:
            from dyad.auth import curve_server, frame_principal
            curve_server(self._sock, curve)
            self._frame_principal = frame_principal
        # A restarted peer that reuses its identity takes over the old route.
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # After a master failover every agent connects at once; ZMQ's default
        # listen backlog (100) drops the excess SYNs, costing them 1-7 s of TCP
        # retransmission. The kernel caps this at net.core.somaxconn.
        self._sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)

    @property
    def socket(self) -> zmq.asyncio.Socket:
        """The raw socket, for a `dyad.auth.HandshakeWatch`."""
        return self._sock

    def bind(self, host: str, port: int) -> int:
        """Bind to host:port (port 0 picks a free one); return the bound port."""
        if port == 0:
            return self._sock.bind_to_random_port(f"tcp://{host}")
        self._sock.bind(f"tcp://{host}:{port}")
        return port

    async def recv(self) -> Inbound:
        return (await self.recv_undecoded(1))[0].decode()

    async def recv_undecoded(self, most: int) -> list[Undecoded]:
        """Wait for one message, then take those already here, up to `most` in
        all, without waiting again: a burst costs one wake-up, not one per frame,
        and decoding waits until the caller wants it (`Undecoded.decode`)."""
        batch: list[Undecoded] = []
        while not batch:
            await self._ready.wait(zmq.POLLIN)
            try:
                self._add(batch, _recv_nowait(self._now, not self.curve))
            except zmq.Again:
                continue
        while len(batch) < most:
            try:
                self._add(batch, _recv_nowait(self._now, not self.curve))
            except zmq.Again:
                break
        return batch

    def _add(self, batch: list[Undecoded], frames: list[Any]) -> None:
        """Append what arrived, unless its identity came as someone else."""
        if not self.curve:
            batch.append(Undecoded(frames[0] if frames else b"", frames[1:]))
            return
        principal = self._frame_principal(frames[-1])
        parts = [frame.bytes for frame in frames]
        identity = parts[0] if parts else b""
        if self._same_principal(identity, principal):
            batch.append(Undecoded(identity, parts[1:], principal))

    def _same_principal(self, identity: bytes, principal: str | None) -> bool:
        known = self._principals.get(identity, principal)
        if known != principal:
            self.principal_changes += 1
            log.warning("dropped a frame from identity %s: it first came as %r, now as %r",
                        identity.hex()[:64], known, principal)
            return False
        if identity not in self._principals:
            if len(self._principals) >= MAX_REMEMBERED_IDENTITIES:
                # Forget the oldest half; they are long gone or will be re-learnt.
                for old in list(self._principals)[:MAX_REMEMBERED_IDENTITIES // 2]:
                    del self._principals[old]
            self._principals[identity] = principal
        return True

    async def send(self, identity: bytes, message: Message) -> bool:
        return self.send_frame(identity, encode(message))

    async def send_raw(self, identity: bytes, frame: bytes) -> bool:
        return self.send_frame(identity, frame)

    def send_frame(self, identity: bytes, frame: bytes) -> bool:
        """Queue `frame` for the peer now, never waiting. False when the peer's
        queue is full. Unknown peers: dropped silently (ZMQ's ROUTER default,
        like a message lost on the network), or False with a `send_queue`
        (mandatory sends)."""
        try:
            sent = _send_nowait(self._now, self._ready, [identity, frame])
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.sends_unroutable += 1
            return False
        if not sent:
            self.sends_full += 1
        return sent

    def close(self) -> None:
        self._ready.forget()
        self._sock.close(linger=0)


class Dealer:
    """A DEALER connected to one endpoint at a time; `connect` again to follow a
    new leader. The socket and identity stay, so a pending `recv` survives.
    With `curve` (our key pair) and `server_key` it speaks CURVE and talks only
    to a server holding the secret of `server_key`; without `server_key`,
    `set_server_key` must name it before the first `connect`."""

    def __init__(self, identity: str | None = None,
                 context: zmq.asyncio.Context | None = None, *,
                 curve: CurveKeys | None = None, server_key: bytes | None = None,
                 private: bool = False) -> None:
        self._ctx = context or zmq.asyncio.Context.instance()
        self.identity = (identity or uuid.uuid4().hex).encode()
        self._sock = self._ctx.socket(zmq.DEALER)
        _configure(self._sock)
        self._sock.setsockopt(zmq.IDENTITY, self.identity)
        self._now = zmq.Socket.shadow(self._sock.underlying)
        # `private`: nothing but this class's own calls (each of which looks at
        # `EVENTS` itself) ever touches the socket, so no signal can be lost to a
        # stranger and the periodic rechecks are not needed. For a process of
        # thousands of sockets (benchmarks' simulated agents) they were a fifth of
        # its CPU; a socket handed out (`socket`, a handshake watch) must not be.
        self._ready = _Ready(self._now, rechecked=not private)
        self.endpoint: str | None = None
        self.curve = curve is not None
        self.server_key: bytes | None = None
        if curve is None and server_key is not None:
            raise ValueError("a server key needs our own CURVE keys")
        if curve is not None:
            from dyad.client_auth import curve_client
            curve_client(self._sock, curve, server_key)
            self.server_key = server_key

    def set_server_key(self, server_key: bytes) -> None:
        """Talk (CURVE) only to a server holding the secret of `server_key`
        from now on; a connection made with another key is made again."""
        if not self.curve:
            raise ValueError("a server key needs our own CURVE keys")
        if server_key == self.server_key:
            return
        self._sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        self.server_key = server_key
        endpoint, self.endpoint = self.endpoint, None
        if endpoint is not None:
            self._sock.disconnect(endpoint)
            self.connect(endpoint)

    @property
    def socket(self) -> zmq.asyncio.Socket:
        """The raw socket, for a `dyad.auth.HandshakeWatch`."""
        return self._sock

    def connect(self, endpoint: str) -> None:
        """(Re)connect to `endpoint`; messages queued for the old one are dropped."""
        if endpoint == self.endpoint:
            return
        if self.curve and self.server_key is None:
            raise ValueError("CURVE: set the server's public key before connecting")
        if self.endpoint is not None:
            self._sock.disconnect(self.endpoint)
        self._sock.connect(endpoint)
        self.endpoint = endpoint
        self._ready.poke()

    async def recv(self) -> Inbound:
        while True:
            await self._ready.wait(zmq.POLLIN)
            try:
                frames = _recv_nowait(self._now)
            except zmq.Again:
                continue
            return _parse(b"", frames)

    async def recv_undecoded(self, most: int) -> list[list[bytes]]:
        """Wait for one message, then take those already here, up to `most`:
        each message's parts, undecoded (a link shard moves bytes only)."""
        batch: list[list[bytes]] = []
        while len(batch) < most:
            try:
                batch.append(_recv_nowait(self._now))
            except zmq.Again:
                if batch:
                    break
                await self._ready.wait(zmq.POLLIN)
        return batch

    async def send(self, message: Message) -> bool:
        return self.send_frame(encode(message))

    async def send_raw(self, frame: bytes) -> bool:
        return self.send_frame(frame)

    def send_frame(self, frame: bytes) -> bool:
        """Queue one frame now; False if the queue is full (the peer is long gone).
        Never blocks: callers that need delivery retry (status updates do)."""
        return _send_nowait(self._now, self._ready, [frame])

    async def send_waiting(self, message: Message) -> None:
        """Queue one frame, waiting while the queue to the peer is full: for a
        sender that must not drop (a driver's acknowledgements)."""
        await self.send_frame_waiting(encode(message))

    async def send_frame_waiting(self, frame: bytes) -> None:
        """`send_waiting` for a frame already encoded."""
        while not self.send_frame(frame):
            await self._ready.wait(zmq.POLLOUT)

    def close(self, linger_ms: int = 0) -> None:
        """Close; `linger_ms` > 0 keeps flushing queued frames that long in ZMQ's
        I/O thread (a farewell such as Teardown), 0 drops them."""
        self._ready.forget()
        self._sock.close(linger=linger_ms)
