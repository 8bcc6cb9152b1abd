"""The events the master has not yet handled: what it takes from its socket, and
in which order the core gets it (issue 19).

Two rules keep a flood from collapsing the master.

Frameworks first. A flood is agents' traffic -- status updates, their resends,
pongs -- that frameworks' frames unblock: an `Accept` must be handled before its
offers time out, and an `Acknowledge` is what lets an agent send its next update
and stop resending the last. Handled in arrival order, 40,000 updates of a burst
sit ahead of every acknowledgement and accept, whose delay then exceeds the
retry and offer timeouts: resends pile up and accepted tasks are dropped. So
frames that only schedulers send wait in a lane of their own, and the core takes
up to `FRAMEWORK_TURNS` of them for every other event. The other lane is never
starved (it gets at least one turn in `FRAMEWORK_TURNS + 1`); each peer's own
frames stay in the order they came.

Timers and operator calls wait in the other lane, in arrival order with agents'
frames: a liveness check (an agent's ping timeout, a framework's heartbeat) must
never overtake the frame that would have answered it. A framework's frame may
overtake a timer, which only makes an offer's timeout find the offer accepted.

Bounded, and nothing silently dropped. The shell reads only while fewer than
`limit` frames wait (`room()`); beyond that frames stay in ZeroMQ, whose per-peer
queues fill to their high-water marks, and then a sender's socket refuses more:
a driver waits (its outbox), an agent resends later. The only frame not queued
is a status update whose very copy (same peer, same uuid) already waits here: it
is `coalesced` into that one, which is still handled, and counted.

The limit is a valve against memory exhaustion, not the working point: once it is
reached ZeroMQ reads its peers in turn, a framework among ten thousand agents gets
one frame in ten thousand, and frameworks starve. So it is set far above a busy
master's queue (tens of thousands of frames: a few hundred MB of decoded events).
"""

from __future__ import annotations

from collections import deque

import attrs

from dyad.messages import (
    Accept, Acknowledge, Decline, FrameworkToExecutor, Kill, Message, Preempt, Reconcile,
    Revive, SchedulerHeartbeat, StatusUpdate, Subscribe, Suppress, Teardown, Unsubscribe)
from master.model import Event, Received

DEFAULT_LIMIT = 100_000
FRAMEWORK_TURNS = 4

FRAMEWORK_MESSAGES: tuple[type[Message], ...] = (
    Subscribe, Unsubscribe, Teardown, Accept, Decline, Revive, Suppress, Kill, Acknowledge,
    Reconcile, SchedulerHeartbeat, Preempt, FrameworkToExecutor)
"""What only a scheduler sends: the frames of the framework lane."""


@attrs.define
class Inflow:
    """Events not yet handled: two lanes, a limit on frames, copies coalesced."""

    limit: int = DEFAULT_LIMIT
    turns: int = FRAMEWORK_TURNS
    most: int = 0
    """The most frames ever waiting at once (a gauge)."""
    full: int = 0
    """How many times the limit was reached (reading stopped)."""
    coalesced: int = 0
    """Status updates not queued because the same one already waited."""
    _frameworks: deque[Event] = attrs.field(factory=deque)
    _others: deque[Event] = attrs.field(factory=deque)
    _updates: set[tuple[str, str]] = attrs.field(factory=set)
    _streak: int = 0

    def __attrs_post_init__(self) -> None:
        if self.limit < 1 or self.turns < 1:
            raise ValueError(f"an inflow needs a limit and turns of at least 1, "
                             f"not {self.limit} and {self.turns}")

    def __len__(self) -> int:
        return len(self._frameworks) + len(self._others)

    def room(self) -> int:
        """How many frames may be read now (0: wait until `take` makes room)."""
        return max(0, self.limit - len(self))

    def put(self, event: Event) -> None:
        """Queue an event: a frame read from the socket, a timer, a call. Never
        refused: `limit` binds only what the shell reads (frames released from a
        standby's early buffer, timers and calls may pass it)."""
        key = _update_key(event)
        if key is not None:
            if key in self._updates:
                self.coalesced += 1
                return
            self._updates.add(key)
        if isinstance(event, Received) and isinstance(event.message, FRAMEWORK_MESSAGES):
            self._frameworks.append(event)
        else:
            self._others.append(event)
        self.most = max(self.most, len(self))
        if len(self) == self.limit:
            self.full += 1

    def take(self) -> Event | None:
        """The next event for the core (None: nothing waits)."""
        if self._frameworks and (self._streak < self.turns or not self._others):
            self._streak += 1
            event = self._frameworks.popleft()
        elif self._others:
            self._streak = 0
            event = self._others.popleft()
        else:
            return None
        key = _update_key(event)
        if key is not None:
            self._updates.discard(key)
        return event


def _update_key(event: Event) -> tuple[str, str] | None:
    """A status update's identity, if it has one (an update without a uuid is
    never taken for a copy of another)."""
    if (isinstance(event, Received) and isinstance(event.message, StatusUpdate)
            and event.message.status.uuid):
        return event.peer, event.message.status.uuid
    return None
