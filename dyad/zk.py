"""ZooKeeper at the edge: kazoo, handed to asyncio.

kazoo runs threads of its own: answers to requests, watch callbacks and
session-state listeners all arrive there. This module is the one place in Dyad
that imports kazoo, and everything it hands back crosses into the event loop
through `loop.call_soon_threadsafe`, so the loop's single thread owns all state
and no callback ever blocks kazoo's thread.

Layout (Mesos' own, so Mesos tooling finds a Dyad master): under a root path such
as `/dyad`, every master contending for leadership creates an ephemeral
sequential znode `json.info_NNNNNNNNNN` holding its MasterInfo JSON; the lowest
sequence number leads. Nothing else lives directly under the root, because Mesos
tools read every child there. The master registry lives at the sibling path
`<root>-registry` (`/dyad-registry`).

Sessions: SUSPENDED (the connection is gone, the session may still live on the
server) means "do not act as leader"; LOST means the session expired, our
ephemeral znode is gone and anything we held on it is void.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import attrs
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException
from kazoo.recipe.watchers import ChildrenWatch

from dyad.codec import CodecError, from_json, to_json
from dyad.messages import MasterInfo
from dyad.zk_acl import ZkDigest, acl_for, client_options

log = logging.getLogger(__name__)

CONTENDER_PREFIX = "json.info_"
DEFAULT_ROOT = "/dyad"
_SEQUENCE = re.compile(rf"^{re.escape(CONTENDER_PREFIX)}(\d+)$")
_PATH_PART = re.compile(r"^[A-Za-z0-9_.-]+$")
_HOST = re.compile(r"^[A-Za-z0-9_.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")

# Reconnect fast and forever: a master or agent cut off from ZooKeeper has nothing
# better to do, and kazoo's default backoff grows to an hour.
_RETRY = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0, "max_jitter": 0.2}

SessionState = str
"""kazoo's `KazooState` names: "CONNECTED", "SUSPENDED" or "LOST"."""
CONNECTED: SessionState = KazooState.CONNECTED
SUSPENDED: SessionState = KazooState.SUSPENDED
LOST: SessionState = KazooState.LOST


class ZkError(Exception):
    """A ZooKeeper request failed (no connection, session expired, node missing)."""


class VersionConflict(ZkError):
    """A version-checked write lost: someone else wrote first, or the writer's
    own contender znode (its claim to lead) is gone."""


@attrs.frozen
class ZkAddress:
    """Where the masters meet: ZooKeeper `hosts` (kazoo's `h1:2181,h2:2181`) and
    the `root` under which they contend."""

    hosts: str
    root: str

    @property
    def registry_path(self) -> str:
        """The registry's znode: the root's sibling, so the root holds contenders only."""
        return f"{self.root}-registry"

    @property
    def liveness_path(self) -> str:
        """Where each contender publishes its liveness listener (master/liveness.py),
        under its own contender's name: a sibling too, private to the masters."""
        return f"{self.root}-liveness"

    @property
    def url(self) -> str:
        return f"zk://{self.hosts}{self.root}"


def parse_zk_url(url: str) -> ZkAddress:
    """'zk://host1:2181,host2:2181/dyad' -> ZkAddress; the root defaults to /dyad.

    Raises ValueError with a reason an operator can act on."""
    if not url.startswith("zk://"):
        raise ValueError(f"ZooKeeper URL {url!r} must start with zk://")
    rest = url[len("zk://"):]
    hosts, slash, path = rest.partition("/")
    if "@" in hosts:
        raise ValueError("ZooKeeper authentication (user:password@) is not supported")
    if not hosts or not all(_HOST.match(h) for h in hosts.split(",")):
        raise ValueError(f"ZooKeeper URL {url!r} needs host:port[,host:port...] after zk://")
    root = f"/{path}".rstrip("/") if slash else DEFAULT_ROOT
    if not root:
        raise ValueError("the ZooKeeper root cannot be / (the registry lives beside it)")
    if not all(_PATH_PART.match(part) for part in root.split("/")[1:]):
        raise ValueError(f"invalid ZooKeeper path {root!r} (letters, digits, _ . - and /)")
    return ZkAddress(hosts=hosts, root=root)


