"""Declared demand: offers bounded by what a framework says it wants.

Mesos has a REQUEST call (`SchedulerDriver.requestResources`) that its
allocator ignores. Dyad makes it mean something, and only for a framework that
uses it: while a framework has declared demand, an allocation pass stops
offering to it once the offers it holds cover that demand with headroom; the
agents it is skipped on go on in DRF order to the others. A framework that
never declares demand is offered exactly as before.

Covered means: the scalar amounts of its outstanding offers made since the
declaration reach `HEADROOM` times the declared total in every kind the
demand names, *and* those offers are on at least `min(MIN_AGENTS, tasks)`
agents (`tasks`: the number of task shapes declared, counts included). The
headroom leaves placement (locality, constraints, fragmentation) a choice of
agents; the agent floor matters for small demands, which one agent's offer
would otherwise cover. Coverage is checked before each offer, so a pass
overshoots the headroom by at most one agent's offer.

A declaration replaces the previous one; an empty one clears it. Demand is
also cleared when the framework suppresses offers, is deactivated
(disconnected: whoever subscribes next knows nothing of it) or removed. It is
not cleared by a launch: a framework that launched re-declares what is left
(the batch core does at each answer to offers); clearing it at the accept
would offer the whole cell at the next pass, before the new declaration
arrives. Revive keeps it (a framework reviving for new work declares first).

Agents a covered framework was skipped on are remembered (`blocked`) and made
dirty again when its coverage falls (one of its offers closed, or a new
declaration), so the pass that could offer to it looks at them: the
allocator's rule that a pass leaves its agents clean holds.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dyad.resources import Resources

__all__ = ["HEADROOM", "MIN_AGENTS", "Demands"]

HEADROOM = 2
"""Offers may cover this multiple of the declared amounts before they stop."""
MIN_AGENTS = 8
"""...and are spread over at least this many agents (fewer if fewer tasks)."""


class _Demand:
    __slots__ = ("need", "agents", "offers", "held")

    def __init__(self, need: dict[str, int], agents: int) -> None:
        self.need = need  # kind -> milli to cover (HEADROOM x declared)
        self.agents = agents  # agents the offers must span
        self.offers: dict[str, Mapping[str, int]] = {}  # agent -> scalars offered there
        self.held: dict[str, int] = dict.fromkeys(need, 0)  # kind -> milli offered

    def covered(self) -> bool:
        if len(self.offers) < self.agents:
            return False
        held = self.held
        return all(held[kind] >= milli for kind, milli in self.need.items())


class Demands:
    """Every framework's declared demand and the offers counted against it.
    `covered` (framework ids) and `blocked` (agent ids) are read by the
    allocator's pick; both are mutated in place, never replaced."""

    def __init__(self) -> None:
        self._demands: dict[str, _Demand] = {}
        self.covered: set[str] = set()
        self.blocked: dict[str, None] = {}  # ordered: deterministic passes

    def __contains__(self, framework_id: str) -> bool:
        return framework_id in self._demands

    def declare(self, framework_id: str, requests: Iterable[tuple[Resources, int]]) -> list[str]:
        """Replace the framework's demand with `requests` (each a task shape and
        how many of it); none clears it. Returns agents to make dirty."""
        need: dict[str, int] = {}
        tasks = 0
        for resources, count in requests:
            if count <= 0:
                continue
            tasks += count
            for kind, milli in resources.scalar_items().items():
                need[kind] = need.get(kind, 0) + HEADROOM * count * milli
        need = {kind: milli for kind, milli in need.items() if milli > 0}
        old = self._demands.pop(framework_id, None)
        self.covered.discard(framework_id)
        if not tasks:
            return self._release_blocked() if old is not None else []
        demand = self._demands[framework_id] = _Demand(need, min(MIN_AGENTS, tasks))
        if old is not None:  # its outstanding offers still count
            for agent_id, scalars in old.offers.items():
                self._count(demand, agent_id, scalars)
        if demand.covered():
            self.covered.add(framework_id)
            return []
        return self._release_blocked()

    def clear(self, framework_id: str) -> None:
        """Suppressed, deactivated or removed: back to offers without a bound.
        Nothing to make dirty: the framework takes no offers now."""
        if self._demands.pop(framework_id, None) is not None:
            self.covered.discard(framework_id)

    def offered(self, framework_id: str, agent_id: str, scalars: Mapping[str, int]) -> None:
        """An offer was made to a framework with demand (`in` says which)."""
        demand = self._demands[framework_id]
        self._count(demand, agent_id, scalars)
        if demand.covered():
            self.covered.add(framework_id)

    def closed(self, framework_id: str, agent_id: str) -> list[str]:
        """The framework's offer on the agent ended. Returns agents to make dirty."""
        demand = self._demands.get(framework_id)
        if demand is None:
            return []
        scalars = demand.offers.pop(agent_id, None)
        if scalars is None:
            return []  # made before the declaration: never counted
        held = demand.held
        for kind in held:
            held[kind] -= scalars.get(kind, 0)
        if framework_id in self.covered and not demand.covered():
            self.covered.discard(framework_id)
            return self._release_blocked()
        return []

    def agent_removed(self, agent_id: str) -> list[str]:
        """Its offers are gone. Returns agents to make dirty."""
        self.blocked.pop(agent_id, None)
        dirty: list[str] = []
        for framework_id in [f for f, d in self._demands.items() if agent_id in d.offers]:
            dirty += self.closed(framework_id, agent_id)
        return dirty

    def _count(self, demand: _Demand, agent_id: str, scalars: Mapping[str, int]) -> None:
        demand.offers[agent_id] = scalars
        held = demand.held
        for kind in held:
            held[kind] += scalars.get(kind, 0)

    def _release_blocked(self) -> list[str]:
        agents = list(self.blocked)
        self.blocked.clear()
        return agents
