"""What the usage store holds: one row type per table, and the tables' columns.

Two tables, both wide and denormalised as Scuba's are (every row carries its
dimensions, so any group-by needs no join):

- `task_usage`: one row per usage sample of a task's executor;
- `task_events`: one row per task state change.

Rows are plain frozen values built by the master shell from what it already knows
(the agent's `UsageReport`, its own task, framework and agent records). Times are
seconds since the epoch (floats); the store keeps them as UTC `TIMESTAMP`s.
"""

from __future__ import annotations

import collections
import math

import attrs


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


_EVENT_FIELDS = ("at", "who", "state", "reason", "message", "source", "healthy", "cpus",
                 "mem_bytes")


class TaskEvent(collections.namedtuple("TaskEvent", _EVENT_FIELDS,
                                       defaults=("", "", "", None, 0.0, 0))):
    """A task changed state. `cpus` and `mem_bytes` are the task's allocation, so
    slack (allocation - usage) can be asked of the store alone.

    A tuple (issue 19: the master makes three a task under a launch flood, and an
    attrs instance with validators cost it ten times a tuple). Made with keywords
    it checks its numbers as the other rows do; the master core makes its own
    with `trusted_event`, from values it built itself (its clock, a launched
    task's resources), which skips the checks."""

    __slots__ = ()

    def __new__(cls, at: float, who: Dimensions, state: str, reason: str = "",
                message: str = "", source: str = "", healthy: bool | None = None,
                cpus: float = 0.0, mem_bytes: int = 0) -> TaskEvent:
        _check_time("at", at)
        _check_finite_nonnegative("cpus", cpus)
        _check_finite_nonnegative("mem_bytes", mem_bytes)
        return tuple.__new__(cls, (at, who, state, reason, message, source, healthy,
                                   cpus, mem_bytes))


def trusted_event(values: tuple) -> TaskEvent:
    """A `TaskEvent` of `values` in `TaskEvent` field order, unchecked: for rows
    the master core builds from its own records (`master.usage_rows`)."""
    return _tuple_new(TaskEvent, values)


_tuple_new = tuple.__new__


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


def event_values(e: TaskEvent) -> tuple:
    """An event's values in `EVENT_COLUMNS` order (`ts` as epoch seconds)."""
    return (e[0], *dimension_values(e[1]), *e[2:])  # a `TaskEvent` is a tuple
