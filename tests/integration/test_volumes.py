"""Real master, agent and executor processes: data a task writes into a persistent
volume is there for the next task of its role on that agent, after the agent is
SIGKILLed and restarted, after the (standalone) master restarts from its
registry, and after the leading master is SIGKILLed and a standby elected through
a real ZooKeeper takes over; DESTROY of a volume in use is refused with a reason."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from frameworks import (
    CommandInfo, Filters, FrameworkInfo, Operation, OperationType, PersistentVolume,
    Resources, TaskInfo,
)

from .conftest import Recorder, wait_for
from .test_ha import ha_cluster, leading  # noqa: F401 (ha_cluster: the fixture)
from .zookeeper import zookeeper  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

PATIENT_MASTER = ["--agent-ping-timeout", "2s", "--max-agent-ping-timeouts", "5"]
VOLUME = PersistentVolume(id="v1", container_path="data", size=64, role="eng")
ON_VOLUME = Resources.parse("cpus:0.1;mem:32") + VOLUME.resources
ENDS = {"TASK_FINISHED", "TASK_FAILED", "TASK_ERROR", "TASK_LOST", "TASK_DROPPED"}


class Keeper(Recorder):
    """Remembers which offers it has used, so each accept gets a fresh one, and
    declines offers without the volume unless `want_plain`: held, they would keep
    the agent's cpus and mem from ever coming back beside the volume."""

    def __init__(self) -> None:
        super().__init__()
        self.used: set[str] = set()
        self.want_plain = True

    def resource_offers(self, driver: Any, offers: list[Any]) -> None:
        super().resource_offers(driver, offers)
        for offer in offers:
            if not offer.volumes and not self.want_plain:
                self.used.add(offer.id)
                driver.decline_offer(offer.id, Filters(refuse_seconds=0.1))

    def fresh(self, with_volume: bool) -> Any:
        closed = set(self.named("rescinded")) | self.used
        return next((o for o in reversed(self.offers) if o.id not in closed
                     and bool(o.volumes) == with_volume), None)


async def accept(runner: Any, keeper: Keeper, with_volume: bool, *ops: Operation) -> Any:
    keeper.want_plain = not with_volume
    offer = await wait_for(lambda: keeper.fresh(with_volume), 30,
                           "an offer " + ("with" if with_volume else "without") + " the volume")
    keeper.used.add(offer.id)
    keeper.want_plain = False
    runner.driver.accept_offers([offer.id], list(ops), Filters(refuse_seconds=0.1))
    return offer


def task(offer: Any, task_id: str, shell: str) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                    resources=ON_VOLUME, command=CommandInfo(shell=shell))


async def run_on_volume(runner: Any, keeper: Keeper, task_id: str, shell: str) -> str:
    """Run `shell` on the volume as it is offered back; its final state. An offer
    that raced its rescission (the agent or master just came back) drops the task,
    and one accepted while the agent was restarting loses it (the launch went to
    the dead process): then the next offer is tried."""
    keeper.want_plain = False
    for plain in [o for o in keeper.offers if not o.volumes and o.id not in keeper.used]:
        keeper.used.add(plain.id)
        runner.driver.decline_offer(plain.id, Filters(refuse_seconds=0.1))
    for _ in range(3):
        offer = await wait_for(lambda: keeper.fresh(True), 30, "the volume offered back")
        keeper.used.add(offer.id)
        assert [v.id for v in offer.volumes] == ["v1"]
        seen = len(keeper.states(task_id))
        runner.driver.accept_offers([offer.id], [Operation(
            type=OperationType.LAUNCH, tasks=[task(offer, task_id, shell)])],
            Filters(refuse_seconds=0.1))
        await wait_for(lambda seen=seen: set(keeper.states(task_id)[seen:]) & ENDS, 40,
                       f"{task_id} to end")
        if keeper.states(task_id)[-1] not in ("TASK_DROPPED", "TASK_LOST"):
            break
    return keeper.states(task_id)[-1]