def contender_sequence(name: str) -> int | None:
    """The sequence number of a contender znode name, None for anything else."""
    match = _SEQUENCE.match(name)
    return int(match.group(1)) if match else None


def leader_child(children: list[str]) -> str | None:
    """The leading contender among a root's children: the lowest sequence number."""
    numbered = [(seq, name) for name in children
                if (seq := contender_sequence(name)) is not None]
    return min(numbered)[1] if numbered else None


def encode_master_info(info: MasterInfo) -> bytes:
    return json.dumps(to_json(info), separators=(",", ":")).encode()


def decode_master_info(data: bytes) -> MasterInfo:
    """Raise ValueError when a znode does not hold MasterInfo JSON."""
    try:
        return from_json(MasterInfo, json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError, CodecError) as exc:
        raise ValueError(f"not MasterInfo JSON: {exc}") from None


class ZkSession:
    """One ZooKeeper session for one event loop.

    `on_state` is called on the loop with each kazoo state change. Requests are
    coroutines; their failures become `ZkError` (or `VersionConflict`).

    With a `digest` credential the session authenticates, and every znode it
    creates gets the ACL `dyad.zk_acl.acl_for` gives it: world-readable under
    `leader_root` (the contenders, for leader detection), private elsewhere."""

    def __init__(self, hosts: str, session_timeout: float,
                 on_state: Callable[[SessionState], None] | None = None, *,
                 digest: ZkDigest | None = None, leader_root: str = "") -> None:
        self.session_timeout = session_timeout
        self._digest = digest
        self._leader_root = leader_root
        self._client = KazooClient(hosts=hosts, timeout=session_timeout,
                                   connection_retry=dict(_RETRY), command_retry=dict(_RETRY),
                                   **client_options(digest))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_state = on_state
        self._connected = asyncio.Event()
        self._watches: list[ChildrenWatch] = []  # live for as long as the session

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self) -> None:
        """Connect, waiting as long as ZooKeeper takes to answer (kazoo retries)."""
        self._loop = asyncio.get_running_loop()
        self._client.add_listener(self._listener)
        self._client.start_async()
        if self._client.connected:
            self._connected.set()
        await self._connected.wait()

    async def close(self) -> None:
        """End the session: the server deletes our ephemeral znodes at once, which
        is what makes a clean master shutdown an instant failover."""
        self._client.remove_listener(self._listener)
        await asyncio.to_thread(self._stop_client)

    def _stop_client(self) -> None:
        try:
            self._client.stop()
            self._client.close()
        except KazooException as exc:
            log.debug("closing the ZooKeeper client: %s", exc)

    def _listener(self, state: SessionState) -> None:
        """kazoo's thread: hand the state to the loop, never block here."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._state_changed, state)

    def _state_changed(self, state: SessionState) -> None:
        if state == CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if self._on_state is not None:
            self._on_state(state)

    # ------------------------------------------------------------- requests

    async def _await(self, async_result: Any) -> Any:
        """Bridge a kazoo IAsyncResult into the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any) -> None:
            if future.done():
                return  # the caller gave up (timeout, cancellation)
            if result.successful():
                future.set_result(result.value)
            else:
                future.set_exception(result.exception)

        def hand_over(result: Any) -> None:  # on kazoo's thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, result)

        async_result.rawlink(hand_over)
        try:
            return await future
        except BadVersionError as exc:
            raise VersionConflict(f"version check failed: {exc!r}") from None
        except KazooException as exc:
            raise ZkError(f"{type(exc).__name__}: {exc}") from None

    def _acl(self, path: str) -> Any:
        return acl_for(self._leader_root, path, self._digest) if self._digest else None

    async def ensure_path(self, path: str) -> None:
        await self._await(self._client.ensure_path_async(path, acl=self._acl(path)))

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequence: bool = False) -> str:
        """Create a znode; return its path (with the sequence number, if any)."""
        return str(await self._await(self._client.create_async(
            path, data, acl=self._acl(path), ephemeral=ephemeral, sequence=sequence)))

    async def create_if_missing(self, path: str, data: bytes) -> None:
        """Create a persistent znode with `data` unless it exists already."""
        try:
            await self._await(self._client.create_async(path, data, acl=self._acl(path)))
        except ZkError:
            if await self.exists(path) is None:
                raise

    async def get(self, path: str) -> tuple[bytes, int]:
        """A znode's data and version; `ZkError` if it does not exist."""
        data, stat = await self._await(self._client.get_async(path))
        return data, stat.version

    @property
    def session_id(self) -> int | None:
        """This session's id (the `ephemeralOwner` of znodes it creates)."""
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    async def sync(self, path: str) -> None:
        """Make the server we talk to catch up with the ensemble's leader, so the
        next read sees every write committed before this call."""
        await self._await(self._client.sync_async(path))

    async def owner(self, path: str) -> tuple[int, int] | None:
        """The session owning an ephemeral znode and its version; None if it does
        not exist (a persistent znode's owner is 0)."""
        stat = await self._await(self._client.exists_async(path))
        return None if stat is None else (int(stat.ephemeralOwner), int(stat.version))

    async def delete_owned(self, path: str, owner: int, version: int) -> None:
        """Delete an ephemeral znode only if session `owner` holds it at `version`.

        The owner is read first, then the delete is checked against the version:
        a contender's path is never reused while its parent lives, so the only
        znode that can be at that path and version is the one whose owner we read.
        `VersionConflict` if it is not ours to delete, `ZkError` if it is gone."""
        found = await self.owner(path)
        if found is None:
            raise ZkError(f"{path} is gone already")
        if found != (owner, version):
            raise VersionConflict(f"{path} is held by session {found[0]:#x} at version "
                                  f"{found[1]}, not {owner:#x} at {version}")
        await self._await(self._client.delete_async(path, version=version))

    async def exists(self, path: str) -> int | None:
        """A znode's version, or None if it does not exist."""
        stat = await self._await(self._client.exists_async(path))
        return None if stat is None else stat.version

    async def set_checked(self, path: str, data: bytes, version: int,
                          guard: str | None = None) -> int:
        """Write `data` if the znode is still at `version` and (when given) the
        `guard` znode still exists; return the new version, or raise
        `VersionConflict`. One transaction: a deposed leader cannot slip a write in
        between the two checks."""
        transaction = self._client.transaction()
        if guard is not None:
            transaction.check(guard, 0)  # a contender znode is never rewritten
        transaction.set_data(path, data, version=version)
        results = await self._await(transaction.commit_async())
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            raise VersionConflict(f"write to {path} at version {version} refused: "
                                  f"{', '.join(type(f).__name__ for f in failures)}")
        return int(results[-1].version)

    async def watch_children(self, path: str, on_children: Callable[[list[str]], None]) -> None:
        """Call `on_children` (on the loop) with `path`'s children now and after
        every change, across reconnections; the path must exist."""
        loop = asyncio.get_running_loop()

        def changed(children: list[str]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(on_children, list(children))

        # ChildrenWatch reads the children once, synchronously: off the loop.
        self._watches.append(await asyncio.to_thread(ChildrenWatch, self._client, path, changed))


class LeaderWatch:
    """Follows who leads under a root: calls `on_leader(path, info)` on the loop
    whenever the leading contender changes (`None, None` while nobody leads, or
    while the leader's znode holds something that is not MasterInfo)."""

    def __init__(self, session: ZkSession, root: str,
                 on_leader: Callable[[str | None, MasterInfo | None], None]) -> None:
        self._session = session
        self._root = root
        self._on_leader = on_leader
        self._leader_path: str | None = None
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._session.ensure_path(self._root)
        await self._session.watch_children(self._root, self._children)

    def _children(self, children: list[str]) -> None:
        name = leader_child(children)
        path = None if name is None else f"{self._root}/{name}"
        if path == self._leader_path:
            return
        self._leader_path = path
        if self._reading is not None:
            self._reading.cancel()
        if path is None:
            self._on_leader(None, None)
        else:
            self._reading = asyncio.ensure_future(self._read(path))

    async def _read(self, path: str) -> None:
        try:
            data, _ = await self._session.get(path)
            info = decode_master_info(data)
        except ZkError:
            return  # gone already: the children watch brings the next leader
        except ValueError as exc:
            log.error("leading znode %s does not hold MasterInfo (%s); ignoring it", path, exc)
            self._on_leader(None, None)
            return
        if path == self._leader_path:
            self._on_leader(path, info)

    def stop(self) -> None:
        if self._reading is not None:
            self._reading.cancel()


LEASE_MOST = 0.5
"""Seconds: the longest lease a leader holds, whatever its session timeout. A
standby that proved the leader dead and deleted its znode sends nothing for this
long (master/election.py), so it is what the fast failover costs; it must stay
well below an agent's first registration retry (1 s), or every agent asks twice.
A leader renews five times per lease, so a renewal (two ZooKeeper round trips,
and the leader's own loop) slower than 4/5 of it pauses the leader, never deposes
it (`master/leadership_pauses`)."""


def lease_term(session_timeout: float) -> float:
    """The lease a leader holds with this session timeout (see `Lease`)."""
    return min(session_timeout * 2 / 3, LEASE_MOST)


class Lease:
    """How long this process may still act on its contender znode.

    A renewal syncs the server we talk to with the ensemble, then reads our own
    contender znode (`guard`). An answer that finds it proves two things at the
    moment the request was sent: the session was alive, so the server cannot
    expire it before `sent + session_timeout`; and nobody had deleted the znode
    (the sync makes the read see every delete committed before it). The lease runs
    to `sent + term`, `term` being the smaller of 2/3 of the session timeout and
    `LEASE_MOST`, and is renewed five times per term. So a leader whose znode goes
    (its session expired, or a standby proved it dead and deleted it) stops acting
    at most `term` after that, even if it hears nothing. This also covers what
    kazoo's SUSPENDED cannot: a process paused (SIGSTOP, a frozen VM) wakes up
    with a lapsed lease before its kazoo thread has noticed anything.

    `on_expired(reason)` is called once the lease has stayed lapsed for
    `grace` seconds: the holder must stop for good."""

    def __init__(self, session: ZkSession, guard: str, grace: float,
                 on_expired: Callable[[str], None]) -> None:
        self._session = session
        self._guard = guard
        self.term = lease_term(session.session_timeout)
        self._grace = grace
        self._on_expired = on_expired
        self._until = 0.0  # the last confirmed lease's end; revoking keeps it
        self._revoked = False
        self._lapsed_since: float | None = None
        self.renewed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def valid(self) -> bool:
        return not self._revoked and time.monotonic() < self._until

    def dead(self) -> bool:
        """Lapsed for longer than `grace`: the holder is done, whether or not the
        renewal loop has run since (a process resumed after a pause)."""
        return self._until > 0 and time.monotonic() > self._until + self._grace

    def revoke(self) -> None:
        """Stop acting now (kazoo said SUSPENDED); renewals may restore the lease."""
        self._lapse(time.monotonic())
        self._revoked = True

    def _lapse(self, now: float) -> None:
        self.renewed.clear()
        if self._lapsed_since is None:
            # A lease that ran out while the process was paused lapsed back then.
            self._lapsed_since = min(now, self._until) if self._until > 0 else now

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._renew_forever())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def renew(self) -> bool:
        """One renewal round trip; True if the lease is valid afterwards."""
        sent = time.monotonic()
        try:
            # A later answer could not extend the lease past now anyway.
            version = await asyncio.wait_for(self._confirm(), self.term)
        except (ZkError, asyncio.TimeoutError):
            version = None
        if version is not None and self._session.connected:
            self._until = sent + self.term
            self._revoked = False
            self._lapsed_since = None
            self.renewed.set()
            return True
        return False

    async def _renew_forever(self) -> None:
        while True:
            await self.renew()
            now = time.monotonic()
            if not self.valid():
                self._lapse(now)
                assert self._lapsed_since is not None
                if now - self._lapsed_since > self._grace:
                    self._on_expired(f"could not confirm the ZooKeeper session for "
                                     f"{now - self._lapsed_since:.1f}s")
                    return
            await asyncio.sleep(self.term / 5)

    async def _confirm(self) -> int | None:
        await self._session.sync(self._guard)
        return await self._session.exists(self._guard)


async def create_contender(session: ZkSession, root: str, info: MasterInfo) -> str:
    """Enter the election: an ephemeral sequential znode with our MasterInfo."""
    await session.ensure_path(root)
    return await session.create(f"{root}/{CONTENDER_PREFIX}", encode_master_info(info),
                                ephemeral=True, sequence=True)

