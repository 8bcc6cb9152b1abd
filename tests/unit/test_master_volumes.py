"""The master core's offer operations on reserved disk (CREATE, DESTROY), and
dynamic reservations and volumes surviving a failover through the registry and
through the agents' reports (master/volumes.py, master/registry.py)."""

from __future__ import annotations

import pytest

from dyad.effects import ArmTimer
from dyad.messages import (
    Accept,
    AgentInfo,
    AgentRegistered,
    CheckpointResources,
    Decline,
    Filters,
    FrameworkInfo,
    Offer,
    Operation,
    RegisterAgent,
    Rejected,
    Revive,
    RunTask,
    StatusUpdate,
    Task,
    TaskState,
    Update,
)
from dyad.resources import Resources
from dyad.volumes import DynamicResources, PersistentVolume
from master.model import MasterConfig
from master.registry import RegistryData, decode, encode, snapshot_of
from master.restore import restore
from tests.unit.test_master_state import AGENT_RES, Harness, messages, status, task

VOLUME = PersistentVolume(id="v1", container_path="data", size=64, role="eng")


@pytest.fixture
def h() -> Harness:
    return Harness()


def accept(fid: str, offer: Offer, *ops: Operation) -> Accept:
    return Accept(framework_id=fid, offer_ids=[offer.id], operations=list(ops),
                  filters=Filters(refuse_seconds=0))


def op(kind: str, text: str = "", *volumes: PersistentVolume, tasks: list | None = None) -> Operation:
    return Operation(type=kind, resources=Resources.parse(text), volumes=list(volumes),
                     tasks=tasks or [])


def offer_to(h: Harness, peer: str = "f1") -> Offer:
    (offer,) = h.offers_to(h.allocate(), peer)
    return offer


def decline(h: Harness, fid: str, offer: Offer) -> None:
    h.recv("f1", Decline(framework_id=fid, offer_ids=[offer.id], filters=Filters(refuse_seconds=0)))


def with_volume(h: Harness) -> tuple[str, str, Offer]:
    """A framework in role eng that reserved 100 MB of disk and made volume v1
    (64 MB) of it; returns its id, the agent's and the next offer."""
    fid = h.subscribe("f1", roles=["eng"], principal="alice")
    aid = h.register("a1")
    first = offer_to(h)
    sends = h.recv("f1", accept(fid, first, op("RESERVE", "disk(eng):100"),
                                op("CREATE", "", VOLUME)))
    assert not messages(sends, Rejected), messages(sends, Rejected)
    return fid, aid, offer_to(h)


def failover(h: Harness) -> Harness:
    """A new leader restored from what `h` left in the registry."""
    new = Harness(MasterConfig(agent_reregister_timeout=60.0))
    data = decode(encode(snapshot_of(h.state)))
    for effect in restore(new.state, data, new.clock.now()):
        assert isinstance(effect, ArmTimer)
        new.timers[effect.key] = effect.at
    return new


def reregister(h: Harness, aid: str, dynamic: DynamicResources | None = None,
               tasks: tuple[Task, ...] = (), frameworks: tuple[FrameworkInfo, ...] = ()) -> list:
    return h.recv("a1", RegisterAgent(
        agent=AgentInfo(id=aid, hostname="h", port=5051, resources=Resources.parse(AGENT_RES)),
        dynamic=dynamic, tasks=list(tasks), frameworks=list(frameworks)))


def told(h: Harness) -> DynamicResources:
    """What the master last told agent a1 its reservations and volumes are."""
    return [s.message.resources for s in h.log if isinstance(s.message, CheckpointResources)][-1]


# ------------------------------------------------------------------ CREATE, DESTROY


def test_a_created_volume_is_offered_back_to_its_role_with_its_metadata(h: Harness) -> None:
    fid, _aid, offer = with_volume(h)
    assert offer.resources.reserved("eng") == Resources.parse("disk(eng):36;disk(eng){v1}:64")
    (volume,) = offer.volumes
    assert volume == PersistentVolume(id="v1", container_path="data", size=64, role="eng",
                                      principal="alice")
    assert told(h).volumes == [volume] and told(h).version == 2
    assert h.metric("master/operations_create") == 1
    assert h.state.snapshot()["agents"][0]["volumes"][0]["id"] == "v1"
    # Another role never sees it.
    other = h.subscribe("f2", "ops", roles=["ops"])
    decline(h, fid, offer)
    h.recv("f1", Accept(framework_id=fid, offer_ids=[], operations=[]))  # no-op, refused
    theirs = [o for o in h.offers_to(h.allocate(), "f2")]
    assert theirs and all(not o.volumes and not o.resources.reserved("eng") for o in theirs)
    assert other


