"""The agent shell on real sockets and real processes, against a tiny fake master.

The fake master is a real `dyad.transport.Router` plus an aiohttp `/master/info`;
the executor is a small script written here that speaks the executor protocol with
`dyad.transport.Dealer`, so these tests depend on nothing from `frameworks/`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import yarl
import zmq
import zmq.asyncio
from aiohttp import web

from agent.metrics import COUNTERS, GAUGES
from agent.server import AgentServer
from agent.state import AgentConfig
from dyad.codec import to_json
from dyad.messages import (
    Address, AgentRegistered, ExecutorExited, ExecutorInfo, FrameworkInfo, KillTask,
    MasterInfo, Message, MessageError, Ping, Pong, Reason, RegisterAgent, Rejected, RunTask,
    StatusUpdate, StatusUpdateAck, TaskInfo, TaskState, CommandInfo, decode,
)
from dyad.resources import Resources
from dyad.transport import Router
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

FRAMEWORK = FrameworkInfo(name="shell-test", id="F1")

EXECUTOR_SCRIPT = r'''
"""A test executor. Modes: normal (finishes on kill or shutdown), crash (exits 3 once
its first update is acknowledged), stubborn (ignores shutdown and SIGTERM, and has a
child that does too)."""
import asyncio, os, signal, subprocess, sys, time, uuid

from dyad.messages import (KillTask, LaunchTask, RegisterExecutor, ShutdownExecutor,
                           Source, StatusUpdate, StatusUpdateAck, TaskState, TaskStatus)
from dyad.transport import Dealer

MODE = sys.argv[1]


async def main():
    dealer = Dealer()
    dealer.connect(os.environ["DYAD_AGENT_ENDPOINT"])
    framework_id, executor_id = os.environ["DYAD_FRAMEWORK_ID"], os.environ["DYAD_EXECUTOR_ID"]
    print(f"executor {executor_id} up in {os.getcwd()}", flush=True)
    if MODE == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child
        child = subprocess.Popen(["sleep", "60"])
        with open("child.pid", "w") as handle:
            handle.write(str(child.pid))
    await dealer.send(RegisterExecutor(framework_id=framework_id, executor_id=executor_id))
    terminal = set()

    async def update(task_id, state):
        status = TaskStatus(task_id=task_id, state=state, uuid=str(uuid.uuid4()),
                            source=Source.EXECUTOR, executor_id=executor_id,
                            timestamp=time.time())
        if state.is_terminal:
            terminal.add(status.uuid)
        await dealer.send(StatusUpdate(framework_id=framework_id, status=status))

    while True:
        msg = (await dealer.recv()).message
        if isinstance(msg, LaunchTask):
            await update(msg.task.task_id, TaskState.TASK_RUNNING)
        elif isinstance(msg, KillTask):
            await update(msg.task_id, TaskState.TASK_KILLED)
        elif isinstance(msg, StatusUpdateAck):
            if MODE == "crash":
                sys.exit(3)
            if msg.uuid in terminal:
                return
        elif isinstance(msg, ShutdownExecutor) and MODE != "stubborn":
            return


asyncio.run(main())
'''


class FakeMaster:
    """Answers RegisterAgent and records everything the agent sends."""

    def __init__(self) -> None:
        self.router = Router()
        self.inbox: list[Message | MessageError] = []
        self.agent: bytes | None = None
        self.acks_updates = False

    async def start(self) -> None:
        self.zmq_port = self.router.bind("127.0.0.1", 0)
        app = web.Application()
        app.router.add_get("/master/info", self._info)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        port = self.runner.addresses[0][1]
        self.address = f"127.0.0.1:{port}"
        self.info = MasterInfo(id="fake", hostname="localhost", ip="127.0.0.1", port=port,
                               zmq_port=self.zmq_port, version="test",
                               address=Address(hostname="localhost", ip="127.0.0.1", port=port))
        self.task = asyncio.create_task(self._receive())

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(to_json(self.info))

    async def _receive(self) -> None:
        while True:
            inbound = await self.router.recv()
            self.agent = inbound.identity
            msg = inbound.message
            self.inbox.append(msg if msg is not None else inbound.error)  # type: ignore[arg-type]
            if isinstance(msg, RegisterAgent):
                await self.send(AgentRegistered(agent_id="A1", master_info=self.info,
                                                ping_interval=10.0))
            elif isinstance(msg, StatusUpdate) and self.acks_updates:
                await self.ack(msg)

    async def send(self, msg: Message) -> None:
        assert self.agent is not None
        await self.router.send(self.agent, msg)

    async def ack(self, update: StatusUpdate) -> None:
        await self.send(StatusUpdateAck(agent_id="A1", framework_id=update.framework_id,
                                        task_id=update.status.task_id, uuid=update.status.uuid))

    def received(self, kind: type) -> list[Any]:
        return [m for m in self.inbox if isinstance(m, kind)]

    def states(self, task_id: str) -> list[str]:
        """The task's updates as the master saw them, resends collapsed."""
        seen = [m.status for m in self.received(StatusUpdate) if m.status.task_id == task_id]
        return [s.state.name for s in {s.uuid: s for s in seen}.values()]

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.runner.cleanup()
        self.router.close()


