"""The `marathon` Python client (0.13, which refuses keys Marathon does not have)
against a real `dyad-service` on a real cluster: every answer it reads must
parse into its models and say what Marathon would."""

from __future__ import annotations

import collections
import collections.abc
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import compat_client

compat_client("marathon")
from marathon import MarathonApp, MarathonClient  # noqa: E402
from marathon.exceptions import MarathonHttpError, NotFoundError  # noqa: E402
from marathon.models.events import (  # noqa: E402
    MarathonApiPostEvent, MarathonDeploymentInfo, MarathonDeploymentSuccess,
    MarathonEventStreamAttached, MarathonStatusUpdateEvent)

from .conftest import wait_for
from .test_service import services  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    # marathon 0.13's JSON encoders look for `collections.Iterable`, which
    # Python 3.10 removed: the one patch it needs.
    monkeypatch.setattr(collections, "Iterable", collections.abc.Iterable, raising=False)

    def make(url: str) -> MarathonClient:
        return MarathonClient(url, timeout=10)
    return make


def follow(client: MarathonClient) -> list[Any]:
    """Follow `/v2/events` with the client's own `event_stream()` (it blocks, so
    on a thread of its own) until the service stops: every event it parsed, and
    what it raised, if it did."""
    events: list[Any] = []

    def read() -> None:
        try:
            for event in client.event_stream():
                events.append(event)
        except Exception as exc:  # shown by the test's assertions
            events.append(exc)
    threading.Thread(target=read, daemon=True).start()
    return events


def running(client: MarathonClient, app_id: str) -> list[Any]:
    return [t for t in client.list_tasks(app_id) if t.state == "TASK_RUNNING"]


async def test_the_marathon_client_drives_dyad_service(make_cluster: Any, services: Any,
                                                       client: Any, tmp_path: Path) -> None:
    cluster = make_cluster(agents=2)
    service = await services("svc", "--master", cluster.master_address,
                             "--work-dir", str(tmp_path / "state")).started()
    marathon_client = client(service.url)
    assert marathon_client.ping()
    info = marathon_client.get_info()
    assert info.name == "dyad-service" and info.elected
    assert info.marathon_config.master and info.http_config.http_port
    events = follow(client(service.url))
    await wait_for(lambda: any(isinstance(e, MarathonEventStreamAttached) for e in events),
                   30, "the event stream")

    app = marathon_client.create_app("/sleepy", MarathonApp(
        cmd="sleep 300", cpus=0.1, mem=32, instances=2, ports=[0], backoff_seconds=0.5))
    assert app.id == "/sleepy" and app.instances == 2
    marathon_client.list_deployments()
    marathon_client.list_queue()
    await wait_for(lambda: len(running(marathon_client, "/sleepy")) == 2, 60, "2 tasks")
    # A follower of /v2/events saw the app posted, deployed and its tasks run.
    (posted, *_) = [e for e in events if isinstance(e, MarathonApiPostEvent)]
    assert posted.app_definition["id"] == "/sleepy" and posted.uri == "/v2/apps/sleepy"
    (deploying, *_) = [e for e in events if isinstance(e, MarathonDeploymentInfo)]
    assert deploying.plan.steps[0].actions[0].app == "/sleepy"
    await wait_for(lambda: any(isinstance(e, MarathonDeploymentSuccess)
                               and e.id == deploying.plan.id for e in events), 30,
                   "the deployment's success")
    updates = [e for e in events if isinstance(e, MarathonStatusUpdateEvent)]
    assert {e.task_status for e in updates} >= {"TASK_RUNNING"}
    assert {e.app_id for e in updates} == {"/sleepy"} and all(e.task_id for e in updates)

    (listed,) = marathon_client.list_apps(embed_tasks=True)
    assert listed.id == "/sleepy" and listed.tasks_running == 2 and len(listed.tasks) == 2
    shown = marathon_client.get_app("/sleepy", embed_tasks=True)
    assert {t.host for t in shown.tasks} <= {"127.0.0.2", "127.0.0.3"}
    (task, other) = marathon_client.list_tasks("/sleepy")
    assert task.app_id == "/sleepy" and task.ports and task.slave_id
    assert {t.id for t in marathon_client.list_tasks()} == {task.id, other.id}

    marathon_client.scale_app("/sleepy", instances=1)
    await wait_for(lambda: len(running(marathon_client, "/sleepy")) == 1, 60, "1 task")
    (survivor,) = running(marathon_client, "/sleepy")
    killed = marathon_client.kill_task("/sleepy", survivor.id)
    assert killed.id == survivor.id
    await wait_for(lambda: [t.id for t in running(marathon_client, "/sleepy")
                            if t.id != survivor.id], 60, "a replacement")
    (replacement,) = running(marathon_client, "/sleepy")
    assert marathon_client.kill_given_tasks([replacement.id])
    await wait_for(lambda: [t.id for t in running(marathon_client, "/sleepy")
                            if t.id != replacement.id], 60, "another replacement")
    assert "deploymentId" in marathon_client.restart_app("/sleepy")

    # Versions: newest first, each definition as it was.
    versions = marathon_client.list_versions("/sleepy")
    assert len(versions) >= 3 and versions == sorted(versions, reverse=True)
    first = marathon_client.get_version("/sleepy", versions[-1])
    assert first.instances == 2 and first.cmd == "sleep 300"
    assert marathon_client.get_version("/sleepy", versions[0]).instances == 1
    # Groups: the folders of app ids.
    marathon_client.create_app("/tools/idle", MarathonApp(cmd="sleep 300", cpus=0.1, mem=32,
                                                          instances=0))
    (tools,) = marathon_client.list_groups()
    assert tools.id == "/tools" and [a.id for a in tools.apps] == ["/tools/idle"]
    assert [a.id for a in marathon_client.get_group("/tools").apps] == ["/tools/idle"]
    assert marathon_client.delete_app("/tools/idle", force=True)

    with pytest.raises(NotFoundError):
        marathon_client.get_app("/nothing")
    with pytest.raises(MarathonHttpError) as invalid:
        marathon_client.create_app("/broken", MarathonApp(cmd="true", cpus=-1))
    assert invalid.value.status_code == 422

    assert "deploymentId" in marathon_client.delete_app("/sleepy", force=True)
    await wait_for(lambda: not marathon_client.list_apps(), 60, "the app gone")
    assert not [e for e in events if isinstance(e, Exception)]
