"""Finding the leading master.

Users name a master by its HTTP address (`host:5050`) everywhere; the ZMQ endpoint
is learned from `GET /master/info`, which returns the same MasterInfo JSON that a
master writes into ZooKeeper. A detector's one job: `await detect()` returns the
current leader's MasterInfo, waiting (with backoff) while there is none.

`StandaloneDetector` asks one master. The high-availability work adds a ZooKeeper
detector with the same `detect()`; `make_detector` is the seam where it plugs in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import aiohttp

from dyad.codec import CodecError, from_json
from dyad.messages import MasterInfo

log = logging.getLogger(__name__)


class Detector(Protocol):
    async def detect(self) -> MasterInfo: ...

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
    async with session.get(f"{base_url}/master/info",
                           timeout=aiohttp.ClientTimeout(total=5)) as resp:
        resp.raise_for_status()
        return from_json(MasterInfo, await resp.json())


class StandaloneDetector:
    """Asks one master at a fixed HTTP address; retries until it answers."""

    def __init__(self, address: str, max_backoff: float = 2.0) -> None:
        self.base_url = parse_http_address(address)
        self.max_backoff = max_backoff
        self._session: aiohttp.ClientSession | None = None

    async def detect(self) -> MasterInfo:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        delay = 0.05
        while True:
            try:
                return await fetch_master_info(self._session, self.base_url)
            except (aiohttp.ClientError, asyncio.TimeoutError, CodecError, ValueError) as exc:
                log.debug("master at %s not answering (%s); retrying", self.base_url, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_detector(address: str) -> Detector:
    """A detector for a master address as users write it."""
    if address.startswith("zk://"):
        raise ValueError("zk:// master addresses need ZooKeeper support, which this "
                         "build does not have yet; give the master's host:port")
    return StandaloneDetector(address)
