"""High availability against a real ZooKeeper: failover with no task lost, a leader
that loses ZooKeeper stops offering, partitions, and registry fencing.

Masters, agents and executors are real processes; ZooKeeper is a real server
started by the `zookeeper` fixture. Timeouts are shortened through the real flags.
Tasks record their PID in a file when they start (`echo $$ >> FILE; exec sleep`),
so "the same process is still running" and "launched exactly once" are checked
from outside the cluster rather than taken from its own reports.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dyad.detector import ZooKeeperDetector
from dyad.local import ClusterError, LocalCluster, http_get_json
from dyad.messages import Address, AgentInfo, AgentRegistered, MasterInfo, RegisterAgent
from dyad.resources import Resources
from dyad.transport import Dealer
from dyad.zk import ZkSession, create_contender
from frameworks import CommandInfo, Filters, FrameworkInfo, TaskInfo, TaskState
from master.registry import RegistryData, RegistryError, RegistryFenced, ZooKeeperRegistry
from master.server import MasterServer
from master.model import MasterConfig

from .conftest import FAST_MASTER, Recorder, wait_for
from .zookeeper import ZooKeeperServer, zookeeper  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

SESSION_TIMEOUT = 2.0  # seconds: failovers take about this long
HA_MASTER = FAST_MASTER + ["--zk-session-timeout", f"{SESSION_TIMEOUT}s"]
SMALL = Resources.parse("cpus:0.1;mem:32")


@pytest.fixture
def ha_cluster(tmp_path: Path, zookeeper: ZooKeeperServer) -> Iterator[Any]:
    started: list[LocalCluster] = []

    def make(masters: int, agents: int, master_args: list[str] | None = None) -> LocalCluster:
        cluster = LocalCluster(work_dir=tmp_path / f"cluster{len(started)}", agents=agents,
                               masters=masters, zk=zookeeper.url(),
                               resources="cpus:2;mem:1024;disk:1000",
                               master_args=HA_MASTER + (master_args or []))
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


def pid_task(offer: Any, task_id: str, pids: Path) -> TaskInfo:
    """A long task that appends its PID to `pids/<task_id>` once per launch."""
    return TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id, resources=SMALL,
                    command=CommandInfo(shell=f"echo $$ >> {pids / task_id}; exec sleep 300"))


def launched_pids(pids: Path) -> dict[str, list[int]]:
    return {path.name: [int(line) for line in path.read_text().split()]
            for path in sorted(pids.iterdir())}


async def written_pids(pids: Path, tasks: int) -> dict[str, list[int]]:
    """`launched_pids` once `tasks` tasks have each written a pid: TASK_RUNNING says
    the process was started, not that its first line of shell has run."""
    await wait_for(lambda: len(launched_pids(pids)) == tasks
                   and all(launched_pids(pids).values()), 20, "every task's pid written")
    return launched_pids(pids)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pending_updates(agent: Any) -> int:
    """Status updates the agent still waits to have acknowledged."""
    return int(http_get_json(f"{agent.url}/metrics/snapshot")["agent/status_updates_pending"])


def running_in_master(cluster: LocalCluster) -> set[str]:
    return {task["id"] for framework in cluster.state()["frameworks"]
            for task in framework["tasks"] if task["state"] == "TASK_RUNNING"}


def launch_per_agent(recorder: Recorder, pids: Path, per_agent: int) -> None:
    """Launch `per_agent` tasks on every agent offered, once per agent."""
    launched: set[str] = set()

    def on_offers(driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            if offer.agent_id in launched:
                driver.decline_offer(offer.id, Filters(refuse_seconds=3600))
                continue
            launched.add(offer.agent_id)
            tasks = [pid_task(offer, f"t{len(launched)}-{i}", pids) for i in range(per_agent)]
            driver.launch_tasks([offer.id], tasks, Filters(refuse_seconds=3600))

    recorder.on_offers = on_offers


def leading(cluster: LocalCluster) -> Any:
    """The leading master's Child, or None while nobody leads."""
    try:
        return cluster.leader()
    except ClusterError:
        return None


