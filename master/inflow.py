"""How much the master takes from its socket before it has handled it: backpressure.

The master's shell reads frames into a queue that one task hands to the core. If
it read whatever arrived, a flood would pile up in that queue faster than the core
works it off: every frame would wait longer than the peers' retry and offer
timeouts, their resends would add to the pile, and the master would collapse
(issue 19). So the shell reads only while fewer than `limit` received frames wait
for the core. Beyond that it leaves them in ZeroMQ, whose per-peer queues fill up
to their high-water marks; then a sender's socket refuses more, and a sender that
must not lose a message waits (a driver's outbox) or retries later (an agent's
status updates). Nothing the master has read is ever dropped, and a peer's share
of what is read is ZeroMQ's fair queueing over peers, so one busy framework cannot
crowd out a thousand agents' pings.

`Inflow` is the count behind that rule, kept apart from the sockets so it can be
tested on its own: the shell asks `room()` before each read, reports `taken` and
`handled` frames, and wakes its reader when `handled` says room has opened.
"""

from __future__ import annotations

import attrs

DEFAULT_LIMIT = 1024
"""Received frames waiting for the core at most. At the master's ~0.3 ms a frame
(busy, shared machine) that is a queue of about 0.3 s: far below the 10 s first
status-update retry and the 30 s offer timeout."""


@attrs.define
class Inflow:
    """Frames read from the socket and not yet handled, against a limit."""

    limit: int = DEFAULT_LIMIT
    queued: int = 0
    most: int = 0
    """The most frames ever waiting at once (a gauge)."""
    full: int = 0
    """How many times reading stopped because `limit` frames were waiting."""

    def __attrs_post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"an inflow limit must be at least 1, not {self.limit}")

    def room(self) -> int:
        """How many frames may be read now (0: wait until `handled` opens room)."""
        return max(0, self.limit - self.queued)

    def taken(self, count: int) -> None:
        """`count` frames were read (or released from a standby's early buffer,
        which may take the count past `limit`: they are already ours)."""
        if count < 0:
            raise ValueError(f"cannot take {count} frames")
        self.queued += count
        self.most = max(self.most, self.queued)
        if count and self.queued >= self.limit:
            self.full += 1

    def handled(self) -> bool:
        """One frame was handed to the core. True when that opened room that was
        closed, so the reader, which stopped, must be woken."""
        if self.queued == 0:
            raise ValueError("handled a frame that was never taken")
        self.queued -= 1
        return self.queued == self.limit - 1
