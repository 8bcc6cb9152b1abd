"""Marathon's event bus (`GET /v2/events`), groups and app versions, against the
real API on loopback with a real core and a fake driver (the fixture of
test_service_api.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from dyad.messages import TaskState, TaskStatus
from frameworks.service.appdef import parse_app
from frameworks.service.core import (
    CancelDeployment, PutApp, ServiceConfig, ServiceCore, StatusReceived)
from frameworks.service.marathon_events import MarathonEvents
from tests.unit.test_service_api import WEB, Client, client  # noqa: F401 (the fixture)

SMALL = {"id": "/web", "cmd": "sleep 100", "instances": 1, "cpus": 0.1, "mem": 32}


class Follower:
    """Reads `/v2/events` as a Marathon follower does: `data:` lines."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.seen: list[dict[str, Any]] = []

    async def next(self, kind: str) -> dict[str, Any]:
        """The next event of type `kind` (others are kept in `seen`)."""
        while True:
            line = await asyncio.wait_for(self.response.content.readline(), 5)
            assert line, "the stream ended"
            text = line.decode().rstrip("\n")
            if text.startswith("data:"):
                event = json.loads(text[5:])
                self.seen.append(event)
                if event["eventType"] == kind:
                    return event


async def follow(client: Client, query: str = "") -> Follower:
    response = await client.session.get(client.base + "/v2/events" + query,
                                        headers={"Accept": "text/event-stream"})
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return Follower(response)


async def test_a_follower_sees_a_deployment_through(client: Client) -> None:
    follower = await follow(client)
    attached = await follower.next("event_stream_attached")
    assert attached["timestamp"].endswith("Z")
    status, created = await client.call("POST", "/v2/apps", SMALL)
    assert status == 201
    posted = await follower.next("api_post_event")
    assert posted["uri"] == "/v2/apps/web" and posted["appDefinition"]["id"] == "/web"
    assert "tasks" not in posted["appDefinition"]
    info = await follower.next("deployment_info")
    plan = info["plan"]
    assert plan["id"] == created["deployments"][0]["id"]
    assert plan["steps"][0]["actions"][0]["app"] == "/web"
    assert plan["target"]["apps"][0]["id"] == "/web" and plan["original"]["apps"] == []
    assert info["currentStep"] == plan["steps"][0]

    client.offer("h1")
    (task,) = client.runtime.core.tasks.values()
    client.run_tasks()
    update = await follower.next("status_update_event")
    assert (update["taskId"], update["taskStatus"], update["appId"], update["host"]) == (
        task.task_id, "TASK_RUNNING", "/web", "h1")
    assert update["ports"] == task.ports and update["slaveId"] == task.agent_id
    done = await follower.next("deployment_success")
    assert done["id"] == plan["id"]
    await follower.next("group_change_success")
    follower.response.close()


async def test_failures_terminations_and_filters(client: Client) -> None:
    follower = await follow(client, "?event_type=deployment_failed"
                                    "&event_type=app_terminated_event")
    await client.call("POST", "/v2/apps", SMALL)
    (deployment,) = client.runtime.core.deployments
    # Cancelling rolls the creation back: the deployment failed, and the app is gone.
    assert (await client.call("DELETE", f"/v2/deployments/{deployment}"))[0] == 200
    failed = await follower.next("deployment_failed")
    assert failed["id"] == deployment
    terminated, _ = follower.seen
    assert terminated["eventType"] == "app_terminated_event" and terminated["appId"] == "/web"
    follower.response.close()


async def test_health_changes_are_events(client: Client) -> None:
    await client.call("POST", "/v2/apps", WEB)
    client.offer("h1", "h2")
    client.run_tasks(healthy=True)
    follower = await follow(client, "?event_type=health_status_changed_event")
    task = next(iter(client.runtime.core.tasks.values()))
    client.runtime.handle(StatusReceived(TaskStatus(
        task_id=task.task_id, state=TaskState.TASK_RUNNING, agent_id=task.agent_id,
        healthy=False)))
    changed = await follower.next("health_status_changed_event")
    assert (changed["taskId"], changed["alive"], changed["appId"]) == (task.task_id, False,
                                                                       "/web")
    follower.response.close()


