"""The agent keeping real tasks in line: memory limits, kill policy, health checks,
the fetcher and its cache, logs after exit -- real processes run by the agent itself
(and, where it matters, under the real command executor), an in-process agent, and
the fake master of `test_agent_shell`.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.isolation import IsolationError, detect
from agent.model import AgentConfig
from agent.server import AgentOptions, AgentServer
from dyad.messages import (
    URI, CommandInfo, FrameworkInfo, HealthCheck, HealthCheckType, KillTask, Reason,
    RunTask, StatusUpdate, TaskInfo, TaskState, TaskStatus,
)
from dyad.resources import Resources

from .test_agent_shell import FakeMaster, get, wait_for

pytestmark = pytest.mark.integration

FRAMEWORK = FrameworkInfo(name="agent-tasks", id="F1")
PY = sys.executable


def command_task(task_id: str, shell: str, resources: str = "cpus:0.5;mem:64",
                 **kw: Any) -> TaskInfo:
    uris = kw.pop("uris", [])
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1",
                    resources=Resources.parse(resources),
                    command=CommandInfo(shell=shell, uris=uris), **kw)


async def start_agent(master: FakeMaster, work_dir: Path, isolation: str = "posix",
                      command_tasks: str = "direct", **options: Any) -> AgentServer:
    config = AgentConfig(
        hostname="localhost", ip="127.0.0.1", port=0, executor_port=0,
        work_dir=str(work_dir), python=PY, isolation=isolation, command_tasks=command_tasks,
        resources=Resources.parse("cpus:4;mem:4096;ports:[31000-31100]"),
        status_update_backoff=0.2, status_update_backoff_max=0.4,
        executor_shutdown_grace_period=1.0, executor_kill_delay=0.5)
    server = AgentServer(config, master.address,
                         options=AgentOptions(**{"usage_interval": 0.2, **options}))
    await server.start()
    await wait_for(lambda: server.state.agent_id == "A1", what="registration")
    return server


@pytest.fixture
async def master() -> Any:
    fake = FakeMaster()
    await fake.start()
    fake.acks_updates = True
    yield fake
    await fake.stop()


@pytest.fixture
async def agent(master: FakeMaster, tmp_path: Path) -> Any:
    server = await start_agent(master, tmp_path / "agent")
    yield server
    await asyncio.wait_for(server.stop(), 20)


def statuses(master: FakeMaster, task_id: str) -> list[TaskStatus]:
    seen = [m.status for m in master.received(StatusUpdate) if m.status.task_id == task_id]
    return list({s.uuid: s for s in seen}.values())


async def final(master: FakeMaster, task_id: str, timeout: float = 20.0) -> TaskStatus:
    def terminal() -> TaskStatus | None:
        done = [s for s in statuses(master, task_id) if s.state.is_terminal]
        return done[-1] if done else None
    return await wait_for(terminal, timeout, f"{task_id} to end")


async def running(master: FakeMaster, task_id: str) -> None:
    await wait_for(lambda: any(s.state == TaskState.TASK_RUNNING
                               for s in statuses(master, task_id)), 20, f"{task_id} running")


HOG = f"exec {PY} -c \"import time; x = b'x' * (400 * 2 ** 20); time.sleep(60)\""


def _cgroups_available() -> bool:
    try:
        detect("cgroups", "dyad-test")
    except IsolationError:
        return False
    return True


@pytest.mark.parametrize("isolation,command_tasks", [
    ("posix", "direct"), ("posix", "executor"),
    pytest.param("cgroups", "direct", marks=pytest.mark.skipif(
        not _cgroups_available(), reason="no writable cgroups on this machine"))])
async def test_a_task_over_its_memory_limit_fails_with_the_memory_reason(
        master: FakeMaster, tmp_path: Path, isolation: str, command_tasks: str) -> None:
    server = await start_agent(master, tmp_path / "agent", isolation, command_tasks,
                               cgroups_root="dyad-test")
    try:
        assert server.isolator.kind == isolation
        await master.send(RunTask(framework=FRAMEWORK, task=command_task("hog", HOG)))
        status = await final(master, "hog")
        assert status.state == TaskState.TASK_FAILED, status
        assert status.reason == Reason.CONTAINER_LIMITATION_MEMORY
        assert "Memory limit exceeded" in status.message and "MiB" in status.message
        # 64 MiB asked, + the command executor's 64 if it has one
        assert ("64.0 MiB" if command_tasks == "direct" else "128.0 MiB") in status.message
        await wait_for(lambda: not server.executor_pids, what="the run to be gone")
        assert (await get(server, "/metrics/snapshot"))[1]["agent/executors_memory_limited"] == 1
    finally:
        await asyncio.wait_for(server.stop(), 20)
        _remove_cgroup_roots("dyad-test")


def _remove_cgroup_roots(root: str) -> None:
    """The test's own cgroup roots, once empty (the runs under them are gone)."""
    for hierarchy in ("memory", "cpu", "unified"):
        try:
            os.rmdir(f"/sys/fs/cgroup/{hierarchy}/{root}")
        except OSError:
            pass


