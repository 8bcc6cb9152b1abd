"""ExecutorDriver: the pure core's decisions, then the real driver over real
sockets against `frameworks.testing.FakeAgent` (a ROUTER on loopback)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from dyad.clock import FakeClock
from dyad.effects import ArmTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    AgentInfo, CommandInfo, ExecutorInfo, ExecutorRegistered, ExecutorToFramework,
    FrameworkInfo, FrameworkToExecutor, KillTask, LaunchTask, RegisterExecutor,
    Rejected, ReregisterExecutor, ShutdownExecutor, StatusUpdate, StatusUpdateAck)
from frameworks import (
    DriverStatus, Executor, ExecutorDriver, ExecutorEnvironmentError, Resources,
    TaskInfo, TaskState, TaskStatus)
from frameworks.driver_core import Callback, Finish, Received, Started
from frameworks.executor import _process_alive
from frameworks.executor_core import (
    AgentLost, ExecutorCore, ExecutorEnvironment, ExecutorTimings, RecoveryTimeout,
    RegisterRetry, ResendUpdates, SendStatusUpdateCall, WatchAgent)
from frameworks.testing import FakeAgent
from tests.helpers import running

ENV = ExecutorEnvironment(agent_endpoint="tcp://127.0.0.1:1", agent_id="a1",
                          framework_id="f1", executor_id="e1", sandbox_directory="/tmp",
                          recovery_timeout=60.0)


def task(task_id: str = "t1") -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="a1",
                    resources=Resources.parse("cpus:0.1"), command=CommandInfo(shell="true"))


def registered_message() -> ExecutorRegistered:
    return ExecutorRegistered(
        executor=ExecutorInfo(executor_id="e1", command=CommandInfo(shell="x")),
        framework=FrameworkInfo(name="f", id="f1"),
        agent=AgentInfo(hostname="h", port=5051, resources=Resources(), id="a1"))


def sent(effects: list[Any]) -> list[Any]:
    return [e.message for e in effects if isinstance(e, Send)]


def names(effects: list[Any]) -> list[str]:
    return [e.name for e in effects if isinstance(e, Callback)]


# ---------------------------------------------------------------- pure core


def launch(task_id: str = "t1") -> Received:
    return Received(LaunchTask(framework=FrameworkInfo(name="f", id="f1"), task=task(task_id)))


def report(task_id: str, state: TaskState, uuid: str) -> SendStatusUpdateCall:
    return SendStatusUpdateCall(TaskStatus(task_id=task_id, state=state), uuid)


def ack(task_id: str, uuid: str) -> Received:
    return Received(StatusUpdateAck(agent_id="a1", framework_id="f1", task_id=task_id,
                                    uuid=uuid))


def test_core_registers_with_retries_then_launches() -> None:
    core = ExecutorCore(ENV)
    effects = core.handle(Started(), 0.0)
    assert sent(effects) == [RegisterExecutor(framework_id="f1", executor_id="e1")]
    assert ArmTimer(RecoveryTimeout(), 60.0) in effects
    assert sent(core.handle(TimerFired(RegisterRetry()), 1.0)) == sent(effects)
    effects = core.handle(Received(registered_message()), 1.5)
    assert names(effects) == ["registered"]
    assert core.handle(Received(registered_message()), 1.6) == []  # answer to a retry
    assert core.handle(TimerFired(RegisterRetry()), 2.0) == []
    assert names(core.handle(launch(), 2.0)) == ["launch_task"]
    effects = core.handle(Received(KillTask(framework_id="f1", task_id="t1",
                                            kill_grace_period=4.0)), 2.0)
    assert effects == [Callback("kill_task", ("t1",))]
    assert core.kill_grace_periods == {"t1": 4.0}


def test_core_stamps_updates_and_keeps_them_until_acknowledged() -> None:
    core = ExecutorCore(ENV)
    core.handle(Started(), 0.0)
    # sent before registration: held, then sent on registration
    assert core.handle(report("t1", TaskState.TASK_RUNNING, "u1"), 5.0) == []
    (update,) = sent(core.handle(Received(registered_message()), 6.0))
    assert update.framework_id == "f1"
    status = update.status
    assert (status.uuid, status.timestamp, status.source, status.agent_id,
            status.executor_id) == ("u1", 5.0, "SOURCE_EXECUTOR", "a1", "e1")
    resend = 6.0 + ExecutorTimings().resend_interval
    assert sent(core.handle(TimerFired(ResendUpdates()), resend)) == [update]
    core.handle(ack("t1", "u1"), 12.0)
    assert core.pending == {}
    assert sent(core.handle(TimerFired(ResendUpdates()), 20.0)) == []


def test_core_reregisters_after_agent_loss_or_gives_up() -> None:
    core = ExecutorCore(ENV)
    core.handle(Started(), 0.0)
    core.handle(Received(registered_message()), 0.0)
    core.handle(launch(), 0.0)
    core.handle(report("t1", TaskState.TASK_RUNNING, "u1"), 1.0)
    effects = core.handle(AgentLost(), 2.0)
    assert names(effects) == ["disconnected"]
    (rereg,) = sent(effects)
    assert isinstance(rereg, ReregisterExecutor)
    assert rereg.tasks == [task()] and [u.status.uuid for u in rereg.updates] == ["u1"]
    assert ArmTimer(RecoveryTimeout(), 62.0) in effects
    assert core.handle(AgentLost(), 2.5) == []  # reported once per loss
    # the agent came back
    assert names(core.handle(Received(registered_message()), 3.0)) == ["reregistered"]
    # lost again, and this time it stays away
    core.handle(AgentLost(), 4.0)
    assert core.handle(TimerFired(RecoveryTimeout()), 64.0) == [
        Callback("shutdown"), Finish(DriverStatus.ABORTED)]
    assert core.handle(Received(registered_message()), 65.0) == []


def test_core_watches_whichever_agent_registered_it() -> None:
    core = ExecutorCore(ENV)
    core.handle(Started(), 0.0)
    effects = core.handle(Received(attrs.evolve(registered_message(), agent_pid=4242)), 0.0)
    assert WatchAgent(4242) in effects
    core.handle(AgentLost(), 1.0)
    # A restarted agent is not our parent: from now on we watch the pid it sent.
    assert WatchAgent(5151) in core.handle(
        Received(attrs.evolve(registered_message(), agent_pid=5151)), 2.0)


def test_core_timings_are_injected_and_unknown_timers_raise() -> None:
    core = ExecutorCore(ENV, ExecutorTimings(register_retry=0.2, resend_interval=0.5))
    assert ArmTimer(RegisterRetry(), 0.2) in core.handle(Started(), 0.0)
    assert ArmTimer(ResendUpdates(), 1.5) in core.handle(Received(registered_message()), 1.0)
    assert core.handle(TimerFired(RegisterRetry()), 1.2) == []  # stale: registered by now

    @attrs.frozen
    class Stranger(TimerKey):
        pass

    with pytest.raises(UnknownTimer):
        core.handle(TimerFired(Stranger()), 2.0)


def test_the_agent_probe_follows_one_process_not_its_pid() -> None:
    process = subprocess.Popen(["sleep", "30"])
    alive = _process_alive(process.pid)
    assert alive()
    process.kill()
    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:  # a zombie already counts as gone
        time.sleep(0.01)
    assert not alive()
    process.wait()
    assert not _process_alive(process.pid)()


def test_core_terminal_update_ends_the_task_and_shutdown_stops() -> None:
    core = ExecutorCore(ENV)
    core.handle(Started(), 0.0)
    core.handle(Received(registered_message()), 0.0)
    core.handle(launch(), 0.0)
    core.handle(report("t1", TaskState.TASK_FINISHED, "u1"), 1.0)
    assert core.tasks == {}
    effects = core.handle(Received(ShutdownExecutor(grace_period=6.0)), 2.0)
    assert effects == [Callback("shutdown"), Finish(DriverStatus.STOPPED)]
    assert core.shutdown_grace_period == 6.0
    # while shutting down: updates still go out and acks still count, launches don't
    assert core.handle(launch("t2"), 2.0) == []
    assert sent(core.handle(report("t9", TaskState.TASK_KILLED, "u2"), 2.0))
    core.handle(ack("t9", "u2"), 2.5)
    assert "u2" not in core.pending


def test_environment_names_what_is_missing() -> None:
    with pytest.raises(ExecutorEnvironmentError, match="DYAD_AGENT_ENDPOINT.*DYAD_SANDBOX"):
        ExecutorEnvironment.from_environ({"DYAD_AGENT_ID": "a"})
    complete = {"DYAD_AGENT_ENDPOINT": "tcp://x:1", "DYAD_AGENT_ID": "a",
                "DYAD_FRAMEWORK_ID": "f", "DYAD_EXECUTOR_ID": "e",
                "DYAD_SANDBOX_DIRECTORY": "/s"}
    assert ExecutorEnvironment.from_environ(complete).recovery_timeout == 900.0
    assert ExecutorEnvironment.from_environ(
        {**complete, "DYAD_RECOVERY_TIMEOUT": "2mins"}).recovery_timeout == 120.0
    with pytest.raises(ExecutorEnvironmentError, match="RECOVERY"):
        ExecutorEnvironment.from_environ({**complete, "DYAD_RECOVERY_TIMEOUT": "soon"})
    with pytest.raises(ExecutorEnvironmentError):
        ExecutorDriver(Executor(), environ={})


# ------------------------------------------------------ driver over sockets


class Recording(Executor):
    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []
        self.changed = asyncio.Event()

    def _note(self, name: str, *args: Any) -> None:
        self.events.append((name, args))
        self.changed.set()

    def args_of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.events if n == name]

    async def wait_for(self, name: str, count: int = 1, timeout: float = 5.0) -> tuple[Any, ...]:
        """The arguments of the `count`-th call of `name`, once it has happened."""
        async def wait() -> tuple[Any, ...]:
            while len(self.args_of(name)) < count:
                self.changed.clear()
                await self.changed.wait()
            return self.args_of(name)[count - 1]
        return await asyncio.wait_for(wait(), timeout)

    def registered(self, driver: Any, executor_info: Any, framework_info: Any,
                   agent_info: Any) -> None:
        self._note("registered", executor_info, framework_info, agent_info)

    async def launch_task(self, driver: Any, task: TaskInfo) -> None:
        self._note("launch_task", task)
        driver.send_status_update(TaskStatus(task_id=task.task_id,
                                             state=TaskState.TASK_RUNNING))

    def kill_task(self, driver: Any, task_id: str) -> None:
        self._note("kill_task", task_id, driver.kill_grace_period(task_id))

    def framework_message(self, driver: Any, data: bytes) -> None:
        self._note("framework_message", data)
        if data == b"boom":
            raise ValueError("bad message")
        driver.send_framework_message(b"echo:" + data)

    def shutdown(self, driver: Any) -> None:
        self._note("shutdown", driver.shutdown_grace_period)

    def error(self, driver: Any, message: str) -> None:
        self._note("error", message)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[FakeAgent]:
    async with FakeAgent(sandbox=str(tmp_path)) as fake:
        yield fake


async def test_registers_launches_and_updates_are_acknowledged(agent: FakeAgent) -> None:
    executor = Recording()
    driver = ExecutorDriver(executor, environ=agent.environ("exec-1"))
    await agent.launch(task())
    async with running(driver):
        executor_info, framework_info, agent_info = await executor.wait_for("registered")
        assert executor_info.executor_id == "exec-1"
        assert framework_info == agent.framework and agent_info.id == agent.agent_id
        await executor.wait_for("launch_task")
        await agent.wait_until(lambda: agent.states("t1") == [TaskState.TASK_RUNNING])
        (status,) = agent.updates
        assert status.source == "SOURCE_EXECUTOR" and status.uuid
        assert (status.agent_id, status.executor_id) == (agent.agent_id, "exec-1")
        assert status.timestamp > 0
        assert await driver.wait_acknowledged(timeout=5)
        assert driver.unacknowledged == 0
    assert agent.of(RegisterExecutor)[0].executor_id == "exec-1"


async def test_unacknowledged_updates_are_resent(agent: FakeAgent) -> None:
    agent.auto_ack = False
    executor = Recording()
    clock = FakeClock(start=5000.0)
    driver = ExecutorDriver(executor, environ=agent.environ(), clock=clock,
                            timings=ExecutorTimings(resend_interval=0.1))
    async with running(driver):
        await executor.wait_for("registered")
        uuid = driver.send_status_update(TaskStatus(task_id="t1", state=TaskState.TASK_RUNNING))
        await agent.wait_until(lambda: len(agent.of(StatusUpdate)) >= 3, timeout=3)
        assert {u.status.uuid for u in agent.of(StatusUpdate)} == {uuid}
        # stamped by the injected clock, not the wall clock
        assert {u.status.timestamp for u in agent.of(StatusUpdate)} == {5000.0}
        assert not await driver.wait_acknowledged(timeout=0.05)
        await agent.acknowledge(agent.updates[0])
        assert await driver.wait_acknowledged(timeout=5)


async def test_kill_messages_and_errors(agent: FakeAgent) -> None:
    executor = Recording()
    driver = ExecutorDriver(executor, environ=agent.environ())
    async with running(driver) as run:
        await executor.wait_for("registered")
        await agent.kill("t1", kill_grace_period=2.5)
        assert await executor.wait_for("kill_task") == ("t1", 2.5)
        await agent.send(FrameworkToExecutor(framework_id="framework-0001", agent_id="a",
                                             executor_id="executor-1", data=b"hi"))
        reply = await agent.wait_for(ExecutorToFramework)
        assert (reply.data, reply.executor_id) == (b"echo:hi", "executor-1")
        await agent.send(FrameworkToExecutor(framework_id="framework-0001", agent_id="a",
                                             executor_id="executor-1", data=b"boom"))
        (message,) = await executor.wait_for("error")
        assert "framework_message" in message and "bad message" in message
        await agent.send(Rejected(reason="unknown task", message_type="status_update"))
        (message,) = await executor.wait_for("error", count=2)
        assert "status_update" in message and "unknown task" in message
        assert not run.done()


async def test_shutdown_calls_back_and_stops(agent: FakeAgent) -> None:
    executor = Recording()
    driver = ExecutorDriver(executor, environ=agent.environ())
    async with running(driver) as run:
        await executor.wait_for("registered")
        await agent.shutdown(grace_period=4.0)
        assert await asyncio.wait_for(run, 5) is DriverStatus.STOPPED
    assert executor.args_of("shutdown") == [(4.0,)]


async def test_update_sent_from_another_thread(agent: FakeAgent) -> None:
    executor = Recording()
    driver = ExecutorDriver(executor, environ=agent.environ())
    async with running(driver):
        await executor.wait_for("registered")
        await asyncio.to_thread(driver.send_status_update,
                                TaskStatus(task_id="t5", state=TaskState.TASK_FINISHED))
        await agent.wait_until(lambda: agent.states("t5") == [TaskState.TASK_FINISHED])
