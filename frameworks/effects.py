"""The one vocabulary a framework's pure core uses to ask for driver calls.

The batch and service cores decide; their shells own a `SchedulerDriver` (or a
`frameworks.testing.FakeSchedulerDriver`). These small frozen values are what a
core returns when it wants the driver to do something, and `perform` is the one
place that turns each into its driver call, so every shell means the same thing
by "launch", "decline" or "kill". Pure: a core may import this module.

Names follow the driver's methods (`launch_tasks` is `LaunchTasks`), except the
kill: `RequestKill`, because `KillTask` is the agent's wire message.
"""

from __future__ import annotations

from typing import Any

import attrs

from dyad.messages import Filters, Operation, ResourceRequest, TaskInfo
from dyad.resources import Resources


@attrs.frozen
class LaunchTasks:
    """Accept `offer_id` with these tasks; what they leave unused is refused to us
    for `refuse_seconds`."""

    offer_id: str
    tasks: tuple[TaskInfo, ...]
    refuse_seconds: float


@attrs.frozen
class AcceptOffer:
    """Accept `offer_id` with `operations` (RESERVE, CREATE, LAUNCH, ...) in order;
    what they leave unused is refused to us for `refuse_seconds`."""

    offer_id: str
    operations: tuple[Operation, ...]
    refuse_seconds: float


@attrs.frozen
class DeclineOffers:
    """Give the offers back, refused to us for `refuse_seconds`."""

    offer_ids: tuple[str, ...]
    refuse_seconds: float


@attrs.frozen
class SuppressOffers:
    """Nothing to launch: stop sending offers until `ReviveOffers`."""


@attrs.frozen
class ReviveOffers:
    """Something to launch: clear our filters and resume offers."""


@attrs.frozen
class RequestResources:
    """Declare what we want now: `requests` are (task shape, how many) pairs;
    none clears the declaration (`SchedulerDriver.request_resources`)."""

    requests: tuple[tuple[Resources, int], ...]


@attrs.frozen
class RequestKill:
    """Ask the master to kill a task; ``grace_period`` None keeps the executor's
    default SIGTERM-to-SIGKILL wait."""

    task_id: str
    grace_period: float | None = None


@attrs.frozen
class AskPreemption:
    """Ask the master to free room on one agent for a task of `priority` needing
    `resources` (`SchedulerDriver.preempt`)."""

    resources: Resources
    priority: int


@attrs.frozen
class ReconcileTasks:
    """Ask for the latest state of these ``(task_id, agent_id)`` pairs; empty asks
    for every task of the framework the master knows (implicit reconciliation)."""

    tasks: tuple[tuple[str, str], ...] = ()


DriverEffect = (LaunchTasks | AcceptOffer | DeclineOffers | SuppressOffers | ReviveOffers
                | RequestResources | RequestKill | AskPreemption | ReconcileTasks)


def perform(effect: DriverEffect, driver: Any) -> None:
    """Make the driver call `effect` stands for. `driver` is a `SchedulerDriver`
    or anything with its methods (such as `FakeSchedulerDriver`)."""
    match effect:
        case LaunchTasks(offer_id, tasks, refuse_seconds):
            driver.launch_tasks([offer_id], list(tasks), Filters(refuse_seconds=refuse_seconds))
        case AcceptOffer(offer_id, operations, refuse_seconds):
            driver.accept_offers([offer_id], list(operations),
                                 Filters(refuse_seconds=refuse_seconds))
        case DeclineOffers(offer_ids, refuse_seconds):
            driver.decline_offers(list(offer_ids), Filters(refuse_seconds=refuse_seconds))
        case SuppressOffers():
            driver.suppress_offers()
        case ReviveOffers():
            driver.revive_offers()
        case RequestResources(requests):
            driver.request_resources([ResourceRequest(resources=resources, count=count)
                                      for resources, count in requests])
        case RequestKill(task_id, grace_period):
            driver.kill_task(task_id, grace_period)
        case AskPreemption(resources, priority):
            driver.preempt(resources, priority)
        case ReconcileTasks(tasks):
            driver.reconcile_tasks(list(tasks))
        case _:
            raise TypeError(f"not a driver effect: {effect!r}")
