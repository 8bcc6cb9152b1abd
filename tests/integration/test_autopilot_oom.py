"""Autopilot end to end, done-when 2 of issue 14: with real agents, an app whose
task grows past its memory limit is killed for memory once (the agent enforces the
limit and says `REASON_CONTAINER_LIMITATION_MEMORY`), `dyad-service` raises the
app's memory at once in `auto`, and the relaunched task, with room now, stays up.

Sizes: the run's limit is the app's `mem` (the agent runs the command itself: no
command executor's allowance on top), and its usage counts the task's Python and
its shim. The task grows to about GROW MiB (plus its interpreter), which is over
128 MiB and well under the raised 1.5 x 128 = 192 MiB. Long warmup and interval:
the OOM raise is the only change the autopilot may make here. A restarted
`dyad-service` reads the kill back from the master's store: it still counts (its
hold keeps memory up), and raises nothing again.
"""

from __future__ import annotations

import json
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .conftest import wait_for
from .test_autopilot_service import app_on_cluster
from .test_service import services  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

GROW = 160  # MiB the task allocates, 10 at a time
GROWER = (f"exec {sys.executable} -c \"import time\n"
          f"held = []\n"
          f"for _ in range({GROW // 10}):\n"
          f"    held.append(bytearray(10 * 2 ** 20)); time.sleep(0.2)\n"
          f"time.sleep(600)\"")
APP = {"id": "/grower", "cmd": GROWER, "instances": 1, "cpus": 0.2, "mem": 128,
       "upgradeStrategy": {"minimumHealthCapacity": 0, "maximumOverCapacity": 1},
       "taskKillGracePeriodSeconds": 1, "backoffSeconds": 0.5,
       "autopilot": {"mode": "auto", "max": {"mem": 1024}}}
NO_OTHER_CHANGES = ["--autopilot-step", "1s", "--autopilot-warmup", "1h",
                    "--autopilot-min-interval", "1h"]


async def test_an_app_outgrowing_its_memory_is_killed_once_then_raised_and_stays_up(
        make_cluster: Any, services: Any, tmp_path: Path) -> None:  # noqa: F811
    cluster, service = await app_on_cluster(make_cluster, services, tmp_path, 1,
                                            NO_OTHER_CHANGES, APP)

    def raised() -> Any:
        app = service.app("/grower")
        return app if app["mem"] > 128 else None

    app = await wait_for(raised, 60, "memory raised after the OOM kill")
    assert app["mem"] == 192  # 1.5 x the limit the task died at
    rec = service.get("/v2/apps/grower/recommendation")["recommendation"]
    assert rec["ooms"] == 1 and any("OOM" in r for r in rec["reasons"])

    def settled() -> Any:
        app = service.app("/grower")
        tasks = app["tasks"]
        return app if (not app["deployments"] and app["tasksRunning"] == 1 and tasks
                       and tasks[0]["version"] == app["versionInfo"]["lastConfigChangeAt"]) \
            else None

    await wait_for(settled, 60, "the raised task running")

    # Stays up: the master's store shows the new run using more than the old run
    # was allowed (128 MiB) and still running, and the one memory kill is the
    # only failure.
    def full_grown() -> Any:
        answer = query(cluster, "SELECT max(mem_rss_bytes) FROM task_usage WHERE app = "
                       "'/grower' AND mem_limit_bytes > 160 * 1048576")
        peak = answer["rows"][0][0]
        return peak if peak is not None and peak > 128 * 2 ** 20 else None

    await wait_for(full_grown, 60, "the relaunched task grown past the old limit")
    app = service.app("/grower")
    assert app["tasksRunning"] == 1 and app["mem"] == 192
    kills = query(cluster, "SELECT state, reason, count(*) FROM task_events WHERE app = "
                  "'/grower' AND state IN ('TASK_FAILED', 'TASK_KILLED', 'TASK_LOST') "
                  "GROUP BY ALL")["rows"]
    assert kills == [["TASK_FAILED", "REASON_CONTAINER_LIMITATION_MEMORY", 1]]
    metrics = service.get("/metrics")["counters"]
    assert metrics["autopilot_oom_kills"] == 1 and metrics["autopilot_upgrades"] == 1

    # A new leader: the kill is read back from the store, and nothing moves.
    service.stop(signal.SIGKILL)
    second = await services("second", "--master", cluster.master_address, "--work-dir",
                            str(tmp_path / "state"), *NO_OTHER_CHANGES).started()

    def recalled() -> Any:
        rec = second.get("/v2/apps/grower/recommendation")["recommendation"]
        return rec if rec is not None and rec["ooms"] == 1 else None

    await wait_for(recalled, 30, "the kill read back by the new leader")
    metrics = second.get("/metrics")["counters"]
    assert metrics["autopilot_oom_kills_recalled"] == 1
    assert metrics.get("autopilot_upgrades", 0) == 0 and second.app("/grower")["mem"] == 192


def query(cluster: Any, sql: str) -> Any:
    request = urllib.request.Request(
        f"{cluster.master.url}/usage/query", method="POST",
        data=json.dumps({"sql": sql}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())
