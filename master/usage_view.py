"""The web UI's usage view as canned queries: measured usage against allocation
over time for one dimension (role, framework, app, agent), its rows, and the
events that explain a limit moving (docs/usage-store.md, "The web UI").

Pure: it parses the view's parameters, writes the SQL and shapes the engine's
answers; `master/usage_api.py` runs the queries. The browser sends only a
dimension, a window and an optional group, never SQL, so the view needs no
quoting on the client and cannot be bent into a different question. The group is
the one user string that enters the SQL: it goes in as an escaped literal, and
the engine runs the result under the same read-only rules as any query.

How the numbers are made, so the chart can be read right:

- per time bucket and executor, the sample-weighted mean of `cpus_used`,
  `cpus_limit`, `mem_rss_bytes` and `mem_limit_bytes` (the agent reports each
  executor every few seconds; a bucket holds several reports);
- per bucket, the sum of those means over the executors of the group (or of all
  groups): what the group used and was allowed at that time. Buckets with no
  sample are zero (nothing ran, or nothing reported);
- the limit is what the agent enforces on the executor, which is the task's
  allocation plus any executor overhead; slack is limit - used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

DIMENSIONS = {"role": "role", "framework": "framework_id", "app": "app", "agent": "agent_id"}
MIN_WINDOW = 60
MAX_WINDOW = 7 * 86400
DEFAULT_WINDOW = 3600
MIN_BUCKET = 10  # agents report every 5 s by default: a bucket always holds one
MAX_BUCKETS = 1000
TARGET_BUCKETS = 60
NICE_BUCKETS = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_GROUP = 1000  # characters
MAX_EVENTS = 50
OOM_REASON = "REASON_CONTAINER_LIMITATION_MEMORY"
PARAMETERS = ("by", "window", "bucket", "group")


class ViewError(ValueError):
    """The view's parameters are wrong (HTTP 400); the message says how."""


@attrs.frozen
class View:
    by: str = "role"
    window: int = DEFAULT_WINDOW
    bucket: int = 60
    group: str | None = None  # None: every group summed

    @property
    def column(self) -> str:
        return DIMENSIONS[self.by]

    def since(self, now: float) -> int:
        """The first bucket's start: whole buckets, so every bucket is full width."""
        return math.floor((now - self.window) / self.bucket) * self.bucket


def parse(query: Mapping[str, str]) -> View:
    """The view from a request's query string, or a `ViewError` saying what is wrong."""
    unknown = sorted(set(query) - set(PARAMETERS))
    if unknown:
        raise ViewError(f"unknown parameter(s) {', '.join(unknown)}; "
                        f"the view takes {', '.join(PARAMETERS)}")
    by = query.get("by", "role")
    if by not in DIMENSIONS:
        raise ViewError(f"by must be one of {', '.join(DIMENSIONS)}, not {by!r}")
    window = _whole(query, "window", DEFAULT_WINDOW, MIN_WINDOW, MAX_WINDOW)
    bucket = _whole(query, "bucket", _nice_bucket(window), MIN_BUCKET, MAX_WINDOW)
    if window / bucket > MAX_BUCKETS:
        raise ViewError(f"window / bucket must be at most {MAX_BUCKETS} buckets, "
                        f"not {window} / {bucket}")
    group = query.get("group")
    if group is not None and len(group) > MAX_GROUP:
        raise ViewError(f"group must be at most {MAX_GROUP} characters")
    return View(by=by, window=window, bucket=bucket, group=group)


