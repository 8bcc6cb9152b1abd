"""Resource reclamation: how much of what its tasks reserve an agent can lend.

Services declare what they might need on their worst day and use a fraction of
it. Borg reclaims the difference: each task's *reservation* starts at its limit
and decays toward its measured usage plus a safety margin; non-production work
runs in what the reservations leave free, and is the first to go when usage
grows. Mesos calls what is lent this way *revocable resources*. This module is
the estimator: pure arithmetic over samples, with an injected clock.

Per owner run (an executor run whose tasks are all non-revocable):

- its *allocation* is what the run was given (executor plus tasks);
- its *reservation* starts at the allocation. On each sample the *target* is
  usage plus a margin (`margin` of usage, at least `margin_floor`), never above
  the allocation. Above the reservation, the reservation jumps to the target at
  once; below it, the reservation falls toward it linearly, by at most the
  allocation per `window` seconds, so it reaches any target within `window`
  of usage settling there. A run not sampled yet reserves its whole allocation.

The agent's revocable resources are the sum of (allocation - reservation) over
owner runs -- never negative, since no reservation exceeds its allocation. To
keep offers from churning on every wobble the reported amount has hysteresis:
it follows any decrease at once, and an increase only once it is at least
`step` above what was last reported. So what is reported never exceeds what is
estimated.

Runs that hold a revocable task lend nothing: their usage cannot be split
between the owner's part and the borrower's (see agent/oversubscription.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import attrs


@attrs.frozen
class Amount:
    """Cores and MB: the two kinds reclamation deals in."""

    cpus: float = 0.0
    mem: float = 0.0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.cpus + other.cpus, self.mem + other.mem)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.cpus - other.cpus, self.mem - other.mem)

    def scaled(self, factor: float) -> Amount:
        return Amount(self.cpus * factor, self.mem * factor)

    def at_least(self, other: Amount) -> Amount:
        return Amount(max(self.cpus, other.cpus), max(self.mem, other.mem))

    def at_most(self, other: Amount) -> Amount:
        return Amount(min(self.cpus, other.cpus), min(self.mem, other.mem))

    def positive(self) -> Amount:
        return self.at_least(ZERO)

    def is_zero(self) -> bool:
        return self.cpus <= 0 and self.mem <= 0

    def rounded(self) -> Amount:
        """Down to whole thousandths (what `Resources` keeps): never lend more
        than estimated through rounding."""
        return Amount(_floor3(self.cpus), _floor3(self.mem))


ZERO = Amount()


def _floor3(value: float) -> float:
    return max(0, int(value * 1000 + 1e-6)) / 1000


@attrs.frozen(kw_only=True)
class ReclaimConfig:
    """The estimator's knobs (`dyad-agent --oversubscription`, `--reclaim-*`)."""

    enabled: bool = True
    window: float = 300.0  # seconds for a reservation to decay from its allocation
    margin: float = 0.2  # of usage, kept on top of it
    margin_floor: Amount = Amount(cpus=0.05, mem=32.0)
    step: Amount = Amount(cpus=0.1, mem=32.0)  # hysteresis of the reported amount

    def __attrs_post_init__(self) -> None:
        if self.window <= 0:
            raise ValueError("reclaim window must be positive")
        if self.margin < 0:
            raise ValueError("reclaim margin must not be negative")
        for name in ("margin_floor", "step"):
            value = getattr(self, name)
            if value.cpus < 0 or value.mem < 0:
                raise ValueError(f"reclaim {name} must not be negative")


@attrs.frozen
class RunSample:
    """One owner run as the estimator sees it: what it was given and, if it has
    been measured, what it used (None: not yet)."""

    allocation: Amount
    usage: Amount | None


@attrs.frozen
class Estimate:
    """What one update concluded. `revocable` is what may be reported (after
    hysteresis); `unsmoothed` the sum of allocation - reservation itself."""

    revocable: Amount
    reservation: Amount
    allocation: Amount
    unsmoothed: Amount


@attrs.define
class _Run:
    allocation: Amount
    reservation: Amount
    at: float


class ReclaimEstimator:
    """Reservations per owner run and the agent's revocable resources; see the
    module docstring. `update` is the one way in."""

    def __init__(self, config: ReclaimConfig) -> None:
        self.config = config
        self._runs: dict[Hashable, _Run] = {}
        self._reported = ZERO
        self.last = Estimate(ZERO, ZERO, ZERO, ZERO)

    def reservation(self, key: Hashable) -> Amount | None:
        run = self._runs.get(key)
        return run.reservation if run else None

    def update(self, runs: Mapping[Hashable, RunSample], now: float) -> Estimate:
        """Fold in the latest sample of every live owner run; runs not named are
        gone and forgotten."""
        for key in [k for k in self._runs if k not in runs]:
            del self._runs[key]
        total_allocation = total_reservation = ZERO
        for key, sample in runs.items():
            run = self._step(key, sample, now)
            total_allocation += run.allocation
            total_reservation += run.reservation
        unsmoothed = (total_allocation - total_reservation).positive().rounded()
        if not self.config.enabled:
            unsmoothed = ZERO
        self._reported = _hysteresis(self._reported, unsmoothed, self.config.step)
        self.last = Estimate(self._reported, total_reservation, total_allocation, unsmoothed)
        return self.last

    def _step(self, key: Hashable, sample: RunSample, now: float) -> _Run:
        allocation = sample.allocation.positive()
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run(allocation, allocation, now)
        elif allocation != run.allocation:
            # A task joined (its share starts at its limit) or left.
            grown = (allocation - run.allocation).positive()
            run.reservation = (run.reservation + grown).at_most(allocation)
            run.allocation = allocation
        if sample.usage is None:
            run.at = now
            return run
        config = self.config
        usage = sample.usage.positive()
        target = (usage + usage.scaled(config.margin).at_least(config.margin_floor)).at_most(
            allocation)
        elapsed = max(0.0, now - run.at)
        decayed = run.reservation - allocation.scaled(min(1.0, elapsed / config.window))
        run.reservation = Amount(
            _next(run.reservation.cpus, target.cpus, decayed.cpus),
            _next(run.reservation.mem, target.mem, decayed.mem))
        run.at = now
        return run


def _next(reservation: float, target: float, decayed: float) -> float:
    """Up to the target at once; down toward it no faster than the decay."""
    if target >= reservation:
        return target
    return max(target, decayed)


def _hysteresis(reported: Amount, estimate: Amount, step: Amount) -> Amount:
    return Amount(_follow(reported.cpus, estimate.cpus, step.cpus),
                  _follow(reported.mem, estimate.mem, step.mem))


def _follow(reported: float, estimate: float, step: float) -> float:
    if estimate < reported or estimate >= reported + step:
        return estimate
    return reported
