"""Resident apps in the service framework (frameworks/service/resident.py): an
instance reserves, creates its volume and launches on it in one accept, and comes
back only on the agent holding its volume."""

from __future__ import annotations

import pytest

from dyad.messages import Offer, OperationType, TaskState
from dyad.resources import Resources
from dyad.volumes import PersistentVolume
from frameworks.effects import AcceptOffer, DeclineOffers, LaunchTasks
from frameworks.service.appdef import AppInvalid, app_to_json, parse_app
from frameworks.service.core import OffersReceived, PutApp, ServiceConfig
from frameworks.service.testing import ServiceSim

APP = {"id": "/db", "cmd": "echo hi >> data/log; sleep 1000", "cpus": 0.5, "mem": 64,
       "instances": 1,
       "container": {"volumes": [{"containerPath": "data", "mode": "RW",
                                  "persistent": {"size": 64}}]},
       "residency": {"taskLostBehavior": "WAIT_FOREVER"}}


def sim() -> ServiceSim:
    s = ServiceSim(agents=2, config=ServiceConfig(role="db", principal="svc"))
    s.register()
    s.command(PutApp(parse_app(APP)))
    return s


def back(s: ServiceSim, index: int, volume: PersistentVolume) -> Offer:
    """An offer of agent `index` carrying the app's reservation and idle volume."""
    offer = s.offer(index)
    reserved = Resources.parse("cpus(db):0.5;mem(db):64") + volume.resources
    unreserved = offer.resources - Resources.parse("cpus:0.5;mem:64;disk:64")
    return Offer(id=offer.id, framework_id=offer.framework_id, agent_id=offer.agent_id,
                 hostname=offer.hostname, resources=unreserved + reserved,
                 attributes=offer.attributes, url=offer.url, volumes=[volume])


def test_the_first_launch_reserves_creates_and_launches_in_one_accept() -> None:
    s = sim()
    s.offer_all()
    (accept,) = [e for e in s.last if isinstance(e, AcceptOffer)]
    reserve, create, launch = accept.operations
    assert reserve.type == OperationType.RESERVE
    assert reserve.resources == Resources.parse("cpus(db):0.5;mem(db):64;disk(db):64")
    assert create.type == OperationType.CREATE
    assert create.volumes == [PersistentVolume(id="db.0", container_path="data", size=64,
                                               role="db", principal="svc")]
    (task,) = launch.tasks
    assert task.resources == Resources.parse("cpus(db):0.5;mem(db):64;disk(db){db.0}:64")
    assert task.container is None  # a process task: the agent links the volume
    assert s.core.tasks[task.task_id].volume == "db.0"
    assert s.core.residents == {"db.0": task.agent_id}


def test_a_lost_instance_comes_back_only_where_its_volume_is() -> None:
    s = sim()
    s.offer_all()
    (accept,) = [e for e in s.last if isinstance(e, AcceptOffer)]
    (first,) = accept.operations[2].tasks
    volume = accept.operations[1].volumes[0]
    s.update(first.task_id, TaskState.TASK_RUNNING)
    s.update(first.task_id, TaskState.TASK_FAILED)
    s.advance(60)
    # Agents without its volume: declined, no second volume made.
    home = int(first.agent_id.removeprefix("agent-"))
    s.step(OffersReceived((s.offer(1 - home),)))
    assert not [e for e in s.last if isinstance(e, AcceptOffer | LaunchTasks)]
    assert [e for e in s.last if isinstance(e, DeclineOffers)]
    # Its agent offers the volume back: the next task uses it, with no new operations.
    s.step(OffersReceived((back(s, home, volume),)))
    (launch,) = [e for e in s.last if isinstance(e, LaunchTasks)]
    (again,) = launch.tasks
    assert again.agent_id == first.agent_id
    assert again.resources.volumes() == {"db.0": ("db", 64000)}


def test_residents_are_known_again_from_the_tasks_after_a_restart() -> None:
    s = sim()
    s.offer_all()
    restarted = ServiceSim(agents=2, config=ServiceConfig(role="db"), snapshot=s.snapshot())
    assert restarted.core.residents == s.core.residents


def test_without_a_role_a_resident_app_says_why_it_waits() -> None:
    s = ServiceSim(agents=1)
    s.register()
    s.command(PutApp(parse_app(APP)))
    s.offer_all()
    assert not [e for e in s.last if isinstance(e, AcceptOffer | LaunchTasks)]
    assert "--role" in s.core.runtime("/db").unplaced_example


def test_the_definition_round_trips_and_bad_ones_are_refused() -> None:
    app = parse_app(APP)
    assert parse_app(app_to_json(app)) == app
    assert app.persistent is not None and app.persistent.size == 64
    implied = parse_app({k: v for k, v in APP.items() if k != "residency"})
    assert implied.residency is not None
    with pytest.raises(AppInvalid, match="one persistent volume"):
        parse_app({**APP, "container": {"volumes": [
            {"containerPath": "a", "persistent": {"size": 1}},
            {"containerPath": "b", "persistent": {"size": 1}}]}})
    with pytest.raises(AppInvalid, match="relative path"):
        parse_app({**APP, "container": {"volumes": [
            {"containerPath": "/abs", "persistent": {"size": 1}}]}})
    with pytest.raises(AppInvalid, match="residency needs"):
        parse_app({**APP, "container": None})
