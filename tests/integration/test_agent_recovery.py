"""Real master and agent processes: an agent SIGKILLed and started again takes its
running task back untouched; a drained agent kills its tasks and is offered no
more; an agent whose resources changed refuses its checkpoint; two agents share
one host given only their own `--port` and `--work-dir`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from dyad.local import Child, agent_address, http_get_json
from dyad.messages import Reason
from dyad.resources import Resources
from frameworks import CommandInfo, Filters, FrameworkInfo, TaskInfo

from .conftest import Recorder, wait_for

pytestmark = pytest.mark.integration

# Pings every 2 s, 5 may be missed: an agent restart (a second or two) stays well
# inside the window, so the master never declares the agent's tasks lost.
PATIENT_MASTER = ["--agent-ping-timeout", "2s", "--max-agent-ping-timeouts", "5"]
SMALL = Resources.parse("cpus:0.1;mem:32")


def sleeper(offer: Any, task_id: str, **kw: Any) -> TaskInfo:
    shell = "echo $$ > task.pid; exec sleep 300"
    return TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id, resources=SMALL,
                    command=CommandInfo(shell=shell), **kw)


class OfferKeeper(Recorder):
    """A Recorder that also remembers which offers it launched on."""

    def __init__(self) -> None:
        super().__init__()
        self.used_offers: set[str] = set()


def agent_executor(agent_url: str, executor_id: str) -> dict[str, Any] | None:
    state = http_get_json(f"{agent_url}/state")
    return next((e for f in state["frameworks"] for e in f["executors"]
                 if e["id"] == executor_id), None)


def master_tasks(cluster: Any, task_id: str) -> list[dict[str, Any]]:
    state = cluster.state()
    return [t for f in state["frameworks"] for t in f["tasks"] + f["completed_tasks"]
            if t["id"] == task_id]


async def launch(runner: Any, recorder: OfferKeeper, task_id: str, **kw: Any) -> Any:
    """Launch on an offer still open: not rescinded (an agent's re-registration
    rescinds its offers) and not launched on before."""
    await runner.registered()

    def open_offer() -> Any:
        closed = set(recorder.named("rescinded")) | recorder.used_offers
        return next((o for o in reversed(recorder.offers) if o.id not in closed), None)
    offer = await wait_for(open_offer, what="an open offer")
    recorder.used_offers.add(offer.id)
    runner.driver.launch_tasks([offer.id], [sleeper(offer, task_id, **kw)],
                               filters=Filters(refuse_seconds=0.1))  # what is left comes back
    await wait_for(lambda: "TASK_RUNNING" in recorder.states(task_id), 20, f"{task_id} running")
    return offer


async def test_an_agents_life_sigkill_and_recovery_drain_and_a_refused_restart(
        make_cluster: Any, drivers: Any) -> None:
    """One cluster, three chapters (a cluster start costs seconds on a busy machine)."""
    cluster = make_cluster(agents=1, master_args=PATIENT_MASTER)
    recorder = OfferKeeper()
    runner = drivers(recorder, FrameworkInfo(name="life", failover_timeout=60),
                     cluster.master_address)
    agent = await sigkilled_agent_takes_its_task_back(cluster, runner, recorder)
    await drain_kills_tasks_and_stops_offers(cluster, runner, recorder)
    await changed_agent_refuses_to_recover(cluster, agent)


async def sigkilled_agent_takes_its_task_back(cluster: Any, runner: Any,
                                              recorder: OfferKeeper) -> Any:
    offer = await launch(runner, recorder, "survivor")
    before = await wait_for(lambda: agent_executor(offer.url, "survivor"), what="executor")
    pid_file = Path(before["directory"], "task.pid")
    await wait_for(pid_file.exists, what="the task's pid")
    task_pid, executor_pid = int(pid_file.read_text()), before["pid"]

    old = cluster.agent_children[0]
    old.process.kill()  # SIGKILL: no goodbye, no cleanup
    old.process.wait()
    assert psutil.pid_exists(task_pid) and psutil.pid_exists(executor_pid)
    cluster.agent_args = ["--usage-interval", "0.2s", "--usage-report-interval", "0.3s"]
    agent = await asyncio.to_thread(cluster.start_agent, 0)  # keep the driver's loop free
    assert agent.url == offer.url  # the HTTP port of the last run was taken back

    after = await wait_for(lambda: (agent_executor(agent.url, "survivor") or {}).get(
        "state") == "RUNNING" and agent_executor(agent.url, "survivor"), 20, "re-registration")
    assert after["pid"] == executor_pid and after["run_id"] == before["run_id"]
    assert psutil.Process(task_pid).is_running()
    assert int(pid_file.read_text()) == task_pid
    (task,) = master_tasks(cluster, "survivor")
    assert task["state"] == "TASK_RUNNING"
    assert len(cluster.state()["agents"]) == 1
    assert recorder.states("survivor").count("TASK_RUNNING") == 1
    assert not [s for s in recorder.statuses if s.state.is_terminal]
    # The adopted run is measured, and the master shows used beside allocated.
    usage = await wait_for(lambda: master_tasks(cluster, "survivor")[0]["usage"], 10, "usage")
    # The task's own 32 MiB: the agent runs it directly, no command executor to add.
    assert usage["mem_rss_mb"] > 0 and usage["mem_limit_mb"] == 32.0

    # Still under control: a kill reaches the task through the adopted run.
    runner.driver.kill_task("survivor")
    await wait_for(lambda: "TASK_KILLED" in recorder.states("survivor"), 20, "the kill")
    await wait_for(lambda: not psutil.pid_exists(task_pid) or
                   psutil.Process(task_pid).status() == psutil.STATUS_ZOMBIE, what="task gone")
    return agent


async def drain_kills_tasks_and_stops_offers(cluster: Any, runner: Any,
                                             recorder: OfferKeeper) -> None:
    offer = await launch(runner, recorder, "drained", kill_grace_period=0.5)
    outstanding = await wait_for(lambda: recorder.offers[-1].id != offer.id
                                 and recorder.offers[-1], what="an offer of what is left")
    body = json.dumps({"agent_id": offer.agent_id}).encode()
    request = urllib.request.Request(f"{cluster.master.url}/machine/drain", data=body,
                                     method="POST")
    response = await asyncio.to_thread(urllib.request.urlopen, request, timeout=10)
    assert response.status == 202
    response.close()

    await wait_for(lambda: "TASK_KILLED" in recorder.states("drained"), 20, "the drain")
    killed = [s for s in recorder.statuses if s.task_id == "drained"][-1]
    assert killed.reason == Reason.AGENT_DRAINING and "draining" in killed.message
    await wait_for(lambda: cluster.state()["agents"][0]["drained"], what="the master to know")
    await wait_for(lambda: http_get_json(f"{offer.url}/state")["drain_state"] == "DRAINED",
                   what="the agent to be drained")
    assert outstanding.id in recorder.named("rescinded"), "the open offer was taken back"
    offers = len(recorder.offers)
    runner.driver.revive_offers()
    await asyncio.sleep(1.0)  # ten allocation cycles: none may offer the drained agent
    assert len(recorder.offers) == offers


async def changed_agent_refuses_to_recover(cluster: Any, agent: Any) -> None:
    """Killed again, the agent's checkpoint names its resources: the same work dir
    started with other resources is refused, and says why."""
    agent.process.kill()
    agent.process.wait()
    assert os.path.exists(cluster.work_dir / "agent0" / "meta" / "agent.json")
    changed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agent.main", "--master", cluster.master_address,
         "--ip", agent_address(0), "--hostname", agent_address(0), "--port", "0",
         "--executor-port", "0",
         "--work-dir", str(cluster.work_dir / "agent0"), "--resources", "cpus:1;mem:512"],
        capture_output=True, text=True, timeout=30)
    assert changed.returncode == 1
    assert "cannot recover" in changed.stderr and "resources were" in changed.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_plain_agent(cluster: Any, name: str, port: int) -> Child:
    """`dyad-agent` as a user starts a second one on the same host: only `--port`
    and `--work-dir` differ (no `--executor-port`). Registered with the cluster so
    its stop() takes the agent down."""
    argv = [sys.executable, "-m", "agent.main", "--master", cluster.master_address,
            "--ip", "127.0.0.1", "--resources", "cpus:1;mem:256", "--port", str(port),
            "--work-dir", str(cluster.work_dir / name)]
    log_path = cluster.work_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    child = Child(name, process, log_path, url=f"http://127.0.0.1:{port}")
    cluster.agent_children.append(child)
    return child


def answers(child: Child) -> bool:
    assert child.process.poll() is None, child.log_path.read_text(errors="replace")[-2000:]
    try:
        return bool(http_get_json(f"{child.url}/health", timeout=1))
    except OSError:
        return False


async def test_two_agents_on_one_host_need_only_their_own_port_and_work_dir(
        make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=0, master_args=PATIENT_MASTER)
    agents = [start_plain_agent(cluster, name, free_port()) for name in ("a", "b")]
    await wait_for(lambda: all(answers(a) for a in agents), 30, "both agents up")
    await wait_for(lambda: len(cluster.state()["agents"]) == 2, 30, "both registered")
    endpoints = {http_get_json(f"{a.url}/state")["id"]: a for a in agents}
    assert len(endpoints) == 2

    recorder = OfferKeeper()
    runner = drivers(recorder, FrameworkInfo(name="pair", failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    offers = await wait_for(lambda: len({o.agent_id for o in recorder.offers}) == 2 and {
        o.agent_id: o for o in recorder.offers}, 20, "offers from both agents")
    for index, offer in enumerate(offers.values()):
        runner.driver.launch_tasks([offer.id], [sleeper(offer, f"t{index}")])
    for index in range(2):
        await wait_for(lambda: "TASK_RUNNING" in recorder.states(f"t{index}"), 20,
                       f"t{index} running")

    # Agent b is SIGKILLed and started again the same way: it binds the executor
    # port it chose the first time, and its running executor re-attaches.
    b = agents[1]
    state = http_get_json(f"{b.url}/state")
    (before,) = [e for f in state["frameworks"] for e in f["executors"]]
    b.process.kill()
    b.process.wait()
    restarted = start_plain_agent(cluster, "b", int(b.url.rsplit(":", 1)[1]))
    await wait_for(lambda: answers(restarted), 30, "agent b again")
    after = await wait_for(lambda: (agent_executor(restarted.url, before["id"]) or {}).get(
        "state") == "RUNNING" and agent_executor(restarted.url, before["id"]), 20,
        "the executor to re-register")
    assert (after["pid"], after["run_id"]) == (before["pid"], before["run_id"])
    assert all(t["state"] == "TASK_RUNNING" for i in range(2)
               for t in master_tasks(cluster, f"t{i}"))
    assert not [s for s in recorder.statuses if s.state.is_terminal]
