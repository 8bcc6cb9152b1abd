"""Sandbox garbage collection (the plan is pure; scanning and removal use a real
directory tree) and log rotation (real files, written while 'open' like a task's)."""

from __future__ import annotations

import os
from pathlib import Path

from agent.gc import Sandbox, max_age, plan, remove, rotate, rotate_logs, scan
from agent.sandbox import run_directory

WEEK = 7 * 86400.0


def test_the_age_limit_shrinks_as_the_disk_fills() -> None:
    assert max_age(WEEK, 0.0, 0.1) == WEEK * 0.9
    assert max_age(WEEK, 0.5, 0.1) == WEEK * 0.4
    assert max_age(WEEK, 0.95, 0.1) == 0.0


def test_plan_removes_finished_sandboxes_oldest_first_and_never_live_ones() -> None:
    now = 1_000_000.0
    sandboxes = [Sandbox("/w/new", now - 10), Sandbox("/w/old", now - 2 * WEEK),
                 Sandbox("/w/older", now - 3 * WEEK), Sandbox("/w/live", now - 9 * WEEK)]
    assert plan(sandboxes, {"/w/live"}, now, WEEK, 0.2, 0.1) == ["/w/older", "/w/old"]
    assert plan(sandboxes, {"/w/live"}, now, WEEK, 0.95, 0.1) == [
        "/w/older", "/w/old", "/w/new"]  # the disk is short: everything finished goes


def test_scan_and_remove_real_sandboxes(tmp_path: Path) -> None:
    work = str(tmp_path)
    old = Path(run_directory(work, "F1", "E1", "r1"))
    new = Path(run_directory(work, "F1", "E2", "r2"))
    for directory in (old, new):
        directory.mkdir(parents=True)
        (directory / "stdout").write_text("output")
    for path in (old, old / "stdout"):
        os.utime(path, (1000.0, 1000.0))
    found = {s.path: s.last_written for s in scan(work)}
    assert found[str(old)] == 1000.0 and found[str(new)] > 1000.0
    assert remove([str(old), "/etc", str(tmp_path / "..")], work) == 1
    assert not old.exists() and not old.parent.parent.exists()  # emptied dirs go too
    assert new.exists() and Path(work, "frameworks", "F1").exists()


def test_logs_rotate_past_the_limit_keeping_the_newest_bytes(tmp_path: Path) -> None:
    log = tmp_path / "stdout"
    with open(log, "ab") as writer:  # the executor's handle stays open throughout
        writer.write(b"a" * 60 + b"b" * 60)
        writer.flush()
        assert not rotate(str(log), 200, 2)
        assert rotate(str(log), 100, 2)
        assert (tmp_path / "stdout.1").read_bytes() == b"a" * 40 + b"b" * 60
        assert log.stat().st_size == 0
        writer.write(b"c" * 150)  # appends land at the new start of the file
        writer.flush()
        assert rotate(str(log), 100, 2)
        writer.write(b"d" * 150)
        writer.flush()
        assert rotate(str(log), 100, 2)
    assert (tmp_path / "stdout.1").read_bytes() == b"d" * 100
    assert (tmp_path / "stdout.2").read_bytes() == b"c" * 100
    assert not (tmp_path / "stdout.3").exists()
    assert rotate_logs([str(tmp_path)], 100, 2) == 0


def test_keeping_nothing_just_truncates(tmp_path: Path) -> None:
    (tmp_path / "stderr").write_bytes(b"x" * 50)
    assert rotate_logs([str(tmp_path)], 10, 0) == 1
    assert (tmp_path / "stderr").stat().st_size == 0
    assert not (tmp_path / "stderr.1").exists()
