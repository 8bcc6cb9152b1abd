"""What survives a failover: the registry's format and file store, the ZooKeeper
address rules, and the master core's recovery from a registry (recovering agents,
the re-registration timeout, unreachable agents coming back, the removal rate
limit), and a scheduler driver following a new leader. Pure: a fake clock, no
sockets; the master core runs in the shared `Harness` of test_master_state, which
validates after every step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
import pytest

from dyad.effects import ArmTimer, Send
from dyad.messages import (
    Accept, AgentInfo, AgentRegistered, CommandInfo, Failure, FrameworkInfo, KillTask,
    Offer, Offers, Operation, Reconcile, ReconcileTask, RegisterAgent, RunTask, Subscribe,
    Subscribed, Task, TaskInfo, TaskState, Update,
)
from dyad.resources import Resources
from dyad.zk import leader_child, parse_zk_url
from frameworks.driver_core import Callback, Received, Started
from frameworks.scheduler_core import MasterDetected, SchedulerCore
from frameworks.testing import make_master_info
from master.allocator import Quota
from master.registry import (
    FileRegistry, RegistryData, RegistryError, decode, encode, snapshot_of,
)
from master.restore import restore
from master.operator import SetQuota, SetWeights
from master.model import MasterConfig, UnreachableAgent

from .test_master_state import Harness, messages

RES = "cpus:4;mem:4096"


def agent_info(agent_id: str, hostname: str = "h") -> AgentInfo:
    return AgentInfo(hostname=hostname, port=5051, id=agent_id, resources=Resources.parse(RES),
                     attributes={"rack": "r1"}, ip="10.0.0.1")


# ---------------------------------------------------------------- format, files


def test_registry_document_round_trips_and_bad_ones_say_why() -> None:
    data = RegistryData(agents=[agent_info("S1"), agent_info("S2")],
                        unreachable=[UnreachableAgent(agent_info("S3"), 1234.5)])
    assert decode(encode(data)) == data
    for raw, reason in [(b"{", "not valid"), (b'{"format": 9}', "format 9"),
                        (b'{"agents": [{"hostname": 1}]}', r"agents\[0\]")]:
        with pytest.raises(RegistryError, match=reason):
            decode(raw)


async def test_file_registry_persists_atomically_and_locks(tmp_path: Path) -> None:
    first = FileRegistry(tmp_path)
    assert await first.recover() == RegistryData()
    data = RegistryData(agents=[agent_info("S1")])
    await first.store(data)
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(RegistryError, match="in use by another master"):
        await FileRegistry(tmp_path).recover()
    await first.close()
    second = FileRegistry(tmp_path)
    assert await second.recover() == data
    await second.close()
    (tmp_path / "registry.json").write_text("garbage")
    with pytest.raises(RegistryError, match="not valid"):
        await FileRegistry(tmp_path).recover()


def test_file_registry_store_needs_recover_first(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="before recover"):
        asyncio.run(FileRegistry(tmp_path).store(RegistryData()))


@pytest.mark.parametrize("url, hosts, root", [
    ("zk://127.0.0.1:2181/dyad", "127.0.0.1:2181", "/dyad"),
    ("zk://a:1,b:2,c/team/dyad/", "a:1,b:2,c", "/team/dyad"),
    ("zk://zk1:2181", "zk1:2181", "/dyad"),
])
def test_zk_urls(url: str, hosts: str, root: str) -> None:
    address = parse_zk_url(url)
    assert (address.hosts, address.root) == (hosts, root)
    assert address.registry_path == root + "-registry"


@pytest.mark.parametrize("url, reason", [
    ("127.0.0.1:2181/dyad", "must start with zk://"),
    ("zk:///dyad", "needs host:port"),
    ("zk://u:p@h:2181/dyad", "authentication"),
    ("zk://h:2181/", "cannot be /"),
    ("zk://h:2181/a//b", "invalid ZooKeeper path"),
])
def test_bad_zk_urls(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_zk_url(url)


def test_lowest_sequence_leads_and_other_children_are_ignored() -> None:
    assert leader_child(["json.info_0000000010", "json.info_0000000009", "info_0000000001",
                         "json.info_x", "log_replicas"]) == "json.info_0000000009"
    assert leader_child(["info_0000000001"]) is None


# ------------------------------------------------------------- master recovery


def harness(config: MasterConfig | None = None, agents: list[AgentInfo] = [],
            unreachable: list[UnreachableAgent] = []) -> Harness:
    """A master core (the shared test harness) that recovered from a registry."""
    h = Harness(config or MasterConfig(agent_reregister_timeout=60.0, offer_timeout=1e6))
    for effect in restore(h.state, RegistryData(agents=agents, unreachable=unreachable),
                          h.clock.now()):
        assert isinstance(effect, ArmTimer)
        h.timers[effect.key] = effect.at
    return h


def reregister(h: Harness, peer: str, agent_id: str, tasks: list[Task] = []) -> list[Send]:
    return h.recv(peer, RegisterAgent(agent=agent_info(agent_id), tasks=tasks))


def running(task_id: str, framework_id: str, agent_id: str) -> Task:
    return Task(task_id=task_id, framework_id=framework_id, agent_id=agent_id,
                executor_id=task_id, name=task_id, state=TaskState.TASK_RUNNING,
                resources=Resources.parse("cpus:1;mem:128"))


def offered(sends: list[Send], peer: str) -> list[Offer]:
    return [o for m in messages(sends, Offers, to=peer) for o in m.offers]


def test_registry_agents_are_recovering_until_they_reregister() -> None:
    h = harness(agents=[agent_info("S1"), agent_info("S2")])
    fid = h.subscribe("fw")
    assert h.metric("master/agents_recovering") == 2
    assert not messages(h.advance(5.0), Offers)  # nothing of theirs is offered
    # Explicit reconciliation waits for them rather than calling tasks lost.
    assert not messages(h.recv("fw", Reconcile(framework_id=fid, tasks=[
        ReconcileTask(task_id="t1", agent_id="S1"), ReconcileTask(task_id="t9")])), Update)

    changes = h.persisted
    sends = reregister(h, "a1", "S1", tasks=[running("t1", fid, "S1")])
    assert messages(sends, AgentRegistered)[0].agent_id == "S1"
    assert h.persisted == changes  # the registry already says so
    (offer,) = offered(h.advance(1.0), "fw")
    assert (offer.agent_id, offer.resources) == ("S1", Resources.parse("cpus:3;mem:3968"))
    assert {t["id"] for t in h.state.snapshot()["frameworks"][0]["tasks"]} == {"t1"}
    assert [a.id for a in h.state.admitted_agents()] == ["S1", "S2"]
    assert h.state.snapshot()["recovering_agents"] == [{"id": "S2", "hostname": "h"}]
    h.recv("a9", RegisterAgent(agent=attrs.evolve(agent_info("S9"), id=None)))
    assert h.persisted > changes  # a new admission must be written


def test_agents_not_back_by_the_timeout_become_unreachable() -> None:
    h = harness(agents=[agent_info("S1"), agent_info("S2")])
    h.subscribe("fw")
    reregister(h, "a1", "S1")
    assert messages(h.advance(60.0), Failure, to="fw") == [Failure(agent_id="S2")]
    assert h.metric("master/agents_recovering") == 0
    assert h.metric("master/agents_unreachable") == 1
    assert [a.id for a in h.state.admitted_agents()] == ["S1"]
    assert [u.info.id for u in h.state.unreachable_agents()] == ["S2"]


def test_unreachable_agent_returning_to_a_new_leader_is_reconciled() -> None:
    """The old leader marked S1 unreachable and told frameworks its tasks were lost
    (or unreachable); the new leader only knows that from the registry."""
    h = harness(unreachable=[UnreachableAgent(agent_info("S1"), 900.0)])
    plain = h.subscribe("plain")
    aware = h.subscribe("aware", capabilities=["PARTITION_AWARE"])
    # Reconciliation for its tasks answers from the unreachable list.
    (answer,) = messages(h.recv("aware", Reconcile(framework_id=aware, tasks=[
        ReconcileTask(task_id="a", agent_id="S1")])), Update)
    assert answer.status.state is TaskState.TASK_UNREACHABLE
    (answer,) = messages(h.recv("plain", Reconcile(framework_id=plain, tasks=[
        ReconcileTask(task_id="p", agent_id="S1")])), Update)
    assert answer.status.state is TaskState.TASK_LOST

    sends = h.recv("a1", RegisterAgent(
        agent=agent_info("S1"), tasks=[running("p", plain, "S1"), running("a", aware, "S1")],
        frameworks=[FrameworkInfo(name="plain", id=plain),
                    FrameworkInfo(name="aware", id=aware, capabilities=["PARTITION_AWARE"])]))
    assert messages(sends, KillTask, to="a1") == [KillTask(framework_id=plain, task_id="p")]
    (update,) = messages(sends, Update, to="aware")
    assert (update.status.task_id, update.status.state) == ("a", TaskState.TASK_RUNNING)
    assert not messages(sends, Update, to="plain")
    assert h.state.unreachable_agents() == []


def test_removals_are_rate_limited_and_a_pong_cancels_one() -> None:
    h = harness(MasterConfig(agent_ping_timeout=1.0, max_agent_ping_timeouts=2,
                             agent_removal_rate=(1, 10.0), offer_timeout=1e6))
    h.subscribe("fw")
    for n in (1, 2, 3):
        reregister(h, f"a{n}", f"S{n}")
    h.silent_agents |= {"S1", "S2", "S3"}
    lost_at: dict[str, float] = {}

    def run(seconds: float) -> None:
        for _ in range(int(seconds / 0.5)):
            for failure in messages(h.advance(0.5), Failure, to="fw"):
                lost_at[failure.agent_id] = h.clock.now()

    run(3.0)
    assert list(lost_at) == ["S1"]  # the first goes at once; the others wait
    assert h.metric("master/agent_removals_deferred") == 2
    h.silent_agents.discard("S3")  # S3 answers again while it waits for a permit
    run(20.0)
    assert list(lost_at) == ["S1", "S2"]
    assert lost_at["S2"] - lost_at["S1"] == pytest.approx(10.0, abs=1.0)
    assert h.metric("master/agent_removals_cancelled") == 1
    assert h.metric("master/agents_active") == 1


def test_the_reregister_timeout_spends_removal_permits_too() -> None:
    h = harness(MasterConfig(agent_reregister_timeout=30.0, agent_removal_rate=(1, 5.0),
                             offer_timeout=1e6), agents=[agent_info(f"S{n}") for n in range(3)])
    h.advance(30.0)
    assert h.metric("master/agents_unreachable") == 1
    h.advance(10.0)
    assert h.metric("master/agents_unreachable") == 3
    assert h.metric("master/recovery_agents_unreachable") == 3


def test_weights_and_quota_survive_through_the_registry() -> None:
    h = harness()
    h.call(SetWeights({"eng": 2.0}))
    h.call(SetQuota({"eng": Quota(guarantee={"cpus": 1000}, limit={"cpus": 4000})}))
    old = h.state
    data = decode(encode(snapshot_of(old)))
    new = Harness().state
    restore(new, data, 0.0)
    assert (new.weights, new.quota) == ({"eng": 2.0}, old.quota)
    with pytest.raises(RegistryError, match="weights or quota"):
        restore(Harness().state, attrs.evolve(data, weights={"eng": -1.0}), 0.0)


def test_accepting_on_a_recovered_agent_works_like_any_other() -> None:
    h = harness(agents=[agent_info("S1")])
    fid = h.subscribe("fw")
    reregister(h, "a1", "S1")
    (offer,) = offered(h.advance(1.0), "fw")
    task = TaskInfo(task_id="new", name="new", agent_id="S1",
                    resources=Resources.parse("cpus:1;mem:64"), command=CommandInfo(shell="true"))
    sends = h.recv("fw", Accept(framework_id=fid, offer_ids=[offer.id],
                                operations=[Operation(type="LAUNCH", tasks=[task])]))
    assert [s.to for s in sends if isinstance(s.message, RunTask)] == ["a1"]


# ------------------------------------------------------ following a new leader


def test_a_subscribed_driver_moves_to_a_new_leader_at_once() -> None:
    old = attrs.evolve(make_master_info(port=5050), id="old-leader")
    new = attrs.evolve(make_master_info(port=6060), id="new-leader")
    core = SchedulerCore(FrameworkInfo(name="f"))
    core.handle(Started(), 0.0)
    core.handle(MasterDetected(old), 0.0)
    core.handle(Received(Subscribed(framework_id="F1", heartbeat_interval=1.0,
                                    master_info=old)), 0.1)
    assert core.handle(MasterDetected(old), 0.2) == []  # the same leader again: nothing to do
    effects = core.handle(MasterDetected(new), 0.3)
    assert [e.name for e in effects if isinstance(e, Callback)] == ["disconnected"]
    (subscribe,) = [e.message for e in effects if isinstance(e, Send)]
    assert isinstance(subscribe, Subscribe) and subscribe.framework.id == "F1"
    effects = core.handle(Received(Subscribed(framework_id="F1", heartbeat_interval=1.0,
                                              master_info=new, reregistered=True)), 0.4)
    assert [e.name for e in effects if isinstance(e, Callback)] == ["reregistered"]
