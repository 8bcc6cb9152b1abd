"""The REST API against a real aiohttp server on loopback, with a real core, a
real file store and a fake driver: status codes, Marathon's fields, bad input."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from dyad.clock import FakeClock
from dyad.messages import TaskState, TaskStatus
from frameworks.service.api import ServiceApi
from frameworks.service.core import (
    OffersReceived, Registered, ServiceConfig, ServiceCore, StatusReceived)
from frameworks.service.runtime import ServiceRuntime
from frameworks.service.store import FileStore
from frameworks.testing import FakeSchedulerDriver, make_offer

WEB = {"id": "/web", "cmd": "python3 -m http.server $PORT0", "instances": 2, "cpus": 0.1,
       "mem": 64, "ports": [0], "constraints": [["hostname", "UNIQUE"]],
       "healthChecks": [{"protocol": "HTTP", "path": "/", "portIndex": 0,
                         "gracePeriodSeconds": 10, "intervalSeconds": 5,
                         "maxConsecutiveFailures": 3}],
       "upgradeStrategy": {"minimumHealthCapacity": 1.0, "maximumOverCapacity": 0.5},
       "env": {"MODE": "test"}, "labels": {"team": "web"}}


class Client:
    """Talks to the API; `call` returns (status, decoded JSON or text)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, api: ServiceApi,
                 runtime: ServiceRuntime, store_dir: Path) -> None:
        self.session, self.base, self.api, self.runtime = session, base, api, runtime
        self.store_dir = store_dir

    async def call(self, method: str, path: str, body: Any = None,
                   raw: bytes | None = None) -> tuple[int, Any]:
        data = io.BytesIO(raw) if raw is not None else (None if body is None else json.dumps(body))
        async with self.session.request(method, self.base + path, data=data) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text

    def offer(self, *hosts: str) -> None:
        offers = tuple(make_offer(agent_id=f"agent-{h}", hostname=h, url="http://127.0.0.9:5051",
                                  resources="cpus:2;mem:1024;ports:[31000-31009]")
                       for h in hosts)
        self.runtime.handle(OffersReceived(offers))

    def run_tasks(self, healthy: bool = True) -> None:
        for task in list(self.runtime.core.tasks.values()):
            self.runtime.handle(StatusReceived(TaskStatus(
                task_id=task.task_id, state=TaskState.TASK_RUNNING, agent_id=task.agent_id,
                healthy=healthy)))

    def stored(self) -> Any:
        return json.loads((self.store_dir / "state.json").read_text())


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    store = FileStore(tmp_path)
    core = ServiceCore(ServiceConfig(), iter(f"{i:04d}" for i in range(1, 10**6)).__next__,
                       store.load())
    runtime = ServiceRuntime(core, store, FakeClock())
    runtime.driver = FakeSchedulerDriver()

    async def leader() -> str:
        return "127.0.0.1:8080"

    api = ServiceApi(leader)
    api.runtime = runtime
    runtime.handle(Registered("framework-1"))
    server = TestServer(api.app)
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield Client(session, f"http://127.0.0.1:{server.port}", api, runtime, tmp_path)
    runtime.close()
    await server.close()
    store.close()


async def test_create_show_and_list_an_app(client: Client) -> None:
    status, body = await client.call("POST", "/v2/apps", WEB)
    assert status == 201
    assert body["id"] == "/web" and body["instances"] == 2 and body["deployments"]
    assert body["healthChecks"][0]["portIndex"] == 0 and body["env"] == {"MODE": "test"}
    # Marathon's shape by default; Dyad's extra fields when asked for.
    assert body["tasksRunning"] == 0 and "waitingReason" not in body
    extra = (await client.call("GET", "/v2/apps/web?dyad=true"))[1]["app"]
    assert extra["waitingReason"] == "2 task(s) waiting for offers"
    client.offer("agent0", "agent1")
    client.run_tasks()
    status, body = await client.call("GET", "/v2/apps/web")
    assert status == 200
    app = body["app"]
    assert (app["tasksRunning"], app["tasksHealthy"], app["tasksStaged"],
            app["tasksUnhealthy"]) == (2, 2, 0, 0)
    assert {t["host"] for t in app["tasks"]} == {"agent0", "agent1"}
    assert app["tasks"][0]["ipAddresses"] == [{"ipAddress": "127.0.0.9", "protocol": "IPv4"}]
    assert app["deployments"] == [] and "waitingReason" not in app
    assert app["tasks"][0]["servicePorts"] == [] and "agentId" not in app["tasks"][0]
    extra = (await client.call("GET", "/v2/apps/web?dyad=true"))[1]["app"]
    assert extra["waitingReason"] is None and extra["tasks"][0]["agentId"]
    status, listing = await client.call("GET", "/v2/apps")
    assert [a["id"] for a in listing["apps"]] == ["/web"] and "tasks" not in listing["apps"][0]
    assert (await client.call("GET", "/v2/apps?embed=apps.tasks"))[1]["apps"][0]["tasks"]
    assert (await client.call("GET", "/v2/apps?embed=app.tasks"))[1]["apps"][0]["tasks"]
    assert "web" in client.stored()["apps"]


