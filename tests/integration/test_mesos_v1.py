"""The Mesos v1 scheduler API against a real master and agent: a plain HTTP client
(aiohttp, no Dyad code on its side) subscribes, reads the RecordIO stream while
making calls on other connections, launches, acknowledges, reconciles, drops its
stream and comes back with its framework id, exchanges framework messages with a
Dyad executor; and every refusal is a 4xx with a reason. tests/integration/test_pymesos.py drives the same API with pymesos."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dyad.local import http_get_json

from .conftest import wait_for
from .test_ha import ha_cluster, leading  # noqa: F401 (the fixture)
from .zookeeper import zookeeper  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}


def small_task(task_id: str, offer: dict[str, Any], command: str) -> dict[str, Any]:
    return {"name": task_id, "task_id": {"value": task_id}, "agent_id": offer["agent_id"],
            "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
                          {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}}],
            "command": {"value": command}}


class V1Client:
    """A minimal Mesos v1 scheduler client: one connection holds the event stream,
    calls go over the session's other connections."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.events: list[dict[str, Any]] = []
        self.stream_id = ""
        self.framework_id: dict[str, str] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._response: aiohttp.ClientResponse | None = None

    async def subscribe(self, name: str = "v1-test", framework_id: dict[str, str] | None = None,
                        failover_timeout: float = 60.0) -> dict[str, Any]:
        info: dict[str, Any] = {"user": "nobody", "name": name,
                                "failover_timeout": failover_timeout}
        body: dict[str, Any] = {"type": "SUBSCRIBE", "subscribe": {"framework_info": info}}
        if framework_id is not None:
            body["framework_id"] = info["id"] = framework_id
        self.events = []
        response = await self.session.post(f"{self.url}/api/v1/scheduler", json=body)
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers.get("Transfer-Encoding") == "chunked"
        self.stream_id = response.headers["Mesos-Stream-Id"]
        self._response = response
        self._reader = asyncio.create_task(self._read(response))
        subscribed = await self.next("SUBSCRIBED")
        self.framework_id = subscribed["subscribed"]["framework_id"]
        return subscribed

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        """RecordIO: `<length>\\n<json>`, records split anywhere across chunks."""
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            while b"\n" in buffer:
                size, rest = buffer.split(b"\n", 1)
                if len(rest) < int(size):
                    break
                self.events.append(json.loads(rest[:int(size)]))
                buffer = rest[int(size):]

    def close(self) -> None:
        if self._response is not None:
            self._response.close()
        if self._reader is not None:
            self._reader.cancel()

    async def next(self, kind: str, after: int = 0, timeout: float = 60.0,
                   where: Any = None) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for event in self.events[after:]:
                if event["type"] == kind and (where is None or where(event)):
                    return event
            return None
        return await wait_for(found, timeout, what=f"a {kind} event")

    async def reach(self, task_id: str, state: str) -> dict[str, Any]:
        """Acknowledge `task_id`'s updates as they come until one in `state` (the
        agent sends each only after the previous one is acknowledged)."""
        seen = 0
        while True:
            event = await self.next("UPDATE", after=seen,
                                    where=lambda e: e["update"]["status"]["task_id"]["value"]
                                    == task_id)
            seen = self.events.index(event) + 1
            status = event["update"]["status"]
            if "uuid" in status:
                assert await self.call("ACKNOWLEDGE", acknowledge={
                    "agent_id": status["agent_id"], "task_id": status["task_id"],
                    "uuid": status["uuid"]}) == (202, "")
            if status["state"] == state:
                return status

    async def call(self, kind: str, **sections: Any) -> tuple[int, str]:
        body = {"type": kind, "framework_id": self.framework_id, **sections}
        async with self.session.post(f"{self.url}/api/v1/scheduler", json=body,
                                     headers={"Mesos-Stream-Id": self.stream_id}) as answer:
            return answer.status, await answer.text()


