"""frameworks.testing: builders, FakeSchedulerDriver and SchedulerHarness, used the
way a framework author would use them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from frameworks import (
    CommandInfo, Filters, FrameworkInfo, Offer, Operation, OperationType, Resources,
    Scheduler, TaskInfo, TaskState, TaskStatus)
from frameworks.testing import (
    DriverCall, FakeSchedulerDriver, SchedulerHarness, make_agent_id, make_offer,
    make_status)
from dyad.messages import ReconcileTask


class OneTaskPerOffer(Scheduler):
    """Launches `wanted` tasks of cpus:1, one per offer that fits; declines the rest;
    stops when all have finished."""

    def __init__(self, wanted: int = 2) -> None:
        self.wanted = wanted
        self.launched = 0
        self.finished = 0

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        for offer in offers:
            if self.launched < self.wanted and offer.resources.get("cpus") >= 1:
                self.launched += 1
                driver.launch_tasks([offer.id], [TaskInfo(
                    task_id=f"task-{self.launched}", name="work", agent_id=offer.agent_id,
                    resources=Resources.of(cpus=1, mem=64),
                    command=CommandInfo(shell="work"))])
            else:
                driver.decline_offer(offer.id, Filters(refuse_seconds=60))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        if status.state is TaskState.TASK_FINISHED:
            self.finished += 1
            if self.finished == self.wanted:
                driver.stop()
        elif status.state is TaskState.TASK_FAILED:
            driver.reconcile_tasks([status])


class AsyncScheduler(Scheduler):
    async def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        await asyncio.sleep(0)
        for offer in offers:
            driver.decline_offer(offer.id)

    async def status_update(self, driver: Any, status: TaskStatus) -> None:
        await asyncio.sleep(0)
        driver.acknowledge_status_update(status)


def test_builders_make_sequential_unique_ids() -> None:
    a, b = make_offer(), make_offer()
    assert a.id != b.id and a.agent_id != b.agent_id
    assert a.resources == Resources.parse("cpus:4;mem:1024")
    same_agent = make_offer(agent_id="agent-x", hostname="h1", resources="cpus:1",
                            attributes={"rack": "r1"})
    assert (same_agent.agent_id, same_agent.hostname) == ("agent-x", "h1")
    assert same_agent.attributes == {"rack": "r1"}
    assert make_agent_id() != make_agent_id()
    task = TaskInfo(task_id="t1", name="t", agent_id="agent-x", resources=Resources.of(cpus=1),
                    command=CommandInfo(shell="x"))
    status = make_status(task, TaskState.TASK_RUNNING)
    assert (status.task_id, status.agent_id) == ("t1", "agent-x") and status.uuid
    assert make_status("t2", TaskState.TASK_LOST, uuid="").uuid == ""


def test_harness_drives_a_sync_scheduler() -> None:
    harness = SchedulerHarness(OneTaskPerOffer(wanted=2))
    harness.register()
    small = make_offer(resources="cpus:0.5;mem:512")
    big1, big2, big3 = make_offer(), make_offer(), make_offer()
    calls = harness.offer(small, big1)
    assert [c.method for c in calls] == ["decline_offer", "launch_tasks"]
    harness.offer(big2, big3)
    driver = harness.driver
    assert [t.task_id for t in driver.launched_tasks] == ["task-1", "task-2"]
    assert [ids for ids, _, _ in driver.launched] == [[big1.id], [big2.id]]
    assert driver.declined == [(small.id, Filters(refuse_seconds=60)),
                               (big3.id, Filters(refuse_seconds=60))]
    assert len(driver.accepted) == 2
    assert driver.accepted[0][1][0].type == OperationType.LAUNCH

    task1, task2 = driver.launched_tasks
    harness.update(task1, TaskState.TASK_FINISHED)
    assert not driver.stopped
    failed = make_status(task2, TaskState.TASK_FAILED)
    assert harness.update(failed) == [DriverCall("reconcile_tasks", (
        [ReconcileTask(task_id="task-2", agent_id=task2.agent_id)],))]
    harness.update(task2, TaskState.TASK_FINISHED)
    assert driver.stopped and driver.failover is False
    assert len(harness.implicitly_acknowledged) == 3
    assert driver.acknowledged == []


def test_harness_runs_async_callbacks() -> None:
    harness = SchedulerHarness(AsyncScheduler(),
                               FrameworkInfo(name="x", implicit_acknowledgements=False))
    offer = make_offer()
    assert harness.offer(offer) == [DriverCall("decline_offer", (offer.id, None))]
    status = make_status("t1", TaskState.TASK_RUNNING)
    harness.update(status)
    assert harness.driver.acknowledged == [status]
    assert harness.implicitly_acknowledged == []


async def test_harness_refuses_async_callbacks_inside_a_running_loop() -> None:
    harness = SchedulerHarness(AsyncScheduler())
    with pytest.raises(RuntimeError, match="FakeSchedulerDriver"):
        harness.offer(make_offer())
    # the documented alternative: await the callback with a FakeSchedulerDriver
    driver = FakeSchedulerDriver()
    offer = make_offer()
    await AsyncScheduler().resource_offers(driver, [offer])
    assert driver.declined == [(offer.id, Filters())]


def test_harness_lets_callback_exceptions_reach_the_test() -> None:
    class Broken(Scheduler):
        def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
            raise KeyError("bug")

    with pytest.raises(KeyError):
        SchedulerHarness(Broken()).offer(make_offer())


def test_fake_driver_records_every_call() -> None:
    driver = FakeSchedulerDriver()
    task = TaskInfo(task_id="t1", name="t", agent_id="a1", resources=Resources.of(cpus=1),
                    command=CommandInfo(shell="x"))
    driver.accept_offers(["o1"], [Operation(type=OperationType.LAUNCH, tasks=[task])],
                         Filters(refuse_seconds=1))
    driver.launch_tasks(["o2"], [])  # no tasks: a decline, as with the real driver
    driver.kill_task("t1", kill_grace_period=2)
    driver.suppress_offers()
    driver.revive_offers()
    driver.revive_offers()
    driver.reconcile_tasks([])
    driver.send_framework_message("e1", "a1", b"hi")
    driver.stop(failover=True)
    assert driver.launched_tasks == [task]
    assert driver.declined == [("o2", Filters())]
    assert driver.killed == ["t1"]
    assert (driver.suppressed, driver.revived) == (1, 2)
    assert driver.reconciled == [[]]
    assert driver.messages == [("e1", "a1", b"hi")]
    assert driver.stopped and driver.failover is True
    assert [c.method for c in driver.calls][-1] == "stop"


# ------------------------------------- the harness on the documented examples


def load_example(relative: str) -> Any:
    path = Path(__file__).resolve().parents[2] / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hello_example_launches_once_and_stops() -> None:
    """The snippet of docs/framework-guide.md, run on examples/hello.py."""
    hello = load_example("examples/hello.py")
    harness = SchedulerHarness(hello.Hello())
    harness.register()
    calls = harness.offer(make_offer(), make_offer(resources="cpus:0.05;mem:16"))
    assert [c.method for c in calls] == ["launch_tasks", "decline_offer"]
    (task,) = harness.driver.launched_tasks
    assert task.command == CommandInfo(shell="echo hello from dyad")
    harness.update(task, TaskState.TASK_FINISHED)
    assert harness.driver.stopped and harness.driver.failover is False


def test_pi_example_spreads_tasks_and_counts_each_result_once() -> None:
    pi = load_example("examples/pi/scheduler.py")
    scheduler = pi.PiScheduler(tasks=4, samples=100)
    harness = SchedulerHarness(scheduler)
    harness.register()
    agents = [make_offer(resources="cpus:2;mem:256") for _ in range(3)]
    harness.offer(*agents)
    driver = harness.driver
    per_agent = sorted(len(tasks) for _, tasks, _ in driver.launched)
    assert per_agent == [1, 1, 2] and driver.suppressed == 1
    assert {t.executor.executor_id for t in driver.launched_tasks if t.executor} == {"pi-executor"}
    assert all(t.executor for t in driver.launched_tasks)

    def result(task_id: str, inside: int) -> bytes:
        return json.dumps({"task_id": task_id, "inside": inside, "total": 100}).encode()

    tasks = driver.launched_tasks
    # the first result both as a message and in the update: counted once
    harness.framework_message("pi-executor", tasks[0].agent_id, result(tasks[0].task_id, 78))
    harness.update(tasks[0], TaskState.TASK_FINISHED, data=result(tasks[0].task_id, 78))
    for task in tasks[1:]:
        assert not driver.stopped
        harness.update(task, TaskState.TASK_FINISHED, data=result(task.task_id, 79))
    assert driver.stopped
    assert scheduler.estimate() == (4 * (78 + 3 * 79) / 400, 400)
