"""Reliable, ordered delivery of task status updates from the agent to the master.

Each task has one *stream*: a queue of updates the master has not acknowledged.
Only the head is ever on the wire. It is sent as soon as it becomes the head, resent
when its retry timer fires (1 s, doubling to 30 s), and replaced by the next update
only when the master acknowledges the head's uuid. That gives the framework every
update of a task, in order, at least once -- the promise of DESIGN.md §4.

While the agent has no registered master the manager is *paused*: updates queue up
and timers stay quiet; `resume` (after (re-)registration) resends every head.

A stream ends with its terminal update: later additions are refused, and the
acknowledgement of the terminal update closes (forgets) the stream. The caller
must not open a new stream for a task whose stream was closed (AgentState keeps
completed tasks for that). Pure: effects out, no I/O, time passed in as `now`.
"""

from __future__ import annotations

import itertools
from collections import deque

import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerKey
from dyad.messages import Message, StatusUpdate


@attrs.frozen
class SendMaster:
    """Send `message` to the master the agent is currently connected to."""

    message: Message


StreamKey = tuple[str, str]  # (framework_id, task_id)


@attrs.frozen
class UpdateRetry(TimerKey):
    """Resend the head of a task's stream. `seq` tells a retry that was already
    due when the head changed from the current one, so it cannot cut a backoff
    short."""

    framework_id: str
    task_id: str
    seq: int

    @property
    def stream(self) -> StreamKey:
        return (self.framework_id, self.task_id)


Effect = SendMaster | ArmTimer | CancelTimer


@attrs.define
class _Stream:
    queue: deque[StatusUpdate] = attrs.field(factory=deque)
    backoff: float = 0.0
    timer: UpdateRetry | None = None
    head_sent: bool = False


class StatusUpdateManager:
    """One stream of unacknowledged updates per (framework, task)."""

    def __init__(self, backoff: float = 1.0, max_backoff: float = 30.0) -> None:
        if not 0 < backoff <= max_backoff:
            raise ValueError("need 0 < backoff <= max_backoff")
        self.initial_backoff = backoff
        self.max_backoff = max_backoff
        self.paused = True
        self._streams: dict[StreamKey, _Stream] = {}
        self._seq = itertools.count()
        self.sent = 0
        self.retried = 0
        self.acked = 0
        self.stale_acks = 0
        self.refused = 0

    # ------------------------------------------------------------------ queries

    def has_stream(self, framework_id: str, task_id: str) -> bool:
        return (framework_id, task_id) in self._streams

    def pending(self) -> list[StatusUpdate]:
        """The head of every stream: what a re-registration must replay."""
        return [s.queue[0] for s in self._streams.values()]

    def queued(self, framework_id: str, task_id: str) -> list[StatusUpdate]:
        stream = self._streams.get((framework_id, task_id))
        return list(stream.queue) if stream else []

    def all_queued(self) -> list[StatusUpdate]:
        """Every unacknowledged update, each stream in order: what a checkpoint
        keeps. `add`ing them back to a paused manager restores the streams."""
        return [update for stream in self._streams.values() for update in stream.queue]

    # ---------------------------------------------------------------- mutators

    def add(self, update: StatusUpdate, now: float) -> list[Effect]:
        """Queue `update`; send it at once if its stream was idle.

        Refused (and counted) when its uuid is already queued -- an executor's
        resend -- or when the stream already ends with a terminal update."""
        key = (update.framework_id, update.status.task_id)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        elif (any(u.status.uuid == update.status.uuid for u in stream.queue)
              or stream.queue[-1].status.state.is_terminal):
            self.refused += 1
            return []
        stream.queue.append(update)
        if len(stream.queue) == 1 and not self.paused:
            stream.backoff = self.initial_backoff
            return self._send_head(key, stream, now)
        return []

    def acknowledge(self, framework_id: str, task_id: str, uuid: str,
                    now: float) -> list[Effect]:
        """The master acknowledged `uuid`. Only an ack of the head counts; a stale
        or duplicate ack (retries cross acks on the wire) is ignored and counted."""
        key = (framework_id, task_id)
        stream = self._streams.get(key)
        if stream is None or stream.queue[0].status.uuid != uuid:
            self.stale_acks += 1
            return []
        self.acked += 1
        stream.queue.popleft()
        effects: list[Effect] = []
        if stream.timer is not None:
            effects.append(CancelTimer(stream.timer))
            stream.timer = None
        stream.head_sent = False
        if not stream.queue:
            del self._streams[key]
        elif not self.paused:
            stream.backoff = self.initial_backoff
            effects += self._send_head(key, stream, now)
        return effects

    def timer_fired(self, key: UpdateRetry, now: float) -> list[Effect]:
        """Resend the head whose retry timer `key` came due; stale keys are ignored."""
        stream = self._streams.get(key.stream)
        if stream is None or stream.timer != key or self.paused:
            return []
        stream.timer = None
        stream.backoff = min(stream.backoff * 2, self.max_backoff)
        return self._send_head(key.stream, stream, now)

    def pause(self) -> list[Effect]:
        """The master is gone: stop sending and retrying until `resume`."""
        self.paused = True
        effects: list[Effect] = []
        for stream in self._streams.values():
            if stream.timer is not None:
                effects.append(CancelTimer(stream.timer))
                stream.timer = None
        return effects

    def resume(self, now: float) -> list[Effect]:
        """A master registered us: replay the head of every stream, backoff reset."""
        self.paused = False
        effects: list[Effect] = []
        for key, stream in self._streams.items():
            stream.backoff = self.initial_backoff
            effects += self._send_head(key, stream, now)
        return effects

    def validate(self) -> None:
        for (framework_id, task_id), stream in self._streams.items():
            assert stream.queue, "empty streams are dropped"
            uuids = [u.status.uuid for u in stream.queue]
            assert len(set(uuids)) == len(uuids), uuids
            assert all(u.framework_id == framework_id and u.status.task_id == task_id
                       for u in stream.queue)
            assert not any(u.status.state.is_terminal for u in list(stream.queue)[:-1])
            assert (stream.timer is not None) == (not self.paused), (self.paused, stream)
            assert self.paused or stream.head_sent

    def _send_head(self, key: StreamKey, stream: _Stream, now: float) -> list[Effect]:
        effects: list[Effect] = []
        if stream.timer is not None:
            effects.append(CancelTimer(stream.timer))
        self.sent += 1
        if stream.head_sent:
            self.retried += 1
        stream.head_sent = True
        stream.timer = UpdateRetry(*key, next(self._seq))
        effects += [SendMaster(stream.queue[0]), ArmTimer(stream.timer, now + stream.backoff)]
        return effects
