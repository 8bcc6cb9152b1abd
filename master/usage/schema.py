"""What the usage store holds: one row type per table, and the tables' columns.

Two tables, both wide and denormalised as Scuba's are (every row carries its
dimensions, so any group-by needs no join):

- `task_usage`: one row per usage sample of a task's executor;
- `task_events`: one row per task state change.

Rows are plain values built by the master core from what it already knows (the
agent's `UsageReport`, its own task, framework and agent records). A sample
carries its `Dimensions`; state changes come as an events stream (`EventItem`):
each change is the tuple the master's events log keeps for it (`StateRow`), and
a task's `TaskFacts` come once, ahead of its first row, for the store to join to
the task's later rows (`KnownTasks`): a table stays wide, and the master builds
one tuple an event and a task's dimensions once. Times are seconds since the
epoch (floats); the store keeps them as UTC `TIMESTAMP`s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import attrs

from dyad.messages import TaskState


def _check_finite_nonnegative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")


def _check_time(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0 <= value < 2 ** 34):  # until the year 2514
        raise ValueError(f"{name} must be seconds since the epoch, not {value!r}")


def _finite_nonnegative(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    _check_finite_nonnegative(attribute.name, value)


def _time(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    _check_time(attribute.name, value)


def _labels(value: object) -> dict[str, str]:
    if not value:  # most tasks and agents have none: no copy and comprehension to make
        return {}
    if type(value) is dict and all(type(k) is str and type(v) is str
                                   for k, v in value.items()):
        return dict(value)  # the master's records hold str -> str already
    return {str(k): str(v) for k, v in dict(value).items()}  # type: ignore[call-overload]


@attrs.frozen(kw_only=True)
class Dimensions:
    """Who a row is about: the same columns in both tables."""

    task_id: str
    framework_id: str = ""
    role: str = ""
    app: str = ""  # the service app id or the batch job id (from the task's labels)
    agent_id: str = ""
    hostname: str = ""
    agent_attributes: dict[str, str] = attrs.field(factory=dict, converter=_labels)
    labels: dict[str, str] = attrs.field(factory=dict, converter=_labels)
    priority: int = 0
    revocable: bool = False


@attrs.frozen(kw_only=True)
class UsageSample:
    """One sample of what a task's executor used. `cpus_used` is cores averaged over
    the agent's sampling interval; `cpus_throttled_secs` and `oom_events` are counts
    since the previous sample; limits are what the agent enforces (0: none).
    `sample_weight` is how many samples this row stands for (>= 1; sampling at rate
    r keeps a row with weight 1/r), so ``sum(sample_weight)`` estimates a count."""

    at: float = attrs.field(validator=_time)
    who: Dimensions
    executor_id: str = ""
    cpus_used: float = attrs.field(default=0.0, validator=_finite_nonnegative)
    cpus_limit: float = attrs.field(default=0.0, validator=_finite_nonnegative)
    cpus_throttled_secs: float = attrs.field(default=0.0, validator=_finite_nonnegative)
    mem_rss_bytes: int = attrs.field(default=0, validator=_finite_nonnegative)
    mem_limit_bytes: int = attrs.field(default=0, validator=_finite_nonnegative)
    oom_events: int = attrs.field(default=0, validator=_finite_nonnegative)
    disk_used_bytes: int = attrs.field(default=0, validator=_finite_nonnegative)
    disk_limit_bytes: int = attrs.field(default=0, validator=_finite_nonnegative)
    sample_weight: float = attrs.field(default=1.0, validator=attrs.validators.ge(1.0))


class TaskFacts(NamedTuple):
    """What a task's event rows share (every `Dimensions` column but the agent's
    id, which each state row carries, and the task's allocation): an item of
    the events stream ahead of the first state row of a task that the store has
    not heard of; the store joins them to the task's later rows (`KnownTasks`),
    so the master makes and sends these once a task, not once an event. The
    stream carries them as plain tuples in this layout (the collector stops
    tracking a plain tuple of plain values; a named tuple it tracks for ever),
    with the master's own maps (str to str), or None for an empty one."""

    framework_id: str
    task_id: str
    role: str
    app: str
    hostname: str
    agent_attributes: dict[str, str]
    labels: dict[str, str]
    priority: int
    revocable: bool
    cpus: float  # the task's allocation, so slack (allocation - usage) can be
    mem_bytes: int  # asked of the store alone