async def test_a_volume_keeps_its_data_across_tasks_agent_restarts_and_master_restarts(
        make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1, master_args=PATIENT_MASTER)
    keeper = Keeper()
    runner = drivers(keeper, FrameworkInfo(name="vols", roles=["eng"], failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    offer = await accept(runner, keeper, False,
                         Operation(type=OperationType.RESERVE, resources=Resources.parse(
                             "disk(eng):64")),
                         Operation(type=OperationType.CREATE, volumes=[VOLUME]))
    offer_back = await wait_for(lambda: keeper.fresh(True), 30, "the new volume offered")
    assert offer_back.agent_id == offer.agent_id
    volume_dir = Path(cluster.work_dir, "agent0", "volumes", "roles", "eng", "v1")
    assert volume_dir.is_dir()

    assert await run_on_volume(runner, keeper, "write", "echo one > data/log") == "TASK_FINISHED"
    assert await run_on_volume(runner, keeper, "append",
                               "grep -q one data/log && echo two >> data/log") == "TASK_FINISHED"

    # The agent dies and comes back: the volume and its data are still offered.
    agent = cluster.agent_children[0]
    agent.process.kill()
    agent.process.wait()
    await asyncio.to_thread(cluster.start_agent, 0)
    assert await run_on_volume(runner, keeper, "after-agent",
                               "grep -q two data/log && echo three >> data/log") == "TASK_FINISHED"

    # The master dies and restarts (on its ports) from its registry: reservation and
    # volume return.
    cluster.port = int(cluster.master.url.rsplit(":", 1)[1])
    cluster.zmq_port = int(cluster.master.zmq.rsplit(":", 1)[1])
    keeper.used |= {o.id for o in keeper.offers}  # offers of the old master are void
    cluster.master.process.kill()
    cluster.master.process.wait()
    await asyncio.to_thread(cluster.start_master)
    await wait_for(lambda: keeper.named("reregistered"), 30, "the framework back")
    assert await run_on_volume(runner, keeper, "after-master",
                               "grep -q three data/log") == "TASK_FINISHED"
    assert (volume_dir / "log").read_text().split() == ["one", "two", "three"]
    state = cluster.state()
    assert [v["id"] for v in state["agents"][0]["volumes"]] == ["v1"]

    # DESTROY while a task uses it: refused, naming the task; the volume stays.
    offer = await wait_for(lambda: keeper.fresh(True), 30, "the volume offered back")
    keeper.used.add(offer.id)
    runner.driver.accept_offers([offer.id], [Operation(type=OperationType.LAUNCH, tasks=[
        task(offer, "holder", "sleep 300")])], Filters(refuse_seconds=0.1))
    await wait_for(lambda: "TASK_RUNNING" in keeper.states("holder"), 30, "holder running")
    errors = len(keeper.named("error"))
    await accept(runner, keeper, False, Operation(type=OperationType.DESTROY, volumes=[VOLUME]))
    refused = await wait_for(lambda: keeper.named("error")[errors:], 20, "the refusal")
    assert "DESTROY refused" in refused[0] and "in use by task(s) holder" in refused[0]
    assert volume_dir.is_dir()

    # Once the task is gone, DESTROY removes the volume on the agent.
    runner.driver.kill_task("holder")
    await wait_for(lambda: "TASK_KILLED" in keeper.states("holder"), 30, "holder killed")
    await accept(runner, keeper, True, Operation(type=OperationType.DESTROY, volumes=[VOLUME]))
    await wait_for(lambda: not volume_dir.exists(), 20, "the volume removed")


async def test_a_volume_and_its_reservation_survive_a_master_failover(
        ha_cluster: Any, drivers: Any) -> None:
    cluster = ha_cluster(masters=2, agents=1)
    keeper = Keeper()
    runner = drivers(keeper, FrameworkInfo(name="vols", roles=["eng"], failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    await accept(runner, keeper, False,
                 Operation(type=OperationType.RESERVE, resources=Resources.parse("disk(eng):64")),
                 Operation(type=OperationType.CREATE, volumes=[VOLUME]))
    assert await run_on_volume(runner, keeper, "write", "echo one > data/log") == "TASK_FINISHED"

    # The leader dies; the standby, elected through ZooKeeper, reads the registry
    # the old leader wrote there: the reservation and the volume are offered again.
    keeper.used |= {o.id for o in keeper.offers}  # offers of the old leader are void
    leader = cluster.leader()
    leader.process.send_signal(signal.SIGKILL)
    await wait_for(lambda: leading(cluster) not in (None, leader), 20, "a new leader")
    await wait_for(lambda: keeper.named("reregistered"), 30, "the framework back")
    assert await run_on_volume(runner, keeper, "after-failover",
                               "grep -q one data/log && echo two >> data/log") == "TASK_FINISHED"
    volume_dir = Path(cluster.work_dir, "agent0", "volumes", "roles", "eng", "v1")
    assert (volume_dir / "log").read_text().split() == ["one", "two"]
    (agent,) = cluster.state()["agents"]
    assert [v["id"] for v in agent["volumes"]] == ["v1"]
