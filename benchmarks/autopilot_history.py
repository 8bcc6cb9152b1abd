"""What a new `dyad-service` leader pays to read the autopilot's evidence back
(`--autopilot-history`, frameworks/service/usage_feed.py).

    python -m benchmarks.autopilot_history [--tasks 100] [--every 10] [--hours 24]

Rows as the master's usage store answers `usage_feed.samples_sql` (one per task
per usage report, `--every` seconds apart, over `--hours`), in polls of
`usage_feed.ROWS_PER_POLL`. Reference: decoding each poll's JSON answer, which
any reader of the store pays. Measured: the same rows through
`RightSizing.sampled` into the autopilot core (one app per task, in `recommend`),
which is what runs on the service's event loop between polls. Printed: rows and
polls, CPU seconds in all and per poll for both, and their ratio. The store's own
query time is not in it (docs/usage-store.md has the store's figures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from frameworks.service.appdef import parse_app
from frameworks.service.core import ServiceConfig, ServiceCore
from frameworks.service.rightsizing import RightSizing, Sample
from frameworks.service.usage_feed import ROWS_PER_POLL

MIB = 2**20


def answers(tasks: int, every: float, hours: float) -> list[bytes]:
    """The polls' JSON answers, oldest rows first, as the store sends them."""
    rows = []
    for k in range(int(hours * 3600 / every)):
        for i in range(tasks):
            at_us = int((k * every + i * every / tasks) * 1e6)
            mem = (100 + (k * 7 + i * 13) % 50) * MIB
            rows.append([f"/app{i:04d}", at_us, 0.1 + (k + i) % 5 / 20, mem,
                         f"app{i:04d}.t1", 164 * MIB, 0.0])
    return [json.dumps({"columns": [], "rows": rows[n:n + ROWS_PER_POLL]}).encode()
            for n in range(0, len(rows), ROWS_PER_POLL)]


def decode(polls: list[bytes]) -> float:
    started = time.process_time()
    for body in polls:
        json.loads(body)
    return time.process_time() - started


def feed(polls: list[bytes], tasks: int, now: float) -> tuple[float, int]:
    """CPU seconds to decode and feed every poll, and the samples the core took."""
    core = ServiceCore(ServiceConfig(), new_id=lambda: "x")
    sizing = RightSizing()
    apps = {f"/app{i:04d}": parse_app({"id": f"/app{i:04d}", "cmd": "sleep 1", "mem": 256,
                                       "autopilot": {"mode": "recommend"}})
            for i in range(tasks)}
    sizing.sync(apps, now)
    started = time.process_time()
    for body in polls:
        sizing.sampled(core, [Sample(app, at_us / 1e6, float(cpus), float(mem), task,
                                     float(limit or 0), float(throttled or 0))
                              for app, at_us, cpus, mem, task, limit, throttled
                              in json.loads(body)["rows"]], now)
    return time.process_time() - started, sizing.counters["autopilot_samples"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.autopilot_history",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--every", type=float, default=10.0, help="seconds between a task's rows")
    p.add_argument("--hours", type=float, default=24.0)
    args = p.parse_args(argv)
    polls = answers(args.tasks, args.every, args.hours)
    rows = sum(len(json.loads(b)["rows"]) for b in polls)
    reference = decode(polls)
    measured, fed = feed(polls, args.tasks, args.hours * 3600)
    assert fed == rows, (fed, rows)
    print(f"{rows:,} rows of {args.tasks} tasks over {args.hours:g} h (one every "
          f"{args.every:g} s a task), {len(polls)} polls of at most {ROWS_PER_POLL:,}")
    print(f"{'':<34}{'CPU s':>8}{'per poll':>11}{'per row':>10}")
    for name, seconds in (("decode the answers (reference)", reference),
                          ("decode and feed the autopilot", measured)):
        print(f"{name:<34}{seconds:>8.2f}{seconds / len(polls) * 1e3:>9.1f}ms"
              f"{seconds / rows * 1e6:>8.1f}us")
    print(f"feeding / decoding: {measured / reference:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
