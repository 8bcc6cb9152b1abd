"""What the master core hands the usage store: rows built from what it already
knows (docs/usage-store.md).

The core emits one `RecordUsage(samples, events)` effect per `UsageReport` and
per step with task state changes it sees or makes, only when
`MasterConfig.record_usage` is set (the shell has a store). Building the rows is
pure: the agent's report plus the master's task, framework and agent records. The
shell only appends them to the store's buffer, so ingestion costs the event loop a
few attribute reads per executor and never a wait.

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
- an event row carries its task's facts (`TaskFacts`) only when the store has
  not been told them (`ToldTasks`); the store joins them to the task's later
  rows. So a task's events share the role its first row in this master was
  charged to, and its agent's registration and record as they were then, until
  either is replaced (the next row carries them afresh);
- `priority` and `revocable` are the task's (dyad/priority.py, master/revocable.py);
- `app` is the service app (`DYAD_APP_ID`) or batch job (`DYAD_JOB_ID`) label;
- `source` is the wire's (`SOURCE_MASTER`, `SOURCE_AGENT`, `SOURCE_EXECUTOR`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import attrs

from dyad.messages import ExecutorUsage, Source, UsageReport
from master.usage.schema import TASKS_TOLD, Dimensions, TaskEvent, TaskFacts, UsageSample

if TYPE_CHECKING:
    from master.model import MasterAgent, MasterFramework, MasterTask

APP_LABELS = ("DYAD_APP_ID", "DYAD_JOB_ID")
MIB = 2 ** 20
SOURCES = {"master": Source.MASTER, "agent": Source.AGENT, "executor": Source.EXECUTOR}
"""The events log's short names for who made a status; the store keeps the wire's
(others as they are)."""

tuple_new = tuple.__new__
"""Builds a row type (a named tuple) from values unchecked: the core's own values."""

RoleOf = Callable[["MasterFramework", str], str]
"""The role a framework's resources on an agent (by id) are charged to."""


class RecordUsage(NamedTuple):
    """Append these rows to the usage store (the shell never waits for it). A
    named tuple, not an attrs class: a step with task events makes one, and a
    launch flood makes two or three a task (the core builds it with `tuple_new`)."""

    samples: Sequence[UsageSample] = ()
    events: Sequence[TaskEvent] = ()


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


def task_facts(framework: MasterFramework, agent: MasterAgent | None,
               task: MasterTask | None, role: str) -> TaskFacts:
    """What a task's rows share: its agent (the agent's current registration),
    labels, priority and allocation (0 without a record: a launch refused before
    the master made one), and `role`."""
    if task is None:
        labels: dict[str, str] = {}
        priority, revocable, cpus, mem_bytes = 0, False, 0.0, 0
    else:
        labels, priority, revocable = task.labels, task.priority, task.revocable
        totals = task.resources.scalar_items()  # one pass, not one a name
        cpus = totals.get("cpus", 0) / 1000
        mem_bytes = totals.get("mem", 0) * MIB // 1000
    if agent is not None:
        agent_id, hostname, attributes = agent.id, agent.info.hostname, agent.info.attributes
    else:
        agent_id, hostname, attributes = (task.agent_id if task else ""), "", {}
    return tuple_new(TaskFacts, (role, app_of(labels), agent_id, hostname, attributes, labels,
                                  priority, revocable, cpus, mem_bytes))


def dimensions(task_id: str, framework: MasterFramework, agent: MasterAgent | None,
               task: MasterTask | None, role: str) -> Dimensions:
    """A sample's dimensions: the same facts as its task's events have."""
    facts = task_facts(framework, agent, task, role)
    return Dimensions(task_id=task_id, framework_id=framework.id, role=role, app=facts.app,
                      agent_id=facts.agent_id, hostname=facts.hostname,
                      agent_attributes=facts.agent_attributes, labels=facts.labels,
                      priority=facts.priority, revocable=facts.revocable)


class ToldTasks:
    """Which tasks' facts the usage store has been sent (the master's half of
    `master.usage.schema.KnownTasks`), so that a task's events after its first
    carry only its ids and state (issue 19: building and sending every event's
    dimensions was most of what the store cost the master under a launch flood,
    three events a task). A task's facts are sent again when what they came
    from is not the very same: the task's record, or its agent's registration.
    The role is the one the task's first row was charged to.

    Both halves forget a task after its terminal row, and everything at a
    `FORGET_ALL` row, which `forget_all` asks the caller to send (`pending`):
    at the bound `most`, or when a failed step's rows were lost."""

    def __init__(self, most: int = TASKS_TOLD) -> None:
        self.most = most
        self.pending = False  # a `FORGET_ALL` row must go before the next row
        self._told: dict[tuple[str, str], tuple[object, object]] = {}

    def __len__(self) -> int:
        return len(self._told)

    def must_tell(self, key: tuple[str, str], task: MasterTask | None,
                  agent: MasterAgent | None) -> bool:
        """Whether this row must carry the task's facts; if so they count as told
        from now on (one call a row: this is on the master's launch path)."""
        info = agent.info if agent is not None else None
        told = self._told.get(key)
        if told is not None and told[0] is task and told[1] is info:
            return False
        if len(self._told) >= self.most:
            self.forget_all()
        self._told[key] = (task, info)
        return True

    def forget(self, key: tuple[str, str]) -> None:
        self._told.pop(key, None)

    def forget_all(self) -> None:
        self._told.clear()
        self.pending = True


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
