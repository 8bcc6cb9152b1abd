"""The master's events log: the pure ring (master.events), what MasterState feeds
it, the operator kill event, and `GET /events` / `POST /tasks/kill` over HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dyad.messages import KillTask, StatusUpdate, Teardown, TaskState
from master.events import EventLog
from master.http import make_app
from master.metrics import Histogram
from master.operator import KillLiveTask, Reply, Request
from master.model import MasterConfig
from tests.unit.test_master_state import Harness, launch, messages, status, task


def kinds(harness: Harness) -> list[str]:
    return [entry.kind for entry in harness.state.events.since(0, 100_000)]


def test_log_numbers_entries_and_keeps_only_the_newest() -> None:
    log = EventLog(capacity=3)
    assert log.page(0) == {"first": 1, "last": 0, "next": 0, "events": []}
    for n in range(5):
        log.record(float(n), "tick", n=n)
    assert [e.seq for e in log.since(0)] == [3, 4, 5]  # 1 and 2 fell off
    assert [e.seq for e in log.since(3)] == [4, 5]
    assert [e.seq for e in log.since(3, limit=1)] == [4]
    assert log.since(5) == [] and log.since(99) == []
    page = log.page(3, limit=1)
    assert page["first"] == 3 and page["last"] == 5 and page["next"] == 4
    assert page["events"] == [{"seq": 4, "time": 3.0, "type": "tick", "n": 3}]
    # A reader ahead of the log (a new leader's log restarted) is sent back to it.
    assert log.page(99)["next"] == 5
    with pytest.raises(ValueError):
        EventLog(capacity=0)


def test_master_logs_the_life_of_agents_frameworks_offers_and_tasks() -> None:
    h = Harness()
    agent = h.register("a1")
    fid = h.subscribe("d1")
    offers = h.offers_to(h.allocate(), "d1")
    h.recv("d1", launch(fid, offers, task("t1", agent), refuse=0))
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_RUNNING,
                                                                 agent_id=agent)))
    h.recv("a1", StatusUpdate(framework_id=fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="u2", agent_id=agent)))
    offers = h.offers_to(h.allocate(), "d1")
    assert offers
    h.recv("d1", Teardown(framework_id=fid))
    assert kinds(h) == ["agent_registered", "framework_subscribed", "task_state", "task_state",
                        "task_state", "offer_rescinded", "framework_removed"]
    states = [e.fields["state"] for e in h.state.events.since(0) if e.kind == "task_state"]
    assert states == ["TASK_STAGING", "TASK_RUNNING", "TASK_FINISHED"]
    removed = h.state.events.since(0)[-1]
    assert removed.fields == {"framework_id": fid, "reason": "torn down by the framework"}
    assert removed.time == h.clock.now()


def test_entries_kept_as_names_and_values_read_as_entries_kept_as_fields() -> None:
    log = EventLog(capacity=4)
    log.record(1.0, "task_state", framework_id="f", task_id="t", state="TASK_RUNNING")
    log.record_values(2.0, "task_state", ("framework_id", "task_id", "state"),
                      ("f", "t", "TASK_FINISHED"))
    first, second = log.since(0)
    assert (second.seq, second.time, second.kind) == (2, 2.0, "task_state")
    assert second.fields == {"framework_id": "f", "task_id": "t", "state": "TASK_FINISHED"}
    assert list(second.to_json()) == list(first.to_json())  # the same keys, in order
    assert log.page(1)["events"] == [{"seq": 2, "time": 2.0, "type": "task_state",
                                      "framework_id": "f", "task_id": "t",
                                      "state": "TASK_FINISHED"}]


def test_the_masters_task_entries_name_every_field_in_order() -> None:
    h = Harness()
    agent = h.register("a1")
    fid = h.subscribe("d1")
    offers = h.offers_to(h.allocate(), "d1")
    h.recv("d1", launch(fid, offers, task("t1", agent), task("bad", agent, resources="cpus:99"),
                        refuse=0))
    h.recv("a1", StatusUpdate(framework_id=fid, status=status(
        "t1", TaskState.TASK_RUNNING, agent_id=agent)))
    staging, error, running = [e.to_json() for e in h.state.events.since(0)
                               if e.kind == "task_state"]
    base = ["seq", "time", "type", "framework_id", "task_id", "state", "agent_id", "source",
            "reason", "message", "healthy"]
    assert list(staging) == base and list(running) == base and list(error) == base
    assert (staging["task_id"], staging["state"], staging["agent_id"], staging["source"],
            staging["reason"]) == ("t1", "TASK_STAGING", agent, "master", "")
    assert (running["state"], running["source"]) == ("TASK_RUNNING", "agent")
    assert (error["task_id"], error["state"], error["source"]) == ("bad", "TASK_ERROR", "master")
    assert error["message"] and error["reason"]


def test_master_logs_invalid_tasks_and_unreachable_agents() -> None:
    h = Harness(MasterConfig(agent_ping_timeout=1.0, max_agent_ping_timeouts=1))
    agent = h.register("a1")
    fid = h.subscribe("d1")
    offers = h.offers_to(h.allocate(), "d1")
    h.recv("d1", launch(fid, offers, task("bad", agent, resources="cpus:99")))
    entry = [e for e in h.state.events.since(0) if e.kind == "task_state"][-1]
    assert entry.fields["state"] == "TASK_ERROR" and entry.fields["source"] == "master"
    h.silent_agents.add(agent)
    h.advance(5.0)
    assert "agent_unreachable" in kinds(h)


def test_log_is_bounded_by_config() -> None:
    h = Harness(MasterConfig(max_events=2))
    for n in range(4):
        h.subscribe(f"d{n}", name=f"fw{n}")
    assert [e.seq for e in h.state.events.since(0)] == [3, 4]


def test_operator_kill_goes_to_the_agent_and_is_logged() -> None:
    h = Harness()
    agent = h.register("a1")
    fid = h.subscribe("d1")
    h.recv("d1", launch(fid, h.offers_to(h.allocate(), "d1"), task("t1", agent)))
    reply = h.call(KillLiveTask(task_id="t1"))
    assert reply.result == {"killing": True, "task_id": "t1", "framework_id": fid}
    (kill,) = messages(h.log[-1:], KillTask, "a1")
    assert kill.task_id == "t1" and kill.framework_id == fid
    assert kinds(h)[-1] == "task_kill_requested"
    assert h.metric("master/operator_kills") == 1
    # Gone (or never there) by the time the call is handled: refused, nothing sent.
    sent = len(h.log)
    for request in (KillLiveTask(task_id="gone"), KillLiveTask(task_id="t1", framework_id="F9")):
        reply = h.call(request)
        assert (reply.ok, reply.refusal) == (False, "not_found") and "no live task" in reply.error
    assert len(h.log) == sent and h.metric("master/operator_kills") == 1


def test_a_task_id_live_in_two_frameworks_needs_the_framework_id() -> None:
    h = Harness()
    agent = h.register("a1")
    fids = [h.subscribe(peer, name=peer) for peer in ("d1", "d2")]
    sends = h.allocate()
    h.recv("d1", launch(fids[0], h.offers_to(sends, "d1"), task("t1", agent)))
    h.allocate()
    h.advance(1.0)
    offers = [o for s in h.log if s.to == "d2" for o in getattr(s.message, "offers", [])]
    h.recv("d2", launch(fids[1], offers[-1:], task("t1", agent)))
    reply = h.call(KillLiveTask(task_id="t1"))
    assert reply.refusal == "conflict" and "give framework_id" in reply.error
    assert h.call(KillLiveTask(task_id="t1", framework_id=fids[1])).ok


class HttpView:
    """`MasterView` over a Harness (no sockets); `submit` runs the event at once."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.state = harness.state
        self.info = harness.state.info
        self.leader = self.info
        self.is_leader = True

    def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()

    def metrics(self) -> dict[str, float]:
        return self.state.metrics()

    def histograms(self) -> dict[str, Histogram]:
        return self.state.histograms()

    def problems(self) -> list[str]:
        return []

    def count_internal_error(self) -> None:
        raise AssertionError("a handler raised")

    async def call(self, request: Request) -> Reply:
        return self.harness.call(request)