@pytest.fixture
async def v1(make_cluster: Any) -> AsyncIterator[tuple[Any, V1Client]]:
    cluster = make_cluster(agents=1)
    async with aiohttp.ClientSession() as session:
        client = V1Client(session, cluster.master.url)
        yield cluster, client
        client.close()


def allocation_runs(cluster: Any) -> int:
    return int(http_get_json(f"{cluster.master.url}/metrics/snapshot")["allocator/allocation_runs"])


def update_of(task_id: str, state: str) -> Any:
    return lambda event: (event["update"]["status"]["task_id"]["value"] == task_id
                          and event["update"]["status"]["state"] == state)


async def test_subscribe_launch_acknowledge_reconcile(v1: Any) -> None:
    cluster, client = v1
    subscribed = await client.subscribe()
    info = subscribed["subscribed"]
    assert info["heartbeat_interval_seconds"] > 0
    assert info["master_info"]["address"]["port"] == int(cluster.master.url.rsplit(":", 1)[1])
    offer = (await client.next("OFFERS"))["offers"]["offers"][0]
    assert {"id", "framework_id", "agent_id", "hostname", "resources", "url"} <= set(offer)
    assert {r["name"]: r["type"] for r in offer["resources"]}["ports"] == "RANGES"
    assert {"name": "rack", "type": "TEXT", "text": {"value": "r1"}} in offer["attributes"]

    status, text = await client.call("ACCEPT", accept={
        "offer_ids": [offer["id"]], "filters": {"refuse_seconds": 1},
        "operations": [{"type": "LAUNCH", "launch": {
            "task_infos": [small_task("hello", offer, "echo hello")]}}]})
    assert (status, text) == (202, "")
    for state in ("TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"):
        update = (await client.next("UPDATE", where=update_of("hello", state)))["update"]
        # Updates are at least once: each waits for the acknowledgement of the last.
        uuid = update["status"]["uuid"]
        assert base64.b64decode(uuid)
        assert await client.call("ACKNOWLEDGE", acknowledge={
            "agent_id": update["status"]["agent_id"], "task_id": {"value": "hello"},
            "uuid": uuid}) == (202, "")

    seen = len(client.events)
    assert await client.call("RECONCILE", reconcile={"tasks": [
        {"task_id": {"value": "hello"}}]}) == (202, "")
    answer = await client.next("UPDATE", after=seen, where=update_of("hello", "TASK_FINISHED"))
    assert "uuid" not in answer["update"]["status"]  # reconciliation needs no ack
    assert (await client.next("HEARTBEAT"))["type"] == "HEARTBEAT"

    assert await client.call("TEARDOWN") == (202, "")
    fid = client.framework_id["value"]  # type: ignore[index]
    await wait_for(lambda: any(f["id"] == fid for f in cluster.state()["completed_frameworks"]),
                   what="the framework torn down")


async def test_decline_revive_kill_and_messages(v1: Any) -> None:
    cluster, client = v1
    await client.subscribe()
    offer = (await client.next("OFFERS"))["offers"]["offers"][0]
    seen = len(client.events)
    assert await client.call("DECLINE", decline={
        "offer_ids": [offer["id"]], "filters": {"refuse_seconds": 3600}}) == (202, "")
    runs = allocation_runs(cluster)
    await wait_for(lambda: allocation_runs(cluster) >= runs + 3, what="allocation runs")
    assert not [e for e in client.events[seen:] if e["type"] == "OFFERS"]
    assert await client.call("REVIVE") == (202, "")
    offer = (await client.next("OFFERS", after=seen))["offers"]["offers"][0]

    assert await client.call("ACCEPT", accept={"offer_ids": [offer["id"]], "operations": [
        {"type": "LAUNCH", "launch": {"task_infos": [
            small_task("sleeper", offer, "sleep 60")]}}]}) == (202, "")
    status = await client.reach("sleeper", "TASK_RUNNING")
    assert await client.call("SUPPRESS") == (202, "")
    # A framework message to the command executor reaches the agent (which has no
    # use for it); the call itself is what is checked here.
    assert await client.call("MESSAGE", message={
        "agent_id": status["agent_id"], "executor_id": status["executor_id"],
        "data": base64.b64encode(b"ping").decode()}) == (202, "")
    assert await client.call("KILL", kill={"task_id": {"value": "sleeper"},
                                           "agent_id": status["agent_id"]}) == (202, "")
    await client.reach("sleeper", "TASK_KILLED")


