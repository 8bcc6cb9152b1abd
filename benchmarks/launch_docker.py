"""Launches from a Docker image through Dyad, against the bare engine in the same run.

    python -m benchmarks.launch --containerizer docker [--agents 1] [--tasks 60] [--slots 4]

Starts a private Docker Engine with the busybox test image
(`tests/integration/docker_engine.py`: root, `docker.io`, `busybox-static`), a
`dyad local`-style master and agents with the docker containerizer, and a
framework launching `--tasks` container tasks (`true`, network NONE, the same
limits as the process benchmark). Then, with the same parallelism, the reference:
the engine's own create + start of the same container (what `docker run -d`
does), timed through `agent.docker.DockerClient`. Prints launches per second and
accept -> TASK_RUNNING latency beside create+start, and their ratios: what Dyad
adds to a container start (offers, the master, the agent's checkpoint and status
updates, log copying).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from agent.container_spec import ContainerRun, DockerConfig, container_name, create_request
from agent.docker import DockerClient
from benchmarks.launch import TASK, peak_rss_mib, run_dyad
from dyad.containers import ContainerInfo, DockerInfo, Network
from dyad.local import LocalCluster
from dyad.messages import CommandInfo
from tests.integration.docker_engine import TEST_IMAGE, DockerEngine, mounts_under

CONTAINER = ContainerInfo(docker=DockerInfo(image=TEST_IMAGE, network=Network.NONE))
MIB = 1024 * 1024


async def bare_reference(socket_path: str, total: int, parallel: int,
                         sandbox: Path) -> tuple[float, list[float]]:
    """Seconds for `total` create+start of the task's container, `parallel` at a
    time, and each one's latency. The containers are removed afterwards, untimed."""
    slots = asyncio.Semaphore(parallel)
    made: list[str] = []
    latencies: list[float] = []

    async def one(client: DockerClient, i: int) -> None:
        run = ContainerRun(agent_id="bench-ref", framework_id="bench", executor_id=f"r{i}",
                           run_id=uuid.uuid4().hex, container=CONTAINER,
                           sandbox_dir=str(sandbox), resources=TASK, cpus=TASK.get("cpus"),
                           mem_bytes=int(TASK.get("mem") * MIB),
                           command=CommandInfo(shell="true"), task_id=f"r{i}")
        async with slots:
            began = time.monotonic()
            container = await client.create(create_request(run, DockerConfig()),
                                            container_name(run.agent_id, run.run_id))
            await client.start(container)
            latencies.append(time.monotonic() - began)
            made.append(container)

    async with DockerClient(socket_path) as client:
        started = time.monotonic()
        await asyncio.gather(*(one(client, i) for i in range(total)))
        span = time.monotonic() - started
        for container in made:
            await client.remove(container, force=True)
    return span, latencies


def run(agents: int, tasks: int, slots: int) -> int:
    directory = Path(tempfile.mkdtemp(prefix="dyad-bench-docker-", dir="/tmp"))
    engine = DockerEngine(directory)
    try:
        engine.start()
        engine.build_test_image()
        resources = f"cpus:{slots * TASK.get('cpus')};mem:4096;disk:1000"
        cluster = LocalCluster(work_dir=directory / "cluster", agents=agents,
                               resources=resources,
                               master_args=["--allocation-interval", "0.05s"],
                               agent_args=["--containerizers", "process,docker",
                                           "--docker-socket", engine.socket_path])
        with cluster:
            flood = asyncio.run(run_dyad(cluster, tasks, CONTAINER))
            assert cluster.master is not None
            master_rss = peak_rss_mib(cluster.master.process.pid)
        sandbox = directory / "reference-sandbox"
        sandbox.mkdir()
        parallel = agents * slots
        span_ref, ref_latencies = asyncio.run(
            bare_reference(engine.socket_path, tasks, parallel, sandbox))
    finally:
        engine.stop()
        if not mounts_under(directory):
            shutil.rmtree(directory, ignore_errors=True)
    if flood.failed:
        print(f"{len(flood.failed)} tasks did not finish: {flood.failed[:3]}")
        return 1
    span = max(flood.finished_at.values()) - min(flood.accepted_at.values())
    latencies = sorted(flood.running_at[t] - flood.accepted_at[t] for t in flood.running_at)
    ref_latencies.sort()
    dyad_rate, bare_rate = tasks / span, tasks / span_ref
    dyad_median, bare_median = statistics.median(latencies), statistics.median(ref_latencies)
    print(f"containerizer=docker agents={agents} tasks={tasks} parallel slots={parallel}")
    print(f"dyad:      {dyad_rate:7.1f} container tasks/s launched and finished "
          f"({span:.2f} s)")
    print(f"reference: {bare_rate:7.1f} bare engine create+start/s ({span_ref:.2f} s, "
          "same image and parallelism, no Dyad)")
    print(f"ratio dyad/reference (launches/s): {dyad_rate / bare_rate:.2f}")
    print(f"accept->RUNNING latency: median {dyad_median * 1000:.0f} ms, "
          f"p90 {latencies[int(len(latencies) * 0.9)] * 1000:.0f} ms; "
          f"create+start median {bare_median * 1000:.0f} ms, "
          f"p90 {ref_latencies[int(len(ref_latencies) * 0.9)] * 1000:.0f} ms")
    print(f"ratio dyad/reference (median latency): {dyad_median / bare_median:.2f}")
    print(f"master peak RSS: {master_rss:.1f} MiB")
    return 0
