"""The election's shell: ZooKeeper, sockets and timers around `master.election`.

Every master runs a `LivenessListener`: a TCP port that accepts connections and
holds them, never sending a byte and discarding whatever arrives. Its only
message is its socket's state, which the kernel keeps: open while the process
lives (paused or not), closed (FIN or reset) when it dies. Whoever can connect
learns only what the master's open ZMQ and HTTP ports already show, that it is
up; and nothing it sends is read, so it cannot be used to fake anything. (A
forged FIN or reset takes a host on the path between the masters, which could
partition them and so depose the leader anyway, only slower.)

The listener's address is published in an ephemeral znode
`<root>-liveness/<session id>`, created before the contender znode by the same
session and private to the masters under ACLs; a standby trusts it only when
that znode's owner is the leader's own session.

`Campaign` follows the election's children, feeds `Election` and carries out
what it decides: reading the leader's znodes, holding the connection, checking
the ports, the conditional delete, and telling the master to lead or to stand
down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable

from dyad.effects import ArmTimer, CancelTimer, TimerFired
from dyad.messages import MasterInfo
from dyad.timers import TimerTable
from dyad.zk import (
    VersionConflict, ZkAddress, ZkError, ZkSession, contender_sequence, decode_master_info,
)
from master.election import (
    CheckPorts, Closed, Connect, ConnectFailed, Connected, Contenders, DeleteLeader,
    Deleted, Disconnect, Effect, Election, Endpoint, Event, Lead, LeaderRead,
    LeaderUnreadable, Note, PortsChecked, ReadLeader, StandDown, Watch,
)

log = logging.getLogger(__name__)

MAX_HELD = 32
"""Connections a listener holds at once; one more is closed at once (a standby
that meets that only sees no proof). A handful of standbys need a few."""
CONNECT_TIMEOUT = 1.0
"""Seconds a connection attempt may take; a timeout is never a refusal."""
DELETE_TIMEOUT = 2.0
"""Seconds the conditional delete may take; its answer sets the fence either way."""
READ_LIMIT = 4096


class LivenessListener:
    """Accept, hold, never answer: see the module docstring."""

    def __init__(self, ip: str) -> None:
        self._ip = ip
        self._server: asyncio.Server | None = None
        self._held: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._hold, self._ip, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._held) >= MAX_HELD:
            writer.close()
            return
        self._held.add(writer)
        try:
            while await reader.read(READ_LIMIT):
                pass  # nothing a peer sends means anything
        except OSError:
            pass
        finally:
            self._held.discard(writer)
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._held):
            writer.close()
        self._held.clear()


def liveness_znode(zk: ZkAddress, session_id: int) -> str:
    return f"{zk.liveness_path}/{session_id:016x}"


async def publish(session: ZkSession, zk: ZkAddress, ip: str, port: int, lease: float) -> None:
    """Publish our liveness listener, before entering the election: a standby
    reading our contender znode then always finds it."""
    session_id = session.session_id
    if session_id is None:
        raise ZkError("no ZooKeeper session")
    await session.ensure_path(zk.liveness_path)
    await session.create(liveness_znode(zk, session_id), liveness_record(ip, port, lease),
                         ephemeral=True)


def liveness_record(ip: str, port: int, lease: float) -> bytes:
    return json.dumps({"ip": ip, "port": port, "lease": lease}).encode()


def parse_liveness(data: bytes) -> tuple[Endpoint, float]:
    """Raise ValueError for anything but a liveness record."""
    try:
        record = json.loads(data)
        ip, port, lease = record["ip"], record["port"], record["lease"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a liveness record: {exc!r}") from None
    if not (isinstance(ip, str) and isinstance(port, int) and 0 < port < 65536
            and isinstance(lease, (int, float)) and 0 < lease <= 60):
        raise ValueError(f"not a liveness record: {record!r}")
    return (ip, port), float(lease)


async def try_connect(endpoint: Endpoint) -> tuple[bool, str]:
    """(refused, what happened) for one fresh connection attempt."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*endpoint), CONNECT_TIMEOUT)
    except ConnectionRefusedError:
        return True, f"{endpoint[0]}:{endpoint[1]} refused"
    except (OSError, asyncio.TimeoutError) as exc:
        return False, f"{endpoint[0]}:{endpoint[1]}: {exc!r}"
    writer.close()
    return False, f"{endpoint[0]}:{endpoint[1]} accepted"


