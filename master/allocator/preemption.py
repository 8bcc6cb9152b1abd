"""Preemption: which running tasks to kill so that more important work fits.

Pure victim choice beside the sorter; the master (master/preempting.py) decides
when to ask and carries the kills out. Two questions:

- `place`: one task of `need` at `priority` must fit on one agent. If some
  agent's free resources already hold it, nothing is preempted. Otherwise, per
  agent, victims are taken in *preemption order* until free plus freed covers the
  need, then any victim the rest can do without is spared (highest in the order
  first); the agent whose victims are fewest wins, then the one whose victims
  have the lowest priorities, then the youngest victims, then agent id.
- `reclaim`: an amount summed over the cluster (a quota guarantee) must be
  freed: victims in preemption order until it is covered, then the same sparing.

Rules both keep, property-tested (tests/unit/test_preemption.py):

- a victim's priority is strictly below the preemptor's: equal never preempts
  equal, and batch work (100-199) never touches production (200-359) or
  monitoring (>= 360);
- no task of a *protected* role is a victim (the master protects roles at or
  below their quota guarantee);
- what the victims free covers the need, or there are no victims (and `place`
  answers None when no agent could be made to fit);
- nothing is preempted when free resources suffice;
- the answer depends only on the inputs, not on their order.

Preemption order: lowest priority first, then youngest (latest started), then
framework and task id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from dyad.resources import Resources


@attrs.frozen(kw_only=True)
class PreemptionConfig:
    """The master's preemption knobs (`dyad-master --preemption`, ...); off by default."""

    enabled: bool = False
    max_per_minute: int = 60  # victims killed per minute, at most
    hold: float = 10.0  # seconds freed agents are kept from everyone but the preemptor
    guarantees: bool = True  # preempt on its own for unmet quota guarantees
    guarantee_priority: int = 200  # the priority a guarantee preempts with

    def __attrs_post_init__(self) -> None:
        if self.max_per_minute < 1:
            raise ValueError("max preemptions per minute must be at least 1")
        if self.hold < 0:
            raise ValueError("preemption hold must not be negative")


@attrs.frozen(kw_only=True)
class Candidate:
    """A running task that might be preempted."""

    framework_id: str
    task_id: str
    agent_id: str
    role: str
    priority: int
    started: float
    resources: Resources

    @property
    def key(self) -> tuple[str, str]:
        return (self.framework_id, self.task_id)


@attrs.frozen
class Plan:
    """Where a task will fit, and whom that costs (possibly nobody)."""

    agent_id: str
    victims: tuple[Candidate, ...]


def order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Preemption order: lowest priority, then youngest, then ids."""
    return sorted(candidates, key=lambda c: (c.priority, -c.started, c.framework_id,
                                             c.task_id))


def eligible(candidates: Iterable[Candidate], priority: int,
             protected: frozenset[str] | set[str] = frozenset()) -> list[Candidate]:
    """The candidates a preemptor of `priority` may take, in preemption order."""
    return order(c for c in candidates if c.priority < priority and c.role not in protected)


def place(need: Resources, priority: int, free: Mapping[str, Resources],
          candidates: Sequence[Candidate],
          protected: frozenset[str] | set[str] = frozenset()) -> Plan | None:
    """Make room for one task of `need` at `priority` on one agent (module
    docstring); None when no agent can be made to fit. `free` maps every agent
    that may host the task to what it has free for the preemptor."""
    fitting = sorted(agent_id for agent_id, have in free.items() if need <= have)
    if fitting:
        return Plan(fitting[0], ())
    allowed = eligible(candidates, priority, protected)
    best: tuple[tuple[object, ...], Plan] | None = None
    for agent_id in sorted(free):
        here = [c for c in allowed if c.agent_id == agent_id]
        have = free[agent_id]
        victims = _cover(lambda chosen, have=have: need <= _sum(chosen, have), here)
        if victims is None:
            continue
        # Fewest victims; then the lowest priorities, most important victim
        # compared first; then the youngest; then the agent id.
        rank = (len(victims), sorted((v.priority for v in victims), reverse=True),
                sorted(-v.started for v in victims), agent_id)
        if best is None or rank < best[0]:
            best = (rank, Plan(agent_id, tuple(victims)))
    return best[1] if best else None


def reclaim(need: Mapping[str, int], priority: int, candidates: Sequence[Candidate],
            protected: frozenset[str] | set[str] = frozenset()) -> list[Candidate]:
    """Victims whose scalar resources together cover `need` (kind -> milli), in
    preemption order; [] when nothing is needed or even every allowed victim
    would not cover it (preempting then would not meet the need either)."""
    need = {kind: milli for kind, milli in need.items() if milli > 0}
    if not need:
        return []
    allowed = eligible(candidates, priority, protected)

    def covers(chosen: list[Candidate]) -> bool:
        freed: Counter[str] = Counter()
        for victim in chosen:  # scalars only: ports of different agents are not a sum
            freed.update(victim.resources.scalar_items())
        return all(freed[kind] >= milli for kind, milli in need.items())

    return _cover(covers, allowed) or []


def _cover(covers: Callable[[list[Candidate]], bool],
           ordered: list[Candidate]) -> list[Candidate] | None:
    """The shortest prefix of `ordered` that `covers`, less every victim (most
    important first) the others can do without; None if all of them do not."""
    chosen: list[Candidate] = []
    if not covers(chosen):
        for candidate in ordered:
            chosen.append(candidate)
            if covers(chosen):
                break
        else:
            return None
    for victim in reversed(list(chosen)):
        rest = [c for c in chosen if c is not victim]
        if covers(rest):
            chosen = rest
    return chosen


def _sum(victims: Iterable[Candidate], start: Resources) -> Resources:
    """`start` plus the victims' resources (all on one agent: they never overlap)."""
    total = start
    for victim in victims:
        total = total + victim.resources
    return total