def _whole(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ViewError(f"{name} must be a whole number of seconds, not {raw!r}") from None
    if not low <= value <= high:
        raise ViewError(f"{name} must be between {low} and {high} seconds, not {value}")
    return value


def _nice_bucket(window: int) -> int:
    wanted = window / TARGET_BUCKETS
    return next((b for b in NICE_BUCKETS if b >= wanted), NICE_BUCKETS[-1])


def _literal(text: str) -> str:
    """A SQL string literal: DuckDB's strings escape only the quote, by doubling it."""
    return "'" + text.replace("'", "''") + "'"


def _recent(view: View, now: float) -> str:
    # A DOUBLE: epoch_ts of a whole number past 2**31 / 10**6 overflows INT32.
    return f"ts >= epoch_ts({view.since(now)}::DOUBLE)"


def _where(view: View, now: float) -> str:
    where = _recent(view, now)
    if view.group is not None:
        where += f" AND {view.column} = {_literal(view.group)}"
    return where


def _per_executor(view: View, now: float, extra: str = "") -> str:
    """Each executor's weighted means per bucket (see the module's docstring)."""
    mean = "sum({0} * sample_weight) / sum(sample_weight) AS {1}"
    return (f"SELECT epoch(bucket(ts, {view.bucket})) AS t, {extra}"
            "framework_id, agent_id, executor_id, "
            + ", ".join(mean.format(c, n) for c, n in (
                ("cpus_used", "cpus_used"), ("cpus_limit", "cpus_limit"),
                ("mem_rss_bytes", "mem_used"), ("mem_limit_bytes", "mem_limit")))
            + f" FROM task_usage WHERE {_where(view, now)} GROUP BY ALL")


SUMS = ("sum(cpus_used) AS cpus_used, sum(cpus_limit) AS cpus_limit, "
        "sum(mem_used) AS mem_used, sum(mem_limit) AS mem_limit")


def series_sql(view: View, now: float) -> str:
    """Per bucket: used and limit, summed over the group's executors."""
    return (f"WITH e AS ({_per_executor(view, now)}) "
            f"SELECT t, {SUMS} FROM e GROUP BY t ORDER BY t")


def groups_sql(view: View, now: float) -> str:
    """Per group over the window: tasks, mean used and limit while it ran, peak
    memory, and OOM kills; the groups holding most cores first."""
    column = view.column
    return (
        f"WITH e AS ({_per_executor(view, now, f'{column} AS grp, ')}), "
        f"b AS (SELECT grp, t, {SUMS} FROM e GROUP BY grp, t), "
        f"d AS (SELECT {column} AS grp, count(DISTINCT task_id) AS tasks, "
        "any_value(framework_id) AS framework_id, any_value(hostname) AS hostname "
        f"FROM task_usage WHERE {_where(view, now)} GROUP BY grp), "
        f"k AS (SELECT {column} AS grp, count(*) AS ooms FROM task_events "
        f"WHERE reason = '{OOM_REASON}' AND {_recent(view, now)} GROUP BY grp) "
        "SELECT b.grp, d.tasks, d.framework_id, d.hostname, avg(b.cpus_used), "
        "avg(b.cpus_limit), avg(b.mem_used), avg(b.mem_limit), max(b.mem_used), "
        "coalesce(any_value(k.ooms), 0) "
        "FROM b JOIN d ON b.grp = d.grp LEFT JOIN k ON b.grp = k.grp "
        "GROUP BY b.grp, d.tasks, d.framework_id, d.hostname "
        "ORDER BY avg(b.cpus_limit) DESC, b.grp")


GROUP_FIELDS = ("group", "tasks", "framework_id", "hostname", "cpus_used", "cpus_limit",
                "mem_used", "mem_limit", "mem_peak", "ooms")


def events_sql(view: View, now: float) -> str:
    """What explains a limit moving, newest first: OOM kills, and (by app, where all
    tasks share one definition) a launch whose allocation differs from the app's
    launch before it."""
    column = view.column
    group = "" if view.group is None else f" AND {column} = {_literal(view.group)}"
    ooms = (f"SELECT epoch(ts) AS t, {column} AS grp, task_id, 'oom_kill' AS kind, "
            "NULL::DOUBLE AS cpus_before, cpus, NULL::BIGINT AS mem_before, mem_bytes, "
            f"message FROM task_events WHERE reason = '{OOM_REASON}' "
            f"AND {_recent(view, now)}{group}")
    if view.by != "app":
        return f"{ooms} ORDER BY t DESC LIMIT {MAX_EVENTS}"
    launches = (
        "SELECT ts, app, task_id, cpus, mem_bytes, "
        "lag(cpus) OVER w AS cpus_before, lag(mem_bytes) OVER w AS mem_before "
        f"FROM task_events WHERE state = 'TASK_STAGING' AND app <> ''{group} "
        "WINDOW w AS (PARTITION BY app ORDER BY ts, task_id)")
    moved = (f"SELECT epoch(ts) AS t, app AS grp, task_id, 'limit_changed' AS kind, "
             "cpus_before, cpus, mem_before, mem_bytes, '' AS message FROM l "
             f"WHERE {_recent(view, now)} AND cpus_before IS NOT NULL "
             "AND (cpus <> cpus_before OR mem_bytes <> mem_before)")
    return (f"WITH l AS ({launches}) {ooms} UNION ALL {moved} "
            f"ORDER BY t DESC LIMIT {MAX_EVENTS}")


EVENT_FIELDS = ("t", "group", "task_id", "kind", "cpus_before", "cpus", "mem_before",
                "mem_bytes", "message")


def shape(view: View, now: float, series: Sequence[Sequence[Any]],
          groups: Sequence[Sequence[Any]], events: Sequence[Sequence[Any]],
          groups_truncated: bool = False) -> dict[str, Any]:
    """The view's JSON: the series with every bucket present (empty ones zero), the
    groups and the events as objects."""
    since = view.since(now)
    count = int((now - since) // view.bucket) + 1
    by_t = {int(row[0]): row[1:] for row in series if row[0] is not None}
    points = []
    for n in range(count):
        t = since + n * view.bucket
        values = by_t.get(t, (0, 0, 0, 0))
        points.append([t, *(_number(v) for v in values)])
    return {
        "by": view.by, "group": view.group, "window": view.window, "bucket": view.bucket,
        "since": since, "now": now,
        "series": {"columns": ["t", "cpus_used", "cpus_limit", "mem_used_bytes",
                               "mem_limit_bytes"], "points": points},
        "groups": [dict(zip(GROUP_FIELDS, row)) for row in groups],
        "groups_truncated": groups_truncated,
        "events": [dict(zip(EVENT_FIELDS, row)) for row in events],
    }


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0