async def no_contenders(zookeeper: ZooKeeperServer) -> bool:
    """Nobody contends under /dyad any more: every master's session has expired."""
    session = ZkSession(zookeeper.hosts, SESSION_TIMEOUT)
    try:
        await session.start()
        found: list[list[str]] = []
        await session.watch_children("/dyad", found.append)
        await wait_for(lambda: found, 5, "the children of /dyad")
        return not found[0]
    finally:
        await session.close()


async def test_failover_keeps_every_task_running(ha_cluster: Any, drivers: Any,
                                                 tmp_path: Path,
                                                 zookeeper: ZooKeeperServer) -> None:
    cluster = ha_cluster(masters=2, agents=3)
    pids = tmp_path / "pids"
    pids.mkdir()
    recorder = Recorder()
    launch_per_agent(recorder, pids, per_agent=1)
    runner = drivers(recorder, FrameworkInfo(name="ha", failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    await wait_for(lambda: len(running_in_master(cluster)) == 3, 30, "a running task per agent")
    before = await written_pids(pids, 3)
    assert len(before) == 3 and all(len(p) == 1 for p in before.values()), before
    # Every update acknowledged: none of them may come again after the failover.
    await wait_for(lambda: all(pending_updates(a) == 0 for a in cluster.agent_children), 20,
                   "acknowledgements to reach the agents")
    acked = {s.uuid for s in recorder.statuses if s.uuid}
    seen = len(recorder.statuses)

    # The standby says who leads and sends leader-only calls there.
    leader = cluster.leader()
    (standby,) = [m for m in cluster.master_children if m is not leader]
    standby_state = http_get_json(f"{standby.url}/state")
    assert standby_state["elected"] is False
    assert standby_state["leader_url"] == leader.url
    async with aiohttp.ClientSession() as http:
        for path in ("/redirect", "/master/info"):
            async with http.get(standby.url + path, allow_redirects=False) as resp:
                assert resp.status == 307
                assert resp.headers["Location"].startswith(leader.url)

    # SIGKILL the leader: the standby takes over, agents and framework follow.
    killed_at = time.monotonic()
    leader.process.send_signal(signal.SIGKILL)
    new_leader = await wait_for(lambda: leading(cluster) not in (None, leader), 20,
                                "a new leader") and leading(cluster)
    elected_in = time.monotonic() - killed_at
    await wait_for(lambda: running_in_master(cluster) == set(before), 20, "tasks relearned")
    await wait_for(lambda: recorder.named("reregistered"), 20, "framework re-registration")
    assert [s for s in recorder.statuses[seen:] if s.uuid in acked] == []
    assert len(cluster.state()["agents"]) == 3
    assert elected_in < SESSION_TIMEOUT + 5, elected_in

    # Every master down: agents and executors carry on; a restarted master
    # recovers the agents from the registry and relearns every task from them.
    new_leader.process.send_signal(signal.SIGKILL)
    await wait_for(lambda: no_contenders(zookeeper), 20, "both sessions to expire")
    assert all(alive(pid) for pid_list in before.values() for pid in pid_list)
    restarted = cluster.start_master(index=0)
    await wait_for(lambda: leading(cluster) is restarted, 20, "restarted master leads")
    await wait_for(lambda: running_in_master(cluster) == set(before), 20, "tasks relearned")
    assert cluster.state()["recovering_agents"] == []

    after = launched_pids(pids)
    assert after == before, "a task was launched twice"
    assert all(alive(pid) for pid_list in after.values() for pid in pid_list)
    bad = [s for s in recorder.statuses if s.state.is_terminal]
    assert bad == [], bad


async def test_agents_move_to_a_new_leader_as_soon_as_zookeeper_names_it(
        ha_cluster: Any) -> None:
    """At stock ping settings an agent notices a dead master only after 3 missed
    pings (45 s; issue 19 measured 44 s): only the election watch can bring the
    agents over within seconds of the successor's election."""
    cluster = ha_cluster(masters=2, agents=3, master_args=[
        "--agent-ping-timeout", "15s", "--max-agent-ping-timeouts", "5"])
    await wait_for(lambda: leading(cluster) is not None and len(cluster.state()["agents"]) == 3,
                   30, "three agents at the first leader")
    leader = cluster.leader()
    leader.process.send_signal(signal.SIGKILL)
    await wait_for(lambda: leading(cluster) not in (None, leader), 20, "a new leader")
    elected_at = time.monotonic()
    await wait_for(lambda: len(cluster.state()["agents"]) == 3, 15, "agents at the new leader")
    back_in = time.monotonic() - elected_at
    assert cluster.state()["recovering_agents"] == []
    assert back_in < 3.0, f"agents took {back_in:.1f}s after the election"


class OfferClock(Recorder):
    """Notes when offers arrive and declines them with a short filter, so offers
    keep coming for as long as the master acts as leader."""

    def __init__(self) -> None:
        super().__init__()
        self.offer_times: list[float] = []

    def resource_offers(self, driver: Any, offers: list[Any]) -> None:
        self.offer_times.append(time.monotonic())
        for offer in offers:
            driver.decline_offer(offer.id, Filters(refuse_seconds=0.2))


async def test_leader_cut_off_from_zookeeper_stops_offering(
        ha_cluster: Any, drivers: Any, zookeeper: ZooKeeperServer) -> None:
    cluster = ha_cluster(masters=1, agents=1)
    recorder = OfferClock()
    drivers(recorder, FrameworkInfo(name="watcher"), cluster.master_address)
    await wait_for(lambda: len(recorder.offer_times) >= 3, 20, "a stream of offers")
    master = cluster.leader()

    zookeeper.pause()
    paused_at = time.monotonic()
    try:
        code = await wait_for(lambda: master.process.poll(), 4 * SESSION_TIMEOUT + 5,
                              "the cut-off leader to exit")
        exited_in = time.monotonic() - paused_at
    finally:
        zookeeper.resume()
    assert code == 75, code  # EX_TEMPFAIL: for a supervisor to restart it
    assert exited_in <= 2 * SESSION_TIMEOUT + 3, exited_in
    assert "stepping down" in master.log_path.read_text()
    # Offers stopped once its lease ran out, at most 2/3 of a session timeout
    # after ZooKeeper went silent: well before anyone else could have been elected.
    assert recorder.offer_times[-1] - paused_at < SESSION_TIMEOUT, \
        recorder.offer_times[-1] - paused_at


async def test_partition_unreachable_then_reconciled(ha_cluster: Any, drivers: Any,
                                                     tmp_path: Path) -> None:
    cluster = ha_cluster(masters=1, agents=1)
    pids = tmp_path / "pids"
    pids.mkdir()
    plain, aware = Recorder(), Recorder()
    launch_per_agent(plain, pids, per_agent=1)
    r1 = drivers(plain, FrameworkInfo(name="plain"), cluster.master_address)
    await r1.registered()
    await wait_for(lambda: "TASK_RUNNING" in plain.states("t1-0"), 20, "plain task running")
    aware_pids = tmp_path / "aware"
    aware_pids.mkdir()
    launch_per_agent(aware, aware_pids, per_agent=1)
    r2 = drivers(aware, FrameworkInfo(name="aware", capabilities=["PARTITION_AWARE"]),
                 cluster.master_address)
    await r2.registered()
    await wait_for(lambda: "TASK_RUNNING" in aware.states("t1-0"), 20, "aware task running")
    (plain_pid,) = (await written_pids(pids, 1))["t1-0"]
    (aware_pid,) = (await written_pids(aware_pids, 1))["t1-0"]

    agent = cluster.agent_children[0].process
    agent.send_signal(signal.SIGSTOP)  # a partition: the agent stops answering pings
    try:
        await wait_for(lambda: "TASK_LOST" in plain.states("t1-0"), 20, "TASK_LOST")
        await wait_for(lambda: "TASK_UNREACHABLE" in aware.states("t1-0"), 20,
                       "TASK_UNREACHABLE")
        assert cluster.state()["unreachable_agents"]
    finally:
        agent.send_signal(signal.SIGCONT)

    # Back: the non-partition-aware task was reported lost, so it is killed (no
    # duplicate); the partition-aware framework learns the task runs after all.
    await wait_for(lambda: not alive(plain_pid), 20, "the lost task to be killed")
    await wait_for(lambda: aware.states("t1-0")[-1] == "TASK_RUNNING", 20,
                   "TASK_RUNNING again")
    assert alive(aware_pid)
    assert cluster.state()["unreachable_agents"] == []
    assert launched_pids(aware_pids) == {"t1-0": [aware_pid]}


async def test_standalone_master_keeps_its_registry_in_the_work_dir(tmp_path: Path) -> None:
    def master() -> MasterServer:
        return MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                            work_dir=tmp_path, config=MasterConfig(allocation_interval=0.05))

    server = master()
    await server.start()
    agent = Dealer()
    try:
        with pytest.raises(RegistryError, match="in use by another master"):
            await master().start()
        agent.connect(server.info.zmq_endpoint)
        await agent.send(RegisterAgent(agent=AgentInfo(
            hostname="a1", port=5051, resources=Resources.parse("cpus:1;mem:64"))))

        async def registered() -> Any:
            inbound = await asyncio.wait_for(agent.recv(), 5)
            return inbound.message if isinstance(inbound.message, AgentRegistered) else None
        agent_id = (await wait_for(registered, 10, "registration")).agent_id
        registry = tmp_path / "registry.json"
        await wait_for(lambda: registry.exists() and agent_id in registry.read_text(), 5,
                       "the registry write")
    finally:
        agent.close()
        await server.stop()
    again = master()
    await again.start()
    try:
        assert again.snapshot()["recovering_agents"] == [{"id": agent_id, "hostname": "a1"}]
        assert again.metrics()["master/agents_recovering"] == 1
    finally:
        await again.stop()


def _master_info(name: str, port: int) -> MasterInfo:
    return MasterInfo(id=name, hostname="h", ip="127.0.0.1", port=port, zmq_port=port + 1,
                      version="test", address=Address(hostname="h", ip="127.0.0.1", port=port))


async def test_detector_follows_leader_and_registry_fences_the_deposed(
        zookeeper: ZooKeeperServer) -> None:
    first = ZkSession(zookeeper.hosts, SESSION_TIMEOUT)
    second = ZkSession(zookeeper.hosts, SESSION_TIMEOUT)
    detector = ZooKeeperDetector(zookeeper.url("/fence"))
    try:
        await first.start()
        await second.start()
        first_path = await create_contender(first, "/fence", _master_info("first", 1000))
        second_path = await create_contender(second, "/fence", _master_info("second", 2000))
        assert (await asyncio.wait_for(detector.detect(), 10)).id == "first"

        # The first leader takes over the registry and writes to it.
        old = ZooKeeperRegistry(first, "/fence-registry", first_path)
        assert await old.recover() == RegistryData()
        agent = _agent("S1")
        await old.store(RegistryData(agents=[agent]))

        # It is deposed (here: it stalls while the second takes over).
        new = ZooKeeperRegistry(second, "/fence-registry", second_path)
        assert (await new.recover()).agents == [agent]
        with pytest.raises(RegistryFenced):
            await old.store(RegistryData())
        await new.store(RegistryData(agents=[agent, _agent("S2")]))

        # Its session ends: the detector moves to the second master, and even a
        # write at the right version fails without the writer's contender znode.
        following = asyncio.ensure_future(detector.next_leader(_master_info("first", 1000)))
        await first.close()
        assert (await asyncio.wait_for(following, 10)).id == "second"
        data, version = await second.get("/fence-registry")
        orphan = ZooKeeperRegistry(second, "/fence-registry", first_path)
        orphan._version = version
        with pytest.raises(RegistryFenced):
            await orphan.store(RegistryData())
    finally:
        await detector.close()
        await second.close()
        await first.close()


def _agent(agent_id: str) -> AgentInfo:
    return AgentInfo(hostname=agent_id, port=5051, id=agent_id,
                     resources=Resources.parse("cpus:1;mem:64"))
