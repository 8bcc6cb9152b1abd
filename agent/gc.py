"""Old sandboxes and big logs: keep what operators need, never fill the disk.

**Sandboxes** of finished runs stay browsable through `/files` for ``--gc-delay``
(default one week) after they were last written to. When the disk fills, that
delay shrinks the way Mesos shrinks it: a sandbox may live
``gc_delay * max(0, 1 - headroom - disk_usage)``, so at 90% usage with the
default 10% headroom every finished sandbox is removed, oldest first. The last
write time is the newest mtime of the run directory and its files, so the
schedule survives agent restarts with nothing to checkpoint. Live runs are never
touched.

**Logs** (a run's ``stdout`` and ``stderr``) are rotated once they pass
``--log-max-size``: the newest `max_size` bytes are copied to ``stdout.1``
(older rotations shift to ``.2`` .. ``.keep``, the oldest is dropped) and the file
is truncated in place. The executor keeps writing to the same open file (it was
opened for appending), so rotation needs no cooperation and survives agent
restarts. The price, named honestly: output written between the copy and the
truncation is lost, and a run can write ``rate x check interval`` past the limit
before it is noticed.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Iterable

import attrs

from agent.sandbox import sandboxes_root

log = logging.getLogger(__name__)

LOGS = ("stdout", "stderr")


@attrs.frozen
class Sandbox:
    path: str
    last_written: float  # seconds since the epoch


def max_age(gc_delay: float, disk_usage: float, headroom: float) -> float:
    """How long a finished sandbox may stay, given the disk's used fraction."""
    return max(0.0, gc_delay * (1.0 - headroom - disk_usage))


def plan(sandboxes: Iterable[Sandbox], live: set[str], now: float, gc_delay: float,
         disk_usage: float, headroom: float) -> list[str]:
    """The sandboxes to remove now, oldest first."""
    age = max_age(gc_delay, disk_usage, headroom)
    due = [s for s in sandboxes if s.path not in live and now - s.last_written >= age]
    return [s.path for s in sorted(due, key=lambda s: (s.last_written, s.path))]


def scan(work_dir: str) -> list[Sandbox]:
    """Every run directory under the work dir, with when it was last written."""
    found = []
    root = sandboxes_root(work_dir)
    for framework in _children(root):
        for executor in _children(os.path.join(framework, "executors")):
            for run in _children(os.path.join(executor, "runs")):
                found.append(Sandbox(run, _last_written(run)))
    return found


def remove(paths: Iterable[str], work_dir: str) -> int:
    """Delete sandboxes and the directories they leave empty; returns how many."""
    root = os.path.realpath(sandboxes_root(work_dir))
    removed = 0
    for path in paths:
        real = os.path.realpath(path)
        if not real.startswith(root + os.sep):
            continue  # never outside the sandboxes, whatever a caller passes
        shutil.rmtree(real, ignore_errors=True)
        removed += 1
        parent = os.path.dirname(real)
        while parent != root and parent.startswith(root + os.sep):
            try:
                os.rmdir(parent)  # only succeeds while empty
            except OSError:
                break
            parent = os.path.dirname(parent)
    return removed


def rotate(path: str, max_size: int, keep: int) -> bool:
    """Rotate `path` if it grew past `max_size` (see the module docstring)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    if size <= max_size:
        return False
    for index in range(keep - 1, 0, -1):
        older = f"{path}.{index}"
        if os.path.exists(older):
            os.replace(older, f"{path}.{index + 1}")
    with open(path, "rb") as source:
        source.seek(max(0, size - max_size))
        tail = source.read(max_size)
    if keep > 0:
        with open(f"{path}.1", "wb") as target:
            target.write(tail)
    os.truncate(path, 0)
    log.info("rotated %s at %d bytes", path, size)
    return True


def rotate_logs(directories: Iterable[str], max_size: int, keep: int) -> int:
    """Rotate the logs of every run directory given; returns how many rotated."""
    return sum(rotate(os.path.join(d, name), max_size, keep)
               for d in directories for name in LOGS)


def _children(directory: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(directory) if entry.is_dir()]
    except OSError:
        return []


def _last_written(directory: str) -> float:
    newest = 0.0
    try:
        newest = os.stat(directory).st_mtime
        for entry in os.scandir(directory):
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        pass
    return newest