def test_a_volume_outlives_its_task_and_is_not_offered_while_in_use(h: Harness) -> None:
    fid, aid, offer = with_volume(h)
    t1 = task("t1", aid, "cpus:1;mem:128;disk(eng){v1}:64")
    sends = h.recv("f1", accept(fid, offer, op("LAUNCH", tasks=[t1])))
    (run,) = messages(sends, RunTask)
    assert run.task.resources.volumes() == {"v1": ("eng", 64000)}
    h.recv("f1", Revive(framework_id=fid))
    during = offer_to(h)
    assert not during.volumes and not during.resources.volumes()
    # DESTROY while the task uses it: refused, saying who uses it.
    sends = h.recv("f1", accept(fid, during, op("DESTROY", "", VOLUME)))
    (refused,) = messages(sends, Rejected)
    assert "in use by task(s) t1" in refused.reason
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_FINISHED)))
    after = offer_to(h)
    assert [v.id for v in after.volumes] == ["v1"]
    sends = h.recv("f1", accept(fid, after, op("DESTROY", "", VOLUME)))
    assert not messages(sends, Rejected)
    assert told(h).volumes == [] and told(h).reservations == Resources.parse("disk(eng):100")
    assert h.metric("master/operations_destroy") == 1
    assert offer_to(h).resources.reserved("eng") == Resources.parse("disk(eng):100")


def test_statically_reserved_disk_cannot_hold_a_volume(h: Harness) -> None:
    fid = h.subscribe("f1", roles=["eng"])
    h.register("a1", AGENT_RES + ";disk(eng):100")
    sends = h.recv("f1", accept(fid, offer_to(h), op("CREATE", "", VOLUME)))
    assert "not dynamically reserved" in messages(sends, Rejected)[0].reason


@pytest.mark.parametrize("volume,reserve,reason", [
    (VOLUME, "", "not in what remains"),
    (PersistentVolume(id="v1", container_path="d", size=64, role="ops"), "disk(eng):64",
     "cannot use"),
    (PersistentVolume(id="v1", container_path="d", size=64, role="eng", principal="bob"),
     "disk(eng):64", "principal"),
    (PersistentVolume(id="v1", container_path="d", size=999, role="eng"), "disk(eng):64",
     "not in what remains"),
])
def test_bad_creates_are_refused_and_change_nothing(h: Harness, volume: PersistentVolume,
                                                    reserve: str, reason: str) -> None:
    fid = h.subscribe("f1", roles=["eng"], principal="alice")
    h.register("a1")
    offer = offer_to(h)
    ops = [op("RESERVE", reserve)] if reserve else []
    sends = h.recv("f1", accept(fid, offer, *ops, op("CREATE", "", volume)))
    (refused,) = messages(sends, Rejected)
    assert reason in refused.reason
    assert h.state.agents[h.state.agent_by_peer["a1"]].dynamic.volumes == []


def test_create_of_an_existing_id_and_destroy_of_an_unknown_one_are_refused(h: Harness) -> None:
    fid, _aid, offer = with_volume(h)
    again = PersistentVolume(id="v1", container_path="other", size=10, role="eng")
    sends = h.recv("f1", accept(fid, offer, op("CREATE", "", again)))
    assert "already exists" in messages(sends, Rejected)[0].reason
    h.recv("f1", Revive(framework_id=fid))
    sends = h.recv("f1", accept(fid, offer_to(h), op(
        "DESTROY", "", PersistentVolume(id="nope", container_path="x", size=1, role="eng"))))
    assert "does not exist" in messages(sends, Rejected)[0].reason


def test_reserve_and_unreserve_do_not_touch_a_volume(h: Harness) -> None:
    fid, _aid, offer = with_volume(h)
    sends = h.recv("f1", accept(fid, offer, op("UNRESERVE", "disk(eng){v1}:64")))
    assert "DESTROY" in messages(sends, Rejected)[0].reason


@pytest.mark.parametrize("resources,reason", [
    ("cpus:1;mem:128;disk(eng){v1}:32", "used whole"),
    ("cpus:1;mem:128;disk(eng){v9}:64", "does not exist"),
])
def test_a_task_uses_a_volume_whole_and_only_an_existing_one(h: Harness, resources: str,
                                                             reason: str) -> None:
    fid, aid, offer = with_volume(h)
    sends = h.recv("f1", accept(fid, offer, op("LAUNCH", tasks=[task("t1", aid, resources)])))
    (update,) = messages(sends, Update)
    assert update.status.state == TaskState.TASK_ERROR and reason in update.status.message


