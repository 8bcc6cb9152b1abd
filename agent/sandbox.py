"""Where executors live on disk: the sandbox layout and the ids that may name it.

Every executor run gets its own directory,
``WORK_DIR/frameworks/F/executors/E/runs/R`` (R is a fresh run id), so a relaunched
executor never writes over the logs of the one before it. Framework and executor
ids come from the network, so they are checked before they become path parts: an id
such as ``../../etc`` must not pick where a sandbox is made.

Pure (paths are built as strings, never looked at), so the core can name
sandboxes; `agent.files` is what serves them.
"""

from __future__ import annotations

FRAMEWORKS_DIR = "frameworks"


class InvalidId(Exception):
    """An id that cannot name a directory (empty, '.', '..', has '/' or NUL)."""


def check_id(kind: str, value: str) -> None:
    """Raise `InvalidId` unless `value` is usable as one path component."""
    if value in ("", ".", "..") or "/" in value or "\0" in value:
        raise InvalidId(f"{kind} {value!r} cannot name a sandbox directory")


def _join(head: str, *rest: str) -> str:
    """`os.path.join` for parts without slashes, as a plain string operation."""
    return "/".join([head.rstrip("/"), *rest]) if head else "/".join(rest)


def sandboxes_root(work_dir: str) -> str:
    return _join(work_dir, FRAMEWORKS_DIR)


def run_directory(work_dir: str, framework_id: str, executor_id: str, run_id: str) -> str:
    """The sandbox of one executor run; raises `InvalidId` for unusable ids."""
    check_id("framework id", framework_id)
    check_id("executor id", executor_id)
    check_id("run id", run_id)
    return _join(sandboxes_root(work_dir), framework_id, "executors", executor_id, "runs",
                 run_id)
