"""Which task an offer gets: map tasks data-local first, delay scheduling, the
steal from the longest backlog, speculative copies, and the knowledge of agents
and hosts these rest on (the module docstring of `frameworks.batch.core` tells
the rules). Apart from the core because picking only reads the job's books,
while the core decides what happens to them: launches, updates, failures, ticks.
Pure: no I/O."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from dyad.messages import Offer
from frameworks.batch.config import Split
from frameworks.batch.tasks import Task
from frameworks.batch.wire import MAP, REDUCE

Pick = tuple[Task, bool, bool | None]
"""A task for an offer: (task, speculative copy?, data-local?)."""


class Why(enum.Enum):
    """Why no task was picked for an offer: decides how long it is refused."""

    NOTHING = "nothing"
    LOCALITY = "locality"


class Placement:
    """What the core knows of where tasks may run, and the pick. It shares the
    core's task lists, pending sets and wanted copies (the core changes them;
    this reads them), and keeps the delay-scheduling clock, `waiting_since`."""

    def __init__(self, splits: Sequence[Split], locality_wait: float, maps: list[Task],
                 reduces: list[Task], pending: dict[str, dict[int, None]],
                 copies: dict[tuple[str, int], None]) -> None:
        self.splits = {s.index: s for s in splits}
        if sorted(self.splits) != list(range(len(splits))):
            raise ValueError("split indexes must be 0..M-1")
        # Whether any map can ever prefer a host (named hosts, or a URI whose
        # fetchers become its hosts): without, the first runnable map is the pick.
        self.placed = any(s.hosts or s.is_uri for s in splits)
        self.locality_wait = locality_wait
        self.maps = maps
        self.reduces = reduces
        self.pending = pending
        self.copies = copies
        self.agents: dict[str, str] = {}  # live agent id -> hostname
        self.lost_hosts: set[str] = set()  # preferring these would wait in vain
        self.cached: dict[str, set[str]] = {}  # URI -> hosts whose executor fetched it
        self.waiting_since: float | None = None

    def pick(self, offer: Offer, now: float, maps_done: bool) -> Pick | Why:
        """The next task for this offer: (task, speculative copy?, data-local?)."""
        if not maps_done:
            if not self.placed:
                for i in self.pending[MAP]:
                    task = self.maps[i]
                    if self._may_run(task, offer.agent_id, now):
                        return task, False, None
                return self._copy_for(MAP, offer)
            # In order of preference: the first runnable map whose data is here,
            # else the first with no data anywhere, else a steal. One scan, which
            # stops at the first local map.
            candidates: list[Task] = []
            anywhere: Task | None = None
            for i in self.pending[MAP]:
                task = self.maps[i]
                if not self._may_run(task, offer.agent_id, now):
                    continue
                preferred = self._preferred(task)
                if offer.hostname in preferred:
                    return task, False, True
                if anywhere is None and not preferred:
                    anywhere = task
                candidates.append(task)
            if anywhere is not None:
                return anywhere, False, None
            if candidates:
                if self._may_go_remote(now):
                    return self._steal(candidates), False, False
                if self.waiting_since is None:
                    self.waiting_since = now
                return Why.LOCALITY
            return self._copy_for(MAP, offer)
        for index in self.pending[REDUCE]:
            task = self.reduces[index]
            if self._may_run(task, offer.agent_id, now):
                return task, False, None
        return self._copy_for(REDUCE, offer)

    def _copy_for(self, kind: str, offer: Offer) -> Pick | Why:
        for copy_kind, index in self.copies:
            task = (self.maps if copy_kind == MAP else self.reduces)[index]
            if copy_kind == kind and offer.agent_id not in {a.agent_id for a in task.live}:
                preferred = self._preferred(task)
                return task, True, (offer.hostname in preferred) if preferred else None
        return Why.NOTHING

    def _preferred(self, task: Task) -> set[str]:
        """Hosts where the map's data is, less those known to be lost."""
        if task.kind != MAP:
            return set()
        split = self.splits[task.index]
        hosts = self.cached.get(split.path, set()) if split.is_uri else set(split.hosts)
        return hosts - self.lost_hosts

    def _may_run(self, task: Task, agent_id: str, now: float) -> bool:
        """Not during a refusal backoff; not where it failed before, unless it
        failed on every agent we know."""
        if now < task.not_before:
            return False
        if agent_id not in task.avoid:
            return True
        return all(known in task.avoid for known in self.agents)

    def _may_go_remote(self, now: float) -> bool:
        wait = self.locality_wait
        return wait <= 0 or (self.waiting_since is not None
                             and now - self.waiting_since >= wait)

    def _steal(self, candidates: list[Task]) -> Task:
        """A non-local map from the host with the longest backlog of pending maps,
        so the steal shortens the job's longest queue."""
        backlog: dict[str, int] = {}
        for task in candidates:
            for host in self._preferred(task):
                backlog[host] = backlog.get(host, 0) + 1
        return max(candidates, key=lambda t: (
            max((backlog[h] for h in self._preferred(t)), default=0), -t.index))
