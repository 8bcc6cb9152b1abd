"""Launch throughput through a real master and real agents.

    python -m benchmarks.launch [--agents 3] [--tasks 300] [--slots 8] [--usage-store off]
    python -m benchmarks.launch --containerizer docker [--agents 1] [--tasks 60]

Starts `dyad local`-style processes, runs a framework that launches `--tasks`
command tasks (`true`) as fast as offers allow, and prints:

- tasks launched and finished per second (first accept to last TASK_FINISHED);
- the median and p90 accept -> TASK_RUNNING latency;
- the master's peak RSS (VmHWM);
- two references measured in the same run, with the same parallelism and without
  Dyad: fork/exec of the task's own command (`sh -c true` from Python), the floor a
  task launcher can reach; and bare executor-like process starts (the Python
  interpreter plus the command executor's imports plus `sh -c true`), what every
  Dyad command task costs at least while it has a Python executor of its own;
- what one command executor costs to start: CPU seconds and peak RSS of a process
  that imports it (mean of a few), against a bare `python -c pass`.

With ``--containerizer docker`` the tasks run from an image on a private Docker
Engine instead, against bare engine create+start of the same image
(`benchmarks.launch_docker`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dyad.local import LocalCluster
from dyad.resources import Resources
from frameworks import (CommandInfo, ContainerInfo, Filters, FrameworkInfo, Scheduler,
                        SchedulerDriver, TaskInfo, TaskState)

TASK = Resources.parse("cpus:0.25;mem:16")


class Flood(Scheduler):
    """Launches as many tasks per offer as fit until `total` are launched."""

    def __init__(self, total: int, container: ContainerInfo | None = None) -> None:
        self.total = total
        self.container = container
        self.launched = 0
        self.accepted_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.finished_at: dict[str, float] = {}
        self.failed: list[Any] = []
        self.done = asyncio.Event()

    def resource_offers(self, driver: SchedulerDriver, offers: list[Any]) -> None:
        for offer in offers:
            free = offer.resources
            tasks = []
            while self.launched < self.total and TASK <= free:
                task_id = f"t{self.launched}"
                self.launched += 1
                free = free - TASK
                tasks.append(TaskInfo(task_id=task_id, name="bench", agent_id=offer.agent_id,
                                      resources=TASK, command=CommandInfo(shell="true"),
                                      container=self.container))
            now = time.monotonic()
            for task in tasks:
                self.accepted_at[task.task_id] = now
            if tasks:
                driver.launch_tasks([offer.id], tasks, filters=Filters(refuse_seconds=0))
            else:
                driver.decline_offer(offer.id, Filters(refuse_seconds=0.2))

    def status_update(self, driver: SchedulerDriver, status: Any) -> None:
        now = time.monotonic()
        if status.state == TaskState.TASK_RUNNING:
            self.running_at.setdefault(status.task_id, now)
        elif status.state == TaskState.TASK_FINISHED:
            self.finished_at[status.task_id] = now
        elif status.state.is_terminal:
            self.failed.append(status)
        if len(self.finished_at) + len(self.failed) >= self.total:
            self.done.set()


async def run_dyad(cluster: LocalCluster, total: int,
                   container: ContainerInfo | None = None, credentials: Any = None) -> Flood:
    flood = Flood(total, container)
    driver = SchedulerDriver(flood, FrameworkInfo(name="bench"), master=cluster.master_address,
                             credentials=credentials)
    running = asyncio.ensure_future(driver.run_async())
    try:
        await asyncio.wait_for(flood.done.wait(), timeout=600)
    finally:
        driver.stop()
        await asyncio.wait_for(running, 30)
    return flood


def bare_reference(total: int, parallel: int) -> float:
    """Seconds to start `total` executor-like processes, `parallel` at a time."""
    return _start_all([sys.executable, "-c",
                       "import frameworks.executors.command, subprocess; "
                       "subprocess.run(['/bin/sh', '-c', 'true'])"], total, parallel)


def _start_all(argv: list[str], total: int, parallel: int) -> float:
    started = time.monotonic()
    running: list[subprocess.Popen[bytes]] = []
    for _ in range(total):
        while len(running) >= parallel:
            running = [p for p in running if p.poll() is None]
            if len(running) >= parallel:
                time.sleep(0.001)
        running.append(subprocess.Popen(argv))
    for process in running:
        process.wait()
    return time.monotonic() - started


def fork_exec_reference(total: int, parallel: int) -> float:
    """Seconds to fork/exec `total` `sh -c true`, `parallel` at a time."""
    return _start_all(["/bin/sh", "-c", "true"], total, parallel)


def start_cost(code: str, runs: int = 5) -> tuple[float, float]:
    """Mean CPU seconds (user + system) and peak RSS (MiB) of `python -c code`. The
    child reads its own peak (a forked child's rusage counts its parent's pages)."""
    probe = f"{code}\nprint(open('/proc/self/status').read())"
    cpu = rss = 0.0
    for _ in range(runs):
        process = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE)
        assert process.stdout is not None
        status = process.stdout.read().decode()
        _, wait_status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(wait_status)
        if process.returncode != 0:
            raise RuntimeError(f"python -c {code!r} exited with {process.returncode}")
        cpu += usage.ru_utime + usage.ru_stime
        rss += next(int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("VmHWM:")) / 1024
    return cpu / runs, rss / runs


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--slots", type=int, default=4,
                        help="tasks that fit on one agent at once")
    parser.add_argument("--usage-store", choices=["on", "off"], default="on",
                        help="the master's usage store (compare launches/s on and off)")
    parser.add_argument("--containerizer", choices=["process", "docker"], default="process")
    args = parser.parse_args(argv)
    if args.containerizer == "docker":
        from benchmarks import launch_docker  # needs root and dockerd
        return launch_docker.run(args.agents, args.tasks, args.slots)
    resources = f"cpus:{args.slots * TASK.get('cpus')};mem:4096;disk:1000"
    with tempfile.TemporaryDirectory(prefix="dyad-bench-") as work:
        cluster = LocalCluster(work_dir=Path(work), agents=args.agents, resources=resources,
                               master_args=["--allocation-interval", "0.05s",
                                            "--usage-store", args.usage_store])
        with cluster:
            flood = asyncio.run(run_dyad(cluster, args.tasks))
            assert cluster.master is not None
            master_rss = peak_rss_mib(cluster.master.process.pid)
    if flood.failed:
        print(f"{len(flood.failed)} tasks did not finish: {flood.failed[:3]}")
        return 1
    span = max(flood.finished_at.values()) - min(flood.accepted_at.values())
    latencies = sorted(flood.running_at[t] - flood.accepted_at[t] for t in flood.running_at)
    parallel = args.agents * args.slots
    reference = bare_reference(args.tasks, parallel)
    fork_exec = fork_exec_reference(args.tasks, parallel)
    dyad_rate, bare_rate = args.tasks / span, args.tasks / reference
    fork_rate = args.tasks / fork_exec
    python_cpu, python_rss = start_cost("pass")
    executor_cpu, executor_rss = start_cost("import frameworks.executors.command")
    print(f"agents={args.agents} tasks={args.tasks} parallel slots={parallel} "
          f"usage store {args.usage_store}")
    print(f"dyad:      {dyad_rate:7.1f} tasks/s launched and finished ({span:.2f} s)")
    print(f"reference: {bare_rate:7.1f} bare executor-like process starts/s "
          f"({reference:.2f} s, same parallelism, no Dyad)")
    print(f"ratio dyad/reference: {dyad_rate / bare_rate:.2f}")
    print(f"fork/exec: {fork_rate:7.1f} sh -c true starts/s ({fork_exec:.2f} s, same "
          f"parallelism); ratio dyad/fork-exec: {dyad_rate / fork_rate:.3f}")
    print(f"command executor start: {executor_cpu * 1000:.0f} ms CPU, {executor_rss:.1f} MiB "
          f"peak RSS (bare python: {python_cpu * 1000:.0f} ms, {python_rss:.1f} MiB)")
    print(f"accept->RUNNING latency: median {statistics.median(latencies) * 1000:.0f} ms, "
          f"p90 {latencies[int(len(latencies) * 0.9)] * 1000:.0f} ms")
    print(f"master peak RSS: {master_rss:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