async def test_messages_cross_to_a_dyad_executor_and_back(v1: Any) -> None:
    """A v1 framework and a Dyad executor (ZMQ) meet in the same cores: messages
    go both ways (the pymesos executor test covers the v1 executor API)."""
    cluster, client = v1
    await client.subscribe()
    offer = (await client.next("OFFERS"))["offers"]["offers"][0]
    task = small_task("echoed", offer, "")
    del task["command"]
    task["executor"] = {"executor_id": {"value": "echo"}, "command": {
        "value": f"{sys.executable} {Path(__file__).with_name('echo_executor.py')}"}}
    assert await client.call("ACCEPT", accept={"offer_ids": [offer["id"]], "operations": [
        {"type": "LAUNCH", "launch": {"task_infos": [task]}}]}) == (202, "")
    status = await client.reach("echoed", "TASK_RUNNING")
    assert status["executor_id"] == {"value": "echo"}
    seen = len(client.events)
    assert await client.call("MESSAGE", message={
        "agent_id": status["agent_id"], "executor_id": status["executor_id"],
        "data": base64.b64encode(b"ping").decode()}) == (202, "")
    answer = (await client.next("MESSAGE", after=seen))["message"]
    assert base64.b64decode(answer["data"]) == b"pong:ping"
    assert (answer["executor_id"], answer["agent_id"]) == (status["executor_id"],
                                                           status["agent_id"])
    assert await client.call("KILL", kill={"task_id": {"value": "echoed"}}) == (202, "")
    await client.reach("echoed", "TASK_KILLED")


async def test_a_dropped_stream_disconnects_and_the_framework_comes_back(v1: Any) -> None:
    cluster, client = v1
    await client.subscribe(failover_timeout=120)
    fid = client.framework_id
    offer = (await client.next("OFFERS"))["offers"]["offers"][0]
    await client.call("ACCEPT", accept={"offer_ids": [offer["id"]], "operations": [
        {"type": "LAUNCH", "launch": {"task_infos": [small_task("keep", offer, "sleep 60")]}}]})
    await client.reach("keep", "TASK_STARTING")
    running = await client.next("UPDATE", where=update_of("keep", "TASK_RUNNING"))
    old_stream = client.stream_id
    client.close()

    def framework() -> Any:
        return next(f for f in cluster.state()["frameworks"] if f["id"] == fid["value"])
    await wait_for(lambda: not framework()["connected"], what="the framework disconnected")
    assert [t["id"] for t in framework()["tasks"]] == ["keep"]  # its task keeps running

    await client.subscribe(framework_id=fid)
    assert client.framework_id == fid
    # The update the old stream did not acknowledge comes again, to the new stream.
    again = await client.next("UPDATE", where=update_of("keep", "TASK_RUNNING"))
    assert again["update"]["status"]["uuid"] == running["update"]["status"]["uuid"]
    assert framework()["connected"]
    async with client.session.post(f"{client.url}/api/v1/scheduler",
                                   json={"type": "REVIVE", "framework_id": fid},
                                   headers={"Mesos-Stream-Id": old_stream}) as answer:
        assert answer.status == 400 and "not open" in await answer.text()


