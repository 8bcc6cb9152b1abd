"""Where executors live on disk, and which files the `/files` API may serve.

Every executor run gets its own directory,
``WORK_DIR/frameworks/F/executors/E/runs/R`` (R is a fresh run id), so a relaunched
executor never writes over the logs of the one before it. Framework and executor
ids come from the network, so they are checked before they become path parts: an id
such as ``../../etc`` must not pick where a sandbox is made.

The `/files` API serves only what is under ``WORK_DIR/frameworks``. `resolve`
follows symlinks before checking, so a task cannot publish ``/etc/shadow`` by
linking to it from its sandbox.
"""

from __future__ import annotations

import os

FRAMEWORKS_DIR = "frameworks"


class SandboxError(Exception):
    """Base of the errors below; each maps to one HTTP status in `agent.http`."""


class InvalidId(SandboxError):
    """An id that cannot name a directory (empty, '.', '..', has '/' or NUL)."""


class InvalidPath(SandboxError):
    """A path the caller wrote wrongly (relative, NUL byte): HTTP 400."""


class OutsideSandbox(SandboxError):
    """A path that leads outside the sandboxes (``..``, symlink, elsewhere): HTTP 403."""


def check_id(kind: str, value: str) -> None:
    """Raise `InvalidId` unless `value` is usable as one path component."""
    if value in ("", ".", "..") or "/" in value or "\0" in value:
        raise InvalidId(f"{kind} {value!r} cannot name a sandbox directory")


def sandboxes_root(work_dir: str) -> str:
    return os.path.join(work_dir, FRAMEWORKS_DIR)


def run_directory(work_dir: str, framework_id: str, executor_id: str, run_id: str) -> str:
    """The sandbox of one executor run; raises `InvalidId` for unusable ids."""
    check_id("framework id", framework_id)
    check_id("executor id", executor_id)
    check_id("run id", run_id)
    return os.path.join(sandboxes_root(work_dir), framework_id, "executors", executor_id,
                        "runs", run_id)


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