async def test_usage_is_sampled_and_shown(master: FakeMaster, agent: AgentServer) -> None:
    burn = f"exec {PY} -c \"import time\nt = time.time()\nwhile time.time() - t < 30: pass\""
    await master.send(RunTask(framework=FRAMEWORK, task=command_task("burn", burn)))
    await running(master, "burn")

    async def busy() -> Any:
        entries = (await get(agent, "/monitor/statistics"))[1]
        stats = entries[0]["statistics"] if entries else {}
        # The burner's share of a busy machine varies; any use, steadily adding up, will do.
        busy = stats.get("processes", 0) >= 1 and stats["cpus_used"] > 0
        return entries if busy and stats["cpus_user_time_secs"] > 0.2 else None
    (entry,) = await wait_for(busy, 15, "the task to show CPU use")
    assert entry["executor_id"] == "burn" and entry["task_ids"] == ["burn"]
    stats = entry["statistics"]
    # The burner (a Python process) alone: no shim, no command executor's 40 MiB.
    assert stats["processes"] == 1
    assert stats["mem_rss_bytes"] > 5 * 2 ** 20 and stats["cpus_user_time_secs"] > 0
    assert stats["cpus_limit"] == pytest.approx(0.5)  # what it asked: no executor to add
    assert stats["mem_limit_bytes"] == 64 * 2 ** 20
    await master.send(KillTask(framework_id="F1", task_id="burn"))
    assert (await final(master, "burn")).state == TaskState.TASK_KILLED


async def test_a_task_ignoring_sigterm_is_sigkilled_after_its_grace_period(
        master: FakeMaster, agent: AgentServer) -> None:
    stubborn = "trap '' TERM; echo ready; while true; do sleep 0.1; done"
    await master.send(RunTask(framework=FRAMEWORK, task=command_task(
        "stubborn", stubborn, kill_grace_period=1.5)))
    await running(master, "stubborn")
    started = time.monotonic()
    await master.send(KillTask(framework_id="F1", task_id="stubborn"))
    status = await final(master, "stubborn")
    elapsed = time.monotonic() - started
    assert status.state == TaskState.TASK_KILLED and "SIGKILL" in status.message
    assert 1.5 <= elapsed < 6, elapsed
    assert [s.state.name for s in statuses(master, "stubborn")][-2:] == [
        "TASK_KILLING", "TASK_KILLED"]


