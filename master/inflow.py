"""The events the master has not yet handled: what it takes from its socket, and
in which order the core gets it (issue 19).

Three rules keep a flood from collapsing the master.

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

A timer waits in the lane of the peers it checks, in arrival order with their
frames, so a liveness check never overtakes the frame that would have answered
it: frameworks' heartbeats and failover timeouts in the framework lane (there,
too, the master's heartbeats to frameworks are not held up behind a flood of
agents' frames), the rest -- agents' ping timeouts, offer timeouts, allocation --
and operator calls in the other lane. A framework's frame may overtake an offer
timeout, which only makes the timeout find the offer accepted.

Liveness first. Frameworks' heartbeats -- `SchedulerHeartbeat` frames and the
master's own `HeartbeatDue` timers -- wait in a third lane, taken before both
others, in arrival order among themselves. A heartbeat is evidence that its
sender is alive and nothing else, so it needs no order with the other frames,
and queued behind a backlog it makes false alarms: a `HeartbeatDue` waits once
per interval, so with a framework lane D seconds deep the master's heartbeats go
out 5 + D s apart, and a driver calls the master lost once D passes 10 s; and
the check judges a driver by a last-seen time that its heartbeat, waiting in the
same lane, is about to refresh (a framework without a failover timeout is then
torn down with its tasks). The check still never overtakes the heartbeat that
answers it: both wait in this lane. (The re-subscriptions issue 19 measured had
another cause, a driver's loop starved by its own receive loop:
frameworks/_callbacks.py.)

Read early, decode late. Frames wait here as read (the shell's undecoded form,
a few hundred bytes each, with the peer's identity and the frame's bytes), sorted into their lane by the type that opens them, and are decoded
only when their turn comes. Reading is then cheap enough to keep ZeroMQ's
queues nearly empty: once frames wait there, ZeroMQ reads its peers in turn, and
one framework among ten thousand agents gets one frame in ten thousand.

Bounded, and nothing silently dropped. The shell reads only while fewer than
`limit` events wait (`room()`); beyond that frames stay in ZeroMQ, whose per-peer
queues fill to their high-water marks, and then a sender's socket refuses more:
a driver waits (its outbox), an agent resends later. The only frame not queued
is an exact copy, from the same peer, of a status update or registration that
still waits here (an agent's retry): it is `coalesced` into the waiting one,
which is handled, and counted. The limit is a valve against memory exhaustion,
not the working point (100,000 frames are some 40 MB): at it, frameworks starve
as above.
"""

from __future__ import annotations

from collections import deque

import attrs

from dyad.messages import (
    Accept, Acknowledge, Acknowledgements, Decline, FrameworkToExecutor, Kill, Message, Preempt, Reconcile,
    RegisterAgent, RequestResources, Revive, SchedulerHeartbeat, StatusUpdate, Subscribe,
    Suppress, Teardown, Unsubscribe, encode_batch)
from dyad.effects import TimerFired
from master.model import Event, FailoverTimeout, HeartbeatDue, Received

DEFAULT_LIMIT = 100_000
FRAMEWORK_TURNS = 4

FRAMEWORK_MESSAGES: tuple[type[Message], ...] = (
    Subscribe, Unsubscribe, Teardown, Accept, Decline, Revive, Suppress, RequestResources, Kill,
    Acknowledge, Acknowledgements, Reconcile, SchedulerHeartbeat, Preempt,
    FrameworkToExecutor)
"""What only a scheduler sends: the frames of the framework lane."""
FRAMEWORK_TIMERS = (HeartbeatDue, FailoverTimeout)
"""Timers that check on frameworks: they wait in the framework lane (or the
liveness lane: `LIVENESS_TIMERS`)."""
LIVENESS_MESSAGES: tuple[type[Message], ...] = (SchedulerHeartbeat,)
"""Frames that only say their sender is alive: the liveness lane."""
LIVENESS_TIMERS = (HeartbeatDue,)
"""The master's heartbeats to frameworks, and its check on theirs: the liveness lane."""
COALESCED_MESSAGES: tuple[type[Message], ...] = (StatusUpdate, RegisterAgent)
"""What an agent resends until answered, so that an exact copy is a retry."""


