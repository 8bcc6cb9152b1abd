"""Finding the leading master.

Users name a master by its HTTP address (`host:5050`) everywhere; the ZMQ endpoint
is learned from `GET /master/info`, which returns the same MasterInfo JSON that a
master writes into ZooKeeper. A detector's one job: `await detect()` returns the
current leader's MasterInfo, waiting (with backoff) while there is none.

Detectors also announce successions: `await next_leader(current)` returns once a
master other than `current` leads, so agents and scheduler drivers follow a
failover as soon as it happens instead of waiting for their heartbeats to time out.

`StandaloneDetector` asks one master at a fixed address. `ZooKeeperDetector`
watches the masters' election znodes (`zk://host:2181,host2:2181/dyad`, see
`dyad.zk`); `make_detector` picks one from the address a user typed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from dyad.codec import CodecError, from_json
from dyad.messages import MasterInfo

if TYPE_CHECKING:
    import aiohttp

    from dyad.auth import ClientCredentials

    from dyad.zk import LeaderWatch, ZkSession

# aiohttp and kazoo are imported where they are first needed: every executor
# process imports `frameworks`, and those two imports were most of its start-up
# time (about 0.25 s of CPU per task launched) while an executor uses neither.

log = logging.getLogger(__name__)


class Detector(Protocol):
    async def detect(self) -> MasterInfo:
        """The current leader; waits while there is none."""

    async def next_leader(self, current: MasterInfo) -> MasterInfo:
        """Wait until a master other than `current` leads, and return it."""

    async def close(self) -> None: ...


def parse_http_address(address: str) -> str:
    """'host:5050' or 'http://host:5050' -> 'http://host:5050'."""
    address = address.strip().rstrip("/")
    if address.startswith(("http://", "https://")):
        return address
    if ":" not in address:
        raise ValueError(f"master address {address!r} needs a port (host:5050)")
    return f"http://{address}"


async def fetch_master_info(session: aiohttp.ClientSession, base_url: str) -> MasterInfo:
    import aiohttp

    async with session.get(f"{base_url}/master/info",
                           timeout=aiohttp.ClientTimeout(total=5)) as resp:
        resp.raise_for_status()
        return from_json(MasterInfo, await resp.json())


class StandaloneDetector:
    """Asks one master at a fixed HTTP address; retries until it answers. With
    `client` credentials it speaks HTTPS (trusting only their CA) and sends
    their token."""

    def __init__(self, address: str, max_backoff: float = 2.0,
                 client: ClientCredentials | None = None) -> None:
        self.base_url = client.base_url(address) if client is not None \
            else parse_http_address(address)
        parse_http_address(address)  # the same checks either way
        self.max_backoff = max_backoff
        self._client = client
        self._session: aiohttp.ClientSession | None = None

    async def detect(self) -> MasterInfo:
        import aiohttp

        if self._session is None:
            options: dict[str, object] = {}
            if self._client is not None:
                from dyad.security import client_session_options
                options = client_session_options(self._client)
            self._session = aiohttp.ClientSession(**options)
        delay = 0.05
        said = ""
        while True:
            try:
                return await fetch_master_info(self._session, self.base_url)
            except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientResponseError) as exc:
                # A refusal (401, 403) or a certificate our CA did not sign: say so,
                # once, since no retry will change it without new credentials.
                if str(exc) != said:
                    said = str(exc)
                    log.warning("master at %s refuses us: %s; retrying", self.base_url, exc)
            except (aiohttp.ClientError, asyncio.TimeoutError, CodecError, ValueError) as exc:
                log.debug("master at %s not answering (%s); retrying", self.base_url, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    async def next_leader(self, current: MasterInfo) -> MasterInfo:
        """Never returns: one fixed address announces no successor. A master
        restarted there is found when heartbeats time out and `detect()` runs again."""
        never: asyncio.Future[MasterInfo] = asyncio.get_running_loop().create_future()
        return await never

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class ZooKeeperDetector:
    """Follows the leading master through ZooKeeper: the contender znode with the
    lowest sequence number under the root holds the leader's MasterInfo.

    The session starts at the first `detect()` and reconnects forever; while
    ZooKeeper is unreachable, the last known leader stays the answer (the masters
    themselves stop leading when they lose ZooKeeper, so it cannot be stale for
    long). Its session timeout does not affect how fast a failover is seen:
    changes are pushed by a watch."""

    def __init__(self, url: str, session_timeout: float = 10.0) -> None:
        from dyad.zk import parse_zk_url

        self.address = parse_zk_url(url)
        self._session_timeout = session_timeout
        self._session: ZkSession | None = None
        self._watch: LeaderWatch | None = None
        self._starting: asyncio.Task[None] | None = None
        self._leader: MasterInfo | None = None
        self._change = asyncio.Event()

    async def detect(self) -> MasterInfo:
        return await self._wait(lambda leader: True)

    async def next_leader(self, current: MasterInfo) -> MasterInfo:
        return await self._wait(lambda leader: leader.id != current.id)

    async def _wait(self, wanted: Callable[[MasterInfo], bool]) -> MasterInfo:
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)
        while self._leader is None or not wanted(self._leader):
            await self._change.wait()
        return self._leader

    async def _start(self) -> None:
        from dyad.zk import LeaderWatch, ZkError, ZkSession

        self._session = ZkSession(self.address.hosts, self._session_timeout)
        self._watch = LeaderWatch(self._session, self.address.root, self._on_leader)
        while True:
            try:
                await self._session.start()
                await self._watch.start()
                return
            except ZkError as exc:  # the connection dropped half-way: again
                log.warning("cannot watch %s yet: %s", self.address.url, exc)
                await asyncio.sleep(0.5)

    def _on_leader(self, path: str | None, info: MasterInfo | None) -> None:
        if info is None:
            log.info("no master leads under %s right now", self.address.url)
            return  # keep the last leader until a successor is elected
        log.info("leading master is %s at %s", info.id, info.zmq_endpoint)
        self._leader = info
        # Wake every waiter; each checks whether this leader is the one it wants.
        self._change.set()
        self._change = asyncio.Event()

    async def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        if self._watch is not None:
            self._watch.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_detector(address: str, client: ClientCredentials | None = None) -> Detector:
    """A detector for a master address as users write it: `host:5050` or
    `zk://host:2181[,host:2181...]/root`. Raises ValueError for a bad address.
    `client`: the credentials for a master's HTTPS API."""
    if address.startswith("zk://"):
        return ZooKeeperDetector(address)
    return StandaloneDetector(address, client=client)
