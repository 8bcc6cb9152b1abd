"""The master's sends to peers that take `Batch` frames, held until the end of a
processing batch and sent as one frame per peer (issue 19).

Under a flood most of what the master sends goes to a few frameworks: two
`Update`s per task to the framework that launched it. Every frame costs both
ends a ZeroMQ send or receive, a wake-up and a decode, whatever its size, so
the shell hands the frames of each processing batch (`PROCESS_BATCH` events) for
a peer that takes batches to `add`, and `flush`es at the end of the batch: one
`Batch` frame per peer instead of one frame per message. The delay this adds is
at most one processing batch (some 10-15 ms under a flood).

Order is kept per peer: everything for a batching peer goes through here, and a
frame too large to share one (`alone_bytes`: an `Offers` frame) first flushes
what waits for that peer, then goes alone. A batch is closed at `max_bytes`.
Pure: frames in, frames out.
"""

from __future__ import annotations

from dyad.messages import MAX_BATCH_BYTES, encode_batch

ALONE_BYTES = 64 * 1024
"""Frames this large go alone: batching saves nothing on them."""

Frame = tuple[str, bytes]  # (peer, frame)


class Outflow:
    """Frames waiting per peer for the end of the processing batch."""

    def __init__(self, max_bytes: int = MAX_BATCH_BYTES, alone_bytes: int = ALONE_BYTES) -> None:
        if not 0 < alone_bytes <= max_bytes:
            raise ValueError("need 0 < alone_bytes <= max_bytes")
        self.max_bytes = max_bytes
        self.alone_bytes = alone_bytes
        self._waiting: dict[str, list[bytes]] = {}
        self._bytes: dict[str, int] = {}
        self.batches = 0
        """Batch frames made (a counter)."""
        self.batched = 0
        """Messages sent inside them (a counter)."""

    def __len__(self) -> int:
        return sum(len(frames) for frames in self._waiting.values())

    def add(self, peer: str, frame: bytes) -> list[Frame]:
        """Hold `frame` for `peer`; return what must be sent now, in order."""
        out: list[Frame] = []
        if len(frame) >= self.alone_bytes:
            out += self._take(peer)
            out.append((peer, frame))
            return out
        if self._bytes.get(peer, 0) + len(frame) > self.max_bytes:
            out += self._take(peer)
        self._waiting.setdefault(peer, []).append(frame)
        self._bytes[peer] = self._bytes.get(peer, 0) + len(frame) + 1
        return out

    def flush(self) -> list[Frame]:
        """Everything held, one frame per peer (a lone message as itself)."""
        out: list[Frame] = []
        for peer in list(self._waiting):
            out += self._take(peer)
        return out

    def _take(self, peer: str) -> list[Frame]:
        frames = self._waiting.pop(peer, None)
        self._bytes.pop(peer, None)
        if not frames:
            return []
        if len(frames) == 1:
            return [(peer, frames[0])]
        self.batches += 1
        self.batched += len(frames)
        return [(peer, encode_batch(frames))]