class StateRow(NamedTuple):
    """A task changed state: the layout of the master's `task_state` entry in its
    events log (master/events.py). The stream carries that very tuple, a plain
    one (a named tuple would cost the master a second allocation an event), so
    the master builds one tuple an event for both. `source` is the log's short
    name ("master", "agent", "executor"); the store writes the wire's
    (`SOURCES`)."""

    framework_id: str
    task_id: str
    state: str
    agent_id: str
    source: str
    reason: str = ""
    message: str = ""
    healthy: bool | None = None


EventItem = float | tuple
"""The events stream the store is sent, in the order the master made it
(issue 19: three state changes a task under a launch flood, so the master must
do as little as it can for each):

- a time (float, seconds since the epoch): the following state rows happened
  then (the master sends one a step, not one a row);
- a task's facts (a plain tuple laid out as `TaskFacts`), before its first
  state row the store has not heard of;
- a state row (a plain tuple laid out as `StateRow`): one `task_events` row
  once joined to its task's facts.

Sent as msgpack, tuples arrive as lists, so items are told apart by type and
length (`is_state_row`)."""

SOURCES = {"master": "SOURCE_MASTER", "agent": "SOURCE_AGENT", "executor": "SOURCE_EXECUTOR"}
"""The events log's short names for who made a status, and the wire's, which the
store keeps (others as they are)."""


def event_items(at: float, who: Dimensions, state: str, reason: str = "", message: str = "",
                source: str = "", healthy: bool | None = None, cpus: float = 0.0,
                mem_bytes: int = 0) -> list[EventItem]:
    """One state change as the events stream carries it, with `who`'s facts,
    checked as the other rows are: for tools and tests (the master core makes its
    own unchecked, from values it built itself)."""
    _check_time("at", at)
    _check_finite_nonnegative("cpus", cpus)
    _check_finite_nonnegative("mem_bytes", mem_bytes)
    if not state:
        raise ValueError("an event needs a state")
    return [float(at),
            (who.framework_id, who.task_id, who.role, who.app, who.hostname,
             who.agent_attributes, who.labels, who.priority, who.revocable, cpus, mem_bytes),
            (who.framework_id, who.task_id, state, who.agent_id, source, reason, message,
             healthy)]


TASKS_KNOWN = 200_000
"""Tasks whose facts `KnownTasks` keeps at most: only a bound against rows that
were lost (the master forgets nothing; a task whose terminal row was dropped
would otherwise stay for ever). Past it, the one told longest ago goes first."""

STATE_ROW_LENGTH = len(StateRow._fields)


def is_state_row(item: EventItem) -> bool:
    """Whether an events stream item is a state row (not a time or facts)."""
    return type(item) is not float and len(item) == STATE_ROW_LENGTH  # type: ignore[arg-type]


TERMINAL_STATES = frozenset(state.name for state in TaskState if state.is_terminal)
"""A task's facts are forgotten after its row in one of these states. Names, not
members: a str's hash is kept, an enum member's is computed in Python each time
it is looked up (the master checks every event's state)."""


