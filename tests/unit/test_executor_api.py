"""The Mesos v1 executor API: its pure core (agent/executor_api_core.py) and its
aiohttp shell (agent/api_v1.py) over a real AgentState."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agent.api_v1 import ExecutorStreams, add_routes
from agent.executor_api_core import (
    Answer, Call, Closed, End, ExecutorApi, FromAgent, Subscribe, ToAgent, Write, peer_of,
    uuid_bytes, uuid_text,
)
from agent.model import ExecutorMessage
from dyad.messages import (
    AgentInfo, CommandInfo, ExecutorInfo, ExecutorRegistered, ExecutorToFramework,
    FrameworkInfo, FrameworkToExecutor, KillTask, LaunchTask, RegisterExecutor, Rejected,
    ReregisterExecutor, ShutdownExecutor, StatusUpdate, StatusUpdateAck, TaskInfo, TaskState,
)
from dyad.resources import Resources

IDS = {"framework_id": {"value": "F1"}, "executor_id": {"value": "E1"}}
PEER = peer_of("F1", "E1")
RAW = uuid.UUID("12345678-1234-5678-1234-567812345678").bytes


def subscribe(stream: str = "s1", **section: Any) -> Subscribe:
    return Subscribe(stream, {"type": "SUBSCRIBE", **IDS, "subscribe": section})


def update(state: str = "TASK_RUNNING", raw: bytes = RAW, **status: Any) -> dict[str, Any]:
    return {"type": "UPDATE", **IDS, "update": {"status": {
        "task_id": {"value": "t1"}, "state": state,
        "uuid": base64.b64encode(raw).decode(), **status}}}


def task(task_id: str = "t1") -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1",
                    resources=Resources.parse("cpus:0.1"),
                    executor=ExecutorInfo(executor_id="E1", command=CommandInfo(argv=["x"])),
                    data=b"payload")


def subscribed() -> ExecutorApi:
    api = ExecutorApi()
    api.handle(subscribe())
    return api


def test_subscribe_registers_the_executor_as_a_peer_of_its_own() -> None:
    effects = ExecutorApi().handle(subscribe())
    assert effects == [Answer(200), ToAgent(PEER, RegisterExecutor(framework_id="F1",
                                                                    executor_id="E1"))]
    assert not PEER.startswith(tuple("0123456789abcdef"))  # never a ZMQ identity
    assert peer_of("F1", "2E") != peer_of("F12", "E")


def test_a_resubscription_keeps_the_tasks_the_agent_launched_and_ends_the_old_stream() -> None:
    api = subscribed()
    unacked = {"task_id": {"value": "t2"}, "name": "t2", "agent_id": {"value": "A1"},
               "executor": {"executor_id": {"value": "E1"}, "command": {"value": "x"}}}
    effects = api.handle(Subscribe("s2", {"type": "SUBSCRIBE", **IDS, "subscribe": {
        "unacknowledged_tasks": [unacked],
        "unacknowledged_updates": [update()["update"]]}}, launched=(task("t1"),)))
    assert effects[:2] == [End("s1"), Answer(200)]
    (to_agent,) = effects[2:]
    assert isinstance(to_agent, ToAgent) and to_agent.peer == PEER
    message = to_agent.message
    assert isinstance(message, ReregisterExecutor)
    assert [t.task_id for t in message.tasks] == ["t2", "t1"]
    assert [u.status.uuid for u in message.updates] == [uuid_text(RAW)]
    # Only the newest stream hears from the agent.
    assert api.handle(FromAgent(PEER, ShutdownExecutor())) == [Write("s2", {"type": "SHUTDOWN"})]
    assert api.handle(Closed("s1")) == []
    assert api.streams == 1


def test_update_becomes_the_executors_status_update_with_its_uuid() -> None:
    api = subscribed()
    answer, to_agent = api.handle(Call(update(message="up", timestamp=7)))
    assert answer == Answer(202) and isinstance(to_agent, ToAgent) and to_agent.peer == PEER
    message = to_agent.message
    assert isinstance(message, StatusUpdate) and message.framework_id == "F1"
    status = message.status
    assert (status.task_id, status.state, status.message, status.timestamp) == (
        "t1", TaskState.TASK_RUNNING, "up", 7)
    assert (status.source, status.executor_id) == ("SOURCE_EXECUTOR", "E1")
    assert status.uuid == "12345678-1234-5678-1234-567812345678"
    # The agent's acknowledgement carries the executor's own 16 bytes back.
    (write,) = api.handle(FromAgent(PEER, StatusUpdateAck(
        agent_id="A1", framework_id="F1", task_id="t1", uuid=status.uuid)))
    assert write.event == {"type": "ACKNOWLEDGED", "acknowledged": {
        "task_id": {"value": "t1"}, "uuid": base64.b64encode(RAW).decode()}}


def test_message_goes_to_the_framework() -> None:
    effects = subscribed().handle(Call({"type": "MESSAGE", **IDS,
                                        "message": {"data": base64.b64encode(b"hi").decode()}}))
    assert effects == [Answer(202), ToAgent(PEER, ExecutorToFramework(
        framework_id="F1", agent_id="", executor_id="E1", data=b"hi"))]


@pytest.mark.parametrize("body, reason", [
    ([], "expected an object"),
    ({"type": "LAUNCH", **IDS}, "unknown call type 'LAUNCH'"),
    ({"type": "SUBSCRIBE", **IDS}, "SUBSCRIBE opens a stream"),
    ({"type": "UPDATE", "executor_id": {"value": "E1"}, "update": {}}, "framework_id"),
    ({"type": "MESSAGE", **IDS, "message": {"data": "%%"}}, "message.data: expected base64"),
    (update(raw=b"short"), "update.status.uuid: must be a 16-byte UUID"),
    (update(state="TASK_STAGING"), "may not send TASK_STAGING"),
    (update(state="TASK_NOPE"), "unknown task state"),
    (update(executor_id={"value": "E2"}), "is not the calling executor"),
    (update(source="SOURCE_MASTER"), "SOURCE_EXECUTOR"),
])
def test_bad_calls_are_refused_with_the_path(body: Any, reason: str) -> None:
    api = subscribed()
    (answer,) = api.handle(Call(body))
    assert answer.status == 400 and reason in answer.reason, answer.reason
    assert api.counts["calls_invalid"] == 1


def test_calls_need_a_subscription() -> None:
    (answer,) = ExecutorApi().handle(Call(update()))
    assert answer.status == 400 and "not subscribed" in answer.reason
    api = subscribed()
    api.handle(Closed("s1"))
    assert api.handle(Call(update()))[0].status == 400


def test_a_subscription_waits_for_an_agent_that_knows_its_executors() -> None:
    (answer,) = ExecutorApi().handle(Subscribe("s1", subscribe().body, ready=False))
    assert answer.status == 503 and "subscribe again" in answer.reason


def test_a_bad_subscription_is_refused() -> None:
    (answer,) = ExecutorApi().handle(Subscribe("s", {"type": "SUBSCRIBE", "framework_id": 3}))
    assert answer.status == 400 and "framework_id" in answer.reason


def test_what_the_agent_sends_becomes_mesos_events() -> None:
    api = subscribed()
    framework = FrameworkInfo(name="fw", id="F1")
    info = ExecutorInfo(executor_id="E1", command=CommandInfo(argv=["x"]), framework_id="F1")
    agent = AgentInfo(hostname="h", port=5051, resources=Resources.parse("cpus:1"), id="A1",
                      attributes={"rack": "r1"})

    def event(message: Any) -> Any:
        (write,) = api.handle(FromAgent(PEER, message))
        return write.event

    sub = event(ExecutorRegistered(executor=info, framework=framework, agent=agent))["subscribed"]
    assert sub["executor_info"]["executor_id"] == {"value": "E1"}
    assert sub["framework_info"]["id"] == {"value": "F1"}
    assert sub["agent_info"]["hostname"] == "h" and sub["agent_info"]["id"] == {"value": "A1"}
    launch = event(LaunchTask(framework=framework, task=task()))["launch"]["task"]
    assert launch["task_id"] == {"value": "t1"} and launch["data"] == "cGF5bG9hZA=="
    assert event(KillTask(framework_id="F1", task_id="t1", kill_grace_period=2)) == {
        "type": "KILL", "kill": {"task_id": {"value": "t1"},
                                 "kill_policy": {"grace_period": {"nanoseconds": 2 * 10**9}}}}
    assert event(FrameworkToExecutor(framework_id="F1", agent_id="A1", executor_id="E1",
                                     data=b"ping")) == {"type": "MESSAGE",
                                                        "message": {"data": "cGluZw=="}}
    assert event(Rejected(reason="no", message_type="status_update"))["error"] == {
        "message": "agent refused status_update: no"}
    # For a peer with no open stream, the message is lost (as to a gone ZMQ peer).
    assert api.handle(FromAgent(peer_of("F1", "E9"), ShutdownExecutor())) == []
    assert api.counts["events_dropped"] == 1


def test_uuids_round_trip() -> None:
    assert uuid_bytes(uuid_text(RAW)) == RAW
    assert uuid_bytes("not-a-uuid") == b"not-a-uuid"


# ----------------------------------------------------------------------- the shell


class _Agent:
    """Collects what the shell submits; no agent core behind it."""

    def __init__(self) -> None:
        self.events: list[Any] = []


async def _client(streams: ExecutorStreams) -> TestClient:
    app = web.Application()
    add_routes(app, streams)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


class _State:
    """The little of an AgentState the shell reads: no executors on record."""

    def __init__(self, agent_id: str | None) -> None:
        self.agent_id = agent_id
        self.records = self

    def executor(self, framework_id: str, executor_id: str) -> None:
        return None


def _streams(agent: _Agent, refused: str = "", agent_id: str | None = "A1") -> ExecutorStreams:
    state = _State(agent_id)
    return ExecutorStreams(agent.events.append, lambda: state,  # type: ignore[arg-type,return-value]
                           refused=refused)


async def test_the_shell_streams_recordio_and_takes_calls() -> None:
    agent = _Agent()
    streams = _streams(agent)
    client = await _client(streams)
    try:
        resp = await client.post("/api/v1/executor", json={"type": "SUBSCRIBE", **IDS})
        assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
        assert agent.events == [ExecutorMessage(PEER, RegisterExecutor(framework_id="F1",
                                                                       executor_id="E1"))]
        assert streams.deliver(PEER, ShutdownExecutor())
        assert not streams.deliver("0a1b", ShutdownExecutor())  # a ZMQ peer: not ours
        length = int(await resp.content.readline())
        assert json.loads(await resp.content.readexactly(length)) == {"type": "SHUTDOWN"}
        call = await client.post("/api/v1/executor", json={
            "type": "MESSAGE", **IDS, "message": {"data": "aGk="}})
        assert call.status == 202
        assert isinstance(agent.events[-1].message, ExecutorToFramework)
        assert streams.metrics()["agent/v1/streams"] == 1
        resp.close()
    finally:
        await client.close()


@pytest.mark.parametrize("headers, body, status", [
    ({"Content-Type": "application/x-protobuf"}, b"\x08\x01", 415),
    ({"Content-Type": "text/plain"}, b"{}", 415),
    ({"Content-Type": "application/json", "Accept": "application/x-protobuf"}, b"{}", 406),
    ({"Content-Type": "application/json"}, b"{nope", 400),
    ({"Content-Type": "application/json"}, b'{"type": "SUBSCRIBE"}', 400),
    ({"Content-Type": "application/json"}, b'{"type": "UPDATE"}', 400),
    ({"Content-Type": "application/json"}, b'"just a string"', 400),
])
async def test_the_shell_answers_bad_requests_with_a_4xx_reason(
        headers: dict[str, str], body: bytes, status: int) -> None:
    agent = _Agent()
    client = await _client(_streams(agent))
    try:
        resp = await client.post("/api/v1/executor", data=body, headers=headers)
        assert resp.status == status and await resp.text()
        assert agent.events == []
    finally:
        await client.close()


async def test_the_shell_is_off_while_executors_must_authenticate() -> None:
    client = await _client(_streams(_Agent(), refused="off: no authentication"))
    try:
        resp = await client.post("/api/v1/executor", json={"type": "SUBSCRIBE", **IDS})
        assert resp.status == 403 and await resp.text() == "off: no authentication"
    finally:
        await client.close()


async def test_the_shell_answers_503_while_the_agent_recovers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.api_v1.READY_TIMEOUT", 0.1)
    agent = _Agent()
    client = await _client(_streams(agent, agent_id=None))
    try:
        resp = await client.post("/api/v1/executor", json={"type": "SUBSCRIBE", **IDS})
        assert resp.status == 503 and "not ready" in await resp.text()
        assert agent.events == []
    finally:
        await client.close()
