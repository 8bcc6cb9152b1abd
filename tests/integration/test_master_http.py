"""In-process tests of the master's shell: a real `MasterServer` on loopback
(ports 0), its HTTP API through an aiohttp client, and its ZMQ ROUTER through a
real DEALER sending good and bad frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dyad.codec import from_json
from dyad.ids import IdGenerator
from dyad.messages import (
    MAX_FRAME_BYTES, AgentInfo, AgentRegistered, FrameworkInfo, MasterInfo, Message, Offers,
    RegisterAgent, Rejected, Subscribe, Subscribed, encode,
)
from dyad.resources import Resources
from dyad.transport import Dealer
from master.main import config_from, parse_args
from master.metrics import COUNTERS, GAUGES
from master.server import MasterServer
from master.model import AllocationTimed, MasterConfig
from tests.helpers import wait_for

DEADLINE = 5.0


@pytest.fixture
async def master() -> AsyncIterator[MasterServer]:
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                          config=MasterConfig(allocation_interval=0.05),
                          ids=IdGenerator("test-master"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def dealer(master: MasterServer) -> AsyncIterator[Dealer]:
    sock = Dealer()
    sock.connect(master.info.zmq_endpoint)
    try:
        yield sock
    finally:
        sock.close()


@pytest.fixture
def dealer_factory() -> Iterator[Callable[[str], Dealer]]:
    """Connected DEALERs, closed at the end of the test."""
    sockets: list[Dealer] = []

    def connect(endpoint: str) -> Dealer:
        sock = Dealer()
        sock.connect(endpoint)
        sockets.append(sock)
        return sock

    yield connect
    for sock in sockets:
        sock.close()


async def recv(sock: Dealer) -> Message:
    inbound = await asyncio.wait_for(sock.recv(), DEADLINE)
    assert inbound.error is None, inbound.error
    assert inbound.message is not None
    return inbound.message


async def recv_type(sock: Dealer, kind: type) -> Message:
    """Wait (with a deadline) for a message of `kind`, skipping heartbeats and pings."""
    async def wait() -> Message:
        while True:
            message = await recv(sock)
            if isinstance(message, kind):
                return message

    return await asyncio.wait_for(wait(), DEADLINE)


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_master_info(master: MasterServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{master.info.http_url}/master/info") as resp:
        assert resp.status == 200
        info = from_json(MasterInfo, await resp.json())
    assert info == master.info
    assert info.id == "test-master" and info.version == "0.1.0"
    assert info.port != 0 and info.zmq_port != 0
    assert info.address.port == info.port


async def test_state_health_metrics(master: MasterServer, http: aiohttp.ClientSession) -> None:
    base = master.info.http_url
    for path in ("/state", "/master/state"):
        async with http.get(base + path) as resp:
            assert resp.status == 200
            state = await resp.json()
        assert state["id"] == "test-master"
        assert state["leader_info"]["zmq_port"] == master.info.zmq_port
        assert state["agents"] == state["slaves"] == [] and state["frameworks"] == []
    async with http.get(base + "/health") as resp:
        assert resp.status == 200
        assert await resp.json() == {"healthy": True, "leader": True}
    async with http.get(base + "/metrics/snapshot") as resp:
        metrics = await resp.json()
    assert metrics["master/agents_active"] == 0
    assert metrics["master/messages_invalid"] == 0
    assert metrics["master/internal_errors"] == 0
    assert set(metrics) <= set(COUNTERS) | set(GAUGES), "every figure needs a catalogue entry"
    async with http.get(base + "/metrics") as resp:
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    assert families["dyad_master_internal_errors"].type == "counter"
    assert families["dyad_master_elected"].type == "gauge"
    assert families["dyad_master_registry_write_seconds"].type == "histogram"
    assert families["dyad_allocator_allocation_run_seconds"].type == "histogram"


async def test_http_errors_are_json(master: MasterServer, http: aiohttp.ClientSession) -> None:
    async with http.get(master.info.http_url + "/nope") as resp:
        assert resp.status == 404
        assert (await resp.json())["path"] == "/nope"
    async with http.post(master.info.http_url + "/state") as resp:
        assert resp.status == 405
        assert "GET" in resp.headers["Allow"]
        assert "error" in await resp.json()


async def test_garbage_frames_rejected_then_master_still_serves(
        master: MasterServer, http: aiohttp.ClientSession, dealer: Dealer) -> None:
    valid = json.loads(encode(Subscribe(framework=FrameworkInfo(name="fw"))))
    valid["body"]["framework"]["failover_timeout"] = "soon"
    garbage = [
        (b"\xff not json", "not JSON"),
        (b'{"type": "launch_missiles", "v": 1, "body": {}}', "unknown message type"),
        (json.dumps(valid).encode(), "framework.failover_timeout: expected float"),
        (b"x" * (MAX_FRAME_BYTES + 10), "exceeds"),
    ]
    for frame, reason in garbage:
        assert await dealer.send_raw(frame)
        reply = await recv(dealer)
        assert isinstance(reply, Rejected)
        assert reason in reply.reason
    assert master.metrics()["master/messages_invalid"] == len(garbage)

    await dealer.send(Subscribe(framework=FrameworkInfo(name="fw")))
    subscribed = await recv_type(dealer, Subscribed)
    assert isinstance(subscribed, Subscribed) and subscribed.master_info == master.info

    async with http.get(master.info.http_url + "/metrics/snapshot") as resp:
        metrics = await resp.json()
    assert metrics["master/messages_invalid"] == len(garbage)
    assert metrics["master/messages_rejected"] == len(garbage)
    assert metrics["master/frameworks_connected"] == 1
    assert metrics["master/internal_errors"] == 0


async def test_agent_and_framework_get_offers_over_the_wire(
        master: MasterServer, http: aiohttp.ClientSession, dealer: Dealer) -> None:
    agent = Dealer()
    agent.connect(master.info.zmq_endpoint)
    try:
        await agent.send(RegisterAgent(agent=AgentInfo(
            hostname="localhost", port=5051, resources=Resources.parse("cpus:2;mem:1024"))))
        registered = await recv_type(agent, AgentRegistered)
        assert isinstance(registered, AgentRegistered)
        await dealer.send(Subscribe(framework=FrameworkInfo(name="fw")))
        await recv_type(dealer, Subscribed)
        offers = await recv_type(dealer, Offers)
        assert isinstance(offers, Offers)
        assert offers.offers[0].agent_id == registered.agent_id

        async def offered() -> bool:
            async with http.get(master.info.http_url + "/state") as resp:
                state = await resp.json()
            return state["agents"][0]["offered_resources"]["cpus"] == 2.0

        await eventually(offered)

        async def timed() -> bool:
            metrics = master.metrics()
            return metrics["allocator/allocation_runs"] >= 2 and metrics["allocator/allocation_run_ms_p99"] > 0

        await eventually(timed)
    finally:
        agent.close()


def test_cli_parses_durations_and_checks_zk(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(["--port", "0", "--offer-timeout", "2m", "--allocation-interval", "200ms"])
    config = config_from(args)
    assert (args.port, config.offer_timeout, config.allocation_interval) == (0, 120.0, 0.2)
    assert config.agent_ping_timeout == 15.0 and config.max_agent_ping_timeouts == 5
    assert parse_args(["--zk", "zk://localhost:2181/dyad"]).zk.root == "/dyad"
    with pytest.raises(SystemExit):
        parse_args(["--zk", "localhost:2181"])
    assert "zk://" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--offer-timeout", "soon"])
    assert "invalid duration" in capsys.readouterr().err


async def test_operator_calls_go_through_the_core_and_reach_the_registry(
        tmp_path: Path, http: aiohttp.ClientSession, dealer_factory: Callable[[str], Dealer]
        ) -> None:
    """Weights, quota and teardown are events the core answers; a weight change is
    written to the registry because the core said so (PersistRegistry)."""
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                          config=MasterConfig(allocation_interval=0.05),
                          ids=IdGenerator("op-master"), work_dir=tmp_path)
    await server.start()
    try:
        base = server.info.http_url
        async with http.put(base + "/weights", json=[{"role": "eng", "weight": 2}]) as resp:
            assert resp.status == 200 and await resp.json() == [{"role": "eng", "weight": 2.0}]
        registry = tmp_path / "registry.json"
        await wait_for(lambda: registry.exists()
                       and json.loads(registry.read_text())["weights"] == {"eng": 2.0},
                       DEADLINE, "the weights in the registry")
        async with http.put(base + "/quota", json={"role": "eng", "limit": {"cpus": -1}}) as resp:
            assert resp.status == 400 and "limit of cpus" in (await resp.json())["error"]
        framework = dealer_factory(server.info.zmq_endpoint)
        await framework.send(Subscribe(framework=FrameworkInfo(name="fw")))
        subscribed = await recv_type(framework, Subscribed)
        assert isinstance(subscribed, Subscribed)
        body = {"framework_id": subscribed.framework_id}
        async with http.post(base + "/teardown", json=body) as resp:
            assert resp.status == 200
            assert await resp.json() == {"torn_down": True, **body}
        async with http.post(base + "/teardown", json=body) as resp:
            assert resp.status == 404 and "no active framework" in (await resp.json())["error"]
        metrics = server.metrics()
        assert metrics["master/operator_teardowns"] == 1
        assert metrics["master/operator_calls_invalid"] == 1
        assert metrics["master/frameworks_completed"] == 1
    finally:
        await server.stop()


# The frames from issue 12 that silenced the master's receive loop.
DEEP_FRAME = b"[" * 1000 + b"]" * 1000
LONG_NUMBER_FRAME = b'{"type":"acknowledge","v":' + b"1" * 4301 + b',"body":{}}'


async def test_frames_that_broke_the_decoder_do_not_silence_the_master(
        master: MasterServer, http: aiohttp.ClientSession, dealer: Dealer) -> None:
    """Whatever the decoder does with them, each is counted, the receive loop goes
    on, and the master still answers and reports healthy."""
    for frame in (DEEP_FRAME, LONG_NUMBER_FRAME) * 3:
        assert await dealer.send_raw(frame)
    await dealer.send(Subscribe(framework=FrameworkInfo(name="fw")))
    assert isinstance(await recv_type(dealer, Subscribed), Subscribed)
    metrics = master.metrics()
    assert metrics["master/messages_invalid"] + metrics["master/internal_errors"] == 6
    assert metrics["master/loop_restarts"] == 0
    async with http.get(master.info.http_url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["healthy"] is True


async def test_frames_that_broke_the_decoder_are_rejected_with_a_reason(
        master: MasterServer, dealer: Dealer) -> None:
    """The sender hears why (`Rejected`), like for any bad frame. Needs the bounded
    decoder in dyad/messages.py (issue 12); with json.loads it raises instead."""
    for frame in (DEEP_FRAME, LONG_NUMBER_FRAME):
        assert await dealer.send_raw(frame)
        reply = await recv(dealer)
        assert isinstance(reply, Rejected) and reply.reason
    assert master.metrics()["master/messages_invalid"] == 2
    assert master.metrics()["master/internal_errors"] == 0


async def test_a_loop_that_keeps_dying_takes_the_master_down(
        master: MasterServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that kills the event loop on every event: logged, counted, restarted,
    and after a few deaths the master steps down (dyad-master then exits 75)
    instead of running as a zombie; /health says why."""
    def broken() -> bool:
        raise RuntimeError("a bug in the shell")

    monkeypatch.setattr(master, "_lease_lapsed", broken)  # asked before every event
    for _ in range(10):  # each kills the loop once
        master.submit(AllocationTimed(0.001))
    reason = await asyncio.wait_for(master.lost, DEADLINE)
    assert reason.startswith("master-process failed")
    metrics = master.metrics()
    assert metrics["master/loop_restarts"] >= 5 and metrics["master/internal_errors"] >= 6
    async with http.get(master.info.http_url + "/health") as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["healthy"] is False
    assert any(problem.startswith("stepped down: master-process failed")
               for problem in body["problems"])
