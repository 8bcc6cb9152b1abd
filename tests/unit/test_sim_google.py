"""The Google cluster-data 2011 importer, on a sample written from the schema."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dyad.cli import main as dyad_main
from sim.cell import load_cell
from sim.google import dyad_priority, import_trace, sample_csv
from sim.inputs import InputError
from sim.policy import Policy
from sim.run import Simulation
from sim.workload import load_workload

S = 1_000_000  # the trace's microseconds


def task_event(t: float, job: int, index: int, event: int, machine: str = "",
               priority: int | str = "", cpu: float | str = "", mem: float | str = ""
               ) -> list[object]:
    return [int(t * S), "", job, index, machine, event, "user", 0, priority, cpu, mem, "", 0]


def usage(begin: float, end: float, job: int, index: int, cpu: float, mem: float) -> list[object]:
    return [int(begin * S), int(end * S), job, index, "m1", cpu, mem, mem, 0, 0, mem, 0, 0, 0,
            0, 0, 0, 1, 0, cpu]


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    root = tmp_path / "trace"
    root.mkdir()
    (root / "machine_events.csv").write_text(sample_csv([
        [0, "m1", 0, "platA", 0.5, 0.5],
        [0, "m2", 0, "platB", 1.0, 1.0],
        [0, "m3", 0, "platA", "", ""],          # size unknown
        [0, "", 0, "platA", 0.5, 0.5],          # missing machine id: malformed
        [0, "m4", 0, "platA", 0.25, 0.25],
        [500 * S, "m4", 1, "", "", ""],          # removed later: still in the cell
        [600 * S, "m1", 2, "platA", 0.5, 0.25],  # resized
        [1, 2, 3],                               # too few columns
    ]))
    (root / "task_events").mkdir()
    (root / "task_events" / "part-00000-of-00002.csv").write_text(sample_csv([
        task_event(0, 3, 0, 0, priority=4, cpu=0.1, mem=0.1),       # before the window
        task_event(600, 1, 0, 0, priority=9, cpu=0.125, mem=0.0625),
        task_event(600, 1, 1, 0, priority=9, cpu=0.125, mem=0.0625),
        task_event(610, 1, 0, 1, "m1"),
        task_event(620, 1, 1, 1, "m2"),
        task_event(650, 1, 1, 2, "m2"),                             # evicted ...
        task_event(660, 1, 1, 0, priority=9, cpu=0.125, mem=0.0625),  # ... resubmitted
        task_event(700, 1, 1, 1, "m1"),
        task_event(710, 1, 0, 4, "m1"),
        ["abc", "", 1, 0, "", 4, "u", 0, "", "", "", "", 0],       # not a number
    ]))
    (root / "task_events" / "part-00001-of-00002.csv").write_text(sample_csv([
        task_event(700, 2, 0, 0, priority=0, cpu=0.0625, mem=0.03),
        task_event(705, 2, 0, 1, ""),                               # missing machine id
        task_event(720, 2, 0, 1, "m2"),
        task_event(760, 1, 1, 4, "m1"),
        task_event(800, 2, 0, 3, "m2"),                             # failed
        task_event(900, 4, 0, 0, priority=11, cpu=0.01, mem=0.01),  # never scheduled
        task_event(950, 5, 0, 0, priority=5, cpu=0.0, mem=0.01),    # asks for no cpu
        task_event(960, 5, 0, 1, "m1"),                             # runs past the window
        task_event(1300, 5, 0, 4, "m1"),
    ]))
    (root / "task_usage").mkdir()
    with gzip.open(root / "task_usage" / "part-00000-of-00001.csv.gz", "wt") as handle:
        handle.write(sample_csv([
            usage(600, 610, 1, 0, 0.01, 0.01),    # before it started
            usage(610, 660, 1, 0, 0.05, 0.02),
            usage(660, 710, 1, 0, 0.1, 0.04),
            usage(720, 780, 1, 0, 0.1, 0.04),     # after it ended
            usage(700, 710, 9, 9, 0.1, 0.1),      # a task never seen
        ]))
    return root


def test_import_sample(trace: Path) -> None:
    imported = import_trace(trace, max_cpus=32, max_mem=65536, start=300, end=1200)
    assert [str(p).rsplit(":", 2)[-2:] for p in imported.problems] == [
        ["4", " missing machine id"], ["8", " 3 columns, expected 6"],
        ["10", " time, job id, task index and event type must be integers"],
        ["2", " a SCHEDULE event without a machine id"]]
    assert imported.cell["agent_groups"] == [
        {"name": "g1", "count": 1, "resources": "cpus:8;mem:16384", "attributes": {"platform": "p1"}},
        {"name": "g2", "count": 1, "resources": "cpus:16;mem:16384", "attributes": {"platform": "p1"}},
        {"name": "g3", "count": 1, "resources": "cpus:32;mem:65536", "attributes": {"platform": "p2"}}]
    counts = imported.counts
    assert counts["machines"] == 3 and counts["machine_rows_without_size"] == 1
    assert counts["machines_removed"] == 1
    assert counts["tasks_submitted_before_window"] == 1
    assert counts["tasks_never_scheduled"] == 1
    assert counts["tasks_resubmitted"] == 1 and counts["evictions"] == 1
    assert counts["usage_rows_outside_task_life"] == 2
    assert counts["usage_rows_for_unknown_tasks"] == 1
    assert counts["tasks_running_at_end"] == 1 and counts["tasks_with_zero_request"] == 1
    tasks = {(r["at"], r["task"]["duration"]): r for r in imported.records if r["kind"] == "tasks"}
    assert sorted(tasks) == [(300.0, 90.0), (300.0, 100.0), (400.0, 80.0), (650.0, 240.0)]
    first = tasks[(300.0, 100.0)]
    assert first["framework"] == "google-production" and first["priority"] == 200
    assert first["task"]["cpus"] == 4 and first["task"]["mem"] == 4096
    assert first["task"]["usage"] == {"cpus": {"steps": [[0.0, 1.6], [50.0, 3.2]]},
                                      "mem": {"steps": [[0.0, 1310.7], [50.0, 2621.4]]}}
    failed = tasks[(400.0, 80.0)]
    assert failed["task"]["fail"] == 1 and failed["role"] == "best-effort"
    assert tasks[(650.0, 240.0)]["task"]["cpus"] == 0.001
    assert imported.records[-1] == {"kind": "end", "at": 900.0}


def test_strict_stops_at_the_first_bad_row(trace: Path) -> None:
    with pytest.raises(InputError, match=r"machine_events.csv:4: missing machine id"):
        import_trace(trace, max_cpus=32, max_mem=65536, strict=True)


def test_imported_files_simulate(trace: Path, tmp_path: Path) -> None:
    assert dyad_main(["sim", "import-google", "--trace", str(trace), "--max-cpus", "32",
                      "--max-mem", "65536", "--start", "300", "--end", "1200",
                      "--cell", str(tmp_path / "c.json"), "--workload", str(tmp_path / "w.jsonl")]) == 0
    workload, skipped = load_workload(tmp_path / "w.jsonl", strict=True)
    report = Simulation(load_cell(tmp_path / "c.json"), workload, Policy(), seed=1).run()
    # The task that ran past the window ran 240 s of it: it ends inside the span.
    assert report["tasks"]["by_final_state"] == {"TASK_FAILED": 1, "TASK_FINISHED": 3}
    assert report["tasks"]["running_at_end"] == 0
    assert report["pending_seconds"]["production"]["count"] == 2
    assert json.loads((tmp_path / "c.json").read_text())["name"] == "google-2011"


def test_priority_bands() -> None:
    assert [dyad_priority(p) for p in range(12)] == [
        50, 51, 100, 110, 120, 130, 140, 150, 160, 200, 250, 360]
