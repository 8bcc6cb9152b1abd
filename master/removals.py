"""The agent-removal rate limit, pure: at most `permits` agents marked unreachable
per `seconds`.

A mass outage and a network partition look alike to a master; marking a whole
rack's agents unreachable at once would tell every framework that all their
tasks there are lost. So the first removal happens at once and the rest queue,
oldest first, each waiting for the next permit. An agent that answers a ping
while it waits leaves the queue (`forget`). The limiter only keeps the books:
the master arms `RemovalDue` when told to, and decides on `due` whether the
oldest queued agent is still failing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs


@attrs.frozen
class Decision:
    """`remove`: go ahead now (a permit was spent). Otherwise the agent waits;
    `queued` says it joined the queue just now, and `wake_at`, when set, is when
    the master must arm `RemovalDue`."""

    remove: bool
    queued: bool = False
    wake_at: float | None = None


class RemovalLimiter:
    """`rate` is ``(permits, seconds)``, or None for no limit."""

    def __init__(self, rate: tuple[int, float] | None) -> None:
        self._rate = rate
        self._queue: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._next = float("-inf")  # when the next permit is free

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._queue

    def ask(self, agent_id: str, now: float) -> Decision:
        """May `agent_id` be marked unreachable at `now`?"""
        if self._rate is None:
            return Decision(remove=True)
        if agent_id in self._queue:
            return Decision(remove=False)
        if self._queue or now < self._next:
            self._queue[agent_id] = None
            first = len(self._queue) == 1
            return Decision(remove=False, queued=True,
                            wake_at=max(now, self._next) if first else None)
        self._spend(now)
        return Decision(remove=True)

    def forget(self, agent_id: str) -> bool:
        """`agent_id` no longer waits (it answered, re-registered or was removed);
        whether it was waiting."""
        if agent_id not in self._queue:
            return False
        del self._queue[agent_id]
        return True

    def due(self, now: float,
            still_failing: Callable[[str], bool]) -> tuple[str | None, float | None]:
        """`RemovalDue` fired: the oldest queued agent that is `still_failing`, to
        be removed now (a permit is spent on it; None if no one is), and when to
        arm `RemovalDue` again (None if the queue is empty)."""
        chosen = None
        while self._queue:
            agent_id, _ = self._queue.popitem(last=False)
            if still_failing(agent_id):
                self._spend(now)
                chosen = agent_id
                break
        return chosen, (self._next if self._queue else None)

    def _spend(self, now: float) -> None:
        assert self._rate is not None
        permits, seconds = self._rate
        self._next = now + seconds / permits
