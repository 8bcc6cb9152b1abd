"""`agent.files`, the file system side of `/files`: paths are opened beneath the
sandboxes root without following symlinks, so neither a link nor a directory
swapped for one while a request walks the path leaks a byte from outside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent import files
from tests.unit.test_beneath import reads_while_swapping

SANDBOX = "frameworks/F1/executors/E1/runs/R1"


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    (tmp_path / "outside").write_text("SECRET")
    (tmp_path / "work" / SANDBOX).mkdir(parents=True)
    (tmp_path / "work" / SANDBOX / "stdout").write_text("hello")
    return tmp_path / "work"


def test_sandbox_files_are_listed_and_read_by_their_paths(work_dir: Path) -> None:
    sandbox = f"{work_dir}/{SANDBOX}"
    assert [e["path"] for e in files.browse(str(work_dir), sandbox)] == [f"{sandbox}/stdout"]
    assert files.read(str(work_dir), f"{sandbox}//./stdout", 0, None) == ("hello", 0)
    assert files.read(str(work_dir), f"{sandbox}/stdout", -1, None) == ("", 5)
    fd, size = files.open_download(str(work_dir), f"{sandbox}/stdout")
    try:
        assert (files.read_at(fd, 0), size) == (b"hello", 5)
    finally:
        os.close(fd)


def test_paths_outside_or_through_symlinks_are_refused(work_dir: Path, tmp_path: Path) -> None:
    sandbox = work_dir / SANDBOX
    os.symlink(tmp_path / "outside", sandbox / "escape")
    os.symlink(sandbox / "stdout", sandbox / "inside")
    os.symlink("loop", sandbox / "loop")
    for path in (str(tmp_path / "outside"), f"{sandbox}/escape", f"{sandbox}/inside",
                 f"{sandbox}/../../../../../../outside"):
        with pytest.raises(files.OutsideSandbox):
            files.read(str(work_dir), path, 0, None)
    with pytest.raises(files.NotServable, match="symbolic links"):
        files.read(str(work_dir), f"{sandbox}/loop", 0, None)
    with pytest.raises(files.InvalidPath):
        files.read(str(work_dir), "relative/stdout", 0, None)


def test_swapping_a_sandbox_directory_for_a_symlink_never_leaks(
        work_dir: Path, tmp_path: Path) -> None:
    """The probe of issue 17 read outside the sandbox 3 times in ~450 reads by
    swapping a directory for a symlink while `/files` resolved and then opened."""
    (tmp_path / "elsewhere" / "executors" / "E1" / "runs" / "R1").mkdir(parents=True)
    (tmp_path / "elsewhere" / "executors" / "E1" / "runs" / "R1" / "stdout").write_text(
        "SECRET")
    seen = reads_while_swapping(
        work_dir / "frameworks" / "F1", tmp_path / "elsewhere",
        lambda: files.read(str(work_dir), f"{work_dir}/{SANDBOX}/stdout", 0, None)[0],
        (files.FilesError, OSError))  # refused, or caught mid-swap
    assert "SECRET" not in seen
    assert {"hello", "refused"} <= seen  # both sides of the race were exercised
