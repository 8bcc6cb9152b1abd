"""The checkpoint on disk: ``WORK_DIR/meta/agent.json`` (the I/O half of
`agent.checkpoint`, which says what is in it).

Writes are atomic (a temporary file renamed over the old one), so a crash leaves
the previous or the new document, never half of one. They are not fsync'ed: they
survive the agent process dying, which is what recovery is for; after a machine
crash there are no executors left to take back.
"""

from __future__ import annotations

import os

from agent.checkpoint import FILE, Encoder, SavedAgent, decode, meta_dir


def path(work_dir: str) -> str:
    return os.path.join(meta_dir(work_dir), FILE)


def load(work_dir: str) -> SavedAgent | None:
    """The checkpoint under `work_dir`, or None if there is none. Raises
    `CheckpointError` when it cannot be read."""
    try:
        with open(path(work_dir), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    return decode(data)


class Writer:
    """Writes the checkpoints of one agent, reusing the encoding of what did not
    change since the last write (`agent.checkpoint.Encoder`)."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self._encoder = Encoder()

    def write(self, saved: SavedAgent) -> None:
        target = path(self.work_dir)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = f"{target}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(self._encoder.encode(saved))
        os.replace(temporary, target)


def write(work_dir: str, saved: SavedAgent) -> None:
    Writer(work_dir).write(saved)


def remove(work_dir: str) -> None:
    """Forget the checkpoint: the next start is a new agent."""
    try:
        os.remove(path(work_dir))
    except FileNotFoundError:
        pass
