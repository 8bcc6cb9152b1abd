"""Oversubscription end to end: a real master, a real agent, real processes.

A service declares far more memory than it uses; once the agent's reclaim window
has passed, a framework with REVOCABLE_RESOURCES is offered the idle part (and
one without it never is), runs a task there, and that task is evicted --
TASK_KILLED with REASON_CONTAINER_PREEMPTED -- when the service's memory grows,
while the service keeps running. The batch framework, asked to, runs maps on
those resources and retries the evicted ones free of charge.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.isolation import IsolationError, detect
from dyad.local import http_get_json
from dyad.messages import Reason
from dyad.resources import Resources
from frameworks import CommandInfo, FrameworkInfo, TaskInfo, TaskState
from frameworks.batch import BatchCore, Job, run_job_async

from .conftest import Recorder, wait_for

pytestmark = pytest.mark.integration

AGENT_ARGS = ["--usage-interval", "0.2s", "--usage-report-interval", "0.5s",
              "--reclaim-window", "2s"]
CGROUPS_ROOT = "dyad-test-oversub"


def _cgroups_available() -> bool:
    try:
        detect("cgroups", CGROUPS_ROOT)
    except IsolationError:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def _remove_cgroup_root() -> Iterator[None]:
    """After the module (its clusters are stopped by then): the empty root."""
    yield
    for hierarchy in ("memory", "cpu", "unified", ""):
        try:
            os.rmdir(os.path.join("/sys/fs/cgroup", hierarchy, CGROUPS_ROOT))
        except OSError:
            pass


ISOLATIONS = ["posix", pytest.param("cgroups", marks=pytest.mark.skipif(
    not _cgroups_available(), reason="no writable cgroups on this machine"))]

# Idles at a few MB; once the flag file exists, holds ~600 MB (touched pages).
GROWER = ("import os, sys, time\n"
          "flag = sys.argv[1]\n"
          "while not os.path.exists(flag):\n"
          "    time.sleep(0.1)\n"
          "held = b'x' * (600 * 2 ** 20)\n"
          "while True:\n"
          "    time.sleep(1)\n")


def grower(directory: Path) -> tuple[Path, str]:
    """The flag file that makes it grow, and the shell command running it."""
    script = directory / "grower.py"
    script.write_text(GROWER)
    flag = directory / "grow"
    return flag, f"{sys.executable} {script} {flag}"


def cpu_weight(run_id: str) -> int:
    """A run's cpu.shares (cgroups v1) or cpu.weight (v2), as the kernel has it."""
    for path in (f"/sys/fs/cgroup/cpu/{CGROUPS_ROOT}/{run_id}/cpu.shares",
                 f"/sys/fs/cgroup/{CGROUPS_ROOT}/{run_id}/cpu.weight"):
        if os.path.exists(path):
            return int(Path(path).read_text())
    raise AssertionError(f"no cgroup for run {run_id}")


def lent_mem(offer: Any) -> float:
    return offer.revocable.get("mem") if offer.revocable else 0.0


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_idle_reservations_are_lent_and_taken_back(make_cluster: Any, drivers: Any,
                                                         tmp_path: Path, isolation: str) -> None:
    args = [*AGENT_ARGS, "--isolation", isolation, "--cgroups-root", CGROUPS_ROOT]
    cluster = make_cluster(agents=1, resources="cpus:2;mem:1024;disk:1000", agent_args=args)
    flag, grow = grower(tmp_path)

    service = Recorder()
    svc = drivers(service, FrameworkInfo(name="service"), cluster.master_address)
    await svc.registered()
    offer = await wait_for(lambda: service.offers[0] if service.offers else None,
                           what="an offer for the service")
    svc.driver.launch_tasks([offer.id], [TaskInfo(
        task_id="svc", name="svc", agent_id=offer.agent_id, priority=200,
        resources=Resources.parse("cpus:1;mem:800"),
        command=CommandInfo(shell=grow))])
    await wait_for(lambda: "TASK_RUNNING" in service.states("svc"), what="the service running")

    borrower = Recorder()
    launched: list[str] = []

    def borrow(driver: Any, offers: list[Any]) -> None:
        for o in offers:
            if lent_mem(o) >= 256 and not launched:
                launched.append(o.id)
                driver.launch_tasks([o.id], [TaskInfo(
                    task_id="be", name="be", agent_id=o.agent_id, priority=50,
                    revocable=True, resources=Resources.parse("cpus:0.25;mem:256"),
                    command=CommandInfo(shell="sleep 600"))])
            else:
                driver.decline_offer(o.id)

    borrower.on_offers = borrow
    bor = drivers(borrower, FrameworkInfo(name="borrower", capabilities=["REVOCABLE_RESOURCES"]),
                  cluster.master_address)
    await bor.registered()
    # Within the reclaim window (plus reports), the idle part is lent, marked.
    await wait_for(lambda: launched, 30, "a revocable offer to the opted-in framework")
    await wait_for(lambda: "TASK_RUNNING" in borrower.states("be"), 20, "the revocable task")
    state = cluster.state()
    (agent,) = state["agents"]
    assert agent["revocable_resources"]["mem"] > 256
    assert agent["revocable_used"]["mem"] == 256
    assert agent["used_resources"]["mem"] == 800  # the borrower's task is not in it
    (be,) = [t for f in state["frameworks"] for t in f["tasks"] if t["id"] == "be"]
    assert be["revocable"] and be["band"] == "best-effort"
    # The framework that did not ask never saw revocable resources.
    assert service.offers and all(not o.revocable for o in service.offers)
    # The borrower's run has next to no CPU weight: only its executor's own 0.1
    # cpus count (cgroups v1 cpu.shares, v2 cpu.weight; niced under posix).
    runs = {t["id"]: e for f in http_get_json(f"{agent['url']}/state")["frameworks"]
            for e in f["executors"] for t in e["tasks"]}
    if isolation == "posix":
        niceness = {task: psutil.Process(run["pid"]).nice() for task, run in runs.items()}
        assert niceness["be"] >= niceness["svc"] + 10, niceness
    else:
        weights = {task: cpu_weight(run["run_id"]) for task, run in runs.items()}
        assert weights["be"] * 5 < weights["svc"], weights

    # The service grows into what it declared: the borrower is evicted, it is not.
    flag.write_text("now")

    def evicted() -> Any:
        done = [s for s in borrower.statuses if s.task_id == "be" and s.state.is_terminal]
        return done[-1] if done else None

    status = await wait_for(evicted, 30, "the revocable task to be evicted")
    assert status.state == TaskState.TASK_KILLED
    assert status.reason == Reason.CONTAINER_PREEMPTED
    assert "need them back" in status.message or "pressure" in status.message
    assert not [s for s in service.statuses if s.task_id == "svc" and s.state.is_terminal]
    agent_state = http_get_json(f"{agent['url']}/state")
    assert agent_state["oversubscription"]["evicted"] >= 1

    def owner_grown() -> Any:
        # The master sees usage one report later than the agent acted on it.
        svc = next(t for f in cluster.state()["frameworks"] for t in f["tasks"]
                   if t["id"] == "svc")
        assert svc["state"] == "TASK_RUNNING", svc
        return svc if (svc.get("usage") or {}).get("mem_rss_mb", 0) > 400 else None

    await wait_for(owner_grown, 20, "the service's usage to show it grew, still running")


