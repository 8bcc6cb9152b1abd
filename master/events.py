"""The master's events (audit) log: what changed in the cluster, in order.

`MasterState` records an entry where a change happens -- a task's state, an agent
registered or marked unreachable, a framework subscribed or torn down, an offer
rescinded, an operator's kill -- and `GET /events?since=N` returns the entries
after sequence number N, so a tool can follow the cluster by polling with the last
`seq` it saw.

Pure and bounded: a ring of at most `capacity` entries (10,000 by default). Older
entries fall off; a reader that asks for a sequence number which fell off learns
it from `first` in the answer (it is greater than its `since` + 1) and can tell it
missed some. Sequence numbers start at 1 and never repeat within one leadership: a
newly elected master starts a new log (the log is not in the registry).
"""

from __future__ import annotations

import collections
from typing import Any

import attrs

DEFAULT_CAPACITY = 10_000


@attrs.frozen
class LogEntry:
    seq: int
    time: float
    kind: str
    fields: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "type": self.kind, **self.fields}


class EventLog:
    """A bounded, append-only, numbered list of cluster changes.

    Entries are kept as plain `(seq, time, kind, fields)` tuples and made
    `LogEntry`s only when read: the master records three a task under a launch
    flood (issue 19), and nearly all of them fall off unread. `record_values`
    keeps `fields` as a `(names, values)` pair, made a dict only when read."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"an events log needs room for at least one entry, not {capacity}")
        self._entries: collections.deque[
            tuple[int, float, str, dict[str, Any] | tuple[tuple[str, ...], tuple[Any, ...]]]] = \
            collections.deque(maxlen=capacity)
        self._last_seq = 0

    @property
    def last_seq(self) -> int:
        """The newest entry's number (0 while empty)."""
        return self._last_seq

    @property
    def first_seq(self) -> int:
        """The oldest entry still kept (last_seq + 1 while empty)."""
        return self._entries[0][0] if self._entries else self._last_seq + 1

    def record(self, now: float, kind: str, **fields: Any) -> None:
        """Append one change; `fields` must be JSON-serialisable plain values."""
        seq = self._last_seq = self._last_seq + 1
        self._entries.append((seq, now, kind, fields))

    def record_values(self, now: float, kind: str, names: tuple[str, ...],
                      values: tuple[Any, ...]) -> None:
        """`record(now, kind, **dict(zip(names, values)))`, without making the
        dict: for the entries the master makes per task (`names` a constant)."""
        seq = self._last_seq = self._last_seq + 1
        self._entries.append((seq, now, kind, (names, values)))

    def since(self, seq: int, limit: int = 1000) -> list[LogEntry]:
        """Up to `limit` entries with a number above `seq`, oldest first."""
        if seq >= self._last_seq or limit <= 0:
            return []
        # Numbers are consecutive, so the start is an index, not a search.
        start = max(0, seq + 1 - self.first_seq)
        entries = self._entries
        return [_entry(*entries[i]) for i in range(start, min(len(entries), start + limit))]

    def page(self, seq: int, limit: int = 1000) -> dict[str, Any]:
        """The `GET /events` document: entries after `seq`, and where to go on."""
        entries = self.since(seq, limit)
        return {"first": self.first_seq, "last": self._last_seq,
                # With nothing new, `last`: also right after a failover, when a
                # reader's `since` belongs to the previous leader's log.
                "next": entries[-1].seq if entries else self._last_seq,
                "events": [entry.to_json() for entry in entries]}


def _entry(seq: int, time: float, kind: str,
           fields: dict[str, Any] | tuple[tuple[str, ...], tuple[Any, ...]]) -> LogEntry:
    if type(fields) is tuple:
        names, values = fields
        fields = dict(zip(names, values))
    return LogEntry(seq, time, kind, fields)  # type: ignore[arg-type]
