"""Fixtures for tests that run real `dyad-master` and `dyad-agent` processes.

Timeouts are shortened through the real command-line flags (not by patching), so
what is tested is what an operator runs, only faster.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from dyad.local import LocalCluster
from frameworks import Scheduler, SchedulerDriver, FrameworkInfo, TaskStatus
from tests.helpers import wait_for

FAST_MASTER = ["--allocation-interval", "0.1s", "--offer-timeout", "30s",
               "--agent-ping-timeout", "0.5s", "--max-agent-ping-timeouts", "3",
               "--heartbeat-interval", "0.5s"]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []

    def make(agents: int = 2, master_args: list[str] | None = None,
             resources: str = "cpus:2;mem:1024;disk:1000",
             agent_args: list[str] | None = None) -> LocalCluster:
        cluster = LocalCluster(work_dir=tmp_path / f"cluster{len(started)}", agents=agents,
                               resources=resources,
                               master_args=FAST_MASTER + (master_args or []),
                               agent_args=agent_args or [])
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


class Recorder(Scheduler):
    """A scheduler that records every callback, for tests to wait on and assert."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.offers: list[Any] = []
        self.statuses: list[TaskStatus] = []
        self.framework_id: str | None = None
        self.on_offers: Callable[[SchedulerDriver, list[Any]], None] | None = None

    def registered(self, driver: SchedulerDriver, framework_id: str, master_info: Any) -> None:
        self.framework_id = framework_id
        self.events.append(("registered", framework_id))

    def reregistered(self, driver: SchedulerDriver, master_info: Any) -> None:
        self.events.append(("reregistered", master_info))

    def disconnected(self, driver: SchedulerDriver) -> None:
        self.events.append(("disconnected", None))

    def resource_offers(self, driver: SchedulerDriver, offers: list[Any]) -> None:
        self.offers.extend(offers)
        self.events.append(("offers", offers))
        if self.on_offers is not None:
            self.on_offers(driver, offers)

    def offer_rescinded(self, driver: SchedulerDriver, offer_id: str) -> None:
        self.events.append(("rescinded", offer_id))

    def status_update(self, driver: SchedulerDriver, status: TaskStatus) -> None:
        self.statuses.append(status)
        self.events.append(("status", status))

    def agent_lost(self, driver: SchedulerDriver, agent_id: str) -> None:
        self.events.append(("agent_lost", agent_id))

    def executor_lost(self, driver: SchedulerDriver, executor_id: str, agent_id: str,
                      status: int) -> None:
        self.events.append(("executor_lost", (executor_id, agent_id, status)))

    def framework_message(self, driver: SchedulerDriver, executor_id: str, agent_id: str,
                          data: bytes) -> None:
        self.events.append(("message", data))

    def error(self, driver: SchedulerDriver, message: str) -> None:
        self.events.append(("error", message))

    def states(self, task_id: str) -> list[str]:
        return [s.state.name for s in self.statuses if s.task_id == task_id]

    def named(self, kind: str) -> list[Any]:
        return [value for name, value in self.events if name == kind]


class RunningDriver:
    """A SchedulerDriver running in the test's event loop."""

    def __init__(self, scheduler: Recorder, info: FrameworkInfo, master: str) -> None:
        self.scheduler = scheduler
        self.driver = SchedulerDriver(scheduler, info, master=master)
        self.task = asyncio.ensure_future(self.driver.run_async())

    async def registered(self, timeout: float = 15.0) -> str:
        await wait_for(lambda: self.scheduler.framework_id, timeout, "registration")
        assert self.scheduler.framework_id is not None
        return self.scheduler.framework_id

    async def stop(self, failover: bool = False) -> None:
        self.driver.stop(failover=failover)
        await asyncio.wait_for(self.task, 15)


@pytest.fixture
async def drivers() -> Any:
    running: list[RunningDriver] = []

    def start(scheduler: Recorder, info: FrameworkInfo, master: str) -> RunningDriver:
        runner = RunningDriver(scheduler, info, master)
        running.append(runner)
        return runner

    yield start
    for runner in running:
        if not runner.task.done():
            runner.driver.stop()
            try:
                await asyncio.wait_for(runner.task, 10)
            except (asyncio.TimeoutError, Exception):
                runner.task.cancel()
