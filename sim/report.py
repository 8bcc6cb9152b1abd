"""What a simulation measured, and `report.json`.

`Recorder` hears from the simulated agents when tasks start and stop using
resources (the usage ledger), and from the frameworks when tasks launch (their
pending time) and end (their final state); `Series` holds the samples taken
every `report.interval` simulated seconds. `build_report` turns both into the
report: plain JSON of numbers rounded to 6 decimals, keys sorted, nothing
measured on the machine (wall time goes to timing.json), so the same inputs
and seed give the same bytes.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dyad.messages import Reason, TaskStatus
from dyad.resources import SHARE_KINDS, Resources
from sim.usage import TaskPlan
from sim.workload import BANDS

FORMAT = "dyad-sim-report/1"
PERCENTILES = (50, 90, 99)
KINDS = ("cpus", "mem")


class Recorder:
    """Usage ledger and task outcomes; see the module docstring."""

    def __init__(self) -> None:
        self.running = 0
        # Usage of tasks with constant curves, summed; others are read at each sample.
        # Index 1: tasks on revocable resources.
        self._constant = [{kind: 0.0 for kind in KINDS}, {kind: 0.0 for kind in KINDS}]
        self._varying: dict[tuple[str, str], tuple[float, TaskPlan, bool]] = {}
        self._plans: dict[tuple[str, str], tuple[TaskPlan, bool]] = {}
        self.revocable_launched = 0
        self.pending: dict[str, list[float]] = {name: [] for name, _, _ in BANDS}
        self.final: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self._ended: set[tuple[str, str]] = set()
        self.jobs: dict[str, tuple[bool, str, float]] = {}

    # agents (sim.agent.Observer)
    def task_started(self, key: tuple[str, str], plan: TaskPlan, now: float,
                     revocable: bool = False) -> None:
        self.running += 1
        self.revocable_launched += revocable
        self._plans[key] = (plan, revocable)
        if plan.cpus.is_constant and plan.mem.is_constant:
            constant = self._constant[revocable]
            constant["cpus"] += plan.cpus.values[0]
            constant["mem"] += plan.mem.values[0]
        else:
            self._varying[key] = (now, plan, revocable)

    def task_stopped(self, key: tuple[str, str], now: float) -> None:
        self.running -= 1
        plan, revocable = self._plans.pop(key)
        if self._varying.pop(key, None) is None:
            constant = self._constant[revocable]
            constant["cpus"] -= plan.cpus.values[0]
            constant["mem"] -= plan.mem.values[0]

    def usage(self, now: float) -> dict[str, float]:
        """What running tasks use (`cpus`, `mem`) and, of that, tasks on revocable
        resources (`revocable_cpus`, `revocable_mem`)."""
        sums = [[c["cpus"], c["mem"]] for c in self._constant]
        for started, plan, revocable in self._varying.values():
            sums[revocable][0] += plan.cpus.at(now - started)
            sums[revocable][1] += plan.mem.at(now - started)
        owners, lent = sums
        return {"cpus": max(0.0, owners[0] + lent[0]), "mem": max(0.0, owners[1] + lent[1]),
                "revocable_cpus": max(0.0, lent[0]), "revocable_mem": max(0.0, lent[1])}

    # frameworks (sim.frameworks.Recorder)
    def launched(self, band_name: str, waited: float) -> None:
        self.pending[band_name].append(waited)

    def task_ended(self, framework: str, status: TaskStatus) -> None:
        key = (framework, status.task_id)
        if key in self._ended:
            return  # at-least-once delivery: the same end again
        self._ended.add(key)
        self.final[status.state.name] += 1
        if status.reason:
            self.reasons[status.reason] += 1

    def job_ended(self, name: str, succeeded: bool, error: str, now: float) -> None:
        self.jobs[name] = (succeeded, error, now)


@attrs.define
class Series:
    """Samples over simulated time; every list has one entry per sample."""

    t: list[float] = attrs.field(factory=list)
    total: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    allocated: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    offered: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    used: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    # Revocable: what agents lend, what revocable tasks hold, and use.
    lent: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    lent_allocated: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    lent_used: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in KINDS})
    shares: dict[str, list[float]] = attrs.field(factory=dict)
    running: list[int] = attrs.field(factory=list)
    waiting: list[int] = attrs.field(factory=list)

    def add(self, now: float, metrics: Mapping[str, float], usage: Mapping[str, float],
            shares: Mapping[str, float], running: int, waiting: int) -> None:
        index = len(self.t)
        self.t.append(now)
        for kind in KINDS:
            self.total[kind].append(metrics[f"master/{kind}_total"])
            self.allocated[kind].append(metrics[f"master/{kind}_used"])
            self.offered[kind].append(metrics[f"master/{kind}_offered"])
            self.used[kind].append(usage[kind])
            self.lent[kind].append(metrics.get(f"master/{kind}_revocable", 0.0))
            self.lent_allocated[kind].append(metrics.get(f"master/{kind}_revocable_used", 0.0))
            self.lent_used[kind].append(usage.get(f"revocable_{kind}", 0.0))
        for role, share in shares.items():
            self.shares.setdefault(role, [0.0] * index).append(share)
        for role, values in self.shares.items():
            if len(values) == index:
                values.append(0.0)
        self.running.append(running)
        self.waiting.append(waiting)


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank percentiles (exact and order-free) plus count, mean and max."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    out: dict[str, float] = {"count": len(ordered), "mean": sum(ordered) / len(ordered),
                             "max": ordered[-1]}
    for p in PERCENTILES:
        rank = max(1, math.ceil(p / 100 * len(ordered)))
        out[f"p{p}"] = ordered[rank - 1]
    return out


def _fraction(part: list[float], whole: list[float]) -> list[float]:
    return [p / w if w else 0.0 for p, w in zip(part, whole)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def build_report(*, inputs: Mapping[str, Any], span: float, stopped: str, series: Series,
                 recorder: Recorder, master_metrics: Mapping[str, float],
                 counters: Mapping[str, int], unfinished_jobs: list[str],
                 recommender: Mapping[str, Any] | None = None) -> dict[str, Any]:
    utilization: dict[str, dict[str, float]] = {}
    fractions: dict[str, dict[str, list[float]]] = {}
    for kind in KINDS:
        alloc = _fraction(series.allocated[kind], series.total[kind])
        used = _fraction(series.used[kind], series.total[kind])
        offered = _fraction(series.offered[kind], series.total[kind])
        lent = _fraction(series.lent[kind], series.total[kind])
        lent_alloc = _fraction(series.lent_allocated[kind], series.total[kind])
        lent_used = _fraction(series.lent_used[kind], series.total[kind])
        # Revocable tasks are not in the master's allocation: slack is the owners'.
        slack = [a - (u - r) for a, u, r in zip(alloc, used, lent_used)]
        fractions[kind] = {"allocated": alloc, "used": used, "offered": offered, "slack": slack,
                           "revocable": lent, "revocable_allocated": lent_alloc,
                           "revocable_used": lent_used}
        utilization[kind] = {"allocated": _mean(alloc), "used": _mean(used),
                             "offered": _mean(offered), "slack": _mean(slack),
                             "peak_allocated": max(alloc, default=0.0),
                             "peak_used": max(used, default=0.0),
                             "revocable": _mean(lent), "revocable_allocated": _mean(lent_alloc),
                             "revocable_used": _mean(lent_used)}
    jobs = recorder.jobs
    report = {
        "format": FORMAT,
        "inputs": dict(inputs),
        "span": {"seconds": span, "stopped": stopped, "samples": len(series.t)},
        "utilization": utilization,
        "pending_seconds": {band: percentiles(values) for band, values in recorder.pending.items()},
        "tasks": {"by_final_state": dict(sorted(recorder.final.items())),
                  "by_reason": dict(sorted(recorder.reasons.items())),
                  "running_at_end": recorder.running,
                  "ooms": recorder.reasons.get(Reason.CONTAINER_LIMITATION_MEMORY, 0),
                  # The master's guarantee/asked preemptions; the agents' QoS evictions.
                  "preemptions": master_metrics.get("master/preemptions", 0),
                  "evictions": counters.get("agents/evictions", 0),
                  "revocable_launched": recorder.revocable_launched},
        "jobs": {"succeeded": sum(1 for ok, _, _ in jobs.values() if ok),
                 "failed": sum(1 for ok, _, _ in jobs.values() if not ok),
                 "unfinished": len(unfinished_jobs),
                 "failures": {name: error for name, (ok, error, _) in sorted(jobs.items())
                              if not ok}},
        "offers": {"made": master_metrics.get("master/offers_sent", 0),
                   "accepted": master_metrics.get("master/offers_accepted", 0),
                   "declined": master_metrics.get("master/offers_declined", 0),
                   "rescinded": master_metrics.get("master/offers_rescinded", 0)},
        "recommender": dict(recommender or {}),
        "master": {key: value for key, value in sorted(master_metrics.items())
                   if _deterministic_metric(key)},
        "simulator": dict(sorted(counters.items())),
        "series": {
            "t": series.t,
            "capacity": {kind: series.total[kind] for kind in KINDS},
            "fractions": fractions,
            "dominant_shares": dict(sorted(series.shares.items())),
            "tasks_running": series.running,
            "tasks_waiting": series.waiting,
        },
    }
    return _rounded(report)


def _deterministic_metric(key: str) -> bool:
    """Master metrics that depend only on events (not the allocation run's
    wall time, which the simulator never reports)."""
    return not key.startswith("allocator/allocation_run_ms")


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        rounded = round(value, 6)
        return 0.0 if rounded == 0 else rounded
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(document, sort_keys=True, indent=1) + "\n", encoding="utf-8")


def capacity_json(capacity: Resources) -> dict[str, float]:
    return {kind: capacity.get(kind) for kind in SHARE_KINDS if capacity.get(kind)}