@pytest.fixture
async def master() -> Any:
    fake = FakeMaster()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def agent(master: FakeMaster, tmp_path: Path) -> Any:
    config = AgentConfig(
        hostname="localhost", ip="127.0.0.1", port=0, executor_port=0,
        work_dir=str(tmp_path / "agent"), python=sys.executable,
        resources=Resources.parse("cpus:4;mem:1024;ports:[31000-31100]"),
        status_update_backoff=0.2, status_update_backoff_max=0.4,
        executor_shutdown_grace_period=0.3, executor_kill_delay=0.3)
    server = AgentServer(config, master.address)
    await server.start()
    await wait_for(lambda: server.state.agent_id == "A1", what="registration")
    yield server
    await asyncio.wait_for(server.stop(), 15)


@pytest.fixture
def executor_script(tmp_path: Path) -> Path:
    path = tmp_path / "executor.py"
    path.write_text(EXECUTOR_SCRIPT)
    return path


def task_for(script: Path, task_id: str, mode: str) -> TaskInfo:
    executor = ExecutorInfo(executor_id=f"E-{task_id}",
                            command=CommandInfo(argv=[sys.executable, str(script), mode]))
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1",
                    resources=Resources.parse("cpus:1;mem:64"), executor=executor)


async def get(server: AgentServer, route: str, **query: Any) -> tuple[int, Any]:
    url = f"{server.http_url}{route}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        body = await resp.read()
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, body


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


# ------------------------------------------------------------------------ tests


async def test_register_ping_and_reject_garbage_from_the_master(
        master: FakeMaster, agent: AgentServer) -> None:
    (register,) = master.received(RegisterAgent)
    assert register.agent.id is None and register.agent.port == int(agent.http_url.split(":")[-1])
    await master.send(Ping(agent_id="A1"))
    assert await wait_for(lambda: master.received(Pong), what="pong") == [Pong(agent_id="A1")]
    assert master.agent is not None
    await master.router.send_raw(master.agent, b"junk")
    rejected = await wait_for(lambda: master.received(Rejected), what="rejected")
    assert rejected[0].reason.startswith("not JSON")
    status, metrics = await get(agent, "/metrics/snapshot")
    assert metrics["agent/registered"] == 1 and metrics["agent/messages_invalid"] == 1
    status, health = await get(agent, "/health")
    assert status == 200 and health["healthy"] is True


async def test_updates_are_retried_until_acked_then_kill_finishes_the_executor(
        master: FakeMaster, agent: AgentServer, executor_script: Path) -> None:
    await master.send(RunTask(framework=FRAMEWORK, task=task_for(executor_script, "t1", "normal")))
    running = await wait_for(lambda: master.received(StatusUpdate), what="TASK_RUNNING")
    assert running[0].status.state == TaskState.TASK_RUNNING
    assert running[0].status.source == "SOURCE_EXECUTOR"
    # Not acknowledged: the agent sends it again (backoff 0.2 s in this test).
    await wait_for(lambda: len(master.received(StatusUpdate)) >= 3, what="retries")
    assert {m.status.uuid for m in master.received(StatusUpdate)} == {running[0].status.uuid}
    master.acks_updates = True
    await master.ack(running[0])
    await master.send(KillTask(framework_id="F1", task_id="t1"))
    exited = await wait_for(lambda: master.received(ExecutorExited), what="executor exit")
    assert exited == [ExecutorExited(agent_id="A1", framework_id="F1", executor_id="E-t1",
                                     status=0)]
    assert master.states("t1") == ["TASK_RUNNING", "TASK_KILLED"]
    metrics = (await get(agent, "/metrics/snapshot"))[1]
    assert metrics["agent/status_updates_retried"] >= 2
    assert metrics["agent/tasks_killed"] == 1 and metrics["agent/executors_running"] == 0