async def test_events_and_kill_over_http() -> None:
    h = Harness()
    agent = h.register("a1")
    fid = h.subscribe("d1")
    h.recv("d1", launch(fid, h.offers_to(h.allocate(), "d1"), task("t1", agent)))
    async with TestClient(TestServer(make_app(HttpView(h)))) as client:
        page = await (await client.get("/events", params={"since": "1"})).json()
        assert [e["type"] for e in page["events"]] == ["framework_subscribed", "task_state"]
        assert page["next"] == 3 and page["first"] == 1
        assert (await (await client.get("/events?since=3")).json())["events"] == []
        bad = await client.get("/events?since=-1")
        assert bad.status == 400 and "since" in (await bad.json())["error"]

        response = await client.post("/tasks/kill", json={"task_id": "t1"})
        assert response.status == 202
        assert await response.json() == {"killing": True, "task_id": "t1", "framework_id": fid}
        assert isinstance(h.log[-1].message, KillTask)
        missing = await client.post("/tasks/kill", json={"task_id": "nope"})
        assert missing.status == 404 and "no live task" in (await missing.json())["error"]
        for body in ({"task": "t1"}, [1], {"task_id": "t1", "framework_id": 3}):
            assert (await client.post("/tasks/kill", json=body)).status == 400
        assert (await client.post("/tasks/kill", data=b"{")).status == 400
        assert h.metric("master/operator_calls_invalid") == 4