class KnownTasks:
    """The store's half of the task facts the master sends once a task
    (`master.books.MasterBooks._usage_row`): each task's facts from the item
    that carried them, until its row in a terminal state. Fed the events
    stream in the order the master made it, it holds what the master believes
    it holds, so `values` gives each row the `Dimensions` the master would
    have built for it. A row of a task whose facts never came (lost) is written
    with only its ids, agent and state, and counted (`unknown`)."""

    def __init__(self, most: int = TASKS_KNOWN) -> None:
        self.most = most
        self.unknown = 0
        self._facts: dict[tuple[str, str], tuple] = {}

    def __len__(self) -> int:
        return len(self._facts)

    def values(self, items: Sequence[EventItem]) -> list[tuple]:
        """The rows' values in `EVENT_COLUMNS` order (`ts` as epoch seconds)."""
        known = self._facts
        sources = SOURCES
        at = 0.0
        out: list[tuple] = []
        for item in items:
            if type(item) is float:
                at = item
                continue
            if len(item) != STATE_ROW_LENGTH:  # a task's facts (`is_state_row`)
                key = (item[0], item[1])
                if known.pop(key, None) is None and len(known) >= self.most:
                    del known[next(iter(known))]
                if item[5] is None or item[6] is None:  # no attributes, no labels
                    item = (*item[:5], item[5] or {}, item[6] or {}, *item[7:])
                known[key] = item
                continue
            framework_id, task_id, state, agent_id, source, reason, message, healthy = item
            key = (framework_id, task_id)
            facts = known.get(key)
            if facts is None:
                facts = NO_FACTS
                self.unknown += 1
            if state in TERMINAL_STATES:
                known.pop(key, None)
            out.append((at, task_id, framework_id, facts[2], facts[3], agent_id, *facts[4:9],
                         state, reason, message, sources.get(source, source), healthy,
                         facts[9], facts[10]))
        return out


NO_FACTS = TaskFacts("", "", "", "", "", {}, {}, 0, False, 0.0, 0)
"""The facts of a row whose task the store was never told of (its first rows
were dropped, or failed to write): only its ids are known."""


DIMENSION_COLUMNS = (
    ("task_id", "VARCHAR"), ("framework_id", "VARCHAR"), ("role", "VARCHAR"),
    ("app", "VARCHAR"), ("agent_id", "VARCHAR"), ("hostname", "VARCHAR"),
    ("agent_attributes", "MAP(VARCHAR, VARCHAR)"), ("labels", "MAP(VARCHAR, VARCHAR)"),
    ("priority", "INTEGER"), ("revocable", "BOOLEAN"),
)
USAGE_COLUMNS = (
    ("ts", "TIMESTAMP"), *DIMENSION_COLUMNS, ("executor_id", "VARCHAR"),
    ("cpus_used", "DOUBLE"), ("cpus_limit", "DOUBLE"), ("cpus_throttled_secs", "DOUBLE"),
    ("mem_rss_bytes", "BIGINT"), ("mem_limit_bytes", "BIGINT"), ("oom_events", "INTEGER"),
    ("disk_used_bytes", "BIGINT"), ("disk_limit_bytes", "BIGINT"),
    ("sample_weight", "DOUBLE"),
)
EVENT_COLUMNS = (
    ("ts", "TIMESTAMP"), *DIMENSION_COLUMNS, ("state", "VARCHAR"), ("reason", "VARCHAR"),
    ("message", "VARCHAR"), ("source", "VARCHAR"), ("healthy", "BOOLEAN"),
    ("cpus", "DOUBLE"), ("mem_bytes", "BIGINT"),
)
TABLES = {"task_usage": USAGE_COLUMNS, "task_events": EVENT_COLUMNS}


def dimension_values(who: Dimensions) -> tuple:
    return (who.task_id, who.framework_id, who.role, who.app, who.agent_id, who.hostname,
            who.agent_attributes, who.labels, who.priority, who.revocable)


def usage_values(s: UsageSample) -> tuple:
    """A sample's values in `USAGE_COLUMNS` order (`ts` as epoch seconds)."""
    return (s.at, *dimension_values(s.who), s.executor_id, s.cpus_used, s.cpus_limit,
            s.cpus_throttled_secs, s.mem_rss_bytes, s.mem_limit_bytes, s.oom_events,
            s.disk_used_bytes, s.disk_limit_bytes, s.sample_weight)
