"""`dyad-batch`: argument handling, clear errors before a job starts, job records
for `status` and `list`, and the progress display (bar on a terminal, plain lines
otherwise)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from frameworks.batch.cli import _job, build_parser, main, parse_size
from frameworks.batch.status import (
    FAILED, LOST, RUNNING, JobRecord, ProgressPrinter, find_job, list_jobs, progress_bar,
    progress_text)

WORDCOUNT = str(Path(__file__).resolve().parents[2] / "examples" / "wordcount.py")


def progress(maps: int = 0, reduces: int = 0, **extra: object) -> dict[str, object]:
    return {"maps_total": 10, "maps_done": maps, "maps_running": 0, "reduces_total": 2,
            "reduces_done": reduces, "reduces_running": 0, "failed_attempts": 0,
            "maps_rerun": 0, "speculative_attempts": 0, "locality": None, **extra}


def test_sizes() -> None:
    assert parse_size("32MiB") == 32 * 1024 * 1024
    assert parse_size("512k") == 512 * 1024
    assert parse_size("1.5g") == int(1.5 * 1024 ** 3)
    assert parse_size("1000") == 1000


def test_submit_defaults_follow_the_issue() -> None:
    args = build_parser().parse_args(
        ["submit", "wc.py", "--input", "a", "b", "--input", "c", "--output", "out"])
    assert args.input == ["a", "b", "c"]
    assert (args.reducers, args.max_attempts, args.locality_wait) == (1, 4, 1.0)
    assert (args.map_cpus, args.map_mem, args.speculative) == (0.5, 256.0, False)
    assert not _job(args).revocable  # revocable resources only when asked
    asked = build_parser().parse_args(["submit", "wc.py", "--input", "a", "--output", "out",
                                       "--revocable"])
    assert _job(asked).revocable


def test_a_job_that_cannot_start_exits_2_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = ["--jobs-dir", str(tmp_path / "jobs")]
    code = main(["submit", "--master", "127.0.0.1:1", WORDCOUNT, "--input",
                 str(tmp_path / "missing.txt"), "--output", str(tmp_path / "out"), *jobs])
    assert code == 2
    assert "error: input" in capsys.readouterr().err
    (tmp_path / "in.txt").write_text("x\n")
    code = main(["submit", "--master", "127.0.0.1:1", str(tmp_path / "nope.py"), "--input",
                 str(tmp_path / "in.txt"), "--output", str(tmp_path / "out"), *jobs])
    assert code == 2
    assert "cannot read the job module" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "jobs").exists()


def test_submit_needs_a_master(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYAD_MASTER", raising=False)
    assert main(["submit", WORDCOUNT, "--input", "x", "--output", str(tmp_path / "o")]) == 2
    assert "give --master" in capsys.readouterr().err


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_status_and_list_read_job_records(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    jobs = tmp_path / "jobs"
    JobRecord(job_id="job-1-aaa", name="wordcount", state=FAILED, master="m:5050",
              output="/out", pid=1, started_at=1.0, error="map 0 failed 4 times",
              progress=progress(maps=3)).save(jobs)
    JobRecord(job_id="job-2-bbb", name="sort", state=RUNNING, master="m:5050",
              output="/o2", pid=dead_pid(), started_at=2.0, progress=progress(10, 1)).save(jobs)
    (jobs / "junk.json").write_text("{not json")
    assert [r.job_id for r in list_jobs(jobs)] == ["job-1-aaa", "job-2-bbb"]
    assert find_job(jobs, "job-2").shown_state == LOST  # its submitter is gone
    with pytest.raises(LookupError, match="matches 2 jobs"):
        find_job(jobs, "job-")
    assert main(["status", "job-1", "--jobs-dir", str(jobs)]) == 0
    shown = capsys.readouterr().out
    assert "state     FAILED" in shown and "error     map 0 failed 4 times" in shown
    assert "maps 3/10" in shown
    assert main(["list", "--jobs-dir", str(jobs)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:3] == ["JOB", "NAME", "STATE"]
    assert "LOST" in listed[2] and "maps 10/10  reduces 1/2" in listed[2]
    assert main(["status", "job-9", "--jobs-dir", str(jobs)]) == 1
    assert "no job 'job-9'" in capsys.readouterr().err


def test_progress_text_and_bar() -> None:
    text = progress_text(progress(maps=5, maps_running=3, failed_attempts=1, maps_rerun=2,
                                  preempted_attempts=3, locality=0.96))
    assert text == ("maps 5/10 (3 running)  reduces 0/2  failures 1  re-run maps 2  "
                    "preempted 3  locality 96%")
    assert progress_bar(progress(maps=10, reduces=1), width=8) == "[######..]"


def test_progress_on_a_terminal_redraws_one_line() -> None:
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=True)
    printer.update(progress(1))
    printer.update(progress(1))
    printer.update(progress(2))
    printer.close()
    assert stream.getvalue().count("\r") == 2 and stream.getvalue().endswith("\n")


def test_plain_progress_is_throttled_but_shows_phase_ends() -> None:
    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=False, clock=lambda: now[0])
    printer.update(progress(1))
    printer.update(progress(2))  # within a second: skipped
    now[0] = 1.5
    printer.update(progress(3))
    printer.update(progress(10))  # the maps are done: shown at once
    printer.update(progress(10, 2))
    lines = stream.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["maps 1/10", "maps 3/10", "maps 10/10",
                                                       "maps 10/10"]
    assert "\r" not in stream.getvalue()
