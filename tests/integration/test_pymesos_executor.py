"""A pymesos executor, unmodified, run by a real Dyad agent as a custom executor
(tests/integration/pymesos_executor.py): for an unmodified pymesos scheduler, with
the Mesos v1 executor API (`POST /api/v1/executor`) and framework messages both
ways, end to end through a real master and agent; and for Dyad's own driver,
across a SIGKILL and restart of its agent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent import checkpoint_file
from dyad.resources import Resources
from frameworks import CommandInfo, ExecutorInfo, FrameworkInfo, TaskInfo
from tests.helpers import compat_client, wait_for

from .conftest import Recorder
from .test_agent_recovery import agent_executor

pytestmark = pytest.mark.integration

FLOW = Path(__file__).with_name("pymesos_executor.py")


async def test_pymesos_executor_runs_unmodified(make_cluster: Any) -> None:
    compat_client("pymesos")
    cluster = make_cluster(agents=1)
    address = cluster.master.url.removeprefix("http://")
    run = subprocess.run([sys.executable, str(FLOW), "scheduler", address],
                         capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert not seen.get("errors")
    assert seen["states"] == {"echo": ["TASK_RUNNING", "TASK_FINISHED"],
                              "sleeper": ["TASK_RUNNING", "TASK_KILLED"]}
    # The executor's updates arrive as the executor's, with its words and ids.
    for update in seen["updates"]:
        assert update["source"] == "SOURCE_EXECUTOR"
        assert update["executor_id"] == {"value": "pymesos-executor"}
        assert update["agent_id"]["value"]
    assert "running echo" in [u["message"] for u in seen["updates"]]
    # Framework messages both ways: the executor's hello names the agent it
    # subscribed to, and its pong answers the scheduler's ping.
    hello, *rest = seen["messages"]
    assert hello.startswith("hello from ") and hello.endswith(" as pymesos-executor")
    assert "pong:ping" in rest

    state = cluster.state()
    (done,) = [f for f in state["completed_frameworks"] if f["id"] == seen["framework_id"]]
    assert {t["id"]: t["state"] for t in done["completed_tasks"]} == {
        "echo": "TASK_FINISHED", "sleeper": "TASK_KILLED"}

    # The agent shut the executor down with the framework (SHUTDOWN), and it left.
    (agent,) = state["agents"]

    def completed_executors() -> list[str]:
        with urllib.request.urlopen(agent["url"] + "/state", timeout=5) as answer:
            return [e["id"] for f in json.load(answer)["completed_frameworks"]
                    if f["id"] == seen["framework_id"] for e in f["completed_executors"]]
    gone = await wait_for(completed_executors, 30, "the executor's exit")
    assert gone == ["pymesos-executor"]

    # Calls from no subscribed executor are refused with a reason, never a 5xx.
    for body in (b"{nope", json.dumps({"type": "UPDATE", "framework_id": {"value": "F"},
                                       "executor_id": {"value": "E"}}).encode()):
        request = urllib.request.Request(agent["url"] + "/api/v1/executor", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 400 and refused.value.read()


async def test_a_pymesos_executor_outlives_its_agents_restart(make_cluster: Any,
                                                              drivers: Any) -> None:
    """Dyad's driver with a pymesos executor: the agent is SIGKILLed and started
    again; the executor (MESOS_CHECKPOINT=1) subscribes again, keeps its task, and
    framework messages still cross both ways."""
    compat_client("pymesos")
    # Missed pings and the executor's reconnection backoff both fit in the windows.
    cluster = make_cluster(agents=1, master_args=["--agent-ping-timeout", "2s",
                                                  "--max-agent-ping-timeouts", "5"],
                           agent_args=["--executor-reregistration-timeout", "30s"])
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="dyad-with-pymesos", failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    offer = await wait_for(lambda: recorder.offers and recorder.offers[-1], what="an offer")
    executor = ExecutorInfo(executor_id="pymesos-executor", command=CommandInfo(
        shell=f"{sys.executable} {FLOW} executor"), resources=Resources.parse("cpus:0.1;mem:32"))
    runner.driver.launch_tasks([offer.id], [TaskInfo(
        task_id="echo", name="echo", agent_id=offer.agent_id,
        resources=Resources.parse("cpus:0.1;mem:32"), executor=executor, data=b"echo")])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("echo"), 30, "echo running")
    (hello,) = await wait_for(lambda: recorder.named("message"), 10, "the executor's hello")
    assert hello.decode().startswith("hello from ")
    before = agent_executor(offer.url, "pymesos-executor")
    assert before is not None and before["state"] == "RUNNING"

    # Once the agent's checkpoint on disk holds no unacknowledged update, nothing is
    # sent again (its metric says 0 as soon as the ack is in memory; an agent killed
    # before that reaches the checkpoint legally resends: updates are at least once).
    work_dir = str(cluster.work_dir / "agent0")
    await wait_for(lambda: (saved := checkpoint_file.load(work_dir)) is not None
                   and not saved.updates, 20, "the acknowledgement in the checkpoint")
    old = cluster.agent_children[0]
    old.process.kill()  # SIGKILL: no goodbye
    old.process.wait()
    agent = await asyncio.to_thread(cluster.start_agent, 0)
    assert agent.url == offer.url
    after = await wait_for(lambda: (agent_executor(agent.url, "pymesos-executor") or {}).get(
        "state") == "RUNNING" and agent_executor(agent.url, "pymesos-executor"), 40,
        "the executor's new subscription")
    assert (after["pid"], after["run_id"]) == (before["pid"], before["run_id"])
    assert [t["id"] for t in after["tasks"]] == ["echo"]  # kept, not counted lost
    assert not [s for s in recorder.statuses if s.state.is_terminal]

    runner.driver.send_framework_message("pymesos-executor", offer.agent_id, b"ping")
    await wait_for(lambda: b"pong:ping" in recorder.named("message"), 20, "the pong")
    await wait_for(lambda: "TASK_FINISHED" in recorder.states("echo"), 20, "echo finished")
    assert recorder.states("echo") == ["TASK_RUNNING", "TASK_FINISHED"]
