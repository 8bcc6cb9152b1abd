"""What the master core hands the usage store: rows built from what it already
knows (docs/usage-store.md).

The core emits one `RecordUsage(samples, events)` effect per `UsageReport` and
per task state change it sees or makes, only when `MasterConfig.record_usage` is
set (the shell has a store). Building the rows is pure: the agent's report plus
the master's task, framework and agent records. The shell only appends them to
the store's buffer, so ingestion costs the event loop a few attribute reads per
executor and never a wait.

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
- `app` is the service app (`DYAD_APP_ID`) or batch job (`DYAD_JOB_ID`) label;
- `source` is the wire's (`SOURCE_MASTER`, `SOURCE_AGENT`, `SOURCE_EXECUTOR`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from dyad.messages import ExecutorUsage, Source, UsageReport
from master.usage.schema import Dimensions, TaskEvent, UsageSample, trusted_event

if TYPE_CHECKING:
    from master.model import MasterAgent, MasterFramework, MasterTask

APP_LABELS = ("DYAD_APP_ID", "DYAD_JOB_ID")
MIB = 2 ** 20
# The events log's short names for who made a status; the store keeps the wire's.
_SOURCES = {"master": Source.MASTER, "agent": Source.AGENT, "executor": Source.EXECUTOR}

DIMENSIONS_KEPT = 100_000
"""Tasks whose dimensions `DimensionsCache` keeps at most (a task's are dropped
once its terminal state is recorded)."""

RoleOf = Callable[["MasterFramework", str], str]
"""The role a framework's resources on an agent (by id) are charged to."""


@attrs.frozen
class RecordUsage:
    """Append these rows to the usage store (the shell never waits for it)."""

    samples: tuple[UsageSample, ...] = ()
    events: tuple[TaskEvent, ...] = ()


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


def dimensions(task_id: str, framework: MasterFramework, agent: MasterAgent | None,
               task: MasterTask | None, role: str) -> Dimensions:
    labels = task.labels if task is not None else {}
    return Dimensions(
        task_id=task_id, framework_id=framework.id, role=role, app=app_of(labels),
        agent_id=agent.id if agent is not None else (task.agent_id if task else ""),
        hostname=agent.info.hostname if agent is not None else "",
        agent_attributes=agent.info.attributes if agent is not None else {}, labels=labels)


def sizes(task: MasterTask | None) -> tuple[float, int]:
    """A task event's `cpus` and `mem_bytes`: the task's allocation (0 without a record)."""
    if task is None:
        return 0.0, 0
    resources = task.resources
    return resources.get("cpus"), int(resources.get("mem") * MIB)


class DimensionsCache:
    """The dimensions (and row sizes, `sizes`) of tasks recently recorded, so a
    task's events after its first reuse one value (issue 19: building them was
    most of what the usage rows cost the master under a launch flood, three
    events a task). A kept value is used only while what it was built from is
    the very same: the agent's info, the task record and its resources, and the
    role; anything else builds afresh, so the rows are exactly those
    `dimensions` and `sizes` give."""

    def __init__(self, most: int = DIMENSIONS_KEPT) -> None:
        self.most = most
        self._kept: dict[tuple[str, str],
                         tuple[object, object, str, object, tuple[Dimensions, float, int]]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def parts(self, task_id: str, framework: MasterFramework, agent: MasterAgent | None,
              task: MasterTask | None, role: str) -> tuple[Dimensions, float, int]:
        """The task's dimensions, `cpus` and `mem_bytes`."""
        key = (framework.id, task_id)
        info = agent.info if agent is not None else None
        resources = task.resources if task is not None else None
        kept = self._kept.get(key)
        if (kept is not None and kept[0] is info and kept[1] is task and kept[2] == role
                and kept[3] is resources):
            return kept[4]
        made = (dimensions(task_id, framework, agent, task, role), *sizes(task))
        if len(self._kept) >= self.most:
            self._kept.clear()  # rebuilt as tasks speak again: a bound, not a policy
        self._kept[key] = (info, task, role, resources, made)
        return made

    def forget(self, framework_id: str, task_id: str) -> None:
        self._kept.pop((framework_id, task_id), None)


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


def task_event(task_id: str, framework: MasterFramework, agent: MasterAgent | None,
               task: MasterTask | None, role: str, state: str, now: float, *,
               reason: str = "", message: str = "", source: str = "",
               healthy: bool | None = None,
               parts: tuple[Dimensions, float, int] | None = None) -> TaskEvent:
    """A state change as a row; `task` is None for a launch refused before the
    master made a record of it. `parts`: its dimensions, `cpus` and `mem_bytes`,
    if the caller has them (`DimensionsCache.parts`). Built unchecked
    (`trusted_event`): every value is the master core's own, its clock and the
    task's record."""
    who, cpus, mem_bytes = (parts if parts is not None
                            else (dimensions(task_id, framework, agent, task, role), *sizes(task)))
    return trusted_event((now, who, state, reason, message, source_name(source), healthy,
                          cpus, mem_bytes))


def source_name(source: str) -> str:
    """The store's `source` for the events log's short name (others as they are)."""
    return _SOURCES.get(source, source)
