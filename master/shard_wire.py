"""The pure parts of link shards (issue 19): the frame a shard and the master
exchange, and the master's table of which shard reaches which agent.

A link shard (master/link_shard.py) holds thousands of agents' connections and
carries their frames to the master over one connection, so the master holds
one file descriptor per shard instead of one per agent. Neither end decodes an
agent's payload on the way: a shard frame is a run of records, each an agent's
identity, the principal its connection was admitted as (empty: none), and the
agent's frame exactly as it came or will go. Packing many records into one
frame per loop turn makes a burst cost the master one receive (or one send)
per shard, not one per agent frame.

    frame  := MAGIC record*
    record := identity_len:u16 principal_len:u16 payload_len:u32
              identity principal payload      (big-endian lengths)

A frame that does not parse is refused whole (`ShardFrameError`): the shell
counts it and reads on.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterable

MAGIC = b"DS1"
_HEADER = struct.Struct("!HHI")
RECORD_OVERHEAD = _HEADER.size
FRAME_RECORDS = 1024
"""Records packed into one shard frame at most."""
FRAME_BYTES = 1024 * 1024
"""A shard frame grows past this only by its last record (at most one agent
frame, itself bounded by the shard: master/link_shard.py)."""
MAX_ROUTES = 250_000
"""Agents whose shard the master remembers; beyond it the longest quiet is forgotten."""

Record = tuple[bytes, bytes, bytes]
"""(agent identity, principal or b"", the agent's frame)."""


class ShardFrameError(ValueError):
    """A shard frame that does not parse; `reason` says why."""


def pack(records: Iterable[Record]) -> list[tuple[bytes, int]]:
    """`records` as shard frames, each of at most `FRAME_RECORDS` records and
    (but for its last record) `FRAME_BYTES` bytes: (frame, records in it)."""
    frames: list[tuple[bytes, int]] = []
    parts: list[bytes] = [MAGIC]
    count = size = 0
    for identity, principal, payload in records:
        parts += (_HEADER.pack(len(identity), len(principal), len(payload)),
                  identity, principal, payload)
        count += 1
        size += RECORD_OVERHEAD + len(identity) + len(principal) + len(payload)
        if count >= FRAME_RECORDS or size >= FRAME_BYTES:
            frames.append((b"".join(parts), count))
            parts, count, size = [MAGIC], 0, 0
    if count:
        frames.append((b"".join(parts), count))
    return frames


def unpack(frame: bytes) -> list[Record]:
    """The records of one shard frame; `ShardFrameError` (and none of them) if
    it does not parse, or holds a record without an identity."""
    if not frame.startswith(MAGIC):
        raise ShardFrameError("not a shard frame (wrong opening)")
    records: list[Record] = []
    at, end = len(MAGIC), len(frame)
    while at < end:
        if at + RECORD_OVERHEAD > end:
            raise ShardFrameError(f"a record header is cut off at byte {at}")
        id_len, principal_len, payload_len = _HEADER.unpack_from(frame, at)
        at += RECORD_OVERHEAD
        stop = at + id_len + principal_len + payload_len
        if stop > end:
            raise ShardFrameError(f"a record at byte {at} runs {stop - end} bytes past the end")
        if id_len == 0:
            raise ShardFrameError(f"a record at byte {at} has no agent identity")
        records.append((frame[at:at + id_len], frame[at + id_len:at + id_len + principal_len],
                        frame[at + id_len + principal_len:stop]))
        at = stop
    return records


class ShardRoutes:
    """Which shard last carried each agent's frames: the master's replies go back
    the way the agent's last frame came. An agent that reconnects through another
    shard moves with its next frame; one that comes directly is `forget`-ten, so
    the master's own socket reaches it (the same take-over as ZeroMQ's
    ROUTER_HANDOVER). A route keeps the principal it was learnt with: a frame
    under another one (someone reusing an agent's identity through another
    shard) is refused until the route is forgotten, as the master's own socket
    refuses it (dyad/transport.py). Bounded: past `most` routes, the one quiet
    longest goes (its agent is found again by its next frame)."""

    def __init__(self, most: int = MAX_ROUTES) -> None:
        self.most = most
        self.forgotten = 0  # routes dropped to stay within `most`
        self._routes: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()

    def learn(self, identity: bytes, shard: bytes, principal: bytes = b"") -> bool:
        """Route `identity` through `shard`; False (and nothing learnt) when it
        came before under another principal."""
        routes = self._routes
        known = routes.get(identity)
        if known is not None:
            if known[1] != principal:
                return False
            if known[0] != shard:
                routes[identity] = (shard, principal)
            routes.move_to_end(identity)
            return True
        routes[identity] = (shard, principal)
        while len(routes) > self.most:
            routes.popitem(last=False)
            self.forgotten += 1
        return True

    def shard_of(self, identity: bytes) -> bytes | None:
        known = self._routes.get(identity)
        return None if known is None else known[0]

    def forget(self, identity: bytes) -> None:
        self._routes.pop(identity, None)

    def shards(self) -> set[bytes]:
        return {shard for shard, _ in self._routes.values()}

    def __len__(self) -> int:
        return len(self._routes)
