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
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.launch import TASK, run_dyad
from dyad.auth import ClientCredentials
from dyad.local import LocalCluster
from dyad.security import client_session_options


def measure(secure: bool, agents: int, tasks: int, requests: int, slots: int) -> tuple[float, float]:
    """(tasks launched and finished per second, /state requests per second)."""
    resources = f"cpus:{slots * TASK.get('cpus')};mem:4096;disk:1000"
    with tempfile.TemporaryDirectory(prefix="dyad-bench-security-") as work:
        cluster = LocalCluster(work_dir=Path(work), agents=agents, resources=resources,
                               master_args=["--allocation-interval", "0.05s"], secure=secure)
        with cluster:
            env = cluster.client_env("operator")
            credentials = ClientCredentials.from_env(env) if secure else None
            flood = asyncio.run(run_dyad(cluster, tasks, credentials=credentials))
            if flood.failed:
                raise SystemExit(f"{len(flood.failed)} tasks did not finish: {flood.failed[:3]}")
            span = max(flood.finished_at.values()) - min(flood.accepted_at.values())
            assert cluster.master is not None
            http_seconds = asyncio.run(get_state(f"{cluster.master.url}/state", requests,
                                                 credentials or ClientCredentials()))
    return tasks / span, requests / http_seconds


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
    for round_ in range(args.rounds):
        for secure in (False, True):
            launches, gets = measure(secure, args.agents, args.tasks, args.requests, args.slots)
            print(f"round {round_ + 1} security {'on ' if secure else 'off'}: "
                  f"{launches:6.1f} tasks/s, {gets:6.1f} GET /state per s", flush=True)
            old = best.get(secure, (0.0, 0.0))
            best[secure] = (max(old[0], launches), max(old[1], gets))
    (off_launch, off_get), (on_launch, on_get) = best[False], best[True]
    print(f"agents={args.agents} tasks={args.tasks} requests={args.requests} "
          f"(best of {args.rounds} rounds)")
    print(f"security off: {off_launch:6.1f} tasks/s launched and finished, "
          f"{off_get:6.1f} GET /state per s (plain HTTP)")
    print(f"security on:  {on_launch:6.1f} tasks/s launched and finished, "
          f"{on_get:6.1f} GET /state per s (HTTPS, token, kept-alive connection)")
    print(f"ratio on/off: launches {on_launch / off_launch:.2f}, "
          f"HTTP requests {on_get / off_get:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
