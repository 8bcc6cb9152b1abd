"""frameworks.effects: each shared effect is exactly one driver call."""

from __future__ import annotations

import pytest

from dyad.messages import CommandInfo, Filters, ReconcileTask, TaskInfo
from dyad.resources import Resources
from frameworks.effects import (
    DeclineOffers, LaunchTasks, ReconcileTasks, RequestKill, ReviveOffers, SuppressOffers,
    perform)
from frameworks.testing import DriverCall, FakeSchedulerDriver

TASK = TaskInfo(task_id="t1", name="t1", agent_id="a1", resources=Resources.of(cpus=0.1),
                command=CommandInfo(shell="true"))


@pytest.mark.parametrize("effect, call", [
    (LaunchTasks("o1", (TASK,), 7.0),
     DriverCall("launch_tasks", (["o1"], [TASK], Filters(refuse_seconds=7.0)))),
    (DeclineOffers(("o1", "o2"), 30.0),
     DriverCall("decline_offers", (["o1", "o2"], Filters(refuse_seconds=30.0)))),
    (SuppressOffers(), DriverCall("suppress_offers")),
    (ReviveOffers(), DriverCall("revive_offers")),
    (RequestKill("t1"), DriverCall("kill_task", ("t1", None))),
    (RequestKill("t1", 2.5), DriverCall("kill_task", ("t1", 2.5))),
    (ReconcileTasks((("t1", "a1"),)),
     DriverCall("reconcile_tasks", ([ReconcileTask(task_id="t1", agent_id="a1")],))),
    (ReconcileTasks(), DriverCall("reconcile_tasks", ([],))),
])
def test_each_effect_is_one_driver_call(effect: object, call: DriverCall) -> None:
    driver = FakeSchedulerDriver()
    perform(effect, driver)  # type: ignore[arg-type]
    assert driver.calls == [call]


def test_anything_else_is_refused() -> None:
    with pytest.raises(TypeError, match="not a driver effect"):
        perform("launch", FakeSchedulerDriver())  # type: ignore[arg-type]
