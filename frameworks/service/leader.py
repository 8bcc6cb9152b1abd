"""Leader election among `dyad-service` instances that share a ZooKeeper root.

Each instance queues for a kazoo `Lock` at ``ROOT/leader`` whose identifier is its
API address; the holder leads, the others stand by and name it. kazoo runs its
callbacks on its own thread: connection changes are handed to the event loop with
``call_soon_threadsafe``. Leadership ends when the session is LOST, or SUSPENDED
(connection dropped, session perhaps alive) for longer than ``grace`` seconds: by
then the server may have expired the session and a standby may lead. The instance
then stands by again and campaigns for another term. While
suspended the leader cannot write its store (ZooKeeper is unreachable), and a
launch or kill is only sent after its write, so the overlap can cost at most a
declined offer. Store writes are fenced by the leader's lock znode.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException

from dyad.zk import DEFAULT_ROOT as ZK_DEFAULT_ROOT
from dyad.zk import parse_zk_url

log = logging.getLogger(__name__)


DEFAULT_ROOT = "/dyad-service"


def parse_service_zk_url(url: str) -> tuple[str, str]:
    """``zk://h1:2181,h2:2181/dyad-service`` -> (``h1:2181,h2:2181``, ``/dyad-service``);
    without a path the root is ``/dyad-service``. The masters' root is refused:
    Mesos tools read every child there as a contending master."""
    address = parse_zk_url(url)
    root = address.root if urlsplit(url).path.strip("/") else DEFAULT_ROOT
    if root == ZK_DEFAULT_ROOT:
        raise ValueError(f"{root} is where the masters contend; give the service its "
                         f"own root, e.g. zk://{address.hosts}{DEFAULT_ROOT}")
    return address.hosts, root


class Leadership:
    """Campaign for leadership; `lost` is set once this instance must stop leading."""

    def __init__(self, client: KazooClient, root: str, identifier: str, grace: float) -> None:
        self.client = client
        self.identifier = identifier
        self.grace = grace
        self.path = f"{root}/leader"
        self.lock = client.Lock(self.path, identifier)
        self.lost = asyncio.Event()
        self.leading = False
        self._loop = asyncio.get_running_loop()
        self._suspended: asyncio.TimerHandle | None = None
        client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        # kazoo's thread: do nothing blocking, just hand it over.
        self._loop.call_soon_threadsafe(self._state_changed, state)

    def _state_changed(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            if self._suspended is not None:
                log.info("ZooKeeper connection back; still leading")
                self._suspended.cancel()
                self._suspended = None
        elif state == KazooState.LOST:
            self._give_up("ZooKeeper session lost")
        elif self._suspended is None and self.leading:
            log.warning("ZooKeeper connection suspended; leading for at most %.1fs more",
                        self.grace)
            self._suspended = self._loop.call_later(
                self.grace, self._give_up, f"ZooKeeper suspended for {self.grace:.1f}s")

    def _give_up(self, why: str) -> None:
        if self.leading and not self.lost.is_set():
            log.error("%s: giving up leadership", why)
            self.lost.set()

    async def campaign(self) -> None:
        """Wait until this instance leads; each term has a lock and `lost` of its own."""
        self.lost = asyncio.Event()
        self.lock = self.client.Lock(self.path, self.identifier)
        await asyncio.to_thread(self.lock.acquire)
        self.leading = True

    async def resign(self) -> None:
        """End a term: give the lock back if the session still holds it."""
        self.leading = False
        if self._suspended is not None:
            self._suspended.cancel()
            self._suspended = None
        try:
            await asyncio.to_thread(self.lock.release)
        except KazooException as exc:
            log.info("lock release failed (%r); the session's end frees it", exc)

    @property
    def fence(self) -> str:
        """The znode that exists exactly while we lead (our lock node)."""
        return f"{self.lock.path}/{self.lock.node}"

    async def leader(self) -> str | None:
        """The leading instance's API address, if any."""
        try:
            contenders = await asyncio.to_thread(self.lock.contenders)
        except KazooException as exc:
            log.warning("cannot read the leader from ZooKeeper: %r", exc)
            return None
        return contenders[0] if contenders else None

    def cancel(self) -> None:
        """Stop campaigning (unblocks a waiting `campaign`)."""
        self.lock.cancel()