async def test_streams_end_when_the_instance_stops_leading(client: Client) -> None:
    follower = await follow(client)
    await follower.next("event_stream_attached")
    assert client.api.events.open_streams == 1
    client.api.runtime = None
    assert (await asyncio.wait_for(follower.response.content.read(), 5)).strip() == b""  # ended
    assert client.api.events.open_streams == 0
    assert (await client.call("GET", "/v2/events"))[0] == 503


async def test_versions_list_and_show_each_definition(client: Client) -> None:
    await client.call("POST", "/v2/apps", SMALL)
    first = client.runtime.core.apps["/web"].version
    await client.call("PUT", "/v2/apps/web?force=true", {**SMALL, "cmd": "sleep 200"})
    second = client.runtime.core.apps["/web"].version
    status, body = await client.call("GET", "/v2/apps/web/versions")
    assert status == 200 and body == {"versions": [second, first]}
    status, old = await client.call("GET", f"/v2/apps/web/versions/{first}")
    assert status == 200 and old["cmd"] == "sleep 100" and old["version"] == first
    assert "tasks" not in old and "waitingReason" not in old
    assert (await client.call("GET", f"/v2/apps/web/versions/{second}"))[1]["cmd"] == "sleep 200"
    assert (await client.call("GET", "/v2/apps/web/versions/2001-01-01T00:00:00.000Z"))[0] == 404
    assert (await client.call("GET", "/v2/apps/nope/versions"))[0] == 404


async def test_groups_are_the_folders_of_app_ids(client: Client) -> None:
    for app_id in ("/web", "/prod/db", "/prod/api", "/prod/batch/etl"):
        assert (await client.call("POST", "/v2/apps", {**SMALL, "id": app_id}))[0] == 201
    status, root = await client.call("GET", "/v2/groups")
    assert status == 200 and root["id"] == "/"
    assert [a["id"] for a in root["apps"]] == ["/web"]
    (prod,) = root["groups"]
    assert prod["id"] == "/prod" and [a["id"] for a in prod["apps"]] == ["/prod/api",
                                                                        "/prod/db"]
    assert [g["id"] for g in prod["groups"]] == ["/prod/batch"]
    assert set(root) == {"id", "apps", "groups", "pods", "dependencies", "version"}
    status, shown = await client.call("GET", "/v2/groups/prod/batch")
    assert status == 200 and [a["id"] for a in shown["apps"]] == ["/prod/batch/etl"]
    assert (await client.call("GET", "/v2/groups/nope"))[0] == 404


def test_versions_are_bounded_and_a_forced_cancel_is_a_failure() -> None:
    core = ServiceCore(ServiceConfig(), iter(f"{i:04d}" for i in range(1, 10**6)).__next__)
    events = MarathonEvents(max_versions=3)
    events.prime(core)
    for instances in range(5):
        put = PutApp(parse_app({**SMALL, "instances": instances}), force=True)
        core.execute(put, 1.0 + instances)
        events.after(core, put, 1.0 + instances)
    versions = events.versions(core, "/web")
    assert len(versions) == 3 and versions[0] == core.apps["/web"].version
    assert events.version(core, "/web", versions[-1]).instances == 2
    (deployment,) = core.deployments
    cancel = CancelDeployment(deployment, force=True)
    core.execute(cancel, 9.0)
    assert [e["eventType"] for e in events.after(core, cancel, 9.0)] == ["deployment_failed"]
    # A new leader starts from what it finds: nothing in it is news.
    fresh = MarathonEvents()
    fresh.prime(core)
    assert fresh.after(core, None, 10.0) == []
