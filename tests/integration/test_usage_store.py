"""The usage store wired into a real cluster: agents' usage reports and tasks'
state changes land in the master's store, and `POST /usage/query` and `dyad query`
answer SQL over them, refusing bad and writing statements with a 4xx."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from dyad.local import PROJECT_ROOT
from dyad.resources import Resources
from frameworks import CommandInfo, FrameworkInfo, SchedulerDriver, TaskInfo
from master.server import MasterServer
from tests.helpers import wait_for

from .conftest import Recorder

pytestmark = pytest.mark.integration

SMALL = Resources.parse("cpus:0.1;mem:32")
TASKS = 4


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def ask(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(f"{url}/usage/query", json=body) as response:
        return response.status, await response.json()


def launcher(recorder: Recorder) -> list[str]:
    """Launch TASKS sleeping tasks labelled as app /busy, two per offer."""
    launched: list[str] = []

    def on_offers(driver: SchedulerDriver, offers: list[Any]) -> None:
        for offer in offers:
            tasks = []
            while len(launched) < TASKS and len(tasks) < 2:
                task_id = f"busy{len(launched)}"
                launched.append(task_id)
                tasks.append(TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                                      resources=SMALL, command=CommandInfo(shell="sleep 60"),
                                      labels={"DYAD_APP_ID": "/busy"}))
            if tasks:
                driver.launch_tasks([offer.id], tasks)
            else:
                driver.decline_offer(offer.id)

    recorder.on_offers = on_offers
    return launched


async def test_queries_over_a_running_clusters_samples_and_events(
        make_cluster: Any, drivers: Any, http: aiohttp.ClientSession) -> None:
    cluster = make_cluster(agents=2, agent_args=["--usage-report-interval", "0.2s"])
    url = cluster.master.url
    recorder = Recorder()
    launcher(recorder)
    runner = drivers(recorder, FrameworkInfo(name="usage-it", roles=["eng"]),
                     cluster.master_address)
    await runner.registered()

    by_app = ("SELECT app, role, count(DISTINCT task_id) AS tasks, count(*) AS samples, "
              "max(mem_rss_bytes) AS peak FROM task_usage GROUP BY app, role ORDER BY app")
    answer: dict[str, Any] = {}

    async def sampled() -> bool:
        status, body = await ask(http, url, {"sql": by_app})
        assert status == 200, body
        answer.update(body)
        return any(row[0] == "/busy" and row[2] == TASKS and row[3] >= 2 * TASKS
                   for row in body["rows"])

    await wait_for(sampled, 30, "samples of every task in the store")
    assert answer["columns"] == ["app", "role", "tasks", "samples", "peak"]
    (row,) = [r for r in answer["rows"] if r[0] == "/busy"]
    assert row[1] == "eng" and row[4] > 0

    states: dict[tuple[str, str], int] = {}

    async def running() -> bool:
        status, events = await ask(http, url, {
            "sql": "SELECT state, source, count(*) FROM task_events WHERE app = '/busy' "
                   "GROUP BY ALL ORDER BY ALL"})
        assert status == 200, events
        states.update({(r[0], r[1]): r[2] for r in events["rows"]})
        return states.get(("TASK_RUNNING", "SOURCE_EXECUTOR")) == TASKS

    await wait_for(running, 30, "every task's TASK_RUNNING in the store")
    assert states[("TASK_STAGING", "SOURCE_MASTER")] == TASKS

    status, limited = await ask(http, url, {"sql": "SELECT * FROM task_usage", "max_rows": 3})
    assert status == 200 and len(limited["rows"]) == 3 and limited["truncated"]

    status, bad = await ask(http, url, {"sql": "SELEKT 1"})
    assert status == 400 and "syntax error" in bad["error"].lower()
    status, write = await ask(http, url, {"sql": "DELETE FROM task_usage"})
    assert status == 403 and "only SELECT" in write["error"]
    status, shape = await ask(http, url, {"query": "SELECT 1"})
    assert status == 400 and "sql" in shape["error"]

    async with http.get(f"{url}/usage/tables") as response:
        tables = await response.json()
    assert tables["tables"]["task_usage"]["rows"] >= 2 * TASKS
    assert {"name": "cpus_used", "type": "DOUBLE"} in tables["tables"]["task_usage"]["columns"]
    async with http.get(f"{url}/metrics/snapshot") as response:
        metrics = await response.json()
    assert metrics["usage/samples"] >= 2 * TASKS and metrics["usage/query_errors"] == 2
    assert metrics["usage/bad_requests"] == 1

    # The same question from a terminal.
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dyad.cli", "query", "--master", cluster.master_address,
        "--csv", "SELECT app, count(DISTINCT task_id) AS tasks FROM task_usage "
                 "WHERE app = '/busy' GROUP BY app",
        cwd=PROJECT_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(cli.communicate(), 30)
    assert cli.returncode == 0, err
    assert out.decode().splitlines() == ["app,tasks", f"/busy,{TASKS}"]
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dyad.cli", "query", "--master", cluster.master_address,
        "DROP TABLE task_usage", cwd=PROJECT_ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(cli.communicate(), 30)
    assert cli.returncode == 1 and b"only SELECT" in err


async def test_with_the_store_off_the_routes_answer_404(http: aiohttp.ClientSession) -> None:
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0)
    await server.start()
    try:
        assert not server.config.record_usage
        status, body = await ask(http, server.info.http_url, {"sql": "SELECT 1"})
        assert status == 404 and "--usage-store" in body["error"]
        async with http.get(f"{server.info.http_url}/usage/tables") as response:
            assert response.status == 404
        assert server.metrics()["usage/samples"] == 0
    finally:
        await server.stop()
