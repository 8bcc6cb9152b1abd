"""The file system side of the agent's `/files` API: which paths may be served,
and listing and reading them without ever blocking.

Only what is under ``WORK_DIR/frameworks`` is served, and no symlink below it
is followed: every path is opened one component at a time, each relative to the
directory descriptor before it, with ``O_NOFOLLOW`` (`dyad.beneath`), so a task
can neither publish ``/etc/shadow`` by linking to it from its sandbox nor win a
race by swapping a directory for a symlink while a request walks the path
(resolving first and then opening by name lost that race). Listing and reading
then use the descriptor, never the name again.

Sandboxes hold whatever tasks put there, so only regular files and directories
are served: the last component is opened with ``O_NONBLOCK`` (opening a FIFO
then returns at once instead of waiting for a writer) and checked with ``fstat``
on the open descriptor, so a FIFO, a device or a socket is refused
(`NotServable`) before a byte is read. Every call
here runs on `FilesPool`, a small thread pool of its own, so even a slow disk
holds up only `/files`, never the agent's other work.

Errors are `FilesError`s, each of which `agent.http` maps to one 4xx status; an
`OSError` the kernel gives (a symlink loop, a name too long) becomes
`FilesError` with the kernel's words.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import os
import pwd
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, TypeVar

from agent.sandbox import sandboxes_root
from dyad.beneath import NotBeneath, open_beneath

READ_LIMIT = 1024 * 1024  # /files/read returns at most 1 MiB per call, like Mesos
DOWNLOAD_CHUNK = 256 * 1024
POOL_THREADS = 4
MAX_WAITING = 64  # requests queued for the pool beyond this are refused (429)

_T = TypeVar("_T")


class FilesError(Exception):
    """A request `/files` cannot serve; `status` is the HTTP status that says why."""

    status = 400


class InvalidPath(FilesError):
    """A path the caller wrote wrongly (relative, NUL byte, not Unicode): HTTP 400."""


class OutsideSandbox(FilesError):
    """A path that leads outside the sandboxes (``..``, symlink, elsewhere): HTTP 403."""

    status = 403


class NotFound(FilesError):
    status = 404


class NotServable(FilesError):
    """Something there, but not a regular file or directory (a FIFO, a device, a
    socket), or not the kind the call wants: HTTP 400."""


class Busy(FilesError):
    """Too many `/files` requests waiting already: HTTP 429."""

    status = 429


_ERRNO_STATUS = {errno.ENOENT: NotFound, errno.EACCES: OutsideSandbox,
                 errno.EPERM: OutsideSandbox}


def from_os_error(exc: OSError) -> FilesError:
    kind = _ERRNO_STATUS.get(exc.errno or 0, NotServable)
    where = f"{exc.filename}: " if isinstance(exc.filename, str) else ""
    return kind(f"{where}{exc.strerror or exc}")


class FilesPool:
    """The threads `/files` runs on, with a bound on how many requests may wait."""

    def __init__(self, threads: int = POOL_THREADS, max_waiting: int = MAX_WAITING) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="agent-files")
        self._slots = max_waiting + threads
        self._in_use = 0

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        if self._in_use >= self._slots:
            raise Busy("too many /files requests in progress; try again")
        self._in_use += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, _guarded, function, args)
        finally:
            self._in_use -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _guarded(function: Callable[..., _T], args: tuple[Any, ...]) -> _T:
    """Run `function`; what the file system or the path's encoding throws becomes a
    `FilesError` (a path the OS cannot encode, e.g. a lone surrogate, included)."""
    try:
        return function(*args)
    except FilesError:
        raise
    except OSError as exc:
        raise from_os_error(exc) from None
    except (UnicodeError, ValueError) as exc:  # unencodable path, NUL byte
        raise InvalidPath(f"path cannot be used: {exc}") from None


def under_sandboxes(work_dir: str, path: str) -> tuple[str, str]:
    """(the sandboxes root, `path` relative to it), if `path` names something
    under the root; nothing on disk is looked at.

    `path` must be absolute, as `/state` shows sandbox directories, and may start
    with the root as configured or as its real path. Raises `OutsideSandbox` or
    `InvalidPath`."""
    if "\0" in path:
        raise InvalidPath("path must not contain NUL")
    if ".." in path.split("/"):
        raise OutsideSandbox("path must not contain '..'")
    if not os.path.isabs(path):
        raise InvalidPath(f"path {path!r} must be absolute")
    normal = os.path.normpath(path)
    root = sandboxes_root(work_dir)
    for candidate in dict.fromkeys((os.path.abspath(root), os.path.realpath(root))):
        if normal == candidate or normal.startswith(candidate + os.sep):
            return candidate, normal[len(candidate):]
    raise OutsideSandbox(f"{path} is outside the agent's sandboxes")


@contextmanager
def _opened(work_dir: str, path: str, want_directory: bool) -> Iterator[int]:
    """A descriptor of `path` under the sandboxes, which must be a directory (or
    else a regular file), opened one component at a time without following any
    symlink (`dyad.beneath`): what is checked is what is read, whatever a task
    swaps in meanwhile."""
    root, relative = under_sandboxes(work_dir, path)
    try:
        with open_beneath(root, relative) as fd:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise NotServable(f"{path} is not a regular file or directory")
            if stat.S_ISDIR(mode) != want_directory:
                raise NotServable(f"{path} is {'not ' if want_directory else ''}a directory")
            yield fd
    except NotBeneath:
        raise _refusal(path) from None


def _refusal(path: str) -> FilesError:
    """Why a path through a symlink is refused. Only the message depends on where
    the link leads (looked up after the refusal, so a race changes only words):
    a loop is the caller's bad path (400), anything else leads out (403)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return NotServable(f"{path}: {exc.strerror}")
    return OutsideSandbox(f"{path} leads through a symbolic link; /files follows none")


def browse(work_dir: str, path: str) -> list[dict[str, Any]]:
    directory = os.path.normpath(path)
    with _opened(work_dir, path, want_directory=True) as fd:
        entries = []
        for name in sorted(os.listdir(fd)):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed
            entries.append({"path": os.path.join(directory, name), "size": info.st_size,
                            "mode": stat.filemode(info.st_mode), "mtime": info.st_mtime,
                            "nlink": info.st_nlink, "uid": _user(info.st_uid),
                            "gid": _group(info.st_gid)})
    return entries


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def read(work_dir: str, path: str, offset: int, length: int | None) -> tuple[str, int]:
    """Mesos semantics: offset -1 asks for the size (empty data, offset = size);
    otherwise up to `length` bytes (default: the rest) capped at 1 MiB."""
    with _opened(work_dir, path, want_directory=False) as fd:
        size = os.fstat(fd).st_size
        if offset == -1:
            return "", size
        if offset > size:
            raise FilesError(f"offset {offset} is beyond the end of the file ({size} bytes)")
        chunk = os.pread(fd, min(READ_LIMIT, size - offset if length is None else length),
                         offset)
    return chunk.decode("utf-8", errors="replace"), offset


def open_download(work_dir: str, path: str) -> tuple[int, int]:
    """A descriptor of the regular file at `path` and its size; the caller closes it."""
    with _opened(work_dir, path, want_directory=False) as fd:
        return os.dup(fd), os.fstat(fd).st_size


def read_at(fd: int, offset: int) -> bytes:
    return os.pread(fd, DOWNLOAD_CHUNK, offset)
