"""The operator CLI, `/metrics`, `/events` and JSON logs against a real cluster:
real master and agent processes, a real driver and executor, and `dyad ...` run
as the subprocess an operator would run."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dyad.local import PROJECT_ROOT, agent_address, http_get_json
from dyad.resources import Resources
from frameworks import CommandInfo, FrameworkInfo, TaskInfo, TaskState

from .conftest import Recorder, wait_for

pytestmark = pytest.mark.integration


async def dyad(master: str, *argv: str) -> tuple[int, str, str]:
    """Run `dyad ARGV` against `master`; (exit code, stdout, stderr)."""
    env = dict(os.environ, DYAD_MASTER=master)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dyad.cli", *argv, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ok(master: str, *argv: str) -> str:
    code, out, err = await dyad(master, *argv)
    assert code == 0, f"dyad {' '.join(argv)} exited {code}: {err}"
    return out


def metric_values(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


async def test_cli_metrics_events_and_json_logs(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1, master_args=["--log-format", "json"])
    master = cluster.master_address
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="ops", roles=["eng"]), master)
    await runner.registered()
    offer = await wait_for(lambda: recorder.offers and recorder.offers[0], what="an offer")
    runner.driver.launch_tasks([offer.id], [TaskInfo(
        task_id="sleeper", name="sleeper", agent_id=offer.agent_id,
        resources=Resources.parse("cpus:0.1;mem:32"),
        command=CommandInfo(shell="echo out-line; echo err-line >&2; exec sleep 60"))])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("sleeper"), 20, "sleeper running")

    agents = json.loads(await ok(master, "agents", "--json"))
    assert [a["hostname"] for a in agents] == [agent_address(0)]
    assert "1 running" in await ok(master, "state")
    assert "ops" in await ok(master, "frameworks")
    tasks = (await ok(master, "tasks", "--framework", "ops", "--state", "running")).splitlines()
    assert tasks[1].split()[:3] == ["sleeper", "ops", "RUNNING"]
    assert isinstance(json.loads(await ok(master, "offers", "--json")), list)
    await ok(master, "weights", "set", "eng", "2")
    roles = await ok(master, "quota", "set", "eng", "cpus:0.5", "--limit", "cpus:1")
    assert any(line.split()[:4] == ["eng", "2", "cpus:0.5", "cpus:1"]
               for line in roles.splitlines()), roles

    async def logs_ready() -> bool:
        return "out-line" in (await dyad(master, "logs", "sleeper"))[1]

    await wait_for(logs_ready, 15, "stdout in the sandbox")
    assert "err-line" in await ok(master, "logs", "sleeper", "--stderr")

    code, _, err = await dyad(master, "kill", "nope")
    assert code == 1 and "no live task nope" in err
    code, _, err = await dyad(master, "quota", "set", "eng", "bogus:1")
    assert code == 1 and err.strip()
    assert "killing sleeper" in await ok(master, "kill", "sleeper")
    await wait_for(lambda: "TASK_KILLED" in recorder.states("sleeper"), 20, "sleeper killed")
    # --follow returns once the task is terminal and its log is read out.
    assert "out-line" in await ok(master, "logs", "sleeper", "--follow")

    events = http_get_json(f"{cluster.master.url}/events?since=0")["events"]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["agent_registered", "framework_subscribed"]
    assert "task_kill_requested" in kinds
    assert [e["state"] for e in events if e["type"] == "task_state"][-1] == TaskState.TASK_KILLED.name

    master_metrics = metric_values(cluster.master.url)
    snapshot = http_get_json(f"{cluster.master.url}/metrics/snapshot")
    assert master_metrics["dyad_master_agents_active"] == snapshot["master/agents_active"] == 1
    assert master_metrics["dyad_master_operator_kills_total"] == 1
    agent_metrics = metric_values(cluster.agent_children[0].url)
    assert agent_metrics["dyad_agent_registered"] == 1
    assert agent_metrics["dyad_agent_tasks_killed_total"] == 1

    lines = cluster.master.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
