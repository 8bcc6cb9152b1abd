"""The public API for writing Dyad frameworks.

A framework is a `Scheduler` (decides what runs where, from resource offers) driven
by a `SchedulerDriver`, and optionally a custom `Executor` driven by an
`ExecutorDriver` on each agent. Tasks with a plain `CommandInfo` need no executor of
yours: the built-in command executor runs them.

    from frameworks import (CommandInfo, Filters, FrameworkInfo, Scheduler,
                            SchedulerDriver, TaskInfo, TaskState)
    from dyad.resources import Resources

    class Hello(Scheduler):
        def resource_offers(self, driver, offers):
            for offer in offers:
                task = TaskInfo(task_id="t1", name="hello", agent_id=offer.agent_id,
                                resources=Resources.parse("cpus:0.1;mem:32"),
                                command=CommandInfo(shell="echo hello"))
                driver.launch_tasks([offer.id], [task], filters=Filters(refuse_seconds=5))

        def status_update(self, driver, status):
            if status.state == TaskState.TASK_FINISHED:
                driver.stop()

    SchedulerDriver(Hello(), FrameworkInfo(name="hello"), master="127.0.0.1:5050").run()

See docs/framework-guide.md; `frameworks.testing` helps test a framework without a
cluster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dyad.containers import ContainerInfo, DockerInfo, PortMapping, Volume
    from dyad.messages import (
        URI, AgentInfo, CommandInfo, ExecutorInfo, Filters, FrameworkInfo, MasterInfo, Offer,
        Operation, OperationType, Reason, Source, TaskInfo, TaskState, TaskStatus)
    from dyad.resources import Resources
    from dyad.volumes import PersistentVolume
    from frameworks.driver_core import DriverStatus
    from frameworks.executor import Executor, ExecutorDriver
    from frameworks.executor_core import ExecutorEnvironmentError
    from frameworks.scheduler import Scheduler, SchedulerDriver

# The names are imported when first used: the command executor, started once per
# task, lives in this package and must not pay for the scheduler side's imports.
_HOMES = {
    **dict.fromkeys(["ContainerInfo", "DockerInfo", "PortMapping", "Volume"], "dyad.containers"),
    **dict.fromkeys(["URI", "AgentInfo", "CommandInfo", "ExecutorInfo", "Filters",
                     "FrameworkInfo", "MasterInfo", "Offer", "Operation", "OperationType",
                     "Reason", "Source", "TaskInfo", "TaskState", "TaskStatus"], "dyad.messages"),
    "Resources": "dyad.resources",
    "PersistentVolume": "dyad.volumes",
    "DriverStatus": "frameworks.driver_core",
    "Executor": "frameworks.executor",
    "ExecutorDriver": "frameworks.executor",
    "ExecutorEnvironmentError": "frameworks.executor_core",
    "Scheduler": "frameworks.scheduler",
    "SchedulerDriver": "frameworks.scheduler",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'frameworks' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "URI", "AgentInfo", "CommandInfo", "ContainerInfo", "DockerInfo", "DriverStatus",
    "Executor", "ExecutorDriver", "ExecutorEnvironmentError", "ExecutorInfo", "Filters",
    "FrameworkInfo", "MasterInfo", "Offer", "Operation", "OperationType", "PersistentVolume",
    "PortMapping", "Reason", "Resources", "Scheduler", "SchedulerDriver", "Source", "TaskInfo",
    "TaskState", "TaskStatus", "Volume",
]