async def test_executor_crash_fails_its_task_and_is_reported(
        master: FakeMaster, agent: AgentServer, executor_script: Path) -> None:
    master.acks_updates = True
    await master.send(RunTask(framework=FRAMEWORK, task=task_for(executor_script, "t2", "crash")))
    exited = await wait_for(lambda: master.received(ExecutorExited), what="executor exit")
    assert exited[0].status == 3
    assert master.states("t2") == ["TASK_RUNNING", "TASK_FAILED"]
    failed = master.received(StatusUpdate)[-1].status
    assert failed.reason == Reason.EXECUTOR_TERMINATED and "3" in failed.message
    assert failed.source == "SOURCE_AGENT"
    (framework,) = agent.state.snapshot()["completed_frameworks"]
    assert framework["completed_executors"][0]["exit_status"] == 3


async def test_files_api_serves_sandboxes_and_nothing_else(
        master: FakeMaster, agent: AgentServer, executor_script: Path) -> None:
    await master.send(RunTask(framework=FRAMEWORK, task=task_for(executor_script, "t3", "normal")))
    await wait_for(lambda: master.received(StatusUpdate), what="TASK_RUNNING")
    status, state = await get(agent, "/state")
    directory = state["frameworks"][0]["executors"][0]["directory"]
    assert directory.startswith(agent.config.work_dir) and os.path.isabs(directory)

    status, listing = await get(agent, "/files/browse", path=directory)
    assert status == 200
    assert {Path(e["path"]).name for e in listing} >= {"stdout", "stderr"}
    entry = next(e for e in listing if e["path"].endswith("/stdout"))
    assert set(entry) == {"path", "size", "mode", "mtime", "nlink", "uid", "gid"}
    assert entry["mode"].startswith("-r")

    stdout = f"{directory}/stdout"
    status, chunk = await get(agent, "/files/read", path=stdout, offset=0)
    assert status == 200 and chunk["offset"] == 0 and "executor E-t3 up" in chunk["data"]
    size = (await get(agent, "/files/read", path=stdout, offset=-1))[1]
    assert size == {"data": "", "offset": len(chunk["data"].encode())}
    part = (await get(agent, "/files/read", path=stdout, offset=2, length=5))[1]
    assert part == {"data": chunk["data"][2:7], "offset": 2}
    status, raw = await get(agent, "/files/download", path=stdout)
    assert status == 200 and raw == chunk["data"].encode()

    os.symlink("/etc/passwd", f"{directory}/escape")
    for path in ("/etc/passwd", f"{directory}/../../../../../../../../etc/passwd",
                 "../etc/passwd", f"{directory}/escape", "/"):
        status, body = await get(agent, "/files/read", path=path)
        assert status == 403 and body["error"], path
    assert (await get(agent, "/files/browse", path="/etc"))[0] == 403
    assert (await get(agent, "/files/read", path=f"{directory}/nope"))[0] == 404
    status, body = await get(agent, "/files/read", path=stdout, offset="abc")
    assert status == 400 and "offset" in body["error"]
    assert (await get(agent, "/files/read"))[0] == 400
    assert (await get(agent, "/files/read", path="relative/x"))[0] == 400
    assert (await get(agent, "/files/read", path=directory))[0] == 400


async def test_garbage_from_an_executor_is_rejected_and_the_agent_carries_on(
        agent: AgentServer) -> None:
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(agent.executor_endpoint)
    try:
        for frame in (b"not json", b'{"type":"status_update","v":1,"body":{}}',
                      b'{"type":"ping","v":1,"body":{"agent_id":"x"}}'):
            await sock.send(frame)
            reply = decode(await asyncio.wait_for(sock.recv(), 5))
            assert isinstance(reply, Rejected) and reply.reason
    finally:
        sock.close()
    status, metrics = await get(agent, "/metrics/snapshot")
    assert metrics["agent/messages_invalid"] == 3
    assert set(metrics) <= set(COUNTERS) | set(GAUGES)  # typed on /metrics
    assert (await get(agent, "/health"))[0] == 200


