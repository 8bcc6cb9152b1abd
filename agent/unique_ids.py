"""Ids the agent makes: a run's id (its sandbox and cgroups are named by it) and
each status update's uuid.

`uuid.uuid4()` for each cost the agent's loop about 6.4 us (a `getrandom` and a
`UUID` object; four a task, 4-9% of the loop under a flood). `UniqueIds` draws
80 random bits once (with `uuid4`'s version and variant bits) and counts in the
last 48: the ids stay in the canonical UUID text form (a v1 executor gets them
back as 16 bytes, `agent.executor_api_core.uuid_bytes`), each in a few hundred
nanoseconds.

Unique as `uuid4` is, by chance, where it matters:
- within one agent process by the counter (a fresh prefix is drawn before the
  48 bits run out, 2^48 ids);
- across its restarts, and across agents sharing a host's cgroups, by the
  prefix: two prefixes drawn at random are equal with probability 2^-74 (74 of
  the 80 bits are random), so a million agent starts collide with probability
  about 2.6e-11. A run id or update uuid of an earlier agent process (its
  checkpoint, its sandboxes, its unacknowledged updates) is met again only by
  that chance. It is a larger chance than with a `uuid4` per id (122 random
  bits) for an agent process that makes fewer than 2^24 ids, and far below the
  rate of undetected disk errors.
"""

from __future__ import annotations

import uuid

COUNTER_BITS = 48


class UniqueIds:
    """`ids()` -> a new id, e.g. ``3f2a9c1e-5b7d-4e21-9a3c-00000000002a``."""

    def __init__(self) -> None:
        self._prefix = ""
        self._next = 1 << COUNTER_BITS  # a prefix is drawn on the first call

    def _draw(self) -> None:
        head = uuid.uuid4().hex  # version 4, RFC 4122 variant: the first 80 bits kept
        self._prefix = f"{head[:8]}-{head[8:12]}-{head[12:16]}-{head[16:20]}-"
        self._next = 0

    def __call__(self) -> str:
        if self._next >> COUNTER_BITS:
            self._draw()
        count = self._next
        self._next = count + 1
        return f"{self._prefix}{count:012x}"
