"""The fleet benchmark over many seeds: is the goal a property of the rule, or of
one draw of 200 apps?

    python -m benchmarks.autopilot_seeds [--apps 1000] [--seeds 3-6,9-12] [--jobs 2] [--json]

Each seed is one fleet of `benchmarks.autopilot` (the same generator, the same
replay, the default policy `meta` against the hand-set limits), replayed in a
process of its own, two at a time by default. Printed: each seed's memory slack
and OOM-affected apps against its allowance (a tenth of the hand-set limits'),
whether both goals hold, and the seeds pooled into one fleet (their samples and
apps summed: what one cell of that many apps would score). A fleet of 200 apps
draws its kinds by chance (one seed has 46 spiky apps, another 80 daily ones), so
its figures swing by a few points of slack and a few apps either way; larger
fleets show what the rule does, not what a seed drew. Deterministic: the same
seeds and size give the same figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.autopilot import GOAL_OOM_RATIO, Score, first_spikes, fleet, goals_met, run, select


def seeds(text: str) -> list[int]:
    """`3-6,9` -> [3, 4, 5, 6, 9]."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    if not out:
        raise argparse.ArgumentTypeError("no seeds")
    return out


def one(apps: int, days: float, seed: int) -> tuple[int, Score, Score]:
    scores = run(apps, days, seed, select("meta"))
    return seed, scores["user"], scores["meta"]


def table(results: dict[int, tuple[Score, Score]], apps: int, days: float) -> Table:
    t = Table(title=f"meta against hand-set limits, {apps} apps over {days:g} days a seed")
    for column in ("seed", "hand-set slack / OOM apps", "allowed", "meta slack / OOM apps",
                   "goals"):
        t.add_column(column, justify="right")
    for seed in sorted(results):
        t.add_row(str(seed), *_row(*results[seed]))
    t.add_section()
    t.add_row(f"pooled ({len(results)})", *_row(*pool(results)))
    return t


def pool(results: dict[int, tuple[Score, Score]]) -> tuple[Score, Score]:
    """The seeds as one fleet: (hand-set, meta) with their samples and apps summed."""
    user, meta = Score(), Score()
    for one_user, one_meta in results.values():
        user.merge(one_user)
        meta.merge(one_meta)
    return user, meta


def _row(user: Score, meta: Score) -> tuple[str, str, str, str]:
    slack_ok, oom_ok = goals_met(meta, user)
    goals = "both" if slack_ok and oom_ok else "slack" if slack_ok else "OOM" if oom_ok \
        else "neither"
    return (f"{user.mem_slack:.1%} / {user.oom_apps}", f"{GOAL_OOM_RATIO * user.oom_apps:.1f}",
            f"{meta.mem_slack:.1%} / {meta.oom_apps}", goals)


def as_json(results: dict[int, tuple[Score, Score]], apps: int, days: float) -> dict:
    user, meta = pool(results)
    return {"apps": apps, "days": days,
            "seeds": {seed: {"user": u.as_json(), "meta": m.as_json(),
                             "first_spikes": first_spikes(fleet(apps, days, seed), days, seed)}
                      for seed, (u, m) in sorted(results.items())},
            "pooled": {"user": user.as_json(), "meta": meta.as_json()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.autopilot_seeds",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--apps", type=int, default=1000)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--seeds", type=seeds, default=seeds("3-6,9-12"),
                   help="comma-separated seeds and ranges (default: 3-6,9-12, none "
                        "of them the rule's tuning seeds 1, 2, 7)")
    p.add_argument("--jobs", type=int, default=2, help="seeds replayed at once")
    p.add_argument("--json", action="store_true",
                   help="print each seed's figures (and its first spikes) and the pool as JSON")
    args = p.parse_args(argv)
    console = Console(stderr=args.json)
    started = time.perf_counter()
    results: dict[int, tuple[Score, Score]] = {}
    with ProcessPoolExecutor(args.jobs) as pool, Progress(console=console) as progress:
        bar = progress.add_task(f"{len(args.seeds)} seeds", total=len(args.seeds))
        futures = [pool.submit(one, args.apps, args.days, s) for s in args.seeds]
        for future in as_completed(futures):
            seed, user, meta = future.result()
            results[seed] = (user, meta)
            progress.advance(bar)
    if args.json:
        print(json.dumps(as_json(results, args.apps, args.days), indent=2))
        return 0
    console.print(table(results, args.apps, args.days))
    both = sum(all(goals_met(meta, user)) for user, meta in results.values())
    console.print(f"both goals on {both} of {len(results)} seeds; "
                  f"replayed in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
