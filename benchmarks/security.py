"""The cost of security: the same cluster with CURVE, TLS, credentials and ACLs
on and off, in the same run.

    python -m benchmarks.security [--agents 2] [--tasks 200] [--rounds 2]

For each setting, a fresh `dyad local`-style cluster (`LocalCluster`, with
``secure=True`` for "on"): a framework launches `--tasks` command tasks as fast
as offers allow (every launch crosses master and agent sockets several times:
accept, RunTask, executor registration, LaunchTask, status updates and their
acknowledgements), then `--requests` GETs of the master's ``/state`` (HTTPS
with a bearer token, or plain HTTP) over one kept-alive connection, as the web UI
and drivers make them.
Rounds alternate off and on; the best round of each is kept (the machine is
shared, and the best is the least disturbed). Prints both figures per setting
and the on/off ratios (the issue's goal: within 15%).

On a shared machine the rates say as much about the neighbours as about Dyad,
so the launch phase's CPU time is measured too, per task and per process kind
(from /proc: the master, the agents, the executors and tasks the agents reaped,
and the driver in this process). CPU seconds do not grow when other processes
take the cores, and they say where security costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import aiohttp

from benchmarks.launch import TASK, run_dyad
from dyad.auth import ClientCredentials
from dyad.local import LocalCluster
from dyad.security import client_session_options

CPU_KINDS = ("master", "agents", "executors", "driver")
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of `pid`, user plus system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) / _TICK, (cutime + cstime) / _TICK


def cpu_snapshot(master: int, agents: Iterable[int]) -> dict[str, float]:
    """CPU seconds so far of each kind (`CPU_KINDS`); executors are the agents'
    reaped children (an executor's own reaped task counts with it)."""
    own = [_cpu(pid) for pid in agents]
    return {"master": sum(_cpu(master)), "agents": sum(o for o, _ in own),
            "executors": sum(c for _, c in own), "driver": time.process_time()}


def measure(secure: bool, agents: int, tasks: int, requests: int, slots: int
            ) -> tuple[float, float, dict[str, float]]:
    """(tasks launched and finished per second, /state requests per second,
    CPU seconds per task of the launch phase by kind)."""
    resources = f"cpus:{slots * TASK.get('cpus')};mem:4096;disk:1000"
    with tempfile.TemporaryDirectory(prefix="dyad-bench-security-") as work:
        cluster = LocalCluster(work_dir=Path(work), agents=agents, resources=resources,
                               master_args=["--allocation-interval", "0.05s"], secure=secure)
        with cluster:
            env = cluster.client_env("operator")
            credentials = ClientCredentials.from_env(env) if secure else None
            assert cluster.master is not None
            pids = (cluster.master.process.pid, [a.process.pid for a in cluster.agent_children])
            before = cpu_snapshot(*pids)
            flood = asyncio.run(run_dyad(cluster, tasks, credentials=credentials))
            after = cpu_snapshot(*pids)
            if flood.failed:
                raise SystemExit(f"{len(flood.failed)} tasks did not finish: {flood.failed[:3]}")
            span = max(flood.finished_at.values()) - min(flood.accepted_at.values())
            http_seconds = asyncio.run(get_state(f"{cluster.master.url}/state", requests,
                                                 credentials or ClientCredentials()))
    cpu = {kind: (after[kind] - before[kind]) / tasks for kind in CPU_KINDS}
    return tasks / span, requests / http_seconds, cpu


def cpu_line(cpu: dict[str, float]) -> str:
    parts = ", ".join(f"{kind} {cpu[kind] * 1000:.0f}" for kind in CPU_KINDS)
    return f"{sum(cpu.values()) * 1000:.0f} ms CPU per task ({parts})"


async def get_state(url: str, requests: int, client: ClientCredentials) -> float:
    """Seconds for `requests` GETs of `url`, one after the other, on one session."""
    async with aiohttp.ClientSession(**client_session_options(client)) as session:
        started = time.perf_counter()
        for _ in range(requests):
            async with session.get(url) as response:
                response.raise_for_status()
                await response.read()
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--slots", type=int, default=4, help="tasks that fit on one agent")
    parser.add_argument("--requests", type=int, default=200, help="GETs of /state")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    best: dict[bool, tuple[float, float]] = {}
    least_cpu: dict[bool, dict[str, float]] = {}
    for round_ in range(args.rounds):
        for secure in (False, True):
            launches, gets, cpu = measure(secure, args.agents, args.tasks, args.requests,
                                          args.slots)
            print(f"round {round_ + 1} security {'on ' if secure else 'off'}: "
                  f"{launches:6.1f} tasks/s, {gets:6.1f} GET /state per s, "
                  f"{cpu_line(cpu)}", flush=True)
            old = best.get(secure, (0.0, 0.0))
            best[secure] = (max(old[0], launches), max(old[1], gets))
            if secure not in least_cpu or sum(cpu.values()) < sum(least_cpu[secure].values()):
                least_cpu[secure] = cpu
    (off_launch, off_get), (on_launch, on_get) = best[False], best[True]
    print(f"agents={args.agents} tasks={args.tasks} requests={args.requests} "
          f"(best of {args.rounds} rounds)")
    print(f"security off: {off_launch:6.1f} tasks/s launched and finished, "
          f"{off_get:6.1f} GET /state per s (plain HTTP)")
    print(f"security on:  {on_launch:6.1f} tasks/s launched and finished, "
          f"{on_get:6.1f} GET /state per s (HTTPS, token, kept-alive connection)")
    print(f"launch CPU off: {cpu_line(least_cpu[False])}")
    print(f"launch CPU on:  {cpu_line(least_cpu[True])}")
    print(f"ratio on/off: launches {on_launch / off_launch:.2f}, "
          f"HTTP requests {on_get / off_get:.2f}, CPU per task off/on "
          f"{sum(least_cpu[False].values()) / sum(least_cpu[True].values()):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
