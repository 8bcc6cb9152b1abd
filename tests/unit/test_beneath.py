"""`dyad.beneath`: files under a root open; no symlink below the root is ever
followed, not even one swapped in while a reader walks the path."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dyad.beneath import NotBeneath, open_beneath, parts


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "outside").write_text("SECRET")
    sandboxes = tmp_path / "frameworks"
    (sandboxes / "f1" / "run").mkdir(parents=True)
    (sandboxes / "f1" / "run" / "stdout").write_text("hello")
    return sandboxes


def read(root: Path, relative: str) -> str:
    with open_beneath(str(root), relative) as fd:
        return os.read(fd, 100).decode()


def test_a_file_beneath_the_root_opens(root: Path) -> None:
    assert read(root, "f1/run/stdout") == "hello"
    assert read(root, "/f1//./run/stdout") == "hello"


def test_a_directory_opens_for_listing(root: Path) -> None:
    with open_beneath(str(root), "f1/run") as fd:
        assert [entry.name for entry in os.scandir(fd)] == ["stdout"]
    with open_beneath(str(root), "") as fd:
        assert [entry.name for entry in os.scandir(fd)] == ["f1"]


@pytest.mark.parametrize("relative", ["../outside", "f1/../../outside", "a\0b"])
def test_paths_that_leave_the_root_are_refused(root: Path, relative: str) -> None:
    with pytest.raises(NotBeneath):
        parts(relative)


def test_symlinks_are_refused_wherever_they_are(root: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "outside", root / "f1" / "run" / "link")
    os.symlink(tmp_path, root / "f1" / "dirlink")
    os.symlink(root / "f1" / "run" / "stdout", root / "f1" / "inside-link")
    for relative in ("f1/run/link", "f1/dirlink/outside", "f1/inside-link"):
        with pytest.raises(NotBeneath, match="symlink"):
            read(root, relative)


def test_missing_files_and_files_used_as_directories_are_os_errors(root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read(root, "f1/run/missing")
    with pytest.raises(NotADirectoryError):
        read(root, "f1/run/stdout/x")


def test_the_root_itself_may_be_a_symlink(root: Path, tmp_path: Path) -> None:
    os.symlink(root, tmp_path / "alias")
    assert read(tmp_path / "alias", "f1/run/stdout") == "hello"


def test_a_fifo_does_not_hang_the_open(root: Path) -> None:
    os.mkfifo(root / "f1" / "run" / "pipe")
    with open_beneath(str(root), "f1/run/pipe") as fd:
        assert os.fstat(fd).st_size == 0


def reads_while_swapping(real: Path, elsewhere: Path, read: Callable[[], str],
                         refused: tuple[type[BaseException], ...], tries: int = 2000) -> set[str]:
    """What `read()` saw, at least `tries` times and on until it has seen both a
    read and a refusal (a loaded machine may interleave the two threads rarely;
    at most 20 s), while a thread kept swapping the directory `real` for a
    symlink to `elsewhere` and back; "refused" for a refusal."""
    stop = threading.Event()
    parked = real.with_name(real.name + ".parked")

    def swap() -> None:
        while not stop.is_set():
            os.rename(real, parked)
            os.symlink(elsewhere, real)
            os.unlink(real)
            os.rename(parked, real)

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen = set()
    try:
        done, deadline = 0, time.monotonic() + 20
        while done < tries or (len(seen) < 2 and time.monotonic() < deadline):
            try:
                seen.add(read())
            except refused:
                seen.add("refused")
            done += 1
    finally:
        stop.set()
        swapper.join()
    return seen


def test_swapping_a_directory_for_a_symlink_never_leaks(root: Path, tmp_path: Path) -> None:
    """The race a probe won 3 times in ~450 reads against resolve-then-open
    (realpath, check, open by name loses about 1 in 1000 reads to this swapper)."""
    (tmp_path / "outside-dir" / "run").mkdir(parents=True)
    (tmp_path / "outside-dir" / "run" / "stdout").write_text("SECRET")
    seen = reads_while_swapping(root / "f1", tmp_path / "outside-dir",
                                lambda: read(root, "f1/run/stdout"),
                                (NotBeneath, FileNotFoundError))
    assert "SECRET" not in seen
    assert {"hello", "refused"} <= seen  # both sides of the race were exercised
