"""Real master and agent processes, command tasks the agent runs itself (no
executor process): an agent SIGKILLed while one task runs and another ends
reports both ends with their exit status once it is back -- the one that ended
while it was away from its shim's status file, the one still running when it
ends later under the restarted agent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent import checkpoint_file
from frameworks import CommandInfo, Filters, FrameworkInfo, TaskInfo, TaskState

from .conftest import Recorder, wait_for
from .test_agent_recovery import PATIENT_MASTER, SMALL, agent_executor

pytestmark = pytest.mark.integration

# Runs until its sandbox holds `go`, then exits with the status given.
WAITER = "echo $$ > task.pid; while [ ! -e go ]; do sleep 0.05; done; exit {status}"


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


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
