"""Usage store: ingestion rate and group-by latency, against plain Python.

    python -m benchmarks.usage_store [--rows 1000000] [--batch 10000] [--threads 2]
                                     [--big-rows 10000000] [--launch-rounds 3] [--quick]
                                     [--launch-agents 200] [--launch-frameworks 1]
                                     [--launch-tasks N]

Synthetic samples from a day of a cell: 2,000 tasks of 100 apps in 5 roles on 200
agents (with rack attributes), one sample per task every ~90 s. Printed:

- **ingest**: rows/s into `DuckDBEngine.insert` in batches of `--batch` (the size
  the store's writer thread hands over), against appending the same rows' tuples
  to a Python list (the floor any store pays: the rows must at least be read);
- **group-by**: the typical question, average cores and peak memory per role per
  minute (7,200 groups), timed as the median of 3 runs, against the same
  aggregation in a Python dict over the list; the answers are checked to agree;
- **percentile and filter**: p95 cores per app and OOM-event counts per app over
  the last hour, DuckDB only (informative: plain Python has no cheap percentile);
- **10 M rows** (`--big-rows`): the ingested rows copied inside DuckDB, each copy a
  day later (so ten days of the cell), then the same group-by (72,000 groups) and
  p95 per app. Goal (issue 14): the group-by under 1 s on this machine;
- **master launches/s, store on vs off**: `benchmarks.master` (a real master, 200
  simulated agents, one framework, 20,000 tasks or one wave of 4 an agent if
  more: `--launch-tasks`; each run's
  flood starts once the store answers, as its process takes ~0.7 CPU s to
  start) run `--launch-rounds` times each way,
  alternating off/on so load drifting on the shared machine hits both alike;
  compared by median, as tasks/s and as the master's CPU time per task (less
  moved by other work on the machine than wall time), and by the median of each
  round's own on/off. Goal: launches/s under 5% apart (the CPU a task has none: it
  says where the time went). `--launch-agents 10000
  --launch-frameworks 10` runs the flood of `benchmarks.master --quick` instead,
  where the master's one core is the bottleneck (docs/usage-store.md). The simulated agents send no usage
  reports, so what the store costs here is the task events every launch and state
  change write (the rows on the master's own path); samples arrive apart from
  launches, every report interval.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import master as master_bench
from master.usage import Dimensions, DuckDBEngine, UsageSample
from master.usage.schema import usage_values

T0 = 1_700_000_000.0
ROLES = ("prod", "batch", "web", "ml", "infra")


def synthetic(rows: int, seed: int = 1) -> list[UsageSample]:
    rng = random.Random(seed)
    agents = [(f"agent-{a}", f"host-{a}", {"rack": f"r{a % 20}", "zone": f"z{a % 3}"})
              for a in range(200)]
    tasks = []
    for t in range(2000):
        app = t % 100
        agent_id, host, attributes = agents[t % len(agents)]
        tasks.append(Dimensions(
            task_id=f"app{app}.{t}", framework_id="svc" if app < 60 else "batch",
            role=ROLES[app % len(ROLES)], app=f"/app{app}", agent_id=agent_id,
            hostname=host, agent_attributes=attributes, labels={"app": f"/app{app}"},
            priority=200 if app < 60 else 100, revocable=app >= 90))
    span = 24 * 3600.0
    out = []
    for i in range(rows):
        who = tasks[i % len(tasks)]
        out.append(UsageSample(
            at=T0 + span * i / rows, who=who, executor_id=who.task_id,
            cpus_used=rng.random() * 2, cpus_limit=2.0,
            mem_rss_bytes=rng.randrange(10 << 20, 900 << 20), mem_limit_bytes=1 << 30,
            oom_events=1 if rng.random() < 1e-4 else 0))
    return out


def timed(run: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def python_group_by(rows: list[tuple]) -> dict[tuple[str, int], tuple[float, int]]:
    """avg(cpus_used), max(mem_rss_bytes) per (role, minute) over `usage_values` tuples."""
    sums: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        key = (row[3], round(row[0] * 1e6) // 60_000_000)  # as the store rounds to µs
        acc = sums.get(key)
        if acc is None:
            sums[key] = [row[12], 1, row[15]]
        else:
            acc[0] += row[12]
            acc[1] += 1
            acc[2] = max(acc[2], row[15])
    return {k: (s / n, m) for k, (s, n, m) in sums.items()}


GROUP_BY = ("SELECT role, epoch_us(ts) // 60000000 AS minute, avg(cpus_used), "
            "max(mem_rss_bytes) FROM task_usage GROUP BY ALL")
PERCENTILE = ("SELECT app, quantile_cont(cpus_used, 0.95) FROM task_usage "
              "GROUP BY app ORDER BY app")
OOMS = ("SELECT app, sum(oom_events) FROM task_usage WHERE ts >= epoch_ts(?) "
        "GROUP BY app HAVING sum(oom_events) > 0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--big-rows", type=int, default=10_000_000,
                        help="rows for the big group-by (0: skip)")
    parser.add_argument("--launch-rounds", type=int, default=3,
                        help="master launch runs each with the store on and off (0: skip)")
    parser.add_argument("--launch-agents", type=int, default=200,
                        help="simulated agents in the launch runs (10000: the flood "
                             "where the master is the bottleneck)")
    parser.add_argument("--launch-frameworks", type=int, default=1)
    parser.add_argument("--launch-tasks", type=int, default=0,
                        help="tasks a launch run starts (0: one wave, 4 a simulated agent, "
                             "and at least 20,000: at 200 agents one wave is over in half "
                             "a second)")
    parser.add_argument("--quick", action="store_true",
                        help="100 k rows, 1 M for the big group-by, one launch round")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.big_rows, args.launch_rounds = 100_000, 1_000_000, 1

    print(f"building {args.rows:,} synthetic samples ...", flush=True)
    samples = synthetic(args.rows)

    started = time.perf_counter()
    reference: list[tuple] = []
    for s in samples:
        reference.append(usage_values(s))
    list_rate = args.rows / (time.perf_counter() - started)

    engine = DuckDBEngine(memory_limit="4GB", threads=args.threads)
    started = time.perf_counter()
    for i in range(0, args.rows, args.batch):
        engine.insert(samples[i:i + args.batch], [])
    ingest_rate = args.rows / (time.perf_counter() - started)
    print(f"ingest      duckdb {ingest_rate:12,.0f} rows/s   python list {list_rate:12,.0f} "
          f"rows/s   list/duckdb {list_rate / ingest_rate:6.1f}x")

    ours, answer = timed(lambda: engine.query(GROUP_BY, 100_000, 60))
    theirs, expected = timed(lambda: python_group_by(reference))
    got = {(r[0], r[1]): (r[2], r[3]) for r in answer.rows}
    assert got.keys() == expected.keys(), "group-by answers differ"
    assert all(abs(got[k][0] - expected[k][0]) < 1e-9 and got[k][1] == expected[k][1]
               for k in expected), "group-by answers differ"
    print(f"group-by    duckdb {ours * 1000:10.1f} ms     python dict {theirs * 1000:10.1f} ms"
          f"     python/duckdb {theirs / ours:6.1f}x   ({len(got):,} groups)")

    p95, _ = timed(lambda: engine.query(PERCENTILE, 1000, 60))
    last_hour, _ = timed(lambda: engine.query(OOMS.replace("?", str(T0 + 23 * 3600)), 1000, 60))
    print(f"p95 per app {p95 * 1000:10.1f} ms     OOMs per app, last hour {last_hour * 1000:8.1f} ms")
    if args.big_rows:
        big(engine, args.rows, args.big_rows, ours)
    engine.close()
    if args.launch_rounds:
        launches(args.launch_rounds, args.launch_agents, args.launch_frameworks,
                 args.launch_tasks)
    return 0


def big(engine: DuckDBEngine, rows: int, target: int, small: float) -> None:
    """Grow the store to `target` rows by copying the ingested ones a day later each
    time (inside DuckDB: ingesting 10 M rows from Python would take minutes and is
    measured above), then time the same questions."""
    copies = -(-target // rows)
    # The benchmark writes through the engine's own connection: queries cannot.
    engine._db.execute(  # noqa: SLF001
        "INSERT INTO task_usage SELECT u.* REPLACE (u.ts + to_days(r.range::INTEGER) AS ts) "
        f"FROM task_usage u, range(1, {copies}) r")
    count = engine.counts()["task_usage"]
    seconds, answer = timed(lambda: engine.query(GROUP_BY, 1_000_000, 60))
    p95, _ = timed(lambda: engine.query(PERCENTILE, 1000, 60))
    verdict = "met" if seconds < 1.0 else "MISSED"
    print(f"{count:,} rows: group-by {seconds * 1000:8.1f} ms ({len(answer.rows):,} groups; "
          f"goal < 1 s: {verdict}; {seconds / small:.1f}x the {rows:,}-row time), p95 per app "
          f"{p95 * 1000:.1f} ms")


def launch_run(store: str, agents: int, frameworks: int, tasks: int) -> tuple[float, float]:
    """Tasks/s and the master's CPU ms per task, in one run with the store on or off,
    of `tasks` launches (0: one wave, `benchmarks.master --quick`'s, and at least
    20,000). The flood starts once the store answers (`benchmarks.master.store_ready`)."""
    args = master_bench.arguments().parse_args(
        ["--agents", str(agents), "--frameworks", str(frameworks)])
    total = tasks or max(args.agents * master_bench.SLOTS_PER_AGENT, 20_000)
    launchers, _, _, _, _, cpu = master_bench.measure(args, total, ("--usage-store", store))
    accepted = [t for l in launchers for t in l.accepted_at.values()]
    finished = [t for l in launchers for t in l.finished_at.values()]
    if len(finished) < total:
        raise SystemExit(f"store {store}: {total - len(finished)} tasks did not finish")
    return len(finished) / (max(finished) - min(accepted)), cpu["master"] * 1000 / total


def launches(rounds: int, agents: int, frameworks: int, tasks: int) -> None:
    runs: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for _ in range(rounds):
        for store in ("off", "on"):
            runs[store].append(launch_run(store, agents, frameworks, tasks))
    for i, what in enumerate(("launches/s", "CPU ms per task")):
        off, on = (statistics.median(r[i] for r in runs[k]) for k in ("off", "on"))
        shown = {k: ", ".join(f"{r[i]:,.2f}" for r in v) for k, v in runs.items()}
        # Each round's own on/off too: the pair shares the machine's speed of the moment.
        paired = statistics.median(b[i] / a[i] for a, b in zip(runs["off"], runs["on"]))
        # The goal is launches/s (issue 14); the CPU a task says where they went.
        verdict = (f" (goal: under 5% apart: {'met' if abs(on - off) / off < 0.05 else 'MISSED'})"
                   if i == 0 else "")
        print(f"master {what} ({agents} simulated agents, {frameworks} framework(s), median "
              f"of {rounds}): store off {off:,.2f} [{shown['off']}]  on {on:,.2f} "
              f"[{shown['on']}]  on/off {on / off:.3f}, by round {paired:.3f}{verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