async def test_refusals_are_4xx_with_reasons(v1: Any) -> None:
    cluster, client = v1
    url = f"{client.url}/api/v1/scheduler"
    post = client.session.post

    async def answer(data: bytes, headers: dict[str, str]) -> tuple[int, str]:
        async with post(url, data=data, headers=headers) as response:
            return response.status, await response.text()

    status, text = await answer(b"\x08\x01", {"Content-Type": "application/x-protobuf"})
    assert status == 415 and "JSON only" in text
    status, text = await answer(b"{}", {**JSON, "Accept": "application/x-protobuf"})
    assert status == 406
    status, text = await answer(b"{nope", JSON)
    assert status == 400 and "must be JSON" in text
    status, text = await answer(b"[" * 100 + b"]" * 100, JSON)
    assert status == 400 and "nested deeper" in text
    status, text = await answer(json.dumps({"type": "SUBSCRIBE", "subscribe": {
        "framework_info": {"user": "u", "name": "n", "roles": [7]}}}).encode(), JSON)
    assert status == 400 and "subscribe.framework_info.roles[0]: expected a string" in text
    status, text = await answer(json.dumps({"type": "SUBSCRIBE", "subscribe": {
        "framework_info": {"user": "u", "name": "n", "role": "no such role!"}}}).encode(), JSON)
    assert status == 400 and "subscription refused" in text

    await client.subscribe()
    body = json.dumps({"type": "REVIVE", "framework_id": client.framework_id}).encode()
    status, text = await answer(body, JSON)
    assert status == 400 and "Mesos-Stream-Id" in text
    status, text = await answer(body, {**JSON, "Mesos-Stream-Id": "0000"})
    assert status == 400 and "not open" in text
    foreign = json.dumps({"type": "REVIVE", "framework_id": {"value": "F-other"}}).encode()
    status, text = await answer(foreign, {**JSON, "Mesos-Stream-Id": client.stream_id})
    assert status == 400 and "belongs to framework" in text
    status, text = await answer(json.dumps({"type": "SUBSCRIBE", "subscribe": {
        "framework_info": {"user": "u", "name": "n"}}}).encode(),
        {**JSON, "Mesos-Stream-Id": client.stream_id})
    assert status == 400 and "must not carry" in text
    metrics = await (await client.session.get(f"{client.url}/metrics/snapshot")).json()
    assert metrics["master/v1/calls_invalid"] >= 9
    assert metrics["master/v1/streams"] == 1
    assert metrics["master/internal_errors"] == 0


async def test_standby_redirects_and_a_failover_gives_the_framework_its_tasks_back(
        ha_cluster: Any) -> None:
    cluster = ha_cluster(masters=2, agents=1)
    leader = cluster.leader()
    (standby,) = [m for m in cluster.master_children if m is not leader]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{standby.url}/api/v1/scheduler", allow_redirects=False,
                                json={"type": "SUBSCRIBE"}) as answer:
            assert answer.status == 307
            assert answer.headers["Location"] == f"{leader.url}/api/v1/scheduler"

        client = V1Client(session, leader.url)
        try:
            await client.subscribe(failover_timeout=120)
            fid = client.framework_id
            offer = (await client.next("OFFERS"))["offers"]["offers"][0]
            launch = {"type": "LAUNCH", "launch": {"task_infos": [
                small_task("survivor", offer, "sleep 120")]}}
            assert await client.call("ACCEPT", accept={"offer_ids": [offer["id"]],
                                                       "operations": [launch]}) == (202, "")
            await client.reach("survivor", "TASK_RUNNING")
            client.close()

            leader.process.send_signal(signal.SIGKILL)
            await wait_for(lambda: leading(cluster) not in (None, leader), 30, "a new leader")
            new_leader = leading(cluster)
            client.url = new_leader.url
            subscribed = await client.subscribe(framework_id=fid)
            assert subscribed["subscribed"]["framework_id"] == fid
            assert subscribed["subscribed"]["master_info"]["address"]["port"] == int(
                new_leader.url.rsplit(":", 1)[1])

            def survivor_known() -> bool:
                framework = [f for f in cluster.state()["frameworks"] if f["id"] == fid["value"]]
                return bool(framework) and [t["id"] for t in framework[0]["tasks"]] == ["survivor"]
            await wait_for(survivor_known, 30, "the agent to bring the task back")
            seen = len(client.events)
            assert await client.call("RECONCILE") == (202, "")
            await client.next("UPDATE", after=seen, where=update_of("survivor", "TASK_RUNNING"))
        finally:
            client.close()