async def test_double_slashes_and_relative_ids_are_tolerated(client: Client) -> None:
    status, body = await client.call("POST", "//v2//apps/", {**WEB, "id": "web//api"})
    assert status == 201 and body["id"] == "/web/api"
    assert (await client.call("GET", "/v2/apps//web/api/"))[0] == 200
    assert (await client.call("GET", "//v2/apps/web//api//tasks"))[0] == 200


async def test_bad_definitions_are_refused_with_reasons_and_leave_nothing(client: Client) -> None:
    cases = [
        ({**WEB, "cpus": -1}, "/cpus"),
        ({**WEB, "instances": "three"}, "/instances"),
        ({**WEB, "instance": 3}, "/instance"),
        ({**WEB, "id": "/Web_App"}, "/id"),
        ({**WEB, "id": "/web/tasks"}, "/id"),
        ({**WEB, "constraints": [["hostname", "SOMETIMES"]]}, "/constraints"),
        ({**WEB, "constraints": [["rack", "LIKE", "("]]}, "/constraints"),
        ({**WEB, "constraints": [["hostname", "CLUSTER", "a"], ["hostname", "UNIQUE"]]},
         "/constraints"),
        ({**WEB, "healthChecks": [{"protocol": "HTTP", "portIndex": 3}]}, "/healthChecks"),
        ({**WEB, "env": {"A": 1}}, "/env"),
        ({**WEB, "mem": float("1e300")}, "/mem"),
        ({k: v for k, v in WEB.items() if k != "cmd"}, "/cmd"),
        ({**WEB, "upgradeStrategy": {"minimumHealthCapacity": 1, "maximumOverCapacity": 0}},
         "/upgradeStrategy"),
    ]
    for definition, path in cases:
        status, body = await client.call("POST", "/v2/apps", definition)
        assert status == 422, definition
        assert body["message"] == "Object is not valid"
        assert path in [d["path"] for d in body["details"]], body
    for raw in (b"{not json", b'{"id": NaN}', b"\xff\xfe", b"[1, 2]"):
        status, body = await client.call("POST", "/v2/apps", raw=raw)
        assert status in (400, 422) and body["message"], raw
    assert (await client.call("GET", "/v2/apps"))[1] == {"apps": []}
    assert not (client.store_dir / "state.json").exists() or client.stored()["apps"] == {}
    metrics = (await client.call("GET", "/metrics"))[1]["counters"]
    assert metrics["invalid_app_definitions"] == len(cases) + 1
    assert metrics["http_responses_4xx"] == len(cases) + 4


async def test_locked_apps_conflict_unless_forced(client: Client) -> None:
    await client.call("POST", "/v2/apps", WEB)
    status, body = await client.call("POST", "/v2/apps", WEB)
    assert status == 409 and "already exists" in body["message"]
    status, body = await client.call("PUT", "/v2/apps/web", {"instances": 3})
    assert status == 409 and body["deployments"][0]["id"]
    assert "force=true" in body["message"]
    status, body = await client.call("PUT", "/v2/apps/web?force=true", {"instances": 3})
    assert status == 200 and body["deploymentId"] and body["version"]
    assert (await client.call("GET", "/v2/apps/web"))[1]["app"]["instances"] == 3
    assert (await client.call("PUT", "/v2/apps/web?force=maybe", {}))[0] == 400


