"""`dyad sim`: replay a cell and a workload through the real cores.

    dyad sim run --cell CELL.json --workload W.jsonl [--policy P.json] [--seed N] --out DIR
    dyad sim compare RUN_A RUN_B
    dyad sim fit --cell CELL.json --app APP.json [--role R] [--workload W.jsonl --at T]
    dyad sim checkpoint --master HOST:PORT --out FILE   (then: run/fit --cell FILE)
    dyad sim import-google --trace DIR --max-cpus N --max-mem MB --cell C.json --workload W.jsonl

`run` writes DIR/report.json (byte-identical for the same inputs and seed),
DIR/timing.json (wall time and speed), DIR/summary.txt and PNG plots, prints the
summary, and shows a progress bar on a terminal. `compare` puts two reports
side by side. `fit` says how many more instances of a Marathon-style app the
real service core places on the cell (constraints honoured), and where. Bad input is reported as ``file:line: what is wrong`` with exit
status 2. docs/simulator.md is the manual.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.inputs import InputError
from sim.policy import load_policy
from sim.report import write_json
from sim.run import Simulation
from sim.workload import BANDS, load_workload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dyad sim", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="simulate a workload on a cell")
    run.add_argument("--cell", type=Path, required=True,
                     help="cell spec (JSON) or a checkpoint (dyad checkpoint save)")
    run.add_argument("--workload", type=Path, help="workload (JSON Lines); default: none")
    run.add_argument("--policy", type=Path, help="policy (JSON); default: production defaults")
    run.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    run.add_argument("--out", type=Path, required=True, help="folder for the results")
    run.add_argument("--strict", action="store_true",
                     help="a malformed workload record is fatal (default: skip it, say so)")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    compare = commands.add_parser("compare", help="two runs side by side")
    compare.add_argument("run_a", type=Path, help="a run folder or its report.json")
    compare.add_argument("run_b", type=Path)
    fit = commands.add_parser("fit", help="how many more instances of an app fit, and where")
    fit.add_argument("--cell", type=Path, required=True,
                     help="cell spec (JSON) or a checkpoint (dyad checkpoint save)")
    fit.add_argument("--app", type=Path, required=True, help="Marathon-style app definition")
    fit.add_argument("--role", default="*", help="the service framework's role (default *)")
    fit.add_argument("--workload", type=Path, help="replay this workload first ...")
    fit.add_argument("--at", type=float, default=0.0, help="... up to this simulated second")
    fit.add_argument("--policy", type=Path, help="policy (JSON)")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--json", action="store_true", help="print the answer as JSON")
    google = commands.add_parser("import-google",
                                 help="a cell and a workload from the Google 2011 trace")
    google.add_argument("--trace", type=Path, required=True,
                        help="folder with machine_events, task_events, task_usage")
    google.add_argument("--max-cpus", type=float, required=True,
                        help="cores of the trace's largest machine (cpus are normalized to it)")
    google.add_argument("--max-mem", type=float, required=True,
                        help="memory (MB) of the trace's largest machine")
    google.add_argument("--start", type=float, default=0.0, help="window start (trace seconds)")
    google.add_argument("--end", type=float, help="window end (trace seconds; default: all)")
    google.add_argument("--cell", type=Path, required=True, help="cell spec to write")
    google.add_argument("--workload", type=Path, required=True, help="workload to write")
    google.add_argument("--strict", action="store_true", help="a malformed row is fatal")
    save = commands.add_parser("checkpoint", help="the same as `dyad checkpoint save` "
                                                  "(kept for scripts written before it)")
    save.add_argument("--master", required=True, help="the master's HTTP address (host:port)")
    save.add_argument("--out", type=Path, required=True, help="the checkpoint file to write")
    return parser


def build_checkpoint_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dyad checkpoint", description="checkpoints of a live cell, for `dyad sim`")
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save", help="save a live master's /state to replay from")
    save.add_argument("--master", required=True, help="the master's HTTP address (host:port)")
    save.add_argument("out", type=Path, metavar="FILE", help="the checkpoint file to write")
    return parser


def checkpoint_main(argv: Sequence[str] | None = None) -> int:
    """`dyad checkpoint save --master M FILE` (docs/simulator.md)."""
    args = build_checkpoint_parser().parse_args(argv)
    try:
        return checkpoint(args)
    except InputError as exc:
        print(f"dyad checkpoint: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return run(args)
        if args.command == "fit":
            return fit_command(args)
        if args.command == "import-google":
            return import_google(args)
        if args.command == "checkpoint":
            return checkpoint(args)
        return compare(args.run_a, args.run_b)
    except InputError as exc:
        print(f"dyad sim: {exc}", file=sys.stderr)
        return 2


# ------------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> int:
    from sim.checkpoint import load_start

    policy = load_policy(args.policy)
    workload, skipped = None, []
    if args.workload is not None:
        workload, skipped = load_workload(args.workload, strict=args.strict)
    cell, workload = load_start(args.cell, workload)
    for problem in skipped:
        print(f"dyad sim: skipped {problem}", file=sys.stderr)
    inputs = {"workload_records_skipped": len(skipped)}
    simulation = Simulation(cell, workload, policy, seed=args.seed, inputs=inputs)
    console = Console(stderr=True)
    show = not args.quiet and console.is_terminal
    started = time.perf_counter()
    if show:
        with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.description}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("", total=simulation.horizon)

            def progress(now: float) -> None:
                bar.update(task, completed=now, description=f"{now / 3600:.2f} h simulated")

            report = simulation.run(progress)
    else:
        report = simulation.run()
    wall = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "report.json", report)
    span = report["span"]["seconds"]
    steps = report["simulator"].get("steps", 0)
    timing = {"wall_seconds": round(wall, 3), "simulated_seconds": span,
              "speed": round(span / wall, 1) if wall > 0 else None,
              "events": steps, "events_per_second": round(steps / wall) if wall > 0 else None}
    write_json(args.out / "timing.json", timing)
    if not args.no_plots:
        from sim.plots import write_plots  # matplotlib is slow to import
        write_plots(args.out, report, simulation.recorder.pending)
    text = summary(report, timing)
    (args.out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    if not args.quiet:
        print(text)
        print(f"results in {args.out}")
    return 0


def summary(report: Mapping[str, Any], timing: Mapping[str, Any]) -> str:
    """The one-screen text summary of a run."""
    inputs, span = report["inputs"], report["span"]
    lines = [f"cell {inputs['cell']}: {inputs['agents']} agents "
             f"({_resources(inputs['capacity'])}), seed {inputs['seed']}",
             f"simulated {_duration(span['seconds'])} ({span['stopped']}) in "
             f"{timing['wall_seconds']:.1f} s wall: {timing['speed']}x real time, "
             f"{timing['events']} events"]
    lines.append("utilization (time average): " + "; ".join(
        f"{kind} allocated {u['allocated']:.1%} used {u['used']:.1%} slack {u['slack']:.1%}"
        for kind, u in sorted(report["utilization"].items())))
    for band, stats in report["pending_seconds"].items():
        if stats["count"]:
            lines.append(f"pending {band:<11} n={stats['count']:<7} p50 {stats['p50']:.1f}s "
                         f"p90 {stats['p90']:.1f}s p99 {stats['p99']:.1f}s max {stats['max']:.1f}s")
    tasks = report["tasks"]
    states = ", ".join(f"{state.removeprefix('TASK_').lower()} {n}"
                       for state, n in tasks["by_final_state"].items()) or "none ended"
    lines.append(f"tasks: {states}; running at end {tasks['running_at_end']}; "
                 f"OOMs {tasks['ooms']}; preemptions {tasks['preemptions']}; "
                 f"evictions {tasks['evictions']}")
    if tasks["revocable_launched"] or report["utilization"]["mem"]["revocable"]:
        lines.append(f"revocable: {tasks['revocable_launched']} tasks launched on it; " + "; ".join(
            f"{kind} lent {u['revocable']:.1%} used by borrowers {u['revocable_used']:.1%}"
            for kind, u in sorted(report["utilization"].items())))
    for framework, pilot in report["recommender"].items():
        for app_id, app in pilot["apps"].items():
            lines.append(f"recommender {framework} {app_id} ({app['mode']}): declared cpus "
                         f"{app['declared']['cpus']:g} mem {app['declared']['mem']:g}, now cpus "
                         f"{app['final']['cpus']:g} mem {app['final']['mem']:g}")
    jobs = report["jobs"]
    lines.append(f"jobs: {jobs['succeeded']} succeeded, {jobs['failed']} failed, "
                 f"{jobs['unfinished']} unfinished")
    offers = report["offers"]
    lines.append(f"offers: {offers['made']} made, {offers['accepted']} accepted, "
                 f"{offers['declined']} declined, {offers['rescinded']} rescinded")
    shares = report["series"]["dominant_shares"]
    if shares:
        lines.append("dominant share at end: " + ", ".join(
            f"{role} {values[-1]:.3f}" for role, values in shares.items() if values))
    return "\n".join(lines)


def _resources(capacity: Mapping[str, float]) -> str:
    return ", ".join(f"{kind} {value:g}" for kind, value in capacity.items())


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds:.0f} s"


# ------------------------------------------------------------------------ fit


def fit_command(args: argparse.Namespace) -> int:
    from sim.fit import fit
    from sim.inputs import load_document
    from sim.workload import app_from_json

    from sim.checkpoint import load_start

    app = app_from_json(load_document(args.app))
    workload = None
    if args.workload is not None:
        workload, _ = load_workload(args.workload, strict=True)
    cell, workload = load_start(args.cell, workload)
    result = fit(cell, app, role=args.role, policy=load_policy(args.policy), workload=workload,
                 at=args.at, seed=args.seed)
    if args.json:
        print(json.dumps(attrs.asdict(result), sort_keys=True, indent=1))
        return 0
    console = Console()
    console.print(f"{result.fits} more instance{'s' if result.fits != 1 else ''} of "
                  f"{result.app_id} fit (at most {result.upper_bound} by resources alone)")
    table = Table("agent", "instances")
    for agent, count in result.by_agent.items():
        table.add_row(agent, str(count))
    if result.by_agent:
        console.print(table)
    if result.unplaced:
        console.print("offers that could not take one more: " + ", ".join(
            f"{code} {n}" for code, n in result.unplaced.items()))
        console.print(f"for example {result.example}")
    return 0


# ------------------------------------------------------------- import-google


def import_google(args: argparse.Namespace) -> int:
    from sim.google import import_trace

    if args.max_cpus <= 0 or args.max_mem <= 0:
        print("dyad sim: --max-cpus and --max-mem must be positive", file=sys.stderr)
        return 2
    imported = import_trace(args.trace, max_cpus=args.max_cpus, max_mem=args.max_mem,
                            start=args.start, end=args.end, strict=args.strict)
    for problem in imported.problems:
        print(f"dyad sim: skipped {problem}", file=sys.stderr)
    imported.write(args.cell, args.workload)
    counts = ", ".join(f"{key.replace('_', ' ')} {n}" for key, n in sorted(imported.counts.items()))
    print(f"wrote {args.cell} and {args.workload}: {counts}; "
          f"{len(imported.problems)} malformed rows skipped")
    return 0


# ---------------------------------------------------------------- checkpoint


def checkpoint(args: argparse.Namespace) -> int:
    from sim.checkpoint import save

    state = save(args.master, args.out)["state"]
    tasks = sum(len(f.get("tasks", [])) for f in state.get("frameworks", []))
    print(f"saved {args.out}: {len(state.get('agents', []))} agents, "
          f"{len(state.get('frameworks', []))} frameworks, {tasks} live tasks")
    return 0


# -------------------------------------------------------------------- compare


def _load(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "report.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}:0", f"cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}", f"not JSON: {exc.msg}") from None
    if not isinstance(document, dict) or document.get("format") != "dyad-sim-report/1":
        raise InputError(f"{path}:1", "not a dyad sim report")
    return document


def comparison_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(figure, value in A, value in B) for the figures worth comparing."""
    def pick(report: Mapping[str, Any], *path: str) -> Any:
        value: Any = report
        for key in path:
            if not isinstance(value, Mapping) or key not in value:
                return None
            value = value[key]
        return value

    rows: list[tuple[str, Any, Any]] = []

    def row(name: str, *path: str) -> None:
        rows.append((name, pick(a, *path), pick(b, *path)))

    row("agents", "inputs", "agents")
    row("simulated seconds", "span", "seconds")
    for kind in ("cpus", "mem"):
        for what in ("allocated", "used", "slack", "offered", "revocable", "revocable_used"):
            row(f"{kind} {what} (mean fraction)", "utilization", kind, what)
    for band, _, _ in BANDS:
        for p in ("p50", "p90", "p99"):
            row(f"pending {band} {p} (s)", "pending_seconds", band, p)
    states = sorted(set(pick(a, "tasks", "by_final_state") or {})
                    | set(pick(b, "tasks", "by_final_state") or {}))
    for state in states:
        row(f"tasks {state}", "tasks", "by_final_state", state)
    for what in ("running_at_end", "ooms", "preemptions", "evictions", "revocable_launched"):
        row(f"tasks {what}", "tasks", what)
    apps = sorted({(framework, app_id) for report in (a, b)
                   for framework, pilot in (pick(report, "recommender") or {}).items()
                   for app_id in pilot["apps"]})
    for framework, app_id in apps:
        for kind in ("cpus", "mem"):
            row(f"{app_id} {kind} at end", "recommender", framework, "apps", app_id, "final", kind)
    for what in ("succeeded", "failed", "unfinished"):
        row(f"jobs {what}", "jobs", what)
    for what in ("made", "accepted", "declined", "rescinded"):
        row(f"offers {what}", "offers", what)
    return [r for r in rows if r[1] is not None or r[2] is not None]


def compare(path_a: Path, path_b: Path) -> int:
    a, b = _load(path_a), _load(path_b)
    table = Table(title=f"{path_a}  vs  {path_b}")
    table.add_column("figure")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("B - A", justify="right")
    for name, value_a, value_b in comparison_rows(a, b):
        delta = ""
        if isinstance(value_a, (int, float)) and isinstance(value_b, (int, float)):
            delta = _number(value_b - value_a, signed=True)
        table.add_row(name, _number(value_a), _number(value_b), delta)
    Console().print(table)
    return 0


def _number(value: Any, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:+.4g}" if signed else f"{value:.4g}"
    return f"{value:+g}" if signed else f"{value:g}"
