"""What the usage store holds: one row type per table, and the tables' columns.

Two tables, both wide and denormalised as Scuba's are (every row carries its
dimensions, so any group-by needs no join):

- `task_usage`: one row per usage sample of a task's executor;
- `task_events`: one row per task state change.

Rows are plain frozen values built by the master core from what it already knows
(the agent's `UsageReport`, its own task, framework and agent records). A sample
carries its `Dimensions`; an event carries its task's `TaskFacts` only when the
store has not heard them, and the store joins them to the task's later events
(`KnownTasks`): a table stays wide, and the master builds and sends a task's
dimensions once, not once an event. Times are seconds since the epoch (floats);
the store keeps them as UTC `TIMESTAMP`s.
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
    """What a task's event rows share (every `Dimensions` column but the task's
    own ids, and its allocation): sent with the first row of a task that the
    store has not heard of, and joined to its later rows by the store
    (`KnownTasks`), so the master makes and sends these once a task, not once an
    event. The maps are the master's own (str to str)."""

    role: str
    app: str
    agent_id: str
    hostname: str
    agent_attributes: dict[str, str]
    labels: dict[str, str]
    priority: int
    revocable: bool
    cpus: float  # the task's allocation, so slack (allocation - usage) can be
    mem_bytes: int  # asked of the store alone


class TaskEvent(NamedTuple):
    """A task changed state: one `task_events` row once the store has joined it
    to its task's facts. `facts` is None when the store already holds them
    (`KnownTasks`).

    A plain tuple (issue 19: the master makes three a task under a launch flood,
    and an attrs instance with validators cost it ten times a tuple). The master
    core makes its own unchecked, from values it built itself (its clock, a
    launched task's record); tools and tests make them with `of`, which checks
    the numbers as the other rows do."""

    at: float
    framework_id: str
    task_id: str
    state: str  # "" only in `FORGET_ALL`
    reason: str = ""
    message: str = ""
    source: str = ""
    healthy: bool | None = None
    facts: TaskFacts | None = None

    @classmethod
    def of(cls, at: float, who: Dimensions, state: str, reason: str = "",
           message: str = "", source: str = "", healthy: bool | None = None,
           cpus: float = 0.0, mem_bytes: int = 0) -> TaskEvent:
        """The event, checked, carrying `who`'s facts."""
        _check_time("at", at)
        _check_finite_nonnegative("cpus", cpus)
        _check_finite_nonnegative("mem_bytes", mem_bytes)
        if not state:
            raise ValueError("an event needs a state")
        return cls(at, who.framework_id, who.task_id, state, reason, message, source, healthy,
                   TaskFacts(who.role, who.app, who.agent_id, who.hostname,
                             who.agent_attributes, who.labels, who.priority, who.revocable,
                             cpus, mem_bytes))


TASKS_TOLD = 100_000
"""Tasks whose facts the master's `ToldTasks` keeps at most (a task's are
dropped after its terminal row); past it, both halves forget all."""

FORGET_ALL = TaskEvent(0.0, "", "", "")
"""Not a row: the store forgets every task's facts here (the master forgot
what it had told it: its bound, or a failed step's rows lost)."""

TERMINAL_STATES = frozenset(state.name for state in TaskState if state.is_terminal)
"""A task's facts are forgotten after its row in one of these states. Names, not
members: a str's hash is kept, an enum member's is computed in Python each time
it is looked up (the master checks every event's state)."""

NO_FACTS = TaskFacts("", "", "", "", {}, {}, 0, False, 0.0, 0)
"""The facts of a row whose task the store was never told of (its first rows
were dropped, or failed to write): only its ids are known."""


class KnownTasks:
    """The store's half of the master's `master.usage_rows.ToldTasks`: each task's
    facts from the row that carried them, until its row in a terminal state or a
    `FORGET_ALL`. Fed every row in the order the master made them, it holds what
    the master believes it holds, so `values` gives each row the `Dimensions`
    the master would have built for it. `most` is only a bound against rows
    that were lost (a dropped terminal row leaves its facts here until the next
    `FORGET_ALL`)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.unknown = 0  # rows written with `NO_FACTS`
        self._facts: dict[tuple[str, str], TaskFacts] = {}

    def __len__(self) -> int:
        return len(self._facts)

    def values(self, events: Sequence[TaskEvent]) -> list[tuple]:
        """The rows' values in `EVENT_COLUMNS` order (`ts` as epoch seconds)."""
        known = self._facts
        out: list[tuple] = []
        for at, framework_id, task_id, state, reason, message, source, healthy, facts in events:
            if not state:  # FORGET_ALL
                known.clear()
                continue
            key = (framework_id, task_id)
            if facts is not None:
                if len(known) >= self.most:
                    known.clear()
                known[key] = facts
            else:
                facts = known.get(key)
                if facts is None:
                    facts = NO_FACTS
                    self.unknown += 1
            if state in TERMINAL_STATES:
                known.pop(key, None)
            out.append((at, task_id, framework_id, *facts[:8], state, reason, message, source,
                        healthy, facts[8], facts[9]))
        return out


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
