"""Sandboxes made with their `executors` directory marked for spreading (ext4)."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

from agent import sandbox_dirs
from agent.sandbox import run_directory


def _flags(path: Path) -> int | None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        raw = fcntl.ioctl(descriptor, sandbox_dirs.FS_IOC_GETFLAGS, b"\0" * 4)
        return int(struct.unpack("i", raw)[0])
    except OSError:  # a file system without inode flags (tmpfs)
        return None
    finally:
        os.close(descriptor)


def test_a_sandbox_is_made_and_its_new_executors_directory_marked(tmp_path: Path) -> None:
    sandbox = Path(run_directory(str(tmp_path), "f1", "e1", "r1"))
    sandbox_dirs.make(str(sandbox))
    assert sandbox.is_dir()
    executors = sandbox.parents[2]
    assert executors.name == "executors"
    flags = _flags(executors)
    if flags is not None and sandbox_dirs.mark_top(str(executors)):  # ext4 and the like
        assert flags & sandbox_dirs.FS_TOPDIR_FL
        assert not (_flags(sandbox) or 0) & sandbox_dirs.FS_TOPDIR_FL  # not inherited


def test_making_it_again_or_beside_it_is_harmless(tmp_path: Path) -> None:
    first = run_directory(str(tmp_path), "f1", "e1", "r1")
    second = run_directory(str(tmp_path), "f1", "e2", "r2")
    for sandbox in (first, first, second):
        sandbox_dirs.make(sandbox)
    assert Path(first).is_dir() and Path(second).is_dir()


def test_a_directory_outside_the_layout_is_made_and_nothing_marked(tmp_path: Path) -> None:
    plain = tmp_path / "a" / "b" / "c" / "d"
    sandbox_dirs.make(str(plain))
    assert plain.is_dir()
    for directory in plain.parents:
        if directory == tmp_path:
            break
        assert not (_flags(directory) or 0) & sandbox_dirs.FS_TOPDIR_FL


def test_a_file_system_without_the_flag_is_refused_quietly(tmp_path: Path) -> None:
    assert sandbox_dirs.mark_top(str(tmp_path / "missing")) is False
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        target = shm / f"dyad-test-{os.getpid()}"
        target.mkdir()
        try:
            assert sandbox_dirs.mark_top(str(target)) is False  # tmpfs: ENOTTY
        finally:
            target.rmdir()
