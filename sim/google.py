"""Import the public Google cluster-data 2011 trace as a cell and a workload.

The trace (clusterdata-2011-2, its schema published with it) has four tables
used here, each a folder of CSV parts (``part-00000-of-00500.csv.gz``) or one
``<table>.csv[.gz]`` file, no header, times in microseconds:

- ``machine_events``: time, machine id, event (0 add, 1 remove, 2 update),
  platform id, cpus, memory (both normalized to the largest machine);
- ``job_events`` (not needed: every task row names its job);
- ``task_events``: time, missing info, job id, task index, machine id, event
  (0 submit, 1 schedule, 2 evict, 3 fail, 4 finish, 5 kill, 6 lost, 7 update
  pending, 8 update running), user, scheduling class, priority (0-11), cpu
  request, memory request, disk request, different-machines restriction;
- ``task_usage``: start, end, job id, task index, machine id, mean cpu rate,
  canonical memory usage, ... (only those two are used).

What comes out:

- a cell: every machine added before the window ends, at its last known size
  (normalized cpus x `max_cpus`, memory x `max_mem` MB), grouped by size and
  platform (attribute ``platform``: p1, p2, ... in order of appearance);
- a workload: one ``tasks`` record per trace task (job, index) first submitted
  inside the window, at its first submit time less the window start, for a
  greedy framework per priority band (``google-<band>``, role ``<band>``).
  Its duration is the time it spent running, summed over its attempts (a task
  evicted and resubmitted keeps the work it still had to do; Dyad has no
  preemption to evict it again); it fails (``fail: 1``) if its last attempt
  ended in FAIL; tasks still running at the window's end run for the part
  inside it. Its usage is a step curve of the usage rows of its life (mean cpu
  rate and canonical memory, denormalized), seconds since it first started.

Priorities map to Borg's bands as Dyad names them: 0-1 (free) -> best-effort
(50 + p), 2-8 (middle) -> batch (100 + 10 (p - 2)), 9-10 (production) ->
production (200 + 50 (p - 9)), 11 (monitoring) -> monitoring (360).

Malformed rows (wrong column count, a number that is not one, a negative time,
a missing machine id where one is needed) are reported with file and line and
skipped, or stop the import with `strict`. Counted without being errors: usage
rows outside their task's life (before its first schedule, after its last
end) or for tasks never seen, tasks submitted before the window, tasks never
scheduled, requests of 0 (raised to the smallest task Dyad takes).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from sim.inputs import InputError
from sim.workload import band

US = 1_000_000
MIN_CPUS = 0.001
MIN_MEM = 1.0
SUBMIT, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST, UPDATE_PENDING, UPDATE_RUNNING = range(9)
ENDS = {EVICT, FAIL, FINISH, KILL, LOST}
MAX_USAGE_STEPS = 200  # per task: a long task's 5-minute samples are thinned to this


def dyad_priority(google: int) -> int:
    if google <= 1:
        return 50 + google
    if google <= 8:
        return 100 + 10 * (google - 2)
    if google <= 10:
        return 200 + 50 * (google - 9)
    return 360


@attrs.define
class _Task:
    job: int
    index: int
    submitted: float
    priority: int = 0
    cpus: float = 0.0
    mem: float = 0.0
    started: float | None = None  # first schedule
    running_since: float | None = None
    ran: float = 0.0
    last_end: float | None = None
    last_event: int = SUBMIT
    usage: list[tuple[float, float, float]] = attrs.field(factory=list)  # (t, cpus, mem)


@attrs.define
class Import:
    cell: dict[str, Any]
    records: list[dict[str, Any]]
    counts: Counter[str]
    problems: list[InputError]

    def write(self, cell_path: Path, workload_path: Path) -> None:
        cell_path.write_text(json.dumps(self.cell, indent=1) + "\n", encoding="utf-8")
        with workload_path.open("w", encoding="utf-8") as out:
            out.write("# imported from the Google cluster-data 2011 trace by dyad sim import-google\n")
            for record in self.records:
                out.write(json.dumps(record, separators=(",", ":")) + "\n")


class _Rows:
    """The rows of one table, with the file and line each came from."""

    def __init__(self, trace: Path, table: str, columns: int, strict: bool,
                 problems: list[InputError]) -> None:
        self.files = _table_files(trace, table)
        self.columns = columns
        self.strict = strict
        self.problems = problems

    def __iter__(self) -> Iterator[tuple[str, list[str]]]:
        for path in self.files:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8", newline="") as handle:  # type: ignore[operator]
                for number, row in enumerate(csv.reader(handle), 1):
                    where = f"{path}:{number}"
                    if len(row) < self.columns:
                        self.bad(where, f"{len(row)} columns, expected {self.columns}")
                        continue
                    yield where, row

    def bad(self, where: str, message: str) -> None:
        problem = InputError(where, message)
        if self.strict:
            raise problem
        self.problems.append(problem)


def _table_files(trace: Path, table: str) -> list[Path]:
    folder = trace / table
    if folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.name.endswith((".csv", ".csv.gz")))
    else:
        files = [p for p in (trace / f"{table}.csv.gz", trace / f"{table}.csv") if p.exists()]
    if not files:
        raise InputError(f"{trace}:0", f"no {table} table (a {table}/ folder of CSV parts or "
                                       f"{table}.csv[.gz])")
    return files


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def import_trace(trace: Path, *, max_cpus: float, max_mem: float, start: float = 0.0,
                 end: float | None = None, strict: bool = False) -> Import:
    """Read the trace under `trace`; `start`/`end` bound the window in trace
    seconds; `max_cpus`/`max_mem` (MB) denormalize."""
    if max_cpus <= 0 or max_mem <= 0:
        raise ValueError("max_cpus and max_mem must be positive")
    problems: list[InputError] = []
    counts: Counter[str] = Counter()
    window_end = float("inf") if end is None else end
    cell = _machines(_Rows(trace, "machine_events", 6, strict, problems), max_cpus, max_mem,
                     window_end, counts)
    tasks = _tasks(_Rows(trace, "task_events", 13, strict, problems), max_cpus, max_mem,
                   start, window_end, counts)
    _usage(_Rows(trace, "task_usage", 7, strict, problems), tasks, max_cpus, max_mem, counts)
    records = _records(tasks, start, window_end, counts)
    return Import(cell=cell, records=records, counts=counts, problems=problems)


def _machines(rows: _Rows, max_cpus: float, max_mem: float, window_end: float,
              counts: Counter[str]) -> dict[str, Any]:
    sizes: dict[str, tuple[float, float, str]] = {}
    platforms: dict[str, str] = {}
    for where, row in rows:
        try:
            time, event = _int(row[0]) / US, _int(row[2])
        except ValueError:
            rows.bad(where, "time and event type must be integers")
            continue
        machine = row[1]
        if not machine:
            rows.bad(where, "missing machine id")
            continue
        if time > window_end:
            continue
        if event == 1:
            counts["machines_removed"] += 1  # agent failures are not simulated
            continue
        if event not in (0, 2):
            rows.bad(where, f"unknown machine event type {event}")
            continue
        if not row[4] or not row[5]:
            counts["machine_rows_without_size"] += 1
            continue
        try:
            cpus, mem = _float(row[4]) * max_cpus, _float(row[5]) * max_mem
        except ValueError:
            rows.bad(where, "cpus and memory must be numbers")
            continue
        platform = platforms.setdefault(row[3], f"p{len(platforms) + 1}")
        sizes[machine] = (round(cpus, 3), round(mem, 1), platform)
    groups: Counter[tuple[float, float, str]] = Counter(sizes.values())
    counts["machines"] = len(sizes)
    agent_groups = []
    for i, ((cpus, mem, platform), count) in enumerate(sorted(groups.items()), 1):
        if cpus <= 0 or mem <= 0:
            counts["machines_without_resources"] += count
            continue
        agent_groups.append({"name": f"g{i}", "count": count,
                             "resources": f"cpus:{cpus:g};mem:{mem:g}",
                             "attributes": {"platform": platform}})
    return {"name": "google-2011", "agent_groups": agent_groups}


def _tasks(rows: _Rows, max_cpus: float, max_mem: float, start: float, window_end: float,
           counts: Counter[str]) -> dict[tuple[int, int], _Task]:
    tasks: dict[tuple[int, int], _Task] = {}
    for where, row in rows:
        try:
            time = _int(row[0]) / US
            job, index, event = _int(row[2]), _int(row[3]), _int(row[5])
        except ValueError:
            rows.bad(where, "time, job id, task index and event type must be integers")
            continue
        if time < 0 or event not in range(9):
            rows.bad(where, f"bad time {row[0]!r} or event type {row[5]!r}")
            continue
        if time > window_end:
            continue
        if event == SCHEDULE and not row[4]:
            rows.bad(where, "a SCHEDULE event without a machine id")
            continue
        key = (job, index)
        task = tasks.get(key)
        if task is None:
            if event != SUBMIT:
                counts["task_rows_before_submit"] += 1
                continue
            if time < start:
                counts["tasks_submitted_before_window"] += 1
                tasks[key] = _Task(job, index, submitted=-1.0)  # remembered, not replayed
                continue
            task = tasks[key] = _Task(job, index, submitted=time)
        if task.submitted < 0:
            continue
        if event in (SUBMIT, UPDATE_PENDING, UPDATE_RUNNING):
            try:
                if row[8]:
                    task.priority = _int(row[8])
                if row[9]:
                    task.cpus = _float(row[9]) * max_cpus
                if row[10]:
                    task.mem = _float(row[10]) * max_mem
            except ValueError:
                rows.bad(where, "priority and requests must be numbers")
                continue
            if event == SUBMIT and task.last_event in ENDS:
                counts["tasks_resubmitted"] += 1
        elif event == SCHEDULE:
            if task.started is None:
                task.started = time
            task.running_since = time
        else:
            if task.running_since is not None:
                task.ran += time - task.running_since
                task.running_since = None
            task.last_end = time
            if event == EVICT:
                counts["evictions"] += 1
        task.last_event = event
    return tasks


def _usage(rows: _Rows, tasks: dict[tuple[int, int], _Task], max_cpus: float, max_mem: float,
           counts: Counter[str]) -> None:
    for where, row in rows:
        try:
            begin = _int(row[0]) / US
            job, index = _int(row[2]), _int(row[3])
            cpus = _float(row[5]) * max_cpus if row[5] else 0.0
            mem = _float(row[6]) * max_mem if row[6] else 0.0
        except ValueError:
            rows.bad(where, "times, ids and usage must be numbers")
            continue
        task = tasks.get((job, index))
        if task is None or task.submitted < 0:
            counts["usage_rows_for_unknown_tasks"] += 1
            continue
        alive_until = task.last_end if task.running_since is None else float("inf")
        if task.started is None or begin < task.started or (
                alive_until is not None and begin >= alive_until):
            counts["usage_rows_outside_task_life"] += 1
            continue
        task.usage.append((begin - task.started, max(0.0, cpus), max(0.0, mem)))


def _records(tasks: dict[tuple[int, int], _Task], start: float, window_end: float,
             counts: Counter[str]) -> list[dict[str, Any]]:
    records = []
    horizon = window_end
    if horizon == float("inf"):  # the window closes with the last event seen
        horizon = max((time for t in tasks.values()
                       for time in (t.submitted, t.running_since, t.last_end) if time is not None),
                      default=start)
    for (job, index), task in sorted(tasks.items(), key=lambda kv: (kv[1].submitted, kv[0])):
        if task.submitted < 0:
            continue
        if task.started is None:
            counts["tasks_never_scheduled"] += 1
            continue
        ran = task.ran
        if task.running_since is not None:  # still running when the window closes
            ran += horizon - task.running_since
            counts["tasks_running_at_end"] += 1
        cpus, mem = task.cpus, task.mem
        if cpus <= 0 or mem <= 0:
            counts["tasks_with_zero_request"] += 1
            cpus, mem = max(cpus, MIN_CPUS), max(mem, MIN_MEM)
        priority = dyad_priority(task.priority)
        name = band(priority)
        shape: dict[str, Any] = {"cpus": round(cpus, 4), "mem": round(mem, 1),
                                 "duration": round(max(ran, 0.0), 3)}
        if task.usage:
            shape["usage"] = _curves(task.usage)
        if task.last_event == FAIL:
            shape["fail"] = 1
        counts["tasks"] += 1
        records.append({"kind": "tasks", "at": round(task.submitted - start, 6),
                        "framework": f"google-{name}", "role": name, "priority": priority,
                        "count": 1, "per_offer": 10, "task": shape})
    if window_end != float("inf"):
        records.append({"kind": "end", "at": round(window_end - start, 6)})
    return records


def _curves(samples: list[tuple[float, float, float]]) -> dict[str, Any]:
    samples = sorted(samples)
    if len(samples) > MAX_USAGE_STEPS:
        step = len(samples) / MAX_USAGE_STEPS
        samples = [samples[int(i * step)] for i in range(MAX_USAGE_STEPS)]
    cpus: list[list[float]] = []
    mem: list[list[float]] = []
    for time, cpu, memory in samples:
        t = round(time, 3)
        if cpus and t <= cpus[-1][0]:
            continue
        cpus.append([t, round(cpu, 4)])
        mem.append([t, round(memory, 1)])
    cpus[0][0] = mem[0][0] = 0.0
    return {"cpus": {"steps": cpus}, "mem": {"steps": mem}}


def sample_csv(rows: list[list[Any]]) -> str:
    """Rows as the trace writes them (for tests and examples)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()
