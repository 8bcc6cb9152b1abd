"""The meta-recommender: run several variants side by side on the same samples,
charge each for what its limits would have cost, and answer with the cheapest.

Each variant keeps a *standing limit*, the one it would have set at the last
decision, moved only by at least `min_change` (as the policy moves a real limit).
Every sample is charged against each variant's standing limit, for the time it
stands for (slack and overrun are prices per hour, so the choice does not depend
on how often samples come):

- slack: ``(limit - usage) / limit`` of the limit left idle, times `Costs.slack`
  per hour;
- overrun: ``(usage - limit) / limit``, times `Costs.overrun` per hour (CPU:
  throttling); where overrunning is fatal (memory: an OOM kill) also `Costs.kill`
  per kill, and the variant then raises its standing limit at once, as the policy
  would;
- churn: `Costs.change` each time the standing limit moves.

The time a sample stands for is a moving average of the gaps between the app's
samples (each gap at most `MAX_GAP`): with n tasks reporting every s seconds each
sample stands for s/n, so a round of samples is charged for s seconds in all.

Costs decay with `Costs.half_life`, so a variant is judged mostly on the recent
past: an app whose behaviour changes moves to the variant that fits it now.
Ties go to the variant listed first (the default).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from frameworks.autopilot.recommenders import Recommender

_MAX_EXPONENT = 64.0
MAX_GAP = 3600.0
"""A longer silence between samples is charged as this long: no evidence is not slack."""
_GAP_SMOOTHING = 0.1


@attrs.frozen
class Costs:
    """Prices, in units of "one hour of the whole limit idle" (`slack`)."""

    slack: float = 1.0  # per hour of the whole limit idle
    overrun: float = 10.0  # per hour of usage a whole limit over it
    kill: float = 24.0  # per OOM kill: as dear as a day of the whole limit idle
    change: float = 2.0  # per move of the limit (a rolling restart of the app's tasks)
    half_life: float = 24 * 3600.0


def moved(current: float | None, proposed: float, min_change: float) -> bool:
    """Whether `proposed` differs from `current` by at least `min_change` of it."""
    return current is None or abs(proposed - current) >= min_change * current


@attrs.frozen
class Choice:
    """The cheapest variant now: its name, the limit it proposes, and the cost table."""

    variant: str
    value: float
    explanation: str
    costs: tuple[tuple[str, float], ...]


class _Candidate:
    def __init__(self, recommender: Recommender) -> None:
        self.recommender = recommender
        self.limit: float | None = None
        self.cost = 0.0  # relative to the meta-recommender's reference time
        self.changes = 0
        self.overruns = 0


class MetaRecommender:
    def __init__(self, recommenders: Sequence[Recommender], costs: Costs,
                 min_change: float, fatal_overrun: bool,
                 bound: Callable[[float], float] = lambda v: v) -> None:
        if not recommenders:
            raise ValueError("a meta-recommender needs at least one variant")
        names = [r.name for r in recommenders]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be distinct: {names}")
        self._candidates = [_Candidate(r) for r in recommenders]
        self.costs = costs
        self.min_change = min_change
        self.fatal_overrun = fatal_overrun
        self._bound = bound  # the policy's bounds, so variants are judged as applied
        self._reference: float | None = None
        self._last: float | None = None
        self._interval: float | None = None  # seconds a sample stands for
        self.samples = 0

    def observe(self, at: float, usage: float) -> None:
        if self._last is not None:
            gap = min(max(at - self._last, 0.0), MAX_GAP)
            self._interval = gap if self._interval is None else (
                self._interval + _GAP_SMOOTHING * (gap - self._interval))
        self._last = at if self._last is None else max(self._last, at)
        hours = (self._interval or 0.0) / 3600.0
        for candidate in self._candidates:
            if candidate.limit is not None:
                self._charge(candidate, at, usage, hours)
            candidate.recommender.add(at, usage)
            if (self.fatal_overrun and candidate.limit is not None
                    and usage > candidate.limit):
                self._move(candidate, at, force=True)
        self.samples += 1

    def decide(self, now: float) -> None:
        """Let each variant move its standing limit, as a decision step would."""
        for candidate in self._candidates:
            self._move(candidate, now, force=False)

    def _move(self, candidate: _Candidate, now: float, force: bool) -> None:
        proposed = candidate.recommender.value(now)
        if proposed is None:
            return
        proposed = self._bound(proposed)
        if candidate.limit is None:
            candidate.limit = proposed
        elif (force and proposed > candidate.limit) or (
                not force and moved(candidate.limit, proposed, self.min_change)):
            candidate.limit = proposed
            candidate.changes += 1
            self._add(candidate, now, self.costs.change)

    def _charge(self, candidate: _Candidate, at: float, usage: float, hours: float) -> None:
        limit = candidate.limit
        assert limit is not None
        if limit <= 0:
            return
        if usage <= limit:
            cost = self.costs.slack * hours * (limit - usage) / limit
        else:
            candidate.overruns += 1
            cost = self.costs.overrun * hours * (usage - limit) / limit
            if self.fatal_overrun:
                cost += self.costs.kill
        self._add(candidate, at, cost)

    def _add(self, candidate: _Candidate, at: float, cost: float) -> None:
        if self._reference is None:
            self._reference = at
        exponent = (at - self._reference) / self.costs.half_life
        if exponent > _MAX_EXPONENT:
            factor = 2.0 ** -exponent
            for other in self._candidates:
                other.cost *= factor
            self._reference, exponent = at, 0.0
        candidate.cost += cost * 2.0 ** exponent

    def cost_now(self, now: float) -> dict[str, float]:
        """Each variant's decayed cost as seen from `now`."""
        scale = 0.0 if self._reference is None else 2.0 ** (
            (self._reference - now) / self.costs.half_life)
        return {c.recommender.name: c.cost * scale for c in self._candidates}

    def choose(self, now: float) -> Choice | None:
        """The cheapest variant that has a proposal (None if none has one yet)."""
        costs = self.cost_now(now)
        best: tuple[float, _Candidate, float] | None = None
        for candidate in self._candidates:
            proposed = candidate.recommender.value(now)
            if proposed is None:
                continue
            cost = costs[candidate.recommender.name]
            if best is None or cost < best[0]:  # strictly: a tie keeps the earlier
                best = (cost, candidate, proposed)
        if best is None:
            return None
        cost, candidate, proposed = best
        table = tuple(sorted(costs.items(), key=lambda item: (item[1], item[0])))
        others = ", ".join(f"{name} {value:.3g}" for name, value in table
                           if name != candidate.recommender.name)
        explanation = (f"{candidate.recommender.name}: {candidate.recommender.explain(now)}; "
                       f"chosen by cost "
                       f"{cost:.3g} over {others or 'no other variant'}")
        return Choice(candidate.recommender.name, self._bound(proposed), explanation,
                      tuple((name, round(value, 6)) for name, value in table))

    def standing(self) -> dict[str, float | None]:
        return {c.recommender.name: c.limit for c in self._candidates}
