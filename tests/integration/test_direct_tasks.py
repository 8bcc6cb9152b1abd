"""Real master and agent processes, command tasks the agent runs itself (no
executor process; the agent's holder, `agent.holder`, is their parent): an agent
SIGKILLed while one task runs and another ends reports both ends with their exit
status once it is back -- the one that ended while it was away from its holder's
word, the one still running when it ends later under the restarted agent. And
when the holder itself dies: what it had reaped keeps its status (its log), what
it held ends with no status, said so, and the next task gets a new holder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent import checkpoint_file
from dyad.messages import Reason
from frameworks import CommandInfo, Filters, FrameworkInfo, TaskInfo, TaskState

from .conftest import Recorder, wait_for
from .test_agent_recovery import PATIENT_MASTER, SMALL, agent_executor

pytestmark = pytest.mark.integration

# Runs until its sandbox holds `go`, then exits with the status given.
WAITER = "echo $$ > task.pid; while [ ! -e go ]; do sleep 0.05; done; exit {status}"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def holder_of(work_dir: str) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] and "agent.holder" in process.info["cmdline"] \
                and work_dir in process.info["cmdline"]:
            return process
    return None


async def running(cluster: Any, recorder: Recorder, runner: Any,
                  tasks: dict[str, int]) -> tuple[Any, dict[str, Path], dict[str, int]]:
    """Launch a WAITER task for each name (exiting with its status when let go);
    once all run: the offer used, their sandboxes and their pids."""
    offer = await wait_for(lambda: recorder.offers[-1] if recorder.offers else None,
                           what="an offer")
    runner.driver.launch_tasks([offer.id], [
        TaskInfo(task_id=name, name=name, agent_id=offer.agent_id, resources=SMALL,
                 command=CommandInfo(shell=WAITER.format(status=status)))
        for name, status in tasks.items()], filters=Filters(refuse_seconds=0.1))
    sandboxes, pids = {}, {}
    for name in tasks:
        await wait_for(lambda: "TASK_RUNNING" in recorder.states(name), 20, f"{name} running")
        run = await wait_for(lambda: agent_executor(offer.url, name), what=f"{name}'s run")
        assert run["name"] == f"Command (Task: {name})"  # no executor process
        sandboxes[name], pids[name] = Path(run["directory"]), run["pid"]
        await wait_for((sandboxes[name] / "task.pid").exists, what=f"{name}'s pid")
    return offer, sandboxes, pids


def last(recorder: Recorder, task_id: str) -> Any:
    return [s for s in recorder.statuses if s.task_id == task_id][-1]


async def test_exit_statuses_survive_an_agent_restart(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1, master_args=PATIENT_MASTER)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="direct", failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    offer = await wait_for(lambda: recorder.offers[-1] if recorder.offers else None,
                           what="an offer")
    tasks = [TaskInfo(task_id=name, name=name, agent_id=offer.agent_id, resources=SMALL,
                      command=CommandInfo(shell=WAITER.format(status=status)))
             for name, status in (("away", 3), ("back", 7))]
    runner.driver.launch_tasks([offer.id], tasks, filters=Filters(refuse_seconds=0.1))
    for name in ("away", "back"):
        await wait_for(lambda: "TASK_RUNNING" in recorder.states(name), 20, f"{name} running")
    sandboxes, shims = {}, {}
    for name in ("away", "back"):
        run = await wait_for(lambda: agent_executor(offer.url, name), what=f"{name}'s run")
        assert run["name"] == f"Command (Task: {name})"  # no executor process
        sandboxes[name], shims[name] = Path(run["directory"]), run["pid"]
        await wait_for((sandboxes[name] / "task.pid").exists, what=f"{name}'s pid")
    # Updates are at least once: one whose acknowledgement the agent had not yet
    # checkpointed is sent again after the restart. Kill it only once none is left,
    # so a second TASK_RUNNING below would be one the recovery made up.
    work_dir = str(cluster.work_dir / "agent0")
    await wait_for(lambda: (saved := checkpoint_file.load(work_dir)) is not None
                   and not saved.updates, 20, "every update acknowledged in the checkpoint")

    old = cluster.agent_children[0]
    old.process.kill()  # SIGKILL: its children are reaped by init from now on
    old.process.wait()
    (sandboxes["away"] / "go").touch()  # ends while no agent watches
    await wait_for(lambda: gone(shims["away"]), what="away to end")
    assert not gone(shims["back"])

    agent = await asyncio.to_thread(cluster.start_agent, 0)
    assert agent.url == offer.url
    await wait_for(lambda: "TASK_FAILED" in recorder.states("away"), 20, "away's end")
    away = [s for s in recorder.statuses if s.task_id == "away"][-1]
    assert away.message == "Command exited with status 3", away
    assert recorder.states("back")[-1] == TaskState.TASK_RUNNING.name
    run = await wait_for(lambda: (agent_executor(agent.url, "back") or {}).get(
        "state") == "RUNNING" and agent_executor(agent.url, "back"), 20, "back adopted")
    assert run["pid"] == shims["back"]

    (sandboxes["back"] / "go").touch()  # ends under the restarted agent, not its parent
    await wait_for(lambda: "TASK_FAILED" in recorder.states("back"), 20, "back's end")
    back = [s for s in recorder.statuses if s.task_id == "back"][-1]
    assert back.message == "Command exited with status 7", back
    assert recorder.states("away").count("TASK_RUNNING") == 1


async def test_a_holder_that_dies_under_a_live_agent_is_noticed_and_replaced(
        make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="direct"), cluster.master_address)
    await runner.registered()
    _, sandboxes, pids = await running(cluster, recorder, runner, {"held": 7})
    first = holder_of(str(cluster.work_dir / "agent0"))
    assert first is not None and psutil.Process(pids["held"]).ppid() == first.pid
    first.kill()
    await asyncio.to_thread(first.wait, 10)  # off the loop: the driver runs on it
    assert not gone(pids["held"])  # the task lives on (init's child now)
    (sandboxes["held"] / "go").touch()
    await wait_for(lambda: "TASK_FAILED" in recorder.states("held"), 20, "held's end")
    lost = last(recorder, "held")
    assert lost.reason == Reason.EXECUTOR_TERMINATED and "holder died" in lost.message, lost
    # The next task gets a new holder, and its real status.
    _, sandboxes, _ = await running(cluster, recorder, runner, {"next": 0})
    second = holder_of(str(cluster.work_dir / "agent0"))
    assert second is not None and second.pid != first.pid
    (sandboxes["next"] / "go").touch()
    await wait_for(lambda: "TASK_FINISHED" in recorder.states("next"), 20, "next's end")


async def test_a_status_the_holder_logged_survives_the_holder_and_the_agent(
        make_cluster: Any, drivers: Any) -> None:
    """The agent and then its holder are SIGKILLed: the task that ended in
    between keeps its status (the holder's log, read by the next holder); the one
    still running then has lost its holder and ends with no status, said so."""
    cluster = make_cluster(agents=1, master_args=PATIENT_MASTER)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="direct", failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    offer, sandboxes, pids = await running(cluster, recorder, runner, {"logged": 3, "orphan": 7})
    work_dir = str(cluster.work_dir / "agent0")
    await wait_for(lambda: (saved := checkpoint_file.load(work_dir)) is not None
                   and not saved.updates, 20, "every update acknowledged in the checkpoint")
    old = cluster.agent_children[0]
    old.process.kill()
    old.process.wait()
    (sandboxes["logged"] / "go").touch()
    await wait_for(lambda: gone(pids["logged"]), what="logged to end")
    the_holder = holder_of(work_dir)
    assert the_holder is not None
    await wait_for(lambda: "logged" in (Path(work_dir) / "holder-exits.log").read_text(),
                   what="its status logged")
    the_holder.kill()
    await asyncio.to_thread(the_holder.wait, 10)

    agent = await asyncio.to_thread(cluster.start_agent, 0)
    assert agent.url == offer.url
    await wait_for(lambda: "TASK_FAILED" in recorder.states("logged"), 20, "logged's end")
    assert last(recorder, "logged").message == "Command exited with status 3"
    assert recorder.states("orphan")[-1] == TaskState.TASK_RUNNING.name  # watched by pidfd
    (sandboxes["orphan"] / "go").touch()
    await wait_for(lambda: "TASK_FAILED" in recorder.states("orphan"), 20, "orphan's end")
    orphan = last(recorder, "orphan")
    assert orphan.reason == Reason.EXECUTOR_TERMINATED and "holder died" in orphan.message
