"""Oversubscription on the agent: the reclamation estimator (agent/reclaim.py)
and the QoS controller (agent/qos.py) fed from the agent's records.

After every usage sample `AgentState` asks `Oversubscription.sampled` what it can
lend (reported to the master in the `UsageReport`) and which revocable tasks to
evict (killed TASK_KILLED with REASON_CONTAINER_PREEMPTED). Pure: it reads
executor records and returns numbers and choices; the agent acts on them.

How runs are seen:

- an *owner run* has only non-revocable tasks; its allocation (executor plus
  tasks) and its measured usage feed the estimator;
- a run with a revocable task lends nothing, and each of its revocable tasks is
  a candidate for eviction, measured as its share of the run's usage (by its
  part of the run's allocation, kind by kind);
- a task's start is when the agent first saw it live (an agent restarted since
  takes the restart as the start).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.model import MIB, AgentExecutor, AgentTask
from agent.qos import Lent, QosConfig, corrections
from agent.reclaim import (
    ZERO,
    Amount,
    Estimate,
    ReclaimConfig,
    ReclaimEstimator,
    RunSample,
)
from agent.records import LIVE_PHASES
from dyad.messages import TaskState
from dyad.resources import Resources

TaskKey = tuple[str, str]  # (framework id, task id)


def amount(resources: Resources) -> Amount:
    return Amount(resources.get("cpus"), resources.get("mem"))


def as_resources(value: Amount) -> Resources:
    value = value.rounded()
    return Resources.of(cpus=value.cpus, mem=value.mem)


class Oversubscription:
    """See the module docstring."""

    def __init__(self, reclaim: ReclaimConfig, qos: QosConfig, capacity: Resources) -> None:
        self.qos = qos
        self.estimator = ReclaimEstimator(reclaim)
        self.capacity = amount(capacity)
        self._since: dict[TaskKey, float] = {}
        self.evicted = 0

    @property
    def last(self) -> Estimate:
        return self.estimator.last

    def sampled(self, executors: Iterable[AgentExecutor], now: float
                ) -> tuple[Estimate, list[tuple[AgentExecutor, AgentTask, str]]]:
        """What the agent can lend now, and the revocable tasks to evict (with why)."""
        owners: dict[TaskKey, RunSample] = {}
        lent: list[Lent] = []
        found: dict[tuple[str, ...], tuple[AgentExecutor, AgentTask]] = {}
        owners_used = ZERO
        live: set[TaskKey] = set()
        for executor in executors:
            tasks = list(executor.live_tasks())
            usage = _usage(executor)
            for task in tasks:
                key = (task.framework_id, task.task_id)
                live.add(key)
                self._since.setdefault(key, now)
            borrowers = [t for t in tasks if t.info.revocable]
            if not borrowers:
                if tasks and executor.phase in LIVE_PHASES:
                    owners[(executor.framework_id, executor.executor_id)] = RunSample(
                        _allocation(executor, tasks), usage)
                owners_used += usage or ZERO
                continue
            whole = _allocation(executor, tasks)
            lent_used = ZERO
            for task in borrowers:
                share = _share(amount(task.info.resources), whole, usage)
                lent_used += share
                if task.kill_as is not None or task.state == TaskState.TASK_KILLING:
                    continue  # being evicted or killed: already counted as gone
                key = (task.framework_id, task.task_id)
                found[key] = (executor, task)
                lent.append(Lent(key, task.info.priority, self._since[key],
                                 amount(task.info.resources), share))
            owners_used += ((usage or ZERO) - lent_used).positive()
        for key in [k for k in self._since if k not in live]:
            del self._since[key]
        estimate = self.estimator.update(owners, now)
        chosen = corrections(self.qos, capacity=self.capacity, revocable=estimate.revocable,
                             lent=lent, owners_used=owners_used)
        self.evicted += len(chosen)
        return estimate, [(*found[e.key], e.why) for e in chosen]  # type: ignore[index]


def _usage(executor: AgentExecutor) -> Amount | None:
    usage = executor.usage
    if usage is None:
        return None
    return Amount(usage.cpus_used, usage.mem_rss_bytes / MIB)


def _allocation(executor: AgentExecutor, tasks: list[AgentTask]) -> Amount:
    total = amount(executor.info.resources)
    for task in tasks:
        total += amount(task.info.resources)
    return total


def _share(part: Amount, whole: Amount, usage: Amount | None) -> Amount:
    if usage is None:
        return ZERO
    return Amount(usage.cpus * part.cpus / whole.cpus if whole.cpus else 0.0,
                  usage.mem * part.mem / whole.mem if whole.mem else 0.0)