async def test_update_scale_restart_and_delete(client: Client) -> None:
    await client.call("POST", "/v2/apps", WEB)
    client.offer("agent0", "agent1")
    client.run_tasks()
    app = (await client.call("GET", "/v2/apps/web"))[1]["app"]
    app["cmd"] = "python3 -m http.server $PORT0 --bind 0.0.0.0"
    status, body = await client.call("PUT", "/v2/apps/web", app)   # GET's JSON goes back
    assert status == 200
    (marathon,) = (await client.call("GET", "/v2/deployments"))[1]
    assert not {"kind", "startedAt", "autoRollback", "progress", "rollbackAt"} & set(marathon)
    (deployment,) = (await client.call("GET", "/v2/deployments?dyad=true"))[1]
    assert deployment["id"] == body["deploymentId"] and deployment["kind"] == "upgrade"
    assert deployment["affectedApps"] == ["/web"] and deployment["autoRollback"]
    assert deployment["currentActions"][0]["action"] == "RestartApplication"
    status, body = await client.call("DELETE", f"/v2/deployments/{deployment['id']}")
    assert status == 200 and body["deploymentId"] != deployment["id"]
    client.runtime.core.deployments.clear()
    assert (await client.call("POST", "/v2/apps/web/restart"))[0] == 200
    status, body = await client.call("DELETE", "/v2/apps/web?force=true")
    assert status == 200 and body["deploymentId"]
    assert (await client.call("GET", "/v2/apps/web"))[0] == 404
    assert (await client.call("DELETE", "/v2/apps/web"))[0] == 404
    assert (await client.call("DELETE", "/v2/deployments/nope"))[0] == 404
    status, body = await client.call("PUT", "/v2/apps/other", {**WEB, "id": "/other"})
    assert status == 201


async def test_tasks_kill_and_discovery(client: Client) -> None:
    await client.call("POST", "/v2/apps", WEB)
    client.offer("agent0", "agent1")
    client.run_tasks()
    status, body = await client.call("GET", "/v2/tasks?format=txt")
    assert status == 200
    lines = body.splitlines()
    assert len(lines) == 2 and all(line.startswith("/web 127.0.0.9:3100") for line in lines)
    tasks = (await client.call("GET", "/v2/apps/web/tasks"))[1]["tasks"]
    assert len(tasks) == 2 and (await client.call("GET", "/v2/tasks"))[1]["tasks"] == tasks
    victim = tasks[0]["id"]
    status, body = await client.call("DELETE", f"/v2/apps/web/tasks/{victim}?scale=false")
    assert status == 200 and body["task"]["id"] == victim
    assert client.runtime.driver.killed == [victim]
    assert (await client.call("DELETE", "/v2/apps/web/tasks/web.nope"))[0] == 404
    assert (await client.call("GET", "/v2/tasks?format=xml"))[0] == 400
    other = tasks[1]["id"]
    status, body = await client.call("POST", "/v2/tasks/delete", {"ids": [other]})
    assert status == 200 and client.runtime.driver.killed == [victim, other]
    assert (await client.call("POST", "/v2/tasks/delete", {"ids": ["web.nope"]}))[0] == 404
    assert (await client.call("POST", "/v2/tasks/delete", {"ids": "x"}))[0] == 400


async def test_queue_shows_why_tasks_wait(client: Client) -> None:
    await client.call("POST", "/v2/apps", {**WEB, "instances": 3})
    client.offer("agent0", "agent1")
    client.offer("agent0", "agent1")
    (entry,) = (await client.call("GET", "/v2/queue"))[1]["queue"]
    assert entry["count"] == 1 and entry["app"]["id"] == "/web"
    # Why it waits, in Marathon's own fields ...
    reasons = entry["processedOffersSummary"]["rejectSummaryLastOffers"]
    assert "UnfulfilledConstraint" in {r["reason"] for r in reasons}
    assert "waitingReason" not in entry and entry["overdue"] is True
    assert (await client.call("GET", "/v2/queue?embed=lastUnusedOffers"))[1][
        "queue"][0]["lastUnusedOffers"] == []
    # ... and in a sentence with ?dyad=true.
    (entry,) = (await client.call("GET", "/v2/queue?dyad=true"))[1]["queue"]
    assert "UnfulfilledConstraint" in entry["waitingReason"]
    assert (await client.call("DELETE", "/v2/queue/web/delay"))[0] == 204
    assert (await client.call("DELETE", "/v2/queue/nope/delay"))[0] == 404


async def test_unknown_routes_methods_and_standby(client: Client) -> None:
    assert (await client.call("GET", "/v3/things"))[0] == 404
    status, body = await client.call("PATCH", "/v2/apps")
    assert status == 405 and "GET" in body["message"]
    assert (await client.call("GET", "/ping"))[1] == "pong\n"
    info = (await client.call("GET", "/v2/info"))[1]
    assert info["frameworkId"] == "framework-1" and info["elected"]
    big = json.dumps({**WEB, "labels": {"x": "y" * (2 * 1024 * 1024)}}).encode()
    assert (await client.call("POST", "/v2/apps", raw=big))[0] == 413
    client.api.runtime = None
    status, body = await client.call("GET", "/v2/apps")
    assert status == 503 and body["leader"] == "127.0.0.1:8080"
    assert (await client.call("GET", "/v2/leader"))[1] == {"leader": "127.0.0.1:8080"}


