"""A Marathon app in a Docker container on a real cluster (`dyad local`'s master
and agent processes, the agent with its Docker containerizer on a private engine):
it comes up healthy through its bridged port, and heals after its container is
killed behind the agent's back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dyad.local import LocalCluster
from tests.helpers import wait_for

from .conftest import FAST_MASTER
from .docker_engine import TEST_IMAGE, DockerEngine, docker_engine  # noqa: F401 (fixture)
from .test_service import HEALTH, answers_http, services, settled  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

WEB = {"id": "/web", "cmd": "exec httpd -f -p 8080 -h /www", "instances": 1,
       "cpus": 0.1, "mem": 32, "backoffSeconds": 0.5, "taskKillGracePeriodSeconds": 1,
       "healthChecks": [{**HEALTH, "gracePeriodSeconds": 10}],
       "container": {"type": "DOCKER", "docker": {
           "image": TEST_IMAGE, "network": "BRIDGE",
           "portMappings": [{"containerPort": 8080, "hostPort": 0}]}}}


@pytest.fixture
def cluster(docker_engine: DockerEngine, tmp_path: Path) -> Any:
    cluster = LocalCluster(work_dir=tmp_path / "cluster", agents=1,
                           resources="cpus:2;mem:1024;disk:1000", master_args=FAST_MASTER,
                           agent_args=["--containerizers", "process,docker",
                                       "--docker-socket", docker_engine.socket_path])
    cluster.start()
    yield cluster
    cluster.stop()


async def test_a_docker_app_is_healthy_through_its_mapped_port_and_heals(
        cluster: LocalCluster, services: Any, docker_engine: DockerEngine,
        tmp_path: Path) -> None:
    argv = ["--master", cluster.master_address, "--work-dir", str(tmp_path / "state")]
    service = await services("service", *argv).started()
    # It listens a moment before it leads (its state loads first).
    await wait_for(lambda: "dyad-service leading" in service.log_path.read_text(), 20,
                   "leadership")
    status, created = service.call("POST", "/v2/apps", WEB)
    assert status == 201, created
    await wait_for(settled(service, 1), 60, "a healthy task")
    (task,) = service.app()["tasks"]
    assert answers_http(task)  # the host port the offer gave, mapped to 8080 inside

    async with docker_engine.client() as client:
        (before,) = await client.list(labels={"dyad.task_id": task["id"]},
                                      include_stopped=False)
        await client.kill(before.id, "KILL")  # behind the agent's back

        def replaced() -> bool:
            tasks = service.app()["tasks"]
            return bool(tasks) and tasks[0]["id"] != task["id"] and settled(service, 1)()
        await wait_for(replaced, 60, "a replacement")
        (after,) = await client.list(labels={"dyad.task_id": service.app()["tasks"][0]["id"]},
                                     include_stopped=False)
        assert after.id != before.id
    assert service.app()["lastTaskFailure"]["taskId"] == task["id"]
    assert answers_http(service.app()["tasks"][0])
