"""Open a file beneath a directory without following any symlink on the way.

Resolving a path (`os.path.realpath`), checking that it lies under a root, and
then opening it by name is a race: between the check and the open, whoever can
write under the root (a task, in its sandbox) can swap a directory for a
symlink to ``/`` and have the open land outside. Here every component is opened
relative to the directory opened before it, with ``O_NOFOLLOW``, so what is
opened is what was checked: a symlink anywhere below the root is refused, at the
moment of opening, whatever it points to.

The root itself is trusted (the caller's own directory) and may be reached
through symlinks.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class NotBeneath(Exception):
    """The path leaves the root: '..', an absolute part, or a symlink on the way."""


def parts(relative: str) -> list[str]:
    """The components of `relative`; `NotBeneath` for '..' or NUL, '' and '.' dropped."""
    if "\0" in relative:
        raise NotBeneath("path contains NUL")
    names = [name for name in relative.split("/") if name not in ("", ".")]
    if ".." in names:
        raise NotBeneath("path contains '..'")
    return names


def _open_at(name: str, flags: int, dir_fd: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP: the name is a symlink (O_NOFOLLOW). ENOTDIR: it was a symlink (or
        # a file) where a directory was needed; if it is a symlink or a directory
        # by now, it was swapped while we opened it, which is refused the same way.
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _not_a_file(name, dir_fd)):
            raise NotBeneath(f"{name!r} is a symlink") from None
        raise


def _not_a_file(name: str, dir_fd: int) -> bool:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return True  # gone meanwhile: it was being swapped
    return stat.S_ISLNK(mode) or stat.S_ISDIR(mode)


@contextmanager
def open_beneath(root: str, relative: str) -> Iterator[int]:
    """A file descriptor for `relative` under `root` (a file or a directory),
    closed afterwards. Raises `NotBeneath`, or `OSError` (`FileNotFoundError`,
    `NotADirectoryError`...) as `os.open` would."""
    names = parts(relative)
    fd = os.open(root, _DIRECTORY & ~os.O_NOFOLLOW)
    try:
        for name in names[:-1]:
            parent, fd = fd, _open_at(name, _DIRECTORY, fd)
            os.close(parent)
        if names:
            parent, fd = fd, _open_at(names[-1], _FILE, fd)
            os.close(parent)
            os.set_blocking(fd, True)  # O_NONBLOCK only kept a FIFO from hanging the open
        yield fd
    finally:
        os.close(fd)
