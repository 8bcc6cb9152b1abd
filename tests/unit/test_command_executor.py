"""The built-in command executor as a real process (``python -m
frameworks.executors.command``) against a FakeAgent ROUTER in the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from frameworks import CommandInfo, Resources, TaskInfo, TaskState
from frameworks.executors.command import command_argv, describe_exit
from frameworks.testing import FakeAgent

REPO = str(Path(__file__).resolve().parents[2])
S, R = TaskState.TASK_STARTING, TaskState.TASK_RUNNING


def make_task(task_id: str = "t1", *, shell: str | None = None, argv: list[str] | None = None,
              grace: float | None = None, environment: dict[str, str] | None = None) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="agent-0001",
                    resources=Resources.parse("cpus:0.1;mem:32"), kill_grace_period=grace,
                    command=CommandInfo(shell=shell, argv=argv,
                                        environment=environment or {}))


@contextlib.asynccontextmanager
async def command_executor(agent: FakeAgent, task: TaskInfo,
                           sandbox: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """Start the executor the way the agent does: own session, cwd and output in the
    sandbox, DYAD_* variables; it gets `task` as soon as it registers."""
    await agent.launch(task)
    env = {**os.environ, **agent.environ(task.task_id), "PYTHONPATH": REPO}
    with open(sandbox / "stdout", "wb") as out, open(sandbox / "stderr", "wb") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "frameworks.executors.command", cwd=sandbox, env=env,
            stdout=out, stderr=err, start_new_session=True)
    try:
        yield process
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def states_until_terminal(agent: FakeAgent, task_id: str,
                                timeout: float = 10.0) -> list[TaskState]:
    await agent.wait_until(lambda: any(s.is_terminal for s in agent.states(task_id)),
                           timeout=timeout)
    return agent.states(task_id)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[FakeAgent]:
    async with FakeAgent(sandbox=str(tmp_path)) as fake:
        yield fake


async def test_failing_command_reports_its_exit_status(agent: FakeAgent, tmp_path: Path) -> None:
    task = make_task(shell='echo "hi from $DYAD_TASK_ID $MESOS_TASK_ID $GREETING"; pwd; exit 3',
                     environment={"GREETING": "hello"})
    async with command_executor(agent, task, tmp_path) as process:
        states = await states_until_terminal(agent, "t1")
        assert states == [S, R, TaskState.TASK_FAILED]
        assert agent.updates[-1].message == "Command exited with status 3"
        # exits by itself once the terminal update is acknowledged
        assert await asyncio.wait_for(process.wait(), 10) == 0
    stdout = (tmp_path / "stdout").read_text().splitlines()
    assert stdout == ["hi from t1 t1 hello", str(tmp_path)]


async def test_successful_command_finishes(agent: FakeAgent, tmp_path: Path) -> None:
    async with command_executor(agent, make_task(argv=["true"]), tmp_path) as process:
        assert await states_until_terminal(agent, "t1") == [S, R, TaskState.TASK_FINISHED]
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_kill_sends_killing_then_killed_within_grace(agent: FakeAgent,
                                                           tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    async with command_executor(agent, make_task(shell="sleep 30", grace=5), tmp_path) as process:
        await agent.wait_until(lambda: R in agent.states("t1"))
        started = loop.time()
        await agent.kill("t1")
        states = await states_until_terminal(agent, "t1")
        assert states == [S, R, TaskState.TASK_KILLING, TaskState.TASK_KILLED]
        assert loop.time() - started < 5  # SIGTERM was enough: no wait for the grace
        assert "SIGTERM" in agent.updates[-1].message
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_task_ignoring_sigterm_is_sigkilled_after_grace(agent: FakeAgent,
                                                              tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    task = make_task(shell="echo $$ > task.pid; trap '' TERM; sleep 30", grace=0.5)
    async with command_executor(agent, task, tmp_path):
        await agent.wait_until(lambda: R in agent.states("t1"))
        await wait_for_file(tmp_path / "task.pid")
        started = loop.time()
        await agent.kill("t1", kill_grace_period=20)  # the task's own grace wins
        states = await states_until_terminal(agent, "t1")
        elapsed = loop.time() - started
        assert states == [S, R, TaskState.TASK_KILLING, TaskState.TASK_KILLED]
        assert 0.5 <= elapsed < 5
        assert agent.updates[-1].message == "Command terminated by signal SIGKILL"
    # nothing of the task's process group is left (`sleep` included)
    pgid = int((tmp_path / "task.pid").read_text())
    await wait_until_gone(pgid)


async def test_bad_argv_fails_the_task(agent: FakeAgent, tmp_path: Path) -> None:
    task = make_task(argv=[str(tmp_path / "no-such-program")])
    async with command_executor(agent, task, tmp_path) as process:
        assert await states_until_terminal(agent, "t1") == [S, TaskState.TASK_FAILED]
        failed = agent.updates[-1]
        assert "Failed to launch command" in failed.message
        assert "no-such-program" in failed.message
        assert failed.reason == "REASON_COMMAND_EXECUTOR_FAILED"
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_shutdown_kills_the_task_and_exits(agent: FakeAgent, tmp_path: Path) -> None:
    async with command_executor(agent, make_task(shell="sleep 30"), tmp_path) as process:
        await agent.wait_until(lambda: R in agent.states("t1"))
        await agent.shutdown(grace_period=2.0)
        states = await states_until_terminal(agent, "t1")
        assert states[-2:] == [TaskState.TASK_KILLING, TaskState.TASK_KILLED]
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_shutdown_gives_the_task_its_own_kill_grace_period(agent: FakeAgent,
                                                                 tmp_path: Path) -> None:
    """The agent's shutdown grace covers the task's kill grace plus its own; the
    executor uses the task's (2 s here), not a share of the agent's (7 s)."""
    loop = asyncio.get_running_loop()
    task = make_task(shell="trap '' TERM; sleep 30", grace=2.0)
    async with command_executor(agent, task, tmp_path) as process:
        await agent.wait_until(lambda: R in agent.states("t1"))
        started = loop.time()
        await agent.shutdown(grace_period=7.0)
        states = await states_until_terminal(agent, "t1")
        elapsed = loop.time() - started
        assert states[-2:] == [TaskState.TASK_KILLING, TaskState.TASK_KILLED]
        assert 2.0 <= elapsed < 5.0, elapsed
        assert await asyncio.wait_for(process.wait(), 10) == 0


def test_describe_exit_and_argv() -> None:
    assert describe_exit(0) == "Command exited with status 0"
    assert describe_exit(-signal.SIGTERM) == "Command terminated by signal SIGTERM"
    assert command_argv(make_task(shell="echo a")) == ["/bin/sh", "-c", "echo a"]
    assert command_argv(make_task(argv=["ls", "-l"])) == ["ls", "-l"]


async def wait_for_file(path: Path, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert loop.time() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


def live_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not zombies (a dead orphan waits for
    init to reap it, which can take a while in containers)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            members.append(int(entry.name))
    return members


async def wait_until_gone(pgid: int, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while live_members(pgid):
        assert loop.time() < deadline, f"process group {pgid} still has live processes"
        await asyncio.sleep(0.02)


def test_the_executor_imports_only_the_executor_side() -> None:
    """One executor process starts per task, so its imports are a per-task cost:
    the scheduler side, psutil (needed only after an agent restart) and the
    HTTP stack stay out, while `from frameworks import ...` still finds them."""
    probe = ("import sys, frameworks.executors.command\n"
             "print(' '.join(sorted(sys.modules)))\n"
             "from frameworks import SchedulerDriver, Resources, __all__\n"
             "import frameworks\n"
             "assert all(getattr(frameworks, name) for name in __all__)\n")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, check=True)
    modules = set(ran.stdout.split())
    assert {"frameworks.executor", "zmq", "asyncio"} <= modules
    assert not modules & {"frameworks.scheduler", "frameworks.scheduler_core", "psutil",
                          "aiohttp", "kazoo", "dyad.detector"}
