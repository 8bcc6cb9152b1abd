"""QoS corrections: which revocable tasks an agent evicts so the owners of what
was lent get it back. Pure: one function over one moment's numbers.

Two rules, checked after every usage sample:

1. **The lender wants it back.** What revocable tasks hold may not exceed what
   the estimator (agent/reclaim.py) says can be lent. When owners' usage grows,
   their reservations jump up, the revocable amount shrinks, and the excess is
   evicted -- well before any owner reaches its own limit, since a reservation
   keeps a margin above usage.
2. **The machine is short.** Measured usage of everything on the agent may not
   exceed `mem_watermark` of its memory, nor `cpu_watermark` of its cores; above
   either, revocable tasks are evicted until the usage they free brings it back.
   This catches what rule 1 is too slow for (a burst between two samples).

Victims are taken in one order for both rules: lowest priority first, then the
youngest (latest start), then by key, so the same numbers always evict the same
tasks. Tasks already being evicted count as gone: they are never chosen twice
and the room they free is not asked for again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import attrs

from agent.reclaim import ZERO, Amount

EPSILON = 1e-6
"""Deficits smaller than this (a millionth of a core or MB) are rounding, not need."""


@attrs.frozen(kw_only=True)
class QosConfig:
    """The controller's knobs (`dyad-agent --qos-*`)."""

    enabled: bool = True
    mem_watermark: float = 0.9  # of the agent's memory, measured over all its runs
    cpu_watermark: float = 1.0  # of its cores; 1.0: only a saturated machine evicts

    def __attrs_post_init__(self) -> None:
        for name in ("mem_watermark", "cpu_watermark"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"qos {name} must be in (0, 1]")


@attrs.frozen
class Lent:
    """One live revocable task: what it holds (its allocation) and what it was
    measured to use (its share of its run's usage)."""

    key: tuple[str, ...]
    priority: int
    started: float
    held: Amount
    used: Amount


@attrs.frozen
class Eviction:
    key: Hashable
    why: str


def victim_order(lent: Sequence[Lent]) -> list[Lent]:
    """Lowest priority first, then youngest, then key."""
    return sorted(lent, key=lambda t: (t.priority, -t.started, t.key))


def corrections(config: QosConfig, *, capacity: Amount, revocable: Amount,
                lent: Sequence[Lent], owners_used: Amount) -> list[Eviction]:
    """The revocable tasks to evict now (none when nothing is wrong). `capacity`
    is the agent's cores and MB, `revocable` what may be lent now, `lent` the
    live revocable tasks not already being evicted, `owners_used` what every
    other run was measured to use."""
    if not config.enabled or not lent:
        return []
    mem_limit = config.mem_watermark * capacity.mem
    cpu_limit = config.cpu_watermark * capacity.cpus

    def wrong(left: Sequence[Lent]) -> tuple[Amount, Amount, Amount]:
        """What is still wrong with `left` kept, summed afresh each time (taking
        victims off a running deficit drifts by float error past EPSILON): rule
        1's excess in held amounts, rule 2's pressure, and what is used."""
        used = owners_used + sum((t.used for t in left), ZERO)
        excess = _need(sum((t.held for t in left), ZERO) - revocable)
        pressure = _need(Amount(cpus=used.cpus - cpu_limit if capacity.cpus else 0.0,
                                mem=used.mem - mem_limit if capacity.mem else 0.0))
        return excess, pressure, used

    order = victim_order(lent)
    excess, pressure, used = wrong(order)
    evictions: list[Eviction] = []
    for done, task in enumerate(order, 1):
        if excess.is_zero() and pressure.is_zero():
            break
        evictions.append(Eviction(task.key, _why(excess, pressure, revocable, used, capacity)))
        excess, pressure, _ = wrong(order[done:])
    return evictions


def _need(deficit: Amount) -> Amount:
    return Amount(deficit.cpus if deficit.cpus > EPSILON else 0.0,
                  deficit.mem if deficit.mem > EPSILON else 0.0)


def _why(excess: Amount, pressure: Amount, revocable: Amount, used: Amount,
         capacity: Amount) -> str:
    if not excess.is_zero():
        return (f"preempted: the owners of the revocable resources it ran on need them "
                f"back (the agent can lend {revocable.cpus:g} cpus, {revocable.mem:g} MB "
                f"now; revocable tasks held {excess.cpus:g} cpus, {excess.mem:g} MB more)")
    kind = "memory" if pressure.mem > 0 else "cpu"
    have, total = (used.mem, capacity.mem) if kind == "memory" else (used.cpus, capacity.cpus)
    unit = "MB" if kind == "memory" else "cpus"
    return (f"preempted: {kind} pressure on the agent (its tasks use {have:.1f} of "
            f"{total:g} {unit})")
