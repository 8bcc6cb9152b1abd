"""The master's socket for link shards (master/link_shard.py, issue 19).

It presents what the master's server loop uses of its own `Router` --
`recv_undecoded(most)` and `send_frame(identity, frame)` -- so agents reached
through a shard look to the core exactly like agents connected directly: the
same identity bytes, the same principal (the one the shard's ZAP admitted the
agent as; none without CURVE), the same frames. Inbound
shard frames (master/shard_wire.py) are split into one `Undecoded` per agent
frame, and each teaches `ShardRoutes` which shard reaches that agent; sends to
an agent wait in its shard's buffer until `flush` (the end of the server's
processing batch) packs them into as few shard frames as possible.

Trust: a shard may claim any agent identity and any agent principal, so this
port is for shards only. It binds to loopback unless told otherwise; with CURVE
only connections ZAP admits as one of `shard_principals` are read (others are
counted and dropped), and each agent frame then carries the principal the
shard's own ZAP gave the agent's connection, which the core checks as it checks
a direct agent's (docs/security.md).
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque

import zmq.asyncio

from dyad.client_auth import CurveKeys
from dyad.supervision import LogLimiter
from dyad.transport import Router, Undecoded
from master.shard_wire import Record, ShardFrameError, ShardRoutes, pack, unpack

log = logging.getLogger(__name__)

SHARD_SEND_QUEUE = 1_000
"""Shard frames queued for one shard before a send to it fails (counted in
`records_dropped`): each holds up to 1,024 agent frames."""
SHARD_FRAMES_READ = 8
"""Shard frames read per wake-up (each holds up to `FRAME_RECORDS` agent frames)."""


class ShardLink:
    """A bound ROUTER that only link shards connect to."""

    def __init__(self, context: zmq.asyncio.Context | None = None, *,
                 send_queue: int = SHARD_SEND_QUEUE, curve: CurveKeys | None = None,
                 shard_principals: frozenset[str] = frozenset()) -> None:
        if curve is not None and not shard_principals:
            raise ValueError("with CURVE, name the principals shards connect as")
        self._router = Router(context, send_queue=send_queue, curve=curve)
        self._curve = curve is not None
        self._shard_principals = shard_principals
        self.routes = ShardRoutes()
        self._log = LogLimiter(log)  # a peer sending junk must not flood the log
        self._pending: deque[Undecoded] = deque()
        self._outgoing: defaultdict[bytes, list[Record]] = defaultdict(list)
        self.counts = {"bad_frames": 0, "frames_received": 0, "frames_sent": 0,
                       "records_received": 0, "records_dropped": 0, "not_a_shard": 0,
                       "records_without_principal": 0, "principal_changed": 0}

    def bind(self, host: str, port: int) -> int:
        return self._router.bind(host, port)

    async def recv_undecoded(self, most: int) -> list[Undecoded]:
        """Agents' frames as if they had come directly: at most `most`, the rest
        kept for the next call. A shard frame that does not parse is counted
        and dropped whole."""
        pending = self._pending
        while not pending:
            for raw in await self._router.recv_undecoded(SHARD_FRAMES_READ):
                self._take(raw)
        return [pending.popleft() for _ in range(min(most, len(pending)))]

    @property
    def socket(self) -> zmq.asyncio.Socket:
        """The raw socket, for a `dyad.auth.HandshakeWatch`."""
        return self._router.socket

    def _take(self, raw: Undecoded) -> None:
        self.counts["frames_received"] += 1
        if self._curve and raw.principal not in self._shard_principals:
            self.counts["not_a_shard"] += 1
            self._log.log(("not a shard", raw.principal), logging.WARNING,
                          "dropped a frame on the shard port from %r, not a shard principal",
                          raw.principal)
            return
        try:
            if len(raw.frames) != 1:
                raise ShardFrameError(f"expected 1 frame, got {len(raw.frames)}")
            records = unpack(raw.frames[0])
        except ShardFrameError as exc:
            self.counts["bad_frames"] += 1
            self._log.log(raw.identity, logging.WARNING, "dropped a frame from shard %s: %s",
                          raw.identity.hex()[:64], exc)
            return
        shard, learn, pending = raw.identity, self.routes.learn, self._pending
        for identity, principal, payload in records:
            if self._curve and not principal:
                # A shard without CURVE towards its agents: nobody vouched for them.
                self.counts["records_without_principal"] += 1
            elif not learn(identity, shard, principal):
                self.counts["principal_changed"] += 1
            else:
                pending.append(Undecoded(identity, [payload], principal.decode(
                    "utf-8", "replace") if self._curve else None))
        self.counts["records_received"] += len(records)

    def send_frame(self, identity: bytes, frame: bytes) -> bool:
        """Queue `frame` for the agent through its shard until `flush`; False
        when no shard is known to reach it."""
        shard = self.routes.shard_of(identity)
        if shard is None:
            return False
        self._outgoing[shard].append((identity, b"", frame))
        return True

    def flush(self) -> None:
        """Send what waits, packed; a shard frame its shard's queue refuses is
        counted in `records_dropped` (the agents' retries cover it, as they
        cover a frame lost on the network)."""
        outgoing, self._outgoing = self._outgoing, defaultdict(list)
        for shard, records in outgoing.items():
            for frame, count in pack(records):
                if self._router.send_frame(shard, frame):
                    self.counts["frames_sent"] += 1
                else:
                    self.counts["records_dropped"] += count

    def metrics(self) -> dict[str, float]:
        result = {f"master/shards/{name}": float(n) for name, n in self.counts.items()}
        result["master/shards/routes"] = len(self.routes)
        result["master/shards/routes_forgotten"] = self.routes.forgotten
        result["master/shards/connected"] = len(self.routes.shards())
        result["master/shards/sends_unroutable"] = self._router.sends_unroutable
        result["master/shards/sends_full"] = self._router.sends_full
        return result

    def close(self) -> None:
        self._router.close()