def _openings(types: tuple[type[Message], ...]) -> tuple[bytes, ...]:
    """How `dyad.messages.encode` starts a frame of each type. A frame encoded
    otherwise only loses its place in a lane: it is decoded and judged as usual."""
    return tuple(b'{"type":"%s",' % cls.TYPE.encode() for cls in types)


def _batch_openings(types: tuple[type[Message], ...]) -> tuple[bytes, ...]:
    """How a `Batch` frame starts whose first message is of one of `types`: a
    batch goes to the lane of its first message (a driver batches only its own)."""
    head = encode_batch([b""])[:-len(b"]}}")]
    return tuple(head + opening for opening in _openings(types))


_FRAMEWORK_OPENINGS = _openings(FRAMEWORK_MESSAGES) + _batch_openings(FRAMEWORK_MESSAGES)
_LIVENESS_OPENINGS = _openings(LIVENESS_MESSAGES)
_COALESCED_OPENINGS = _openings(COALESCED_MESSAGES)

Key = tuple[bytes, bytes]


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
    """Frames not queued because an exact copy already waited."""
    _liveness: deque[tuple[object, Key | None]] = attrs.field(factory=deque)
    _frameworks: deque[tuple[object, Key | None]] = attrs.field(factory=deque)
    _others: deque[tuple[object, Key | None]] = attrs.field(factory=deque)
    _copies: set[Key] = attrs.field(factory=set)
    _streak: int = 0

    def __attrs_post_init__(self) -> None:
        if self.limit < 1 or self.turns < 1:
            raise ValueError(f"an inflow needs a limit and turns of at least 1, "
                             f"not {self.limit} and {self.turns}")

    def __len__(self) -> int:
        return len(self._liveness) + len(self._frameworks) + len(self._others)

    def room(self) -> int:
        """How many frames may be read now (0: wait until `take` makes room)."""
        return max(0, self.limit - len(self))

    def put(self, event: Event) -> None:
        """Queue an event: a timer, a call, a frame a standby decoded and kept.
        Never refused: `limit` binds only what the shell reads."""
        if (isinstance(event, Received) and isinstance(event.message, LIVENESS_MESSAGES)
                or isinstance(event, TimerFired) and isinstance(event.key, LIVENESS_TIMERS)):
            self._queue(event, None, self._liveness)
            return
        framework = (
            isinstance(event, Received) and isinstance(event.message, FRAMEWORK_MESSAGES)
            or isinstance(event, TimerFired) and isinstance(event.key, FRAMEWORK_TIMERS))
        self._queue(event, None, self._frameworks if framework else self._others)

    def put_frame(self, item: object, identity: bytes, frame: bytes | None) -> None:
        """Queue `item`, what the shell read from peer `identity`: `frame` is its
        one frame (None: it came in several, and will be refused when decoded)."""
        key = None
        if frame is not None and frame.startswith(_COALESCED_OPENINGS):
            key = (identity, frame)
            if key in self._copies:
                self.coalesced += 1
                return
            self._copies.add(key)
        if frame is None:
            lane = self._others
        elif frame.startswith(_LIVENESS_OPENINGS):
            lane = self._liveness
        elif frame.startswith(_FRAMEWORK_OPENINGS):
            lane = self._frameworks
        else:
            lane = self._others
        self._queue(item, key, lane)

    def _queue(self, item: object, key: Key | None,
               lane: deque[tuple[object, Key | None]]) -> None:
        lane.append((item, key))
        self.most = max(self.most, len(self))
        if len(self) == self.limit:
            self.full += 1

    def take(self) -> object | None:
        """The next in turn, an event or a frame as the shell put it (None:
        nothing waits)."""
        if self._liveness:
            item, key = self._liveness.popleft()
        elif self._frameworks and (self._streak < self.turns or not self._others):
            self._streak += 1
            item, key = self._frameworks.popleft()
        elif self._others:
            self._streak = 0
            item, key = self._others.popleft()
        else:
            return None
        if key is not None:
            self._copies.discard(key)
        return item
