"""Tasks in real containers through the agent: its Docker containerizer against a
private engine (`docker_engine`), the fake master of `test_agent_shell`, and the
busybox test image. Skipped without an engine unless DYAD_DOCKER_REQUIRED=1."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from agent.model import AgentConfig
from agent.server import AgentOptions, AgentServer
from dyad.containers import ContainerInfo, DockerInfo, Network, PortMapping
from dyad.messages import (
    CommandInfo,
    FrameworkInfo,
    HealthCheck,
    HealthCheckType,
    KillTask,
    Reason,
    RegisterAgent,
    RunTask,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from dyad.resources import Resources
from tests.helpers import wait_for

from .docker_engine import TEST_IMAGE, DockerEngine, docker_engine  # noqa: F401 (fixture)
from .test_agent_shell import FakeMaster, get
from .test_agent_tasks import final, master, statuses  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

FRAMEWORK = FrameworkInfo(name="docker-tasks", id="F1")
RESOURCES = "cpus:4;mem:2048;ports:[31000-31100]"


def container_task(task_id: str, shell: str, resources: str = "cpus:0.5;mem:64", *,
                   network: str = Network.NONE, mappings: tuple[PortMapping, ...] = (),
                   env: dict[str, str] | None = None, **kw: Any) -> TaskInfo:
    docker = DockerInfo(image=TEST_IMAGE, network=network, port_mappings=list(mappings))
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1",
                    resources=Resources.parse(resources),
                    command=CommandInfo(shell=shell, environment=env or {}),
                    container=ContainerInfo(docker=docker), **kw)


def options(engine: DockerEngine) -> AgentOptions:
    return AgentOptions(usage_interval=0.2, containerizers=("process", "docker"),
                        docker_socket=engine.socket_path)


@pytest.fixture
async def agent(master: FakeMaster, docker_engine: DockerEngine, tmp_path: Path) -> Any:
    config = AgentConfig(
        hostname="localhost", ip="127.0.0.1", port=0, executor_port=0,
        work_dir=str(tmp_path / "agent"), python=sys.executable,
        resources=Resources.parse(RESOURCES), status_update_backoff=0.2,
        status_update_backoff_max=0.4, executor_shutdown_grace_period=1.0,
        executor_kill_delay=1.0)
    server = AgentServer(config, master.address, options=options(docker_engine))
    await server.start()
    await wait_for(lambda: server.state.agent_id == "A1", what="registration")
    yield server
    await asyncio.wait_for(server.stop(), 30)


async def running(master: FakeMaster, task_id: str) -> TaskStatus:
    return await wait_for(lambda: next((s for s in statuses(master, task_id)
                                        if s.state == TaskState.TASK_RUNNING), None),
                          30, f"{task_id} running")


def executor_view(state: dict[str, Any], executor_id: str) -> dict[str, Any] | None:
    for framework in state["frameworks"] + state["completed_frameworks"]:
        for executor in framework["executors"] + framework["completed_executors"]:
            if executor["id"] == executor_id:
                return executor
    return None


async def test_a_tasks_output_is_in_its_sandbox_and_its_environment_inside(
        agent: AgentServer, master: FakeMaster, docker_engine: DockerEngine) -> None:
    task = container_task("hello", "echo out $GREETING $PORT0; echo err >&2; "
                                   "echo $MESOS_SANDBOX; pwd; ls $MESOS_SANDBOX",
                          env={"GREETING": "hi", "PORT0": "31005"})
    await master.send(RunTask(framework=FRAMEWORK, task=task))
    status = await final(master, "hello")
    assert status.state == TaskState.TASK_FINISHED, status
    assert [s.state for s in statuses(master, "hello")] == [TaskState.TASK_RUNNING,
                                                          TaskState.TASK_FINISHED]
    _, state = await get(agent, "/state")
    view = executor_view(state, "hello")
    assert view is not None and view["container_id"]
    out = Path(view["directory"], "stdout").read_text()
    assert out.splitlines()[:3] == ["out hi 31005", "/mnt/mesos/sandbox", "/mnt/mesos/sandbox"]
    assert "stdout" in out.splitlines()[3:]  # the sandbox itself is mounted
    assert Path(view["directory"], "stderr").read_text() == "err\n"
    code, read = await get(agent, f"/files/read?path={view['directory']}/stdout&offset=0")
    assert code == 200 and "out hi 31005" in read["data"]
    # Removed from the engine once its end is written down.
    async with docker_engine.client() as client:
        async def gone() -> bool:
            return view["container_id"] not in {c.id for c in await client.list()}
        await wait_for(gone, 10, "the container removed")


async def test_over_its_memory_limit_it_fails_with_the_memory_reason(
        agent: AgentServer, master: FakeMaster) -> None:
    # dd holds a 64 MiB block; the task asked for 16 MiB, the container has no swap.
    task = container_task("hog", "dd if=/dev/zero of=/dev/null bs=64M count=4",
                          "cpus:0.5;mem:16")
    await master.send(RunTask(framework=FRAMEWORK, task=task))
    status = await final(master, "hog")
    assert status.state == TaskState.TASK_FAILED, status
    assert status.reason == Reason.CONTAINER_LIMITATION_MEMORY
    assert "16.0 MiB" in status.message


async def test_a_kill_stops_it_with_its_grace_then_sigkill(
        agent: AgentServer, master: FakeMaster) -> None:
    polite = container_task("polite", "trap 'echo bye; exit 0' TERM; echo ready; "
                                      "while true; do sleep 0.1; done", kill_grace_period=5.0)
    stubborn = container_task("stubborn", "trap '' TERM; echo ready; "
                                          "while true; do sleep 0.1; done",
                              kill_grace_period=1.0)
    for task in (polite, stubborn):
        await master.send(RunTask(framework=FRAMEWORK, task=task))
    for task in (polite, stubborn):
        await running(master, task.task_id)
        view = await wait_for(lambda t=task: executor_view(agent.state.snapshot(), t.task_id))
        stdout = Path(view["directory"], "stdout")
        await wait_for(lambda o=stdout: "ready" in o.read_text(), 10, "the trap to be set")
    for task in (polite, stubborn):
        await master.send(KillTask(framework_id="F1", task_id=task.task_id))
    done = await final(master, "polite")
    assert done.state == TaskState.TASK_KILLED and "status 0" in done.message, done
    view = executor_view(agent.state.snapshot(), "polite")
    assert view is not None and "bye" in Path(view["directory"], "stdout").read_text()
    killed = await final(master, "stubborn")
    assert killed.state == TaskState.TASK_KILLED and "137" in killed.message, killed
    assert TaskState.TASK_KILLING in [s.state for s in statuses(master, "stubborn")]


async def test_an_http_health_check_goes_through_the_bridged_port(
        agent: AgentServer, master: FakeMaster) -> None:
    check = HealthCheck(type=HealthCheckType.HTTP, port=8080, path="/index.html", delay=0.2,
                        interval=0.5, timeout=2.0, grace_period=10.0)
    task = container_task("web", "exec httpd -f -p 8080 -h /www",
                          "cpus:0.5;mem:64;ports:[31042-31042]", network=Network.BRIDGE,
                          mappings=(PortMapping(host_port=31042, container_port=8080),),
                          health_check=check)
    await master.send(RunTask(framework=FRAMEWORK, task=task))
    healthy = await wait_for(lambda: next((s for s in statuses(master, "web")
                                           if s.healthy is True), None), 30, "healthy")
    assert healthy.state == TaskState.TASK_RUNNING
    stats = await wait_for(lambda: [e for e in agent.state.statistics()
                                    if e["executor_id"] == "web"], 10, "usage")
    assert stats[0]["statistics"]["mem_rss_bytes"] > 0
    assert stats[0]["statistics"]["mem_limit_bytes"] == 64 * 1024 * 1024
    _, listed = await get(agent, "/monitor/statistics")
    assert any(e["executor_id"] == "web" for e in listed)


async def test_a_missing_image_fails_the_task_with_the_engines_words(
        agent: AgentServer, master: FakeMaster) -> None:
    task = attrs.evolve(container_task("missing", "true"), container=ContainerInfo(
        docker=DockerInfo(image="127.0.0.1:1/nowhere:1", network=Network.NONE)))
    await master.send(RunTask(framework=FRAMEWORK, task=task))
    status = await final(master, "missing")
    assert status.state == TaskState.TASK_FAILED
    assert status.reason == Reason.CONTAINER_LAUNCH_FAILED and "pull" in status.message


async def test_a_sigkilled_agent_reattaches_to_the_same_running_container(
        master: FakeMaster, docker_engine: DockerEngine, tmp_path: Path) -> None:
    work_dir = tmp_path / "agent"
    argv = [sys.executable, "-m", "agent.main", "--master", master.address,
            "--ip", "127.0.0.1", "--hostname", "localhost", "--port", "0",
            "--work-dir", str(work_dir), "--resources", RESOURCES,
            "--containerizers", "process,docker", "--docker-socket", docker_engine.socket_path,
            "--usage-interval", "0.2s"]
    log_path = tmp_path / "agent.log"

    def start() -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    first = start()
    second: subprocess.Popen[bytes] | None = None
    try:
        await wait_for(lambda: master.received(RegisterAgent), 20, "registration")
        task = container_task("survivor", "i=0; while true; do echo tick $i; i=$((i+1)); "
                                          "sleep 0.2; done")
        await master.send(RunTask(framework=FRAMEWORK, task=task))
        await running(master, "survivor")
        async with docker_engine.client() as client:
            (before,) = [c for c in await client.list(labels={"dyad.task_id": "survivor"})]
            first.kill()  # SIGKILL: no goodbye
            first.wait()
            assert (await client.inspect(before.id)).running
            registrations = len(master.received(RegisterAgent))
            second = start()
            await wait_for(lambda: len(master.received(RegisterAgent)) > registrations, 20,
                           "re-registration")
            after = await client.list(labels={"dyad.task_id": "survivor"})
            assert [c.id for c in after] == [before.id]
            assert (await client.inspect(before.id)).running
            # Still under control: a kill reaches the adopted container.
            await master.send(KillTask(framework_id="F1", task_id="survivor"))
            status = await final(master, "survivor")
            assert status.state == TaskState.TASK_KILLED, status
            assert [s.state for s in statuses(master, "survivor")].count(
                TaskState.TASK_RUNNING) == 1
            # Nothing the container wrote while the agent was away is lost (lines
            # of the last usage interval before the kill may come twice).
            stdout = next(work_dir.rglob("stdout")).read_text().splitlines()
            ticks = [int(line.split()[1]) for line in stdout]
            assert set(ticks) == set(range(max(ticks) + 1)), ticks
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)
