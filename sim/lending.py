"""Oversubscription on a simulated agent: the real agent glue, fed from plans.

The real agent asks `agent.oversubscription.Oversubscription.sampled` after each
usage sample what it can lend (the `revocable` of its `UsageReport`) and which
revocable tasks to evict. That glue reads the agent's executor records; a
simulated agent has none, so `Lending` hands it read-only views with the fields
it reads (framework and executor ids, the executor's resources, its live tasks,
its measured usage), built from the simulated agent's tasks at the moment of the
sample. The estimator (agent/reclaim.py) and the QoS rules (agent/qos.py) behind
it are then exactly the production ones.

A simulated run is always live (no launching or recovering executor phases),
and evictions are immediate (no task is ever "being evicted" at a sample).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from agent.model import RUNNING
from agent.oversubscription import Oversubscription, as_resources
from agent.qos import QosConfig
from agent.reclaim import Estimate, ReclaimConfig
from dyad.messages import ExecutorUsage, TaskInfo, TaskState
from dyad.resources import Resources


@attrs.frozen
class TaskView:
    """What the glue reads of an `agent.model.AgentTask`."""

    framework_id: str
    info: TaskInfo
    state: TaskState
    kill_as: None = None  # evictions are immediate: never pending at a sample

    @property
    def task_id(self) -> str:
        return self.info.task_id


@attrs.frozen
class ExecutorView:
    """What the glue reads of an `agent.model.ExecutorInfo`."""

    resources: Resources


@attrs.frozen
class RunView:
    """What the glue reads of an `agent.model.AgentExecutor`: one executor run."""

    framework_id: str
    executor_id: str
    info: ExecutorView
    tasks: tuple[TaskView, ...]
    usage: ExecutorUsage | None  # None: no task of the run has started yet
    phase: str = RUNNING

    def live_tasks(self) -> Iterator[TaskView]:
        return iter(self.tasks)


@attrs.frozen
class LendingSample:
    """One sample's outcome: what to report, and the tasks to evict (key, why)."""

    revocable: Resources
    reservation: Resources
    evict: tuple[tuple[tuple[str, str], str], ...]


class Lending:
    """The production `Oversubscription` for one simulated agent."""

    def __init__(self, reclaim: ReclaimConfig, qos: QosConfig, capacity: Resources) -> None:
        self.core = Oversubscription(reclaim, qos, capacity)

    @property
    def last(self) -> Estimate:
        return self.core.last

    def sampled(self, runs: Iterable[RunView], now: float) -> LendingSample:
        # The views carry every field the glue reads (see the module docstring).
        estimate, chosen = self.core.sampled(runs, now)  # type: ignore[arg-type]
        evict = tuple(((task.framework_id, task.task_id), why) for _, task, why in chosen)
        return LendingSample(as_resources(estimate.revocable),
                             as_resources(estimate.reservation), evict)
