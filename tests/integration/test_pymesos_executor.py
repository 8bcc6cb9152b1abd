"""A pymesos executor, unmodified, run by a real Dyad agent as a custom executor
for an unmodified pymesos scheduler (both in tests/integration/pymesos_executor.py):
the Mesos v1 executor API (`POST /api/v1/executor`) and framework messages both
ways, end to end through a real master and agent."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import compat_client, wait_for

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