async def test_stopping_the_agent_kills_every_executor_process(
        master: FakeMaster, agent: AgentServer, executor_script: Path) -> None:
    master.acks_updates = True
    await master.send(RunTask(framework=FRAMEWORK,
                              task=task_for(executor_script, "t4", "stubborn")))
    await master.send(RunTask(framework=FRAMEWORK, task=task_for(executor_script, "t5", "normal")))
    await wait_for(lambda: len(master.received(StatusUpdate)) >= 2, what="both running")
    (directory,) = [e["directory"] for e in agent.state.snapshot()["frameworks"][0]["executors"]
                    if e["id"] == "E-t4"]
    child_pid_file = Path(directory, "child.pid")
    await wait_for(child_pid_file.exists, what="child pid")
    pids = agent.executor_pids + [int(child_pid_file.read_text())]
    assert len(pids) == 3 and not any(gone(pid) for pid in pids)
    started = time.monotonic()
    await asyncio.wait_for(agent.stop(), 10)
    assert time.monotonic() - started < 5
    await wait_for(lambda: all(gone(pid) for pid in pids), what="no process left")
    # The agent's farewell messages are flushed after it closed its sockets.
    await wait_for(lambda: len(master.received(ExecutorExited)) == 2, what="both exits")
    assert {m.executor_id: m.status for m in master.received(ExecutorExited)} == {
        "E-t4": -9, "E-t5": 0}


RECURSIVE = b"[" * 1000 + b"]" * 1000
HUGE_NUMBER = b'{"type":"acknowledge","v":' + b"1" * 4301 + b',"body":{}}'
ODD_IDS = (b'{"type":"register_executor","v":1,"body":'
           b'{"framework_id":"\\ud800","executor_id":"a\\nb"}}')


async def test_frames_that_break_a_decoder_cost_only_themselves(agent: AgentServer) -> None:
    """Issue 12, reproducer 1 on the executor socket: a frame whose decoding raises
    something other than MessageError used to end the receive loop for good."""
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(agent.executor_endpoint)
    try:
        for frame in (RECURSIVE, HUGE_NUMBER, RECURSIVE, ODD_IDS,
                      b'{"type":"status_update","v":1,"body":{}}'):
            await sock.send(frame)

        async def the_probes_answer() -> Message:
            while True:  # earlier frames may be answered too (once decode rejects them)
                reply = decode(await sock.recv())
                if isinstance(reply, Rejected) and reply.message_type == "status_update":
                    return reply
        assert (await asyncio.wait_for(the_probes_answer(), 10)).reason
    finally:
        sock.close()
    status, metrics = await get(agent, "/metrics/snapshot")
    # Each of the five frames is refused and counted once as invalid: the three
    # that broke the decoder, the lone surrogate (refused at decoding) and the
    # probe. None of them is left to the receive loop's last-resort guard.
    assert metrics["agent/messages_invalid"] == 5 and metrics["agent/receive_errors"] == 0
    assert (await get(agent, "/health")) == (200, {"healthy": True})


async def test_odd_paths_are_answered_4xx_with_a_json_reason(agent: AgentServer) -> None:
    sandboxes = f"{agent.config.work_dir}/frameworks"
    os.makedirs(sandboxes, exist_ok=True)
    async with aiohttp.ClientSession() as session:
        for raw in ("a%0Ab", "a%0D%0AX-Injected:%201", "%ED%A0%80", "%F0%28%8C%28",
                    "%5Cud800", "a%00b", "x" * 5000):
            for route in ("/files/read", "/files/browse", "/files/download"):
                url = yarl.URL(f"{agent.http_url}{route}?path={sandboxes}/{raw}",
                               encoded=True)
                async with session.get(url) as resp:
                    assert 400 <= resp.status < 500, (route, raw, resp.status)
                    assert "X-Injected" not in resp.headers
                    assert (await resp.json())["error"]
    for offset in ("9" * 400, "1" * 4301, "²", "--1", "1e3", "0x10"):
        status, body = await get(agent, "/files/read", path=f"{sandboxes}/x", offset=offset)
        assert status == 400 and "offset" in body["error"], offset
    assert (await get(agent, "/health"))[0] == 200
    # Each was refused for what it is, not caught as a surprise.
    assert (await get(agent, "/metrics/snapshot"))[1]["agent/http_errors"] == 0