class Campaign:
    """One master's part in the election, once its contender znode exists.

    `on_lead(not_before)`: our znode is the lowest; act from `not_before`
    (monotonic seconds) on. `on_stand_down(reason)`: stop for good."""

    def __init__(self, session: ZkSession, zk: ZkAddress, contender: str, lease: float,
                 on_lead: Callable[[float], None],
                 on_stand_down: Callable[[str], None]) -> None:
        self._session = session
        self._zk = zk
        self._lease = lease
        self._on_lead = on_lead
        self._on_stand_down = on_stand_down
        self.core = Election(me=contender)
        self._timers = TimerTable(time.monotonic, self._fire)
        self._holding: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._delete_done = asyncio.Event()
        self._delete_done.set()
        self.counts: Counter[str] = Counter()
        self._closed = False

    @property
    def watching(self) -> bool:
        """Next in line and holding a connection to the leader (so its death is
        seen at once)."""
        return self.core.watch is Watch.HOLDING

    async def start(self) -> None:
        """Follow the election (our liveness record and contender znode exist)."""
        await self._session.watch_children(self._zk.root, self._children)

    def _children(self, children: list[str]) -> None:
        numbered = sorted((seq, name) for name in children
                          if (seq := contender_sequence(name)) is not None)
        self.handle(Contenders(tuple(f"{self._zk.root}/{name}" for _, name in numbered)))

    def handle(self, event: Event) -> None:
        if self._closed:
            return  # the children watch lives as long as the session
        for effect in self.core.handle(event, time.monotonic()):
            self._perform(effect)

    def _fire(self, key: Hashable) -> None:
        self.handle(TimerFired(key))

    def _spawn(self, work: Callable[[], object]) -> None:
        task = asyncio.ensure_future(work())  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _perform(self, effect: Effect) -> None:
        match effect:
            case Lead(not_before):
                self._on_lead(not_before)
            case StandDown(reason):
                self._on_stand_down(reason)
            case Note(text, counter):
                self.counts[counter] += 1
                log.info("election: %s", text)
            case ReadLeader(path):
                self._spawn(lambda: self._read_leader(path))
            case Connect(path, endpoint):
                self._drop_connection()
                self._holding = asyncio.ensure_future(self._hold(path, endpoint))
            case Disconnect():
                self._drop_connection()
            case CheckPorts(path, endpoints):
                self._spawn(lambda: self._check(path, endpoints))
            case DeleteLeader(path, owner, version):
                self._delete_done.clear()
                self._spawn(lambda: self._delete(path, owner, version))
            case ArmTimer() | CancelTimer():
                self._timers.perform(effect)

    # ------------------------------------------------------------ the work

    async def _read_leader(self, path: str) -> None:
        try:
            owned = await self._session.owner(path)
            if owned is None:
                raise ZkError(f"{path} is gone")
            data, _ = await self._session.get(path)
            info = decode_master_info(data)
            record = liveness_znode(self._zk, owned[0])
            live_owner = await self._session.owner(record)
            live_data, _ = await self._session.get(record)
        except (ZkError, ValueError) as exc:
            log.info("election: cannot read leader %s: %s", path, exc)
            self.handle(LeaderUnreadable(path))
            return
        self.handle(self._leader_read(path, owned, info, live_owner, live_data))

    def _leader_read(self, path: str, owned: tuple[int, int], info: MasterInfo,
                     live_owner: tuple[int, int] | None, live_data: bytes) -> LeaderRead:
        owner, version = owned
        try:
            liveness, lease = parse_liveness(live_data)
        except ValueError as exc:
            log.warning("election: %s's liveness record: %s", path, exc)
            liveness, lease = None, self._lease
        if live_owner is None or live_owner[0] != owner:
            liveness = None  # not written by the leader's own session: not trusted
        ports = ((liveness,) if liveness else ()) + ((info.ip, info.zmq_port),
                                                     (info.ip, info.port))
        return LeaderRead(path=path, owner=owner, version=version, liveness=liveness,
                          ports=ports, lease=max(lease, self._lease))

    async def _hold(self, path: str, endpoint: Endpoint) -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*endpoint),
                                                    CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            self.handle(ConnectFailed(path, repr(exc)))
            return
        self.handle(Connected(path))
        try:
            while await reader.read(READ_LIMIT):
                pass
            event = Closed(path, by_peer=True, reason="end of stream")
        except ConnectionResetError:
            event = Closed(path, by_peer=True, reason="reset by the peer")
        except OSError as exc:  # timed out, unreachable: not the peer's doing
            event = Closed(path, by_peer=False, reason=repr(exc))
        finally:
            writer.close()
        self.handle(event)

    def _drop_connection(self) -> None:
        if self._holding is not None:
            self._holding.cancel()
            self._holding = None

    async def _check(self, path: str, endpoints: tuple[Endpoint, ...]) -> None:
        results = await asyncio.gather(*(try_connect(e) for e in endpoints))
        self.handle(PortsChecked(path, refused=bool(results) and all(r for r, _ in results),
                                 reason="; ".join(why for _, why in results)))

    async def _delete(self, path: str, owner: int, version: int) -> None:
        try:
            try:
                await asyncio.wait_for(self._session.delete_owned(path, owner, version),
                                       DELETE_TIMEOUT)
                event = Deleted(path, done=True, reason="")
            except (VersionConflict, ZkError, asyncio.TimeoutError) as exc:
                event = Deleted(path, done=False, reason=repr(exc))
            self.handle(event)
        finally:
            self._delete_done.set()

    async def hold(self) -> None:
        """Wait until this master may end its session: after a delete we sent is
        answered and the deleted leader's lease is over (else our successor could
        act before it ends)."""
        await self._delete_done.wait()
        wait = self.core.fenced_until - time.monotonic()
        if wait > 0:
            log.info("election: keeping our session %.2fs more, until the deleted "
                     "leader's lease is over", wait)
            await asyncio.sleep(wait)

    async def close(self) -> None:
        self._closed = True
        self._timers.cancel_all()
        self._drop_connection()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