# ------------------------------------------------- bad input (issue 12's fuzz run)

NESTED = b"[" * 10_000 + b"]" * 10_000


async def answered_4xx(client: Client, method: str, path: str, raw: bytes) -> dict[str, Any]:
    """Send `raw` and insist on a quick 4xx whose JSON says why and whose status
    line carries only the standard reason phrase."""
    async with client.session.request(method, client.base + path, data=io.BytesIO(raw),
                                      timeout=aiohttp.ClientTimeout(total=10)) as resp:
        body = await resp.json(content_type=None)
        assert 400 <= resp.status < 500, (method, path, raw[:80], resp.status, body)
        assert resp.reason == HTTPStatus(resp.status).phrase
        assert isinstance(body, dict) and body["message"], body
        return body


@pytest.mark.parametrize("raw, reason", [
    (NESTED, "nested deeper"),
    (b'{"id": "/web", "cmd": "x", "cpus": 1' + b"0" * 309 + b"}", "exceeds the limit"),
    (b'{"id": "/web", "cmd": "x", "cpus": 1e309}', "out of range"),
    (b'{"id": "/web", "cmd": "x", "cpus": -Infinity}', "not a JSON number"),
    (b'{"id": "/web", "cmd": "\\ud800"}', "lone surrogate"),
    (b'{"id": "/web", "cmd": "x", "labels": {"\\udfff": "a"}}', "lone surrogate"),
], ids=["nested", "309-digit-cpus", "1e309-cpus", "infinity", "surrogate", "surrogate-key"])
async def test_unparsable_bodies_are_400_with_the_reason(client: Client, raw: bytes,
                                                         reason: str) -> None:
    for method, path in (("POST", "/v2/apps"), ("PUT", "/v2/apps/web")):
        body = await answered_4xx(client, method, path, raw)
        assert reason in body["message"], body
    assert (await client.call("GET", "/v2/apps"))[1] == {"apps": []}


@pytest.mark.parametrize("constraints, reason", [
    ([["rack", "MAX_PER", "\u00b2"]], "positive whole number"),
    ([["rack", "GROUP_BY", "9" * 400]], "longer than 256"),
    ([["rack", "LIKE", "(?!x)"]], "RE2"),
    ([["rack", "LIKE", "a" * 300]], "longer than 256"),
    ([["hostname", "CLUSTER", "a" * 40 + "!"], ["hostname", "LIKE", "(a+)+"]], "is not LIKE"),
], ids=["superscript-two", "long-count", "lookahead", "long-pattern", "redos"])
async def test_bad_constraints_are_422_at_once(client: Client, constraints: list[Any],
                                               reason: str) -> None:
    raw = json.dumps({**WEB, "constraints": constraints}).encode()
    body = await answered_4xx(client, "POST", "/v2/apps", raw)
    assert body["message"] == "Object is not valid"
    (detail,) = [d for d in body["details"] if d["path"] == "/constraints"]
    assert reason in detail["errors"][0], detail


async def test_newlines_and_odd_characters_in_ids_never_reach_a_header(client: Client) -> None:
    await client.call("POST", "/v2/apps", WEB)
    for method, path in [("GET", "/v2/apps/we%0Ab"), ("GET", "/v2/apps/we%0D%0AX-A:%20b"),
                         ("DELETE", "/v2/apps/web/tasks/web.x%0Ay"),
                         ("DELETE", "/v2/deployments/d%0Ax"),
                         ("DELETE", "/v2/queue/w%0Ab/delay"),
                         ("GET", "/v2/apps/%ED%A0%80"), ("GET", "/v2/apps/%FF"),
                         ("DELETE", "/v2/apps/web?force=%0A")]:
        await answered_4xx(client, method, path, b"")
    body = await answered_4xx(client, "POST", "/v2/apps",
                              json.dumps({**WEB, "id": "/we\nb"}).encode())
    assert body["details"][0]["path"] == "/id"
    metrics = (await client.call("GET", "/metrics"))[1]["counters"]
    assert metrics.get("http_responses_5xx", 0) == 0


async def test_the_api_still_works_after_bad_input(client: Client) -> None:
    for raw in (NESTED, b'{"cpus": 1e309}', b'{"id": "\\ud800"}'):
        await answered_4xx(client, "POST", "/v2/apps", raw)
    status, body = await client.call("POST", "/v2/apps", WEB)
    assert status == 201, body
    metrics = (await client.call("GET", "/metrics"))[1]["counters"]
    assert metrics["http_responses_4xx"] == 3 and metrics.get("http_responses_5xx", 0) == 0