# Reproducers from the fuzz run (issue 12): each is a 4xx JSON answer naming what
# was wrong, never a 500, and refused bodies are counted.
NESTED = b"[" * 1000 + b"]" * 1000
NESTED_OBJECT = b'{"a":' * 1000 + b"1" + b"}" * 1000
HUGE = b"1" + b"0" * 309


@pytest.mark.parametrize(("method", "path", "body", "status", "reason"), [
    ("PUT", "/weights", NESTED, 400, "nested deeper"),
    ("PUT", "/quota", NESTED_OBJECT, 400, "nested deeper"),
    ("POST", "/tasks/kill", NESTED, 400, "nested deeper"),
    ("POST", "/machine/drain", NESTED_OBJECT, 400, "nested deeper"),
    ("POST", "/teardown", NESTED, 400, "nested deeper"),
    ("PUT", "/weights", b'[{"role": "eng", "weight": ' + HUGE + b"}]", 400, "digits exceeds"),
    ("PUT", "/quota", b'{"role": "eng", "limit": {"cpus": ' + HUGE + b"}}", 400, "digits exceeds"),
    ("PUT", "/quota", b'{"role": "eng", "limit": {"cpus": 1e309}}', 400, "out of range"),
    ("POST", "/tasks/kill", b'{"task_id": "\\ud800"}', 400, "lone surrogate"),
    ("POST", "/machine/drain", b'{"agent_id": "\\udfff"}', 400, "lone surrogate"),
    ("POST", "/tasks/kill", b'{"task_id": "t\\n1"}', 404, "no live task t\n1"),
    ("POST", "/machine/drain", b'{"agent_id": "a\\r\\nX-Evil: 1"}', 404, "a\r\nX-Evil: 1"),
    ("POST", "/teardown", b'{"framework_id": "f\\n"}', 404, "no active framework f\n"),
])
async def test_bad_operator_bodies_get_a_json_reason(method: str, path: str, body: bytes,
                                                     status: int, reason: str) -> None:
    h = Harness()
    async with TestClient(TestServer(make_app(HttpView(h)))) as client:
        response = await client.request(method, path, data=body,
                                        headers={"Content-Type": "application/json"})
        assert response.status == status
        answer = await response.json()
        assert reason in answer["error"] and answer["path"] == path
        assert "\n" not in response.reason
    assert h.metric("master/operator_calls_invalid") == (1 if status == 400 else 0)
    assert h.state.weights == {} and h.state.quota == {}


async def test_health_names_what_is_wrong() -> None:
    view = HttpView(Harness())
    async with TestClient(TestServer(make_app(view))) as client:
        assert await (await client.get("/health")).json() == {"healthy": True, "leader": True}
        view.problems = lambda: ["loop master-receive is not running"]  # type: ignore[method-assign]
        response = await client.get("/health")
        assert response.status == 503
        assert await response.json() == {"healthy": False, "leader": True,
                                          "problems": ["loop master-receive is not running"]}
