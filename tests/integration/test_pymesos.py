"""pymesos, the Python Mesos client, unmodified against a real Dyad master and
agent (tests/integration/pymesos_scheduler.py holds the scheduler). pymesos comes
with the `compat` extra; its http-parser dependency is installed without its C
extension first (.ci/run), since that extension does not build on Python 3.11."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import compat_client

pytestmark = pytest.mark.integration

SCHEDULER = Path(__file__).with_name("pymesos_scheduler.py")


def test_pymesos_scheduler_runs_unmodified(make_cluster: Any) -> None:
    compat_client("pymesos")
    cluster = make_cluster(agents=1)
    address = cluster.master.url.removeprefix("http://")
    run = subprocess.run([sys.executable, str(SCHEDULER), address], capture_output=True,
                         text=True, timeout=90)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["registered"]["master_version"] == "1.11.0"
    assert seen["declined"] >= 1 and seen["offers"] >= 2
    assert seen["states"]["hello"] == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
    assert seen["states"]["sleeper"][-1] == "TASK_KILLED"
    assert "TASK_RUNNING" in seen["states"]["sleeper"]
    assert seen["reconciled"] == "TASK_FINISHED"
    assert not seen.get("errors")

    # pymesos tore its framework down on stop; the master agrees on every task.
    state = cluster.state()
    (done,) = [f for f in state["completed_frameworks"]
               if f["id"] == seen["registered"]["framework_id"]]
    assert {t["id"]: t["state"] for t in done["completed_tasks"]} == {
        "hello": "TASK_FINISHED", "sleeper": "TASK_KILLED"}
    assert not state["frameworks"]
