"""Real containers on a private Docker Engine, driven through `agent.docker` with
create requests from `agent.container_spec`: what the Docker containerizer will
rely on, checked against the engine itself."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agent.container_spec import (
    AGENT_LABEL, ContainerLabels, ContainerRun, DockerConfig, container_name, create_request,
)
from agent.docker import (
    DockerClient, LogCopier, NotFound, NotRunning, PullError, PullTimeout,
)
from dyad.containers import ContainerInfo, DockerInfo, Network, PortMapping, Volume
from dyad.messages import CommandInfo
from dyad.resources import Resources
from tests.helpers import wait_for

from .docker_engine import TEST_IMAGE, DockerEngine, docker_engine  # noqa: F401 (fixture)
from .zookeeper import free_port

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


@pytest.fixture
async def client(docker_engine: DockerEngine) -> AsyncIterator[DockerClient]:
    async with docker_engine.client() as engine_client:
        yield engine_client


def a_run(sandbox: Path, shell: str, *, agent_id: str = "agent-1", network: str = Network.NONE,
          port_mappings: tuple[PortMapping, ...] = (), volumes: tuple[Volume, ...] = (),
          resources: str = "cpus:0.5;mem:64", mem_bytes: int = 0,
          task_id: str = "task-1") -> ContainerRun:
    sandbox.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    return ContainerRun(
        agent_id=agent_id, framework_id="fw-1", executor_id=task_id, run_id=run_id,
        task_id=task_id, sandbox_dir=str(sandbox), resources=Resources.parse(resources),
        container=ContainerInfo(docker=DockerInfo(image=TEST_IMAGE, network=network,
                                                  port_mappings=list(port_mappings)),
                                volumes=list(volumes)),
        command=CommandInfo(shell=shell), env={"GREETING": "hello"}, cpus=0.5,
        mem_bytes=mem_bytes)


async def start(client: DockerClient, run: ContainerRun) -> str:
    container = await client.create(create_request(run, DockerConfig()),
                                    name=container_name(run.agent_id, run.run_id))
    await client.start(container)
    return container


async def test_output_lands_in_the_sandbox(client: DockerClient, tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    run = a_run(sandbox, 'echo "$GREETING from $MESOS_SANDBOX"; echo oops >&2; '
                         'echo kept > "$MESOS_SANDBOX/made-inside"; pwd; exit 3')
    container = await start(client, run)
    copier = LogCopier(client, container, str(sandbox / "stdout"), str(sandbox / "stderr"))
    state, _ = await asyncio.gather(client.wait(container), copier.run())
    assert (state.exit_code, state.oom_killed) == (3, False)
    assert (sandbox / "stdout").read_text() == "hello from /mnt/mesos/sandbox\n/mnt/mesos/sandbox\n"
    assert (sandbox / "stderr").read_text() == "oops\n"
    assert (sandbox / "made-inside").read_text() == "kept\n"
    assert copier.last_nanos > 0


async def test_a_second_copier_neither_loses_nor_repeats(client: DockerClient,
                                                         tmp_path: Path) -> None:
    """After an agent restart the log copy resumes where the checkpoint says."""
    sandbox = tmp_path / "sandbox"
    run = a_run(sandbox, "echo one; sleep 0.3; echo two; sleep 0.3; echo three")
    container = await start(client, run)
    first = LogCopier(client, container, str(sandbox / "stdout"), str(sandbox / "stderr"))
    copying = asyncio.ensure_future(first.run())
    await wait_for(lambda: (sandbox / "stdout").exists()
                   and (sandbox / "stdout").read_text() == "one\n", 10, "the first line")
    copying.cancel()  # the agent dies
    await asyncio.gather(copying, return_exceptions=True)
    again = LogCopier(client, container, str(sandbox / "stdout"), str(sandbox / "stderr"),
                      since_nanos=first.last_nanos)
    await again.run()
    assert (sandbox / "stdout").read_text() == "one\ntwo\nthree\n"


async def test_over_its_memory_limit_the_kernel_kills_it(client: DockerClient,
                                                         tmp_path: Path) -> None:
    # dd holds a 64 MiB block in memory; the limit is 16 MiB and there is no swap.
    # It starts a second in: a container OOM-killed the moment it starts can be
    # reported exited 137 without OOMKilled, before the engine watches its cgroup
    # (containerd issue 8180), which is the engine's race, not the client's.
    run = a_run(tmp_path / "sandbox", "sleep 1; dd if=/dev/zero of=/dev/null bs=64M count=4",
                mem_bytes=16 * MIB)
    state = await client.wait(await start(client, run))
    assert state.oom_killed, state
    assert state.exit_code == 137


async def test_stop_lets_a_container_finish_within_its_grace(client: DockerClient,
                                                             tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    run = a_run(sandbox, "trap 'echo bye; exit 0' TERM; echo ready; "
                         "while true; do sleep 0.1; done")
    container = await start(client, run)
    copier = LogCopier(client, container, str(sandbox / "stdout"), str(sandbox / "stderr"))
    copying = asyncio.ensure_future(copier.run())
    await wait_for(lambda: "ready" in (sandbox / "stdout").read_text()
                   if (sandbox / "stdout").exists() else False, 10, "the trap to be set")
    await client.stop(container, grace=10)
    await copying
    state = await client.inspect(container)
    assert (state.running, state.exit_code) == (False, 0)
    assert (sandbox / "stdout").read_text() == "ready\nbye\n"


async def test_stop_kills_a_container_that_ignores_it(client: DockerClient,
                                                      tmp_path: Path) -> None:
    run = a_run(tmp_path / "sandbox", "trap '' TERM; while true; do sleep 0.1; done")
    container = await start(client, run)
    began = time.monotonic()
    await client.stop(container, grace=1)
    took = time.monotonic() - began
    state = await client.inspect(container)
    assert (state.running, state.exit_code) == (False, 137)  # 128 + SIGKILL
    assert 0.9 <= took < 15, took
    with pytest.raises(NotRunning, match="is not running"):
        await client.kill(container)


async def test_labels_find_an_agents_containers_again(client: DockerClient,
                                                      tmp_path: Path) -> None:
    ours = [a_run(tmp_path / f"s{i}", "sleep 30", agent_id="agent-A", task_id=f"t{i}")
            for i in range(2)]
    theirs = a_run(tmp_path / "other", "sleep 30", agent_id="agent-B")
    ids = {run.run_id: await start(client, run) for run in [*ours, theirs]}
    found = await client.list(labels={AGENT_LABEL: "agent-A"})
    assert {c.id for c in found} == {ids[run.run_id] for run in ours}
    parsed = {ContainerLabels.parse(c.labels) for c in found}
    assert parsed == {ContainerLabels.of(run) for run in ours}
    assert all(c.state == "running" for c in found)
    for container in ids.values():
        await client.remove(container, force=True)
    assert await client.list(labels={AGENT_LABEL: "agent-A"}) == []


async def test_a_bridged_port_is_reachable_from_the_host(client: DockerClient,
                                                         tmp_path: Path) -> None:
    host_port = free_port()
    run = a_run(tmp_path / "sandbox", "exec httpd -f -p 8080 -h /www",
                network=Network.BRIDGE, resources=f"cpus:0.5;mem:64;ports:[{host_port}]",
                port_mappings=(PortMapping(host_port=host_port, container_port=8080),))
    container = await start(client, run)

    async def page() -> str:
        try:
            async with aiohttp.ClientSession() as http, \
                    http.get(f"http://127.0.0.1:{host_port}/") as response:
                return await response.text() if response.status == 200 else ""
        except aiohttp.ClientError:
            return ""

    assert await wait_for(page, 20, "the mapped port") == "hello from a dyad container\n"
    checked = await client.exec(container, ["cat", "/www/index.html"], timeout=10)
    assert (checked.exit_code, checked.output) == (0, b"hello from a dyad container\n")
    failed = await client.exec(container, ["sh", "-c", "echo no >&2; exit 4"], timeout=10)
    assert (failed.exit_code, failed.output) == (4, b"no\n")
    usage = await client.stats(container)
    assert usage.processes >= 1 and usage.mem_bytes > 0 and usage.cpus_total_time > 0


async def test_a_volume_from_the_sandbox_is_mounted_read_only(client: DockerClient,
                                                              tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    (sandbox / "config").mkdir(parents=True)
    (sandbox / "config" / "app.conf").write_text("x=1\n")
    run = a_run(sandbox, "cat /etc/app/app.conf && ! touch /etc/app/new",
                volumes=(Volume(container_path="/etc/app", host_path="config", mode="RO"),))
    container = await start(client, run)
    copier = LogCopier(client, container, str(sandbox / "stdout"), str(sandbox / "stderr"))
    state, _ = await asyncio.gather(client.wait(container), copier.run())
    assert state.exit_code == 0, (sandbox / "stderr").read_text()
    assert (sandbox / "stdout").read_text() == "x=1\n"


async def test_a_missing_image_fails_to_create(client: DockerClient, tmp_path: Path) -> None:
    body = create_request(a_run(tmp_path, "true"), DockerConfig())
    body["Image"] = "dyad-test/nothing:here"
    with pytest.raises(NotFound, match="No such image: dyad-test/nothing:here"):
        await client.create(body)


async def test_a_pull_from_nowhere_fails_with_the_engines_reason(client: DockerClient) -> None:
    closed = free_port()  # nothing listens there
    began = time.monotonic()
    with pytest.raises(PullError, match="connection refused") as raised:
        await client.pull(f"127.0.0.1:{closed}/dyad/nothing:1", timeout=30)
    assert not isinstance(raised.value, PullTimeout)
    assert time.monotonic() - began < 30


async def test_a_pull_that_hangs_ends_at_its_own_timeout(client: DockerClient) -> None:
    """A registry that accepts connections and never answers: the pull ends when
    its own timeout says, whatever the engine would wait."""
    held: list[asyncio.StreamWriter] = []

    async def accept_and_stall(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept_and_stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    began = time.monotonic()
    try:
        with pytest.raises(PullTimeout, match=r"no image after 2s \(pulling 127"):
            await client.pull(f"127.0.0.1:{port}/dyad/stalled:1", timeout=2)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert time.monotonic() - began < 10