FLAKY_SERVER = r'''
import http.server, sys
answers = {"n": 0}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        answers["n"] += 1
        self.send_response(200 if answers["n"] <= 2 else 500)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''


async def test_a_failing_http_health_check_kills_the_task(
        master: FakeMaster, agent: AgentServer, tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY_SERVER)
    # The grace period covers the server's start-up (refused connections do not
    # count); once it answered healthy, failures count at once.
    check = HealthCheck(type=HealthCheckType.HTTP, port=31005, path="/health", delay=0.3,
                        interval=0.3, timeout=2, grace_period=20, consecutive_failures=2)
    await master.send(RunTask(framework=FRAMEWORK, task=command_task(
        "web", f"exec {PY} {script} 31005", "cpus:0.5;mem:64;ports:[31005]",
        health_check=check)))
    status = await final(master, "web")
    assert status.state == TaskState.TASK_FAILED and status.reason == Reason.TASK_UNHEALTHY
    assert "HTTP GET http://127.0.0.1:31005/health" in status.message
    assert "2 consecutive" in status.message and "HTTP 500" in status.message
    health = [(s.healthy, s.reason) for s in statuses(master, "web") if s.healthy is not None]
    assert health == [(True, Reason.TASK_HEALTH_CHECK_STATUS_UPDATED),
                      (False, Reason.TASK_HEALTH_CHECK_STATUS_UPDATED)]
    metrics = (await get(agent, "/metrics/snapshot"))[1]
    assert metrics["agent/tasks_killed_unhealthy"] == 1
    assert metrics["agent/health_checks_failed"] >= 2  # refusals while it started count too


async def test_command_and_tcp_health_checks_report_health(
        master: FakeMaster, agent: AgentServer) -> None:
    command = HealthCheck(type=HealthCheckType.COMMAND, delay=0, interval=0.2, timeout=2,
                          consecutive_failures=0,
                          command=CommandInfo(shell='test "$DYAD_TASK_ID" = cmd'))
    tcp = HealthCheck(type=HealthCheckType.TCP, port=31006, delay=0, interval=0.2,
                      timeout=2, grace_period=0, consecutive_failures=0)
    await master.send(RunTask(framework=FRAMEWORK, task=command_task("cmd", "sleep 30",
                                                                     health_check=command)))
    await master.send(RunTask(framework=FRAMEWORK, task=command_task(
        "tcp", "sleep 30", "cpus:0.5;mem:64;ports:[31006]", health_check=tcp)))

    def health(task_id: str) -> list[bool | None]:
        return [s.healthy for s in statuses(master, task_id) if s.healthy is not None]
    await wait_for(lambda: health("cmd") == [True] and health("tcp") == [False], 15,
                   "health updates")
    status, state = await get(agent, "/state")
    tasks = {t["id"]: t for f in state["frameworks"] for e in f["executors"] for t in e["tasks"]}
    assert tasks["cmd"]["healthy"] is True and tasks["tcp"]["healthy"] is False


def _tarball() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as bundle:
        payload = b"#!/bin/sh\necho packaged-tool-ran\n"
        info = tarfile.TarInfo("pkg/tool.sh")
        info.size, info.mode = len(payload), 0o755
        bundle.addfile(info, io.BytesIO(payload))
    return data.getvalue()


async def test_uris_are_fetched_extracted_cached_and_failures_name_the_url(
        master: FakeMaster, agent: AgentServer) -> None:
    hits: list[str] = []
    tarball = _tarball()

    async def serve(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=tarball)
    app = web.Application()
    app.router.add_get("/pkg.tar.gz", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/pkg.tar.gz"
    try:
        for task_id in ("fetch1", "fetch2"):
            await master.send(RunTask(framework=FRAMEWORK, task=command_task(
                task_id, "./pkg/tool.sh", uris=[URI(value=url, cache=True)])))
            assert (await final(master, task_id)).state == TaskState.TASK_FINISHED
        assert hits == ["/pkg.tar.gz"]  # the second came from the cache
        metrics = (await get(agent, "/metrics/snapshot"))[1]
        assert metrics["fetcher/cache_hits"] == 1 and metrics["fetcher/cache_misses"] == 1
        await wait_for(lambda: agent.state.cached_uris == [url], what="cache report")

        missing = url.replace("pkg.tar.gz", "nope.tar.gz")
        await master.send(RunTask(framework=FRAMEWORK, task=command_task(
            "fetch3", "true", uris=[URI(value=missing)])))
        failed = await final(master, "fetch3")
        assert failed.state == TaskState.TASK_FAILED and failed.reason == Reason.FETCH_FAILED
        assert missing in failed.message and "404" in failed.message
    finally:
        await runner.cleanup()

    def finished_sandbox() -> str | None:
        state = agent.state.snapshot()
        return next((e["directory"] for f in state["completed_frameworks"]
                     for e in f["completed_executors"] if e["id"] == "fetch2"), None)
    directory = await wait_for(finished_sandbox, what="fetch2's executor to exit")
    status, chunk = await get(agent, "/files/read", path=f"{directory}/stdout", offset=0)
    assert status == 200 and "packaged-tool-ran" in chunk["data"]  # readable after exit
    assert (await get(agent, "/files/read", path=f"{directory}/pkg.tar.gz", offset=-1))[0] == 200


async def test_a_task_cannot_have_the_fetcher_copy_a_host_file(
        master: FakeMaster, agent: AgentServer) -> None:
    """Issue 17: `file:///etc/passwd` used to be copied into the sandbox and then
    served from it by `/files`. By default no local URI is fetched at all."""
    await master.send(RunTask(framework=FRAMEWORK, task=command_task(
        "steal", "cat passwd", uris=[URI(value="file:///etc/passwd")])))
    failed = await final(master, "steal")
    assert failed.state == TaskState.TASK_FAILED and failed.reason == Reason.FETCH_FAILED
    assert "file:///etc/passwd" in failed.message
    assert "--fetcher-allowed-paths" in failed.message
    (framework,) = agent.state.snapshot()["completed_frameworks"]
    sandbox = framework["completed_executors"][0]["directory"]
    assert not os.path.exists(f"{sandbox}/passwd")


async def test_chatty_logs_are_rotated_and_finished_sandboxes_collected(
        master: FakeMaster, tmp_path: Path) -> None:
    server = await start_agent(master, tmp_path / "agent", log_max_size=64 * 1024,
                               log_keep=1, gc_delay=0.0, disk_watch_interval=3600.0)
    try:
        chatty = "head -c 2000000 /dev/zero | tr '\\0' x; echo; echo tail-line; sleep 30"
        await master.send(RunTask(framework=FRAMEWORK, task=command_task("chatty", chatty)))
        await running(master, "chatty")
        (directory,) = [e["directory"] for e in server.state.snapshot()["frameworks"][0][
            "executors"]]
        stdout = Path(directory, "stdout")
        await wait_for(lambda: Path(directory, "stdout.1").exists()
                       and stdout.stat().st_size < 64 * 1024, what="rotation")
        assert Path(directory, "stdout.1").stat().st_size <= 64 * 1024
        assert not Path(directory, "stdout.2").exists()
        assert (await get(server, "/metrics/snapshot"))[1]["agent/logs_rotated"] >= 1

        await master.send(KillTask(framework_id="F1", task_id="chatty"))
        await final(master, "chatty")
        await wait_for(lambda: not server.state.frameworks, what="the run to end")
        assert await server.collect_garbage() == 1
        assert not Path(directory).exists()
        assert (await get(server, "/files/read", path=str(stdout)))[0] == 404
    finally:
        await asyncio.wait_for(server.stop(), 20)


async def test_fifos_and_symlink_loops_in_a_sandbox_are_refused_without_stalling_the_agent(
        master: FakeMaster, agent: AgentServer) -> None:
    """Issue 12, reproducer 4: eight reads of a task's FIFO used to block every
    default worker thread, after which tasks stopped ending."""
    await master.send(RunTask(framework=FRAMEWORK, task=command_task(
        "fifo", "mkfifo pipe && ln -s loop loop && echo made && exec sleep 60")))
    await running(master, "fifo")
    (executor,) = agent.state.snapshot()["frameworks"][0]["executors"]
    sandbox = executor["directory"]
    await wait_for(lambda: os.path.islink(f"{sandbox}/loop"), 10, "the FIFO and the loop")

    started = time.monotonic()
    reads = await asyncio.wait_for(asyncio.gather(*(
        get(agent, "/files/read", path=f"{sandbox}/pipe") for _ in range(8))), 10)
    assert time.monotonic() - started < 5
    for status, body in reads:
        assert status == 400 and "not a regular file" in body["error"]
    for route in ("/files/download", "/files/browse"):
        status, body = await get(agent, route, path=f"{sandbox}/pipe")
        assert 400 <= status < 500 and body["error"], route
    for route in ("/files/read", "/files/download", "/files/browse"):
        status, body = await get(agent, route, path=f"{sandbox}/loop")
        assert status == 400 and "symbolic links" in body["error"], (route, body)
    status, listing = await get(agent, "/files/browse", path=sandbox)
    assert status == 200 and any(e["mode"].startswith("p") for e in listing)

    # The agent still runs and ends tasks, and checkpoints as it goes.
    await master.send(RunTask(framework=FRAMEWORK, task=command_task("after", "echo done")))
    assert (await final(master, "after")).state == TaskState.TASK_FINISHED
    await master.send(KillTask(framework_id="F1", task_id="fifo"))
    assert (await final(master, "fifo")).state == TaskState.TASK_KILLED
    assert (await get(agent, "/health"))[0] == 200
