"""What the master core hands the usage store: rows built from what it already
knows (docs/usage-store.md).

The core emits one `RecordUsage(samples, events, rows)` effect per `UsageReport`,
and one for the task state changes it sees or makes over `MasterConfig.usage_batch`
(`UsageDue`), only when `MasterConfig.record_usage` is set (the shell has a
store). Building the rows is pure: the agent's report plus the master's task,
framework and agent records. The shell only appends them to the store's buffer,
so ingestion costs the event loop a few attribute reads per executor and never a
wait.

Rules worth knowing when reading the store:

- one `task_usage` row per executor per report, with the dimensions of the
  executor's first live task (a command task is its own executor, so for most
  tasks this is exact); executors the master knows no live task of are skipped
  and counted (`master/usage_samples_unmatched`);
- times are the master's clock when the report or change arrived, so samples and
  events of one task are ordered alike whatever the agents' clocks say;
- the agent reports throttled time cumulatively; rows hold the change since the
  previous report of the same executor (the first report after a launch, or after
  a master failover, counts from the executor's start);
- state changes go as an events stream (`master.usage.schema.EventItem`): each
  is the very tuple the events log keeps for it (`StateRow`), and a task's
  facts (`TaskFacts`) go once, ahead of its first row this master sends (the
  task record's `usage_told`); the store joins them to the task's later rows.
  So a task's events share the role its first row in this master was charged
  to, and its agent's registration then (a record never changes agent, and an
  agent's registration is kept until the agent is removed, whose tasks come
  back as new records);
- `priority` and `revocable` are the task's (dyad/priority.py, master/revocable.py);
- `app` is the service app (`DYAD_APP_ID`) or batch job (`DYAD_JOB_ID`) label;
- `source` is the wire's (`SOURCE_MASTER`, `SOURCE_AGENT`, `SOURCE_EXECUTOR`;
  the store maps the log's short names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import attrs

from dyad.messages import ExecutorUsage, UsageReport
from master.usage.schema import Dimensions, EventItem, TaskFacts, UsageSample

if TYPE_CHECKING:
    from dyad.resources import Resources
    from master.model import MasterAgent, MasterFramework, MasterTask

APP_LABELS = ("DYAD_APP_ID", "DYAD_JOB_ID")
MIB = 2 ** 20
RoleOf = Callable[["MasterFramework", str], str]
"""The role a framework's resources on an agent (by id) are charged to."""


class RecordUsage(NamedTuple):
    """Append these rows to the usage store (the shell never waits for it): one
    per usage report, and one per `MasterConfig.usage_batch` of task events.
    `rows`: how many of `events` are state rows (the core counts them anyway)."""

    samples: Sequence[UsageSample] = ()
    events: Sequence[EventItem] = ()
    rows: int = 0


@attrs.frozen
class Rows:
    """A report's samples, and how many executors were skipped, and why."""

    samples: tuple[UsageSample, ...]
    unmatched: int = 0  # no live task known for the executor
    rejected: int = 0  # numbers the store refuses (negative, not finite)


def app_of(labels: Mapping[str, str]) -> str:
    if not labels:  # most tasks have none
        return ""
    for key in APP_LABELS:
        if labels.get(key):
            return labels[key]
    return ""


def task_facts(framework: MasterFramework, agent: MasterAgent | None, task_id: str,
               task: MasterTask | None, role: str) -> tuple:
    """What a task's rows share, laid out as `TaskFacts`: its agent's
    registration, labels, priority and allocation (0 without a record: a launch
    refused before the master made one), and `role`. A plain tuple, with None
    for an empty map (most tasks and agents have none): the collector stops
    tracking such a tuple at its first pass, and the usage store holds a
    flood's facts for a while (`master.usage.store.UsageStore`)."""
    if task is None:
        labels = None
        priority, revocable, cpus, mem_bytes = 0, False, 0.0, 0
    else:
        labels, priority, revocable = task.labels or None, task.priority, task.revocable
        cpus, mem_bytes = _sizes(task.resources)
    if agent is not None:
        hostname, attributes = agent.info.hostname, agent.info.attributes or None
    else:
        hostname, attributes = "", None
    return (framework.id, task_id, role, app_of(labels) if labels else "", hostname,
            attributes, labels, priority, revocable, cpus, mem_bytes)


_last_sizes: list = [None, 0.0, 0]
"""The last `Resources` `_sizes` was asked of, and its answer: under a launch
flood, tasks alike share one `Resources` (dyad/codec.py keeps decoded values),
and summing its scalars was a third of what a task's facts cost. A memo of a
pure function of an immutable value: never a wrong answer, whoever asks."""


def _sizes(resources: Resources) -> tuple[float, int]:
    """cpus and mem bytes of `resources`, over all roles."""
    memo = _last_sizes
    if memo[0] is not resources:
        totals = resources.scalar_items()  # one pass, not one a name
        memo[:] = resources, totals.get("cpus", 0) / 1000, totals.get("mem", 0) * MIB // 1000
    return memo[1], memo[2]


def dimensions(task_id: str, framework: MasterFramework, agent: MasterAgent | None,
               task: MasterTask | None, role: str) -> Dimensions:
    """A sample's dimensions: the same facts as its task's events have."""
    facts = TaskFacts(*task_facts(framework, agent, task_id, task, role))
    agent_id = agent.id if agent is not None else (task.agent_id if task else "")
    return Dimensions(task_id=task_id, framework_id=framework.id, role=role, app=facts.app,
                      agent_id=agent_id, hostname=facts.hostname,
                      agent_attributes=facts.agent_attributes or {},
                      labels=facts.labels or {}, priority=facts.priority,
                      revocable=facts.revocable)


def usage_samples(report: UsageReport, agent: MasterAgent,
                  frameworks: Mapping[str, MasterFramework], role_of: RoleOf,
                  now: float) -> Rows:
    """The report's rows. Call before the core overwrites `task.usage` with this
    report: the previous one gives the throttled-time delta."""
    samples: list[UsageSample] = []
    unmatched = rejected = 0
    for usage in report.executors:
        framework = frameworks.get(usage.framework_id)
        task = _first_live_task(framework, usage, agent.id)
        if framework is None or task is None:
            unmatched += 1
            continue
        try:
            samples.append(UsageSample(
                at=now, who=dimensions(task.task_id, framework, agent, task,
                                       role_of(framework, agent.id)),
                executor_id=usage.executor_id, cpus_used=usage.cpus_used,
                cpus_limit=usage.cpus_limit,
                cpus_throttled_secs=_throttled_delta(task, usage),
                mem_rss_bytes=usage.mem_rss_bytes, mem_limit_bytes=usage.mem_limit_bytes))
        except (ValueError, TypeError):
            rejected += 1
    return Rows(tuple(samples), unmatched, rejected)


def _first_live_task(framework: MasterFramework | None, usage: ExecutorUsage,
                     agent_id: str) -> MasterTask | None:
    if framework is None:
        return None
    for task_id in usage.task_ids:
        task = framework.tasks.get(task_id)
        if task is not None and task.agent_id == agent_id:
            return task
    return None


def _throttled_delta(task: MasterTask, usage: ExecutorUsage) -> float:
    total = usage.cpus_throttled_time_secs
    previous = task.usage
    if previous is None or previous.get("executor_id") != usage.executor_id:
        return total
    delta = total - float(previous.get("cpus_throttled_time_secs", 0.0))
    # A smaller total means the counter restarted (a new cgroup): count it afresh.
    return delta if delta >= 0 else total
