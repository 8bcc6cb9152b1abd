"""Guarantee preemption end to end: a real master (`--preemption`), real agents,
real processes.

A batch role fills the cluster with tasks of every band. A production role then
gets a quota guarantee and a framework: the master preempts the batch role's
lowest-priority tasks (best-effort first, then batch, youngest first), only as
many as the guarantee misses; they end TASK_KILLED with
REASON_CONTAINER_PREEMPTED, the freed room is offered to the production
framework, its tasks run, its guarantee is met, and no task at or above the
preemptor's priority (200, the production floor) is touched.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from dyad.messages import Reason
from dyad.resources import Resources
from frameworks import CommandInfo, FrameworkInfo, TaskInfo, TaskState

from .conftest import Recorder, wait_for
from .test_service import services  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

# Per agent (cpus:2;mem:1024): (task, priority, resources). Everything is taken.
FILL = [
    [("be-a", 50, "cpus:1;mem:256"), ("batch-a", 150, "cpus:0.5;mem:256"),
     ("equal-a", 200, "cpus:0.5;mem:512")],
    [("be-b", 50, "cpus:1;mem:256"), ("batch-b", 150, "cpus:0.5;mem:256"),
     ("mon-b", 400, "cpus:0.5;mem:512")],
]
GUARANTEE = 2.5  # cpus: both best-effort tasks and one batch task must go
BOUND = 20.0  # seconds from the production framework's arrival to its guarantee offered


def put_json(url: str, body: Any) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def sleeper(task_id: str, agent_id: str, priority: int, resources: str) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id=agent_id, priority=priority,
                    resources=Resources.parse(resources),
                    command=CommandInfo(shell="sleep 600"))


async def test_a_guarantee_preempts_lower_bands_only(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=2, resources="cpus:2;mem:1024;disk:1000",
                           master_args=["--preemption", "--preemption-hold", "5s"])

    # The batch role takes every agent whole, in every band.
    filler = Recorder()
    plans = iter(FILL)
    filled: dict[str, list[tuple[str, int, str]]] = {}

    def fill(driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            plan = None if offer.agent_id in filled else next(plans, None)
            if plan is None:
                driver.decline_offer(offer.id)
                continue
            filled[offer.agent_id] = plan
            driver.launch_tasks([offer.id], [sleeper(name, offer.agent_id, priority, text)
                                             for name, priority, text in plan])

    filler.on_offers = fill
    batch = drivers(filler, FrameworkInfo(name="batch", roles=["batch"]),
                    cluster.master_address)
    await batch.registered()
    every = [name for plan in FILL for name, _, _ in plan]
    await wait_for(lambda: all("TASK_RUNNING" in filler.states(t) for t in every), 30,
                   "the batch role's tasks running on every agent")

    # Production arrives: a guarantee, and a framework that takes what it is offered.
    quota = put_json(f"{cluster.master.url}/quota",
                     {"role": "prod", "guarantee": {"cpus": GUARANTEE}})
    assert [q["role"] for q in quota["quota"]] == ["prod"]
    prod = Recorder()
    launched: list[float] = []

    def take(driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            cpus = offer.resources.get("cpus")
            if cpus <= 0 or sum(launched) >= GUARANTEE:
                driver.decline_offer(offer.id)
                continue
            launched.append(cpus)
            driver.launch_tasks([offer.id], [sleeper(
                f"web{len(launched)}", offer.agent_id, 250, f"cpus:{cpus};mem:64")])

    prod.on_offers = take
    started = time.monotonic()
    web = drivers(prod, FrameworkInfo(name="prod", roles=["prod"]), cluster.master_address)
    await web.registered()
    await wait_for(lambda: sum(launched) >= GUARANTEE, BOUND,
                   f"the production role offered its guarantee within {BOUND}s")
    offered_after = time.monotonic() - started
    webs = [f"web{i + 1}" for i in range(len(launched))]
    await wait_for(lambda: all("TASK_RUNNING" in prod.states(t) for t in webs), 20,
                   "the production tasks running")

    # The victims: lowest priority first, only as many as needed, with the reason.
    def ended(task_id: str) -> Any:
        done = [s for s in filler.statuses if s.task_id == task_id and s.state.is_terminal]
        return done[-1] if done else None

    killed = {t for t in every if ended(t)}
    # Both best-effort tasks, then one batch task (the younger): 2.5 cpus.
    assert {"be-a", "be-b"} <= killed and len(killed & {"batch-a", "batch-b"}) == 1, killed
    assert len(killed) == 3, killed
    for task_id in killed:
        status = ended(task_id)
        assert status.state == TaskState.TASK_KILLED
        assert status.reason == Reason.CONTAINER_PREEMPTED
        assert "quota guarantee" in status.message
    # Never the preemptor's equal (200) nor a higher band; never the guaranteed role.
    survivors = [t for t in every if t not in killed]
    assert {"equal-a", "mon-b"} <= set(survivors)
    state = cluster.state()
    running = {t["id"]: t for f in state["frameworks"] for t in f["tasks"]}
    assert all(running[t]["state"] == "TASK_RUNNING" for t in survivors + webs)
    assert not [s for s in prod.statuses if s.state.is_terminal]
    (role,) = [r for r in state["roles"] if r["name"] == "prod"]
    assert role["allocated"]["cpus"] >= GUARANTEE
    metrics = cluster.get(f"{cluster.master.url}/metrics/snapshot")
    assert metrics["master/preemptions"] == len(killed)
    preempted = [e for e in cluster.get(f"{cluster.master.url}/events")["events"]
                 if e["type"] == "task_preempted"]
    assert sorted(e["task_id"] for e in preempted) == sorted(killed)
    print(f"guarantee of cpus:{GUARANTEE} offered {offered_after:.1f}s after the "
          f"production framework subscribed (bound {BOUND}s)")


ASKING_CLUSTER = dict(agents=1, resources="cpus:2;mem:1024;disk:1000",
                      master_args=["--preemption", "--preemption-guarantees", "off",
                                   "--preemption-hold", "5s"])


async def filled_once(drivers: Any, cluster: Any, plan: list[tuple[str, int, str]]) -> Recorder:
    """A batch-role framework that launches `plan` (task, priority, resources) on the
    first agent offered, declines every other offer, and waits for them to run."""
    filler = Recorder()
    filled: list[str] = []

    def fill(driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            if filled:
                driver.decline_offer(offer.id)
                continue
            filled.append(offer.agent_id)
            driver.launch_tasks([offer.id], [sleeper(name, offer.agent_id, priority, text)
                                             for name, priority, text in plan])

    filler.on_offers = fill
    await drivers(filler, FrameworkInfo(name="batch", roles=["batch"]),
                  cluster.master_address).registered()
    await wait_for(lambda: all("TASK_RUNNING" in filler.states(name) for name, _, _ in plan),
                   30, "the batch role's tasks running")
    return filler


async def test_a_framework_asks_through_its_driver_and_gets_the_room(
        make_cluster: Any, drivers: Any) -> None:
    """`SchedulerDriver.preempt`: a framework with the PREEMPTION capability asks for
    room for one production task on a cluster batch work fills; the master kills the
    batch task (below the asker's priority) and offers the asker the room. A
    framework without the capability is refused through `error`, and nothing ends."""
    cluster = make_cluster(**ASKING_CLUSTER)
    filler = await filled_once(drivers, cluster, [("batch-1", 150, "cpus:1.5;mem:512"),
                                                  ("best-1", 50, "cpus:0.5;mem:256")])

    wanted = Resources.parse("cpus:1;mem:128")
    refused = Recorder()
    plain = drivers(refused, FrameworkInfo(name="plain", roles=["prod"]),
                    cluster.master_address)
    await plain.registered()
    plain.driver.preempt(wanted, 300)
    await wait_for(lambda: any("rejected preempt" in m for m in refused.named("error")), 15,
                   "the request without the capability refused")
    assert not [s for s in filler.statuses if s.state.is_terminal]

    asker = Recorder()
    placed: list[str] = []

    def take(driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            if placed or offer.resources.get("cpus") < 1:
                driver.decline_offer(offer.id)
                continue
            placed.append(offer.agent_id)
            driver.launch_tasks([offer.id], [sleeper("web-1", offer.agent_id, 300,
                                                     "cpus:1;mem:128")])

    asker.on_offers = take
    web = drivers(asker, FrameworkInfo(name="web", roles=["prod"], capabilities=["PREEMPTION"]),
                  cluster.master_address)
    await web.registered()
    web.driver.preempt(wanted, 300)
    await wait_for(lambda: "TASK_RUNNING" in asker.states("web-1"), 30,
                   "the asker's task running in the room it asked for")
    ended = {s.task_id: s for s in filler.statuses if s.state.is_terminal}
    # Best-effort is taken first, then batch; the best-effort task is spared, as the
    # batch task alone frees cpus:1.5: one victim, below the asker's band.
    assert set(ended) == {"batch-1"}, ended
    assert ended["batch-1"].state == TaskState.TASK_KILLED
    assert ended["batch-1"].reason == Reason.CONTAINER_PREEMPTED
    assert "TASK_RUNNING" in filler.states("best-1") and "best-1" not in ended


async def test_a_waiting_service_app_gets_room_from_batch_work(
        make_cluster: Any, drivers: Any, services: Any, tmp_path: Any) -> None:  # noqa: F811
    """`dyad-service --preemption-ask-after`: a production app that cannot be placed on
    a cluster that best-effort work fills asks the master for room, which kills the
    best-effort task and offers the room; the app's task runs."""
    cluster = make_cluster(**ASKING_CLUSTER)
    filler = await filled_once(drivers, cluster, [("best-1", 50, "cpus:2;mem:512")])

    service = await services("svc", "--master", cluster.master_address, "--work-dir",
                             str(tmp_path / "svc"), "--preemption-ask-after", "2s").started()
    status, created = service.call("POST", "/v2/apps", {
        "id": "/prod", "cmd": "sleep 600", "instances": 1, "cpus": 1, "mem": 128})
    assert status == 201, created
    await wait_for(lambda: service.app("/prod")["tasksRunning"] == 1, 40,
                   "the production app running in the room it asked for")
    (ended,) = [s for s in filler.statuses if s.state.is_terminal]
    assert ended.task_id == "best-1" and ended.state == TaskState.TASK_KILLED
    assert ended.reason == Reason.CONTAINER_PREEMPTED
    assert service.get("/metrics")["counters"]["preemption_asks"] >= 1
