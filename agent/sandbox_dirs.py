"""Making sandboxes, spread over the disk's block groups.

A flood of tasks makes a sandbox each (`agent.sandbox`: three directories and two
log files a command task). ext4 places a new directory near its parent, so every
sandbox of a framework lands in the block group of its ``executors`` directory,
next to the sandboxes deleted before it. Without a journal (a configuration run
for speed, and this project's VM), ext4 passes over every free inode deleted in
the last 5-300 s, one inode-table look-up each, before it takes one: a group full
of recent deletions makes each new inode cost a walk over them. Measured on this
VM's `/tmp`, 500 sandboxes in a row: 1.2-2.4 ms of CPU a sandbox, against
0.15-0.30 ms with the mark below (`/dev/shm`: 0.05 ms).

The mark is ext4's "top of directory hierarchies" flag (``chattr +T``) on each
``executors`` directory as it is made: the sandboxes under it are unrelated, so
ext4 spreads them over the groups with the most free inodes and the fewest
directories, as it does for directories under `/`. It changes where inodes go,
nothing of what is in them. A file system without the flag (tmpfs, XFS, btrfs)
refuses it, and that is ignored. A directory made before the agent did this (an
older agent's) stays unmarked.
"""

from __future__ import annotations

import fcntl
import os
import struct

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_TOPDIR_FL = 0x00020000


def make(sandbox_dir: str) -> None:
    """`os.makedirs(sandbox_dir, exist_ok=True)` for a sandbox
    (``.../executors/E/runs/R``), marking a new ``executors`` directory."""
    executors, *rest = sandbox_dir.rsplit("/", 3)
    if len(rest) == 3 and rest[1] == "runs" and executors.endswith("/executors") \
            and not os.path.isdir(executors):  # once a framework (two threads: twice)
        os.makedirs(executors, exist_ok=True)
        mark_top(executors)
    os.makedirs(sandbox_dir, exist_ok=True)


def mark_top(directory: str) -> bool:
    """Set ext4's top-directory flag on `directory`; False where the file system
    has no such flag or refuses it (nothing else changes then)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = struct.unpack("i", fcntl.ioctl(descriptor, FS_IOC_GETFLAGS, b"\0" * 4))[0]
        if not flags & FS_TOPDIR_FL:
            fcntl.ioctl(descriptor, FS_IOC_SETFLAGS, struct.pack("i", flags | FS_TOPDIR_FL))
        return True
    except OSError:  # ENOTTY (tmpfs), EOPNOTSUPP (XFS, btrfs), EPERM
        return False
    finally:
        os.close(descriptor)