# Maps wait for a release file beside the module, so they are still running when
# the owner grows.
HELD_MAP = '''
import os, time

def map(offset, line):
    release = os.path.join(os.path.dirname(__file__), "release")
    while not os.path.exists(release):
        time.sleep(0.05)
    yield line, 1

def reduce(key, values):
    yield key, sum(values)
'''


async def test_a_revocable_batch_job_survives_evictions(make_cluster: Any, drivers: Any,
                                                        tmp_path: Path) -> None:
    """`dyad-batch --revocable`: maps run on what the service lends; when the
    service grows they are evicted, retried on ordinary resources without being
    charged (max_attempts=1), and the job succeeds with the exact output."""
    cluster = make_cluster(agents=1, resources="cpus:2;mem:1024;disk:1000",
                           agent_args=[*AGENT_ARGS, "--isolation", "posix"])
    flag, grow = grower(tmp_path)
    service = Recorder()

    def own(driver: Any, offers: list[Any]) -> None:
        for o in offers:
            if service.states("svc"):
                driver.decline_offer(o.id)
                continue
            driver.launch_tasks([o.id], [TaskInfo(
                task_id="svc", name="svc", agent_id=o.agent_id, priority=200,
                resources=Resources.parse("cpus:1.4;mem:800"),
                command=CommandInfo(shell=grow))])

    service.on_offers = own
    svc = drivers(service, FrameworkInfo(name="service"), cluster.master_address)
    await svc.registered()
    await wait_for(lambda: "TASK_RUNNING" in service.states("svc"), 20, "the service running")

    module = tmp_path / "held.py"
    module.write_text(HELD_MAP)
    inputs = []
    for number in range(4):
        path = tmp_path / f"in-{number}.txt"
        path.write_text(f"line {number}\nshared\n")
        inputs.append(str(path))
    cores: list[BatchCore] = []
    # Ordinary room for the executor and one map (cpus:0.6;mem:224 left); the
    # rest of the maps can only run on revocable resources.
    job = Job(module=str(module), inputs=inputs, output=str(tmp_path / "out"), reducers=1,
              map_cpus=0.5, map_mem=128, reduce_cpus=0.5, reduce_mem=128, max_attempts=1,
              locality_wait=0.0, revocable=True)
    running = asyncio.ensure_future(run_job_async(job, cluster.master_address, timeout=120,
                                                  core_hook=cores.append))

    def on_revocable() -> Any:
        tasks = [t for f in cluster.state()["frameworks"] for t in f["tasks"]
                 if t["revocable"] and t["state"] == "TASK_RUNNING"]
        return tasks or running.done()

    await wait_for(on_revocable, 40, "a map running on revocable resources")
    assert not running.done(), running.result()
    flag.write_text("now")
    await wait_for(lambda: cores[0].progress().preempted_attempts >= 1 or running.done(), 30,
                   "a revocable map to be evicted")
    assert not running.done(), running.result()
    (module.parent / "release").write_text("go")
    result = await asyncio.wait_for(running, 90)
    assert result.succeeded, result.error
    progress = result.progress
    assert progress.revocable_launches >= 1 and progress.preempted_attempts >= 1
    assert progress.failed_attempts == 0
    lines = sorted((tmp_path / "out" / "part-r-00000").read_text().splitlines())
    assert lines == sorted([f"line {n}\t1" for n in range(4)] + ["shared\t4"])
    assert not [s for s in service.statuses if s.task_id == "svc" and s.state.is_terminal]