def test_plain_reserved_disk_never_takes_a_volumes_disk(h: Harness) -> None:
    fid, aid, offer = with_volume(h)
    sends = h.recv("f1", accept(fid, offer, op("LAUNCH", tasks=[
        task("t1", aid, "cpus:1;mem:128;disk(eng):64")])))
    (update,) = messages(sends, Update)
    assert update.status.state == TaskState.TASK_ERROR


# ------------------------------------------------------------- failover, re-registration


def test_after_failover_the_registry_gives_the_same_offers(h: Harness) -> None:
    fid, aid, before = with_volume(h)
    new = failover(h)
    new.subscribe("f1", roles=["eng"], principal="alice", id=fid)
    # An agent that reports nothing (it lost its checkpoint's copy, say) is told.
    sends = reregister(new, aid)
    assert messages(sends, AgentRegistered)
    (sent,) = messages(sends, CheckpointResources)
    assert sent.resources == told(h)
    after = offer_to(new)
    assert (after.resources, after.volumes) == (before.resources, before.volumes)


def test_after_failover_an_agents_report_alone_restores_them(h: Harness) -> None:
    fid, aid, before = with_volume(h)
    empty = Harness()  # a master whose registry is gone
    empty.subscribe("f1", roles=["eng"], principal="alice", id=fid)
    sends = reregister(empty, aid, dynamic=told(h))
    assert messages(sends, AgentRegistered) and not messages(sends, CheckpointResources)
    assert empty.persisted  # the registry learns them from the agent
    after = offer_to(empty)
    assert (after.resources, after.volumes) == (before.resources, before.volumes)


def test_the_newer_record_wins(h: Harness) -> None:
    _fid, aid, _ = with_volume(h)
    registry = told(h)  # version 2
    older = DynamicResources(version=1, reservations=Resources.parse("disk(eng):100"))
    new = failover(h)
    sends = reregister(new, aid, dynamic=older)
    assert messages(sends, CheckpointResources)[0].resources == registry
    # The agent's is newer (the registry missed the last write): the agent wins.
    newest = DynamicResources(version=3, reservations=Resources.parse("disk(eng):100"))
    other = failover(h)
    sends = reregister(other, aid, dynamic=newest)
    assert not messages(sends, CheckpointResources)
    assert other.state.agents[aid].dynamic == newest
    assert decode(encode(snapshot_of(other.state))).dynamic == {aid: newest}


def test_a_report_that_does_not_fit_the_agent_is_ignored(h: Harness) -> None:
    broken = DynamicResources(version=5, reservations=Resources.parse("disk(eng):999999"))
    sends = h.recv("a1", RegisterAgent(
        agent=AgentInfo(id="S9", hostname="h", port=5051, resources=Resources.parse(AGENT_RES)),
        dynamic=broken))
    assert messages(sends, AgentRegistered)
    assert h.state.agents["S9"].dynamic == DynamicResources()
    assert h.metric("master/agent_dynamic_reports_ignored") == 1


def test_a_task_on_a_volume_is_taken_back_after_failover(h: Harness) -> None:
    fid, aid, offer = with_volume(h)
    h.recv("f1", accept(fid, offer, op("LAUNCH", tasks=[
        task("t1", aid, "cpus:1;mem:128;disk(eng){v1}:64")])))
    new = failover(h)
    report = Task(task_id="t1", framework_id=fid, agent_id=aid, executor_id="t1", name="t1",
                  state=TaskState.TASK_RUNNING,
                  resources=Resources.parse("cpus:1;mem:128;disk(eng){v1}:64"))
    sends = reregister(new, aid, dynamic=told(h), tasks=(report,),
                       frameworks=(FrameworkInfo(name="fw", id=fid, roles=["eng"]),))
    assert messages(sends, AgentRegistered)
    new.subscribe("f1", roles=["eng"], principal="alice", id=fid)
    offer = offer_to(new)
    assert not offer.volumes
    sends = new.recv("f1", accept(fid, offer, op("DESTROY", "", VOLUME)))
    assert "in use by task(s) t1" in messages(sends, Rejected)[0].reason


def test_an_unreachable_agent_keeps_its_volumes_for_when_it_returns() -> None:
    h = Harness(MasterConfig(agent_ping_timeout=1.0, max_agent_ping_timeouts=1))
    fid, aid, before = with_volume(h)
    h.silent_agents.add(aid)
    h.advance(5.0)
    assert aid not in h.state.agents and aid in snapshot_of(h.state).dynamic
    h.silent_agents.clear()
    reregister(h, aid, dynamic=told(h))
    h.recv("f1", Revive(framework_id=fid))
    after = offer_to(h)
    assert (after.resources, after.volumes) == (before.resources, before.volumes)


def test_old_registries_without_dynamic_resources_still_load() -> None:
    assert decode(b'{"format":1,"agents":[]}') == RegistryData()
