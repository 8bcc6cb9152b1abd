"""Where the service framework keeps what must survive it: its framework id, app
definitions, deployments and tasks (the core's `Persist` effects).

- `FileStore`: one JSON file, rewritten atomically (temporary file, fsync, rename)
  after each batch of changes. An exclusive ``flock`` on it keeps a second
  instance from using the same file; there is no standby without ZooKeeper.
- `ZkStore`: one znode per entry under ``ROOT/state/{framework,apps,deployments,
  tasks}``. Each batch is one ZooKeeper transaction that also checks the writer's
  leader-election znode, so a deposed leader's write fails instead of overwriting
  the new leader's state.

Writes are synchronous on the event loop: a batch is a few small JSON documents
(milliseconds on loopback), and the core's effects must be durable before the
launch they cover is sent. A failed write raises `StoreError`; the service then
stops rather than act on state it could not keep.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from frameworks.service.core import Persist, Snapshot

log = logging.getLogger(__name__)

KINDS = ("framework", "apps", "deployments", "tasks")


class StoreError(RuntimeError):
    """The state could not be read or written."""


class Store(Protocol):
    def load(self) -> Snapshot: ...

    def apply(self, changes: Sequence[Persist]) -> None: ...

    def close(self) -> None: ...


def _snapshot(data: dict[str, dict[str, Any]]) -> Snapshot:
    return Snapshot(framework_id=data["framework"].get("id"), apps=dict(data["apps"]),
                    deployments=dict(data["deployments"]), tasks=dict(data["tasks"]))


class FileStore:
    """The whole state in one JSON file (``DIR/state.json``)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "state.json"
        self._lock: IO[bytes] | None = open(directory / "state.lock", "wb")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise StoreError(f"{directory} is in use by another dyad-service; give each "
                             "instance its own --work-dir, or use --zk for a standby") from None
        self._data: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}

    def load(self) -> Snapshot:
        if self.path.exists():
            try:
                loaded = json.loads(self.path.read_text())
                self._data = {kind: dict(loaded.get(kind, {})) for kind in KINDS}
            except (OSError, ValueError, AttributeError) as exc:
                raise StoreError(f"cannot read {self.path}: {exc}") from None
        return _snapshot(self._data)

    def apply(self, changes: Sequence[Persist]) -> None:
        for change in changes:
            entries = self._data[change.kind]
            if change.value is None:
                entries.pop(change.key, None)
            else:
                entries[change.key] = change.value
        temporary = self.path.with_suffix(".tmp")
        try:
            with open(temporary, "w") as out:
                json.dump(self._data, out, separators=(",", ":"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            raise StoreError(f"cannot write {self.path}: {exc}") from None

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class ZkStore:
    """The state under ``root/state`` in ZooKeeper; writes fenced by `fence`, the
    path of this instance's leader znode."""

    def __init__(self, client: KazooClient, root: str, fence: str) -> None:
        self.client = client
        self.base = f"{root.rstrip('/')}/state"
        self.fence = fence
        self._present: dict[str, set[str]] = {kind: set() for kind in KINDS}

    def load(self) -> Snapshot:
        data: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
        try:
            for kind in KINDS:
                path = f"{self.base}/{kind}"
                self.client.ensure_path(path)
                for key in self.client.get_children(path):
                    raw, _ = self.client.get(f"{path}/{key}")
                    data[kind][key] = json.loads(raw)
                self._present[kind] = set(data[kind])
        except (KazooException, ValueError) as exc:
            raise StoreError(f"cannot read {self.base}: {exc!r}") from None
        return _snapshot(data)

    def apply(self, changes: Sequence[Persist]) -> None:
        transaction = self.client.transaction()
        transaction.check(self.fence, 0)
        present = {kind: set(keys) for kind, keys in self._present.items()}
        for change in changes:
            path = f"{self.base}/{change.kind}/{change.key}"
            if change.value is None:
                if change.key in present[change.kind]:
                    transaction.delete(path)
                    present[change.kind].discard(change.key)
                continue
            data = json.dumps(change.value, separators=(",", ":")).encode()
            if change.key in present[change.kind]:
                transaction.set_data(path, data)
            else:
                transaction.create(path, data)
                present[change.kind].add(change.key)
        try:
            results = transaction.commit()
        except KazooException as exc:
            raise StoreError(f"ZooKeeper write failed: {exc!r}") from None
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if isinstance(failures[0], NoNodeError):
                raise StoreError("ZooKeeper write refused: this instance no longer leads")
            raise StoreError(f"ZooKeeper write failed: {failures[0]!r}")
        self._present = present

    def close(self) -> None:
        """The client belongs to the caller (it also holds the election)."""
