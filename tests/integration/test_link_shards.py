"""Link shards (issue 19): agents registered through a `LinkShard` look to the
master exactly like agents connected directly, a task runs through one, bad
input costs only itself, and an agent that moves (to another shard, or
directly to the master) is answered the way it came last."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio

from dyad import auth, keys_cli, messages as m
from dyad.ids import IdGenerator, new_uuid
from dyad.local import http_get_json
from dyad.messages import MAX_FRAME_BYTES
from dyad.resources import Resources
from dyad.security import ServerSecurity
from dyad.transport import Dealer
from master.link_shard import LinkShard
from master.model import MasterConfig
from master.server import MasterServer
from master.shard_wire import MAGIC, pack
from tests.helpers import wait_for
from tests.integration.conftest import Recorder
from tests.integration.test_cluster import command_task, final_state, first_offer
from tests.integration.test_master_batches import _next
from frameworks import FrameworkInfo, TaskState

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TASK = Resources.parse("cpus:1;mem:128")


async def _master() -> MasterServer:
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                          config=MasterConfig(allocation_interval=0.05),
                          ids=IdGenerator("shard-master"), shard_port=0)
    await server.start()
    return server


async def _shard(server: MasterServer) -> tuple[LinkShard, str]:
    shard = LinkShard(f"tcp://127.0.0.1:{server.shard_port}")
    port = await shard.start()
    return shard, f"tcp://127.0.0.1:{port}"


async def _register(agent: Dealer, name: str = "a") -> str:
    await agent.send(m.RegisterAgent(agent=m.AgentInfo(
        hostname=name, port=5051, resources=Resources.parse("cpus:4;mem:1024"))))
    return (await _next(agent, m.AgentRegistered)).agent_id


async def test_an_agent_registers_and_runs_a_task_through_a_shard() -> None:
    server = await _master()
    shard, endpoint = await _shard(server)
    agent, driver = Dealer(), Dealer()
    try:
        agent.connect(endpoint)
        driver.connect(server.info.zmq_endpoint)
        agent_id = await _register(agent)
        # The core sees the agent's own identity, as if it had come directly.
        assert server.state.agent_by_peer[agent.identity.hex()] == agent_id
        await driver.send(m.Subscribe(framework=m.FrameworkInfo(name="fw")))
        framework_id = (await _next(driver, m.Subscribed)).framework_id
        (offer,) = (await _next(driver, m.Offers)).offers
        task = m.TaskInfo(task_id="t0", name="t", agent_id=agent_id, resources=TASK,
                          command=m.CommandInfo(shell="true"))
        await driver.send(m.Accept(framework_id=framework_id, offer_ids=[offer.id],
                                   operations=[m.Operation(type="LAUNCH", tasks=[task])]))
        run = await _next(agent, m.RunTask)
        assert isinstance(run, m.RunTask) and run.task.task_id == "t0"
        status = m.TaskStatus(task_id="t0", state=m.TaskState.TASK_RUNNING,
                              source=m.Source.EXECUTOR, agent_id=agent_id, executor_id="t0",
                              uuid=new_uuid())
        await agent.send(m.StatusUpdate(framework_id=framework_id, status=status))
        update = await _next(driver, m.Update)
        assert isinstance(update, m.Update)
        assert update.status.state == m.TaskState.TASK_RUNNING
        metrics = server.metrics()
        assert metrics["master/shards/connected"] == 1
        assert metrics["master/shards/routes"] == 1
        assert metrics["master/shards/bad_frames"] == 0
    finally:
        agent.close()
        driver.close()
        await shard.stop()
        await server.stop()


async def test_garbage_from_agents_and_from_a_fake_shard_is_counted_and_nothing_stops() -> None:
    server = await _master()
    shard, endpoint = await _shard(server)
    ctx = zmq.asyncio.Context.instance()
    rude = ctx.socket(zmq.DEALER)
    fake = ctx.socket(zmq.DEALER)
    agent = Dealer()
    try:
        rude.connect(endpoint)
        await rude.send_multipart([b"one", b"two"])  # an agent's frame in two parts
        await rude.send(b"x" * (MAX_FRAME_BYTES + 1))  # larger than a frame may be
        fake.connect(f"tcp://127.0.0.1:{server.shard_port}")
        for junk in ([b'{"type":"Ping"}'], [MAGIC + b"\x00\x05"], [b"a", b"b"]):
            await fake.send_multipart(junk)
        await wait_for(lambda: shard.counts["agent_frames_bad"] == 1
                       and shard.counts["agent_frames_oversize"] == 1
                       and server.metrics()["master/shards/bad_frames"] == 3, timeout=10)
        agent.connect(endpoint)
        assert await _register(agent)  # both loops read on
        assert server.metrics()["master/internal_errors"] == 0
        assert shard.counts["internal_errors"] == 0
    finally:
        for sock in (rude, fake):
            sock.close(linger=0)
        agent.close()
        await shard.stop()
        await server.stop()


async def test_a_bad_frame_from_the_master_side_is_counted_by_the_shard() -> None:
    ctx = zmq.asyncio.Context.instance()
    fake_master = ctx.socket(zmq.ROUTER)
    port = fake_master.bind_to_random_port("tcp://127.0.0.1")
    shard = LinkShard(f"tcp://127.0.0.1:{port}")
    agent_port = await shard.start()
    agent = Dealer()
    try:
        agent.connect(f"tcp://127.0.0.1:{agent_port}")
        await agent.send_raw(b"hello")
        shard_id, frame = await asyncio.wait_for(fake_master.recv_multipart(), 10)
        assert frame.startswith(MAGIC)
        await fake_master.send_multipart([shard_id, b"not a shard frame"])
        await fake_master.send_multipart([shard_id, b"two", b"parts"])
        ((reply, _),) = pack([(agent.identity, b"", b'{"type":"Ping"}')])
        await fake_master.send_multipart([shard_id, reply])
        assert (await asyncio.wait_for(agent.recv(), 10)).error is not None  # the bytes came
        assert shard.counts["master_frames_bad"] == 2
    finally:
        agent.close()
        fake_master.close(linger=0)
        await shard.stop()


async def test_an_agent_that_moves_is_answered_the_way_it_came_last() -> None:
    server = await _master()
    first, first_endpoint = await _shard(server)
    second, second_endpoint = await _shard(server)
    name = "mover"
    try:
        for endpoint in (first_endpoint, second_endpoint, server.info.zmq_endpoint):
            agent = Dealer(identity=name)  # the same identity, reconnected elsewhere
            agent.connect(endpoint)
            try:
                assert await _register(agent)
            finally:
                agent.close()
        assert server.metrics()["master/shards/routes"] == 0  # came directly at last
    finally:
        await first.stop()
        await second.stop()
        await server.stop()


def test_the_benchmark_runs_through_link_shard_processes() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.master", "--agents", "20", "--quick",
         "--workers", "1", "--link-shards", "2", "--timeout", "120"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "link shards=2" in done.stdout
    assert "frameworks that got offers and launched: 1 of 1" in done.stdout
    assert "lost: 0 (must be 0)" in done.stdout
    assert "duplicate launches: 0" in done.stdout


async def test_a_real_agent_finds_its_master_through_a_shard_and_runs_a_task(
        make_cluster: Any, drivers: Any, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        shard_port = probe.getsockname()[1]
    cluster = make_cluster(agents=0, master_args=["--shard-port", str(shard_port)])
    started: list[subprocess.Popen[str]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        shard = subprocess.Popen(
            [sys.executable, "-m", "master.link_shard", "--listen", "127.0.0.1:0",
             "--master", f"tcp://127.0.0.1:{shard_port}", "--http", "127.0.0.1:0",
             "--master-http", cluster.master_address],
            stdout=subprocess.PIPE, text=True, env=env)
        started.append(shard)
        assert shard.stdout is not None
        line = shard.stdout.readline()  # ... on tcp://H:P http=http://H:Q master=...
        shard_http = line.split()[4].split("http://", 1)[1]
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent.main", "--master", shard_http, "--ip", "127.0.0.1",
             "--hostname", "127.0.0.1", "--port", "0", "--executor-port", "0",
             "--work-dir", str(tmp_path / "agent"), "--resources", "cpus:2;mem:1024;disk:1000",
             "--no-switch-user"], stdout=subprocess.DEVNULL, text=True, env=env)
        started.append(agent)
        recorder = Recorder()
        runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
        await runner.registered()
        offer = await first_offer(recorder)
        runner.driver.launch_tasks([offer.id], [command_task(offer, "hello", "echo hi")])
        status = await final_state(recorder, "hello")
        assert status.state == TaskState.TASK_FINISHED
        shard_metrics = http_get_json(f"http://{shard_http}/metrics/snapshot")
        assert shard_metrics["agent_frames"] > 0 and shard_metrics["agent_frames_bad"] == 0
        master_metrics = http_get_json(f"{cluster.master.url}/metrics/snapshot")
        assert master_metrics["master/shards/routes"] == 1
    finally:
        for process in reversed(started):
            process.terminate()
            process.wait(10)
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys") / "cluster"
    keys_cli.generate(directory, ["master", "agent", "shard"], hosts=["127.0.0.1"])
    return directory


def _keys(directory: Path, principal: str) -> auth.CurveKeys:
    return auth.load_keys(directory / "curve" / f"{principal}.key_secret")


async def test_with_curve_the_master_reads_only_shards_and_keeps_the_agents_principal(
        keys_dir: Path) -> None:
    credentials = auth.load_credentials(keys_dir / "credentials.json")
    master_keys, shard_keys, agent_keys = (_keys(keys_dir, p) for p in ("master", "shard", "agent"))
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                          config=MasterConfig(allocation_interval=0.05),
                          ids=IdGenerator("curve-shard-master"), shard_port=0,
                          shard_principals=frozenset({"shard"}),
                          secure=ServerSecurity(credentials=credentials, curve=master_keys))
    await server.start()
    shard = LinkShard(f"tcp://127.0.0.1:{server.shard_port}",
                      secure=ServerSecurity(credentials=credentials, curve=shard_keys),
                      master_key=master_keys.public)
    port = await shard.start()
    agent = Dealer(curve=agent_keys, server_key=shard_keys.public)
    # An agent's key on the shard port: admitted by ZAP, but not a shard.
    impostor = Dealer(curve=agent_keys, server_key=master_keys.public)
    try:
        impostor.connect(f"tcp://127.0.0.1:{server.shard_port}")
        ((frame, _),) = pack([(b"someone", b"operator", b'{"type":"Ping"}')])
        await impostor.send_raw(frame)
        await wait_for(lambda: server.metrics()["master/shards/not_a_shard"] == 1, timeout=10)
        agent.connect(f"tcp://127.0.0.1:{port}")
        agent_id = await _register(agent)
        assert server.state.authorizer.agent_owners[agent_id] == "agent"
        assert server.state.agent_by_peer[agent.identity.hex()] == agent_id
    finally:
        agent.close()
        impostor.close()
        await shard.stop()
        await server.stop()


async def test_with_curve_a_master_refuses_a_shard_port_without_shard_principals(
        keys_dir: Path) -> None:
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                          shard_port=0, secure=ServerSecurity(
                              credentials=auth.load_credentials(keys_dir / "credentials.json"),
                              curve=_keys(keys_dir, "master")))
    with pytest.raises(ValueError, match="principals"):
        await server.start()
    await server.stop()


async def test_a_shard_whose_master_is_away_answers_master_info_with_503() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        away = probe.getsockname()[1]
    shard = LinkShard(f"tcp://127.0.0.1:{away}", http=("127.0.0.1", 0),
                      master_http=f"127.0.0.1:{away}")
    await shard.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{shard.http_port}/master/info") as resp:
                assert resp.status == 503
                assert "master at" in (await resp.json())["error"]
            async with session.get(
                    f"http://127.0.0.1:{shard.http_port}/metrics/snapshot") as resp:
                assert (await resp.json())["agent_frames"] == 0
    finally:
        await shard.stop()
