"""Declared demand: offers bounded by what a framework says it wants.

Mesos has a REQUEST call (`SchedulerDriver.requestResources`) that its
allocator ignores. Dyad makes it mean something, and only for a framework that
uses it: while a framework has declared demand, an allocation pass stops
offering to it once the offers it holds cover that demand with headroom; the
agents it is skipped on go on in DRF order to the others. A framework that
never declares demand is offered exactly as before.

A declaration is a list of task shapes, each with a count (a shape named twice
wants both counts). An offer counts for how many tasks of each shape it could
hold (each shape on its own). The framework is *covered* when its outstanding
offers made since the declaration could hold `HEADROOM` times the declared
count of every shape, and at least `min(MIN_AGENTS, tasks)` of them hold a
task. The headroom leaves placement (constraints, spreading, fragmentation) a
choice of agents; the agent floor matters for small demands, which one big
agent would otherwise cover. Coverage is checked before each offer, so a pass
overshoots by at most one agent's offer. An offer that holds no declared task
(a fragment) does not count. Up to `FRAGMENTS` of them are made per
declaration, so a framework sees what is free (the batch core's starvation
timeout reports the biggest offer it saw); after that a fragment on an agent
where the framework holds nothing is not offered to it (the agent is *spared*
for it) and goes on in DRF order to the others, who may have tasks that fit
there. On an agent where it holds something (a batch job's executor) a fragment
is always offered: a task needs less there than the declared shape, which
includes an executor. Before this bound every unsuppressed framework with
demand was offered every fragment of a partly full cell at each revive, and
declined nearly all of them (the benchmark's day at 1,000 agents: 494,000 of
594,000 offers).

A declaration replaces the previous one; an empty one clears it. Demand is
also cleared when the framework suppresses offers, is deactivated
(disconnected: whoever subscribes next knows nothing of it) or removed. It is
not cleared by a launch: a framework that launched re-declares what is left
(the batch core does at each answer to offers); clearing it at the accept
would offer the whole cell at the next pass, before the new declaration
arrives. Revive keeps it (a framework reviving for new work declares first).

Agents a framework was skipped on because it was covered are
remembered with its demand (`blocked`). When its coverage falls (one of its
offers closed) or it declares anew, the framework is *reopened*: the next
pass, after its dirty agents, looks at its blocked agents again in order,
only until it is covered again; the rest stay blocked. Everyone else had
its turn on them when they were skipped, and anything that changed that
(resources freed there, a filter expiring, a revive) makes them dirty
anyway, so the allocator's rule that a pass leaves its agents clean holds.
This keeps a job's answer to its offers from making the whole cell dirty.
Spared agents are looked at again only after a new declaration (a fresh
budget), after the blocked ones, while the budget lasts; a spared fragment
changes only when something is freed on it, which makes it dirty anyway. A
declaration of other shapes moves them to the blocked ones (they may hold the
new shapes). An empty declaration makes its blocked and spared agents dirty
(it is unbounded now).

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dyad.resources import Resources

__all__ = ["FRAGMENTS", "HEADROOM", "MIN_AGENTS", "Demands"]

HEADROOM = 2
"""Offers stop once they could hold this multiple of each declared count..."""
MIN_AGENTS = 8
"""...on at least this many agents (fewer if fewer tasks)."""
FRAGMENTS = 8
"""Offers holding no declared task made per declaration (module docstring)."""


class _Demand:
    __slots__ = ("shapes", "wanted", "agents", "offers", "held", "fitting", "covered", "blocked",
                 "fragments", "spared")

    def __init__(self, shapes: list[dict[str, int]], wanted: list[int], agents: int) -> None:
        self.shapes = shapes  # each declared shape's scalar milli (kinds it needs)
        self.wanted = wanted  # per shape: HEADROOM x its count, in tasks
        self.agents = agents  # offers holding a task that must be made
        # agent -> the offer's scalars, and how many tasks of each shape it holds
        self.offers: dict[str, tuple[Mapping[str, int], list[int]]] = {}
        self.held = [0] * len(shapes)  # per shape: tasks the counted offers hold
        self.fitting = 0  # counted offers that hold at least one task
        self.covered = False
        self.blocked: dict[str, None] = {}  # agents it was skipped on; ordered
        self.fragments = 0  # offers holding no declared task made since the declaration
        self.spared: dict[str, None] = {}  # agents skipped as fragments; ordered

    def spares(self, scalars: Mapping[str, int]) -> bool:
        """Whether a fragment of these scalars is withheld now: the budget is
        spent and it holds no declared task (the caller knows the framework
        holds nothing on the agent)."""
        if self.fragments < FRAGMENTS:
            return False
        for shape in self.shapes:
            for kind, milli in shape.items():
                if scalars.get(kind, 0) < milli:
                    break
            else:
                return False  # holds a task of this shape
        return True

    def count(self, agent_id: str, scalars: Mapping[str, int]) -> None:
        holds = [min((scalars.get(kind, 0) // milli for kind, milli in shape.items()), default=0)
                 for shape in self.shapes]
        self.offers[agent_id] = (scalars, holds)
        if not any(holds):
            self.fragments += 1
        self.spared.pop(agent_id, None)
        self._add(holds, 1)

    def uncount(self, agent_id: str) -> bool:
        """Forget the offer on the agent; whether there was one."""
        offer = self.offers.pop(agent_id, None)
        if offer is None:
            return False
        self._add(offer[1], -1)
        return True

    def _add(self, holds: list[int], sign: int) -> None:
        held = self.held
        for index, tasks in enumerate(holds):
            held[index] += sign * tasks
        if any(holds):
            self.fitting += sign
        self.covered = self.fitting >= self.agents and all(
            have >= want for have, want in zip(held, self.wanted))


class Demands:
    """Every framework's declared demand and the offers counted against it.
    `wanting` (framework id -> its demand) is read by the allocator's pick,
    which adds to a demand's `blocked`; `reopened` lists the frameworks whose
    blocked agents the next pass must look at again."""

    def __init__(self) -> None:
        self.wanting: dict[str, _Demand] = {}
        self.reopened: dict[str, None] = {}  # ordered: deterministic passes

    def __contains__(self, framework_id: str) -> bool:
        return framework_id in self.wanting

    def declare(self, framework_id: str, requests: Iterable[tuple[Resources, int]]) -> list[str]:
        """Replace the framework's demand with `requests` (each a task shape and
        how many of it); none clears it. Returns agents to make dirty."""
        shapes: dict[tuple[tuple[str, int], ...], int] = {}
        for resources, count in requests:
            shape = tuple(sorted((k, m) for k, m in resources.scalar_items().items() if m > 0))
            if count > 0 and shape:
                shapes[shape] = shapes.get(shape, 0) + count
        old = self.wanting.pop(framework_id, None)
        if not shapes:  # unbounded now: where it was skipped it may take offers
            return [*old.blocked, *old.spared] if old is not None else []
        demand = self.wanting[framework_id] = _Demand(
            [dict(shape) for shape in shapes], [HEADROOM * n for n in shapes.values()],
            min(MIN_AGENTS, sum(shapes.values())))
        if old is not None:  # its outstanding offers still count
            for agent_id, (scalars, _) in old.offers.items():
                demand.count(agent_id, scalars)
            demand.fragments = 0  # a fresh budget: those counted were made before
            demand.blocked = old.blocked
            if old.shapes == demand.shapes:
                demand.spared = old.spared  # still fragments: nothing freed there
            else:  # they may hold the new shapes
                demand.blocked.update(old.spared)
            self.reopened[framework_id] = None  # other shapes may fit where it was skipped
        return []

    def clear(self, framework_id: str) -> None:
        """Suppressed, deactivated or removed: back to offers without a bound.
        Nothing to make dirty: the framework takes no offers now."""
        self.wanting.pop(framework_id, None)

    def closed(self, framework_id: str, agent_id: str) -> None:
        """The framework's offer on the agent ended."""
        demand = self.wanting.get(framework_id)
        if demand is None:
            return
        was = demand.covered
        if demand.uncount(agent_id) and was and not demand.covered:
            self.reopened[framework_id] = None

    def agent_removed(self, agent_id: str) -> None:
        """Its offers are gone, and it is no longer skipped for anyone."""
        for framework_id, demand in self.wanting.items():
            demand.blocked.pop(agent_id, None)
            demand.spared.pop(agent_id, None)
            self.closed(framework_id, agent_id)

    def take_reopened(self) -> list[str]:
        frameworks = list(self.reopened)
        self.reopened.clear()
        return frameworks
