"""The file system side of the agent's `/files` API: which paths may be served,
and reading them.

Only what is under ``WORK_DIR/frameworks`` is served. `resolve` follows symlinks
before checking, so a task cannot publish ``/etc/shadow`` by linking to it from
its sandbox.
"""

from __future__ import annotations

import os

from agent.sandbox import sandboxes_root


class FilesError(Exception):
    """Base of the errors below; each maps to one HTTP status in `agent.http`."""


class InvalidPath(FilesError):
    """A path the caller wrote wrongly (relative, NUL byte): HTTP 400."""


class OutsideSandbox(FilesError):
    """A path that leads outside the sandboxes (``..``, symlink, elsewhere): HTTP 403."""


def resolve(work_dir: str, path: str) -> str:
    """The real path of `path` if it lies inside the sandboxes of `work_dir`.

    `path` must be absolute (as `/state` shows sandbox directories). Raises
    `OutsideSandbox`, `InvalidPath`, or `FileNotFoundError` if nothing is there.
    """
    if "\0" in path:
        raise InvalidPath("path must not contain NUL")
    if ".." in path.split("/"):
        raise OutsideSandbox("path must not contain '..'")
    if not os.path.isabs(path):
        raise InvalidPath(f"path {path!r} must be absolute")
    root = os.path.realpath(sandboxes_root(work_dir))
    real = os.path.realpath(path)
    if real != root and not real.startswith(root + os.sep):
        raise OutsideSandbox(f"{path} is outside the agent's sandboxes")
    if not os.path.lexists(real):
        raise FileNotFoundError(path)
    return real
