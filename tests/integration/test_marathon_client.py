"""The `marathon` Python client (0.13, which refuses keys Marathon does not have)
against a real `dyad-service` on a real cluster: every answer it reads must
parse into its models and say what Marathon would."""

from __future__ import annotations

import collections
import collections.abc
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import compat_client

compat_client("marathon")
from marathon import MarathonApp, MarathonClient  # noqa: E402
from marathon.exceptions import MarathonHttpError, NotFoundError  # noqa: E402

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

    app = marathon_client.create_app("/sleepy", MarathonApp(
        cmd="sleep 300", cpus=0.1, mem=32, instances=2, ports=[0], backoff_seconds=0.5))
    assert app.id == "/sleepy" and app.instances == 2
    marathon_client.list_deployments()
    marathon_client.list_queue()
    await wait_for(lambda: len(running(marathon_client, "/sleepy")) == 2, 60, "2 tasks")

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

    with pytest.raises(NotFoundError):
        marathon_client.get_app("/nothing")
    with pytest.raises(MarathonHttpError) as invalid:
        marathon_client.create_app("/broken", MarathonApp(cmd="true", cpus=-1))
    assert invalid.value.status_code == 422

    assert "deploymentId" in marathon_client.delete_app("/sleepy", force=True)
    await wait_for(lambda: not marathon_client.list_apps(), 60, "the app gone")
