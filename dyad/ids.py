"""Identifiers. Cores get ids from a generator they are handed, so tests can make
them deterministic while real masters make them unique across restarts."""

from __future__ import annotations

import itertools
import time
import uuid


def new_uuid() -> str:
    return str(uuid.uuid4())


class IdGenerator:
    """Ids of the form `<prefix>-<kind><n>`, e.g. `20261130-0930-ab12-O7`.

    The prefix identifies the master run (Mesos uses the master id), so ids made by a
    restarted master never collide with ones an agent or framework still holds.
    """

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self._counter = itertools.count()

    def next(self, kind: str) -> str:
        return f"{self.prefix}-{kind}{next(self._counter):04d}"
