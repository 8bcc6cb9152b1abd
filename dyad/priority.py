"""Task priorities and their bands, as in Borg: higher is more important.

A priority is a plain integer carried in `TaskInfo.priority` (default 100). It
decides who is evicted (agent QoS) or preempted (master), never who is offered
first: offer order stays DRF. The bands name ranges of it:

    best-effort   priority < 100
    batch         100 <= priority < 200
    production    200 <= priority < 360
    monitoring    priority >= 360

Frameworks pick defaults per band: the service framework launches in the
production band, the batch framework in the batch band.
"""

from __future__ import annotations

BEST_EFFORT = "best-effort"
BATCH = "batch"
PRODUCTION = "production"
MONITORING = "monitoring"

BANDS = (BEST_EFFORT, BATCH, PRODUCTION, MONITORING)
"""Band names, least important first."""

BATCH_MIN = 100
PRODUCTION_MIN = 200
MONITORING_MIN = 360

DEFAULT = BATCH_MIN
"""`TaskInfo.priority` when a framework says nothing."""
DEFAULT_BATCH = BATCH_MIN
DEFAULT_PRODUCTION = PRODUCTION_MIN

# A bound on what the wire may carry, so a hostile number cannot grow without end.
MIN_PRIORITY = -(10**6)
MAX_PRIORITY = 10**6


class PriorityError(ValueError):
    """Not a usable priority (not an integer, or out of bounds)."""


def band(priority: int) -> str:
    """The band `priority` falls in."""
    if priority < BATCH_MIN:
        return BEST_EFFORT
    if priority < PRODUCTION_MIN:
        return BATCH
    if priority < MONITORING_MIN:
        return PRODUCTION
    return MONITORING


def band_floor(name: str) -> int:
    """The lowest priority of band `name` (best-effort: `MIN_PRIORITY`)."""
    floors = {BEST_EFFORT: MIN_PRIORITY, BATCH: BATCH_MIN, PRODUCTION: PRODUCTION_MIN,
              MONITORING: MONITORING_MIN}
    try:
        return floors[name]
    except KeyError:
        raise PriorityError(f"unknown band {name!r}; bands are {', '.join(BANDS)}") from None


def check_priority(value: object) -> int:
    """`value` as a priority, or `PriorityError` saying why not. A band name
    stands for the lowest priority of that band (best-effort: 0)."""
    if isinstance(value, str):
        if value in BANDS:
            return 0 if value == BEST_EFFORT else band_floor(value)
        try:
            value = int(value, 10)
        except ValueError:
            raise PriorityError(f"priority must be an integer or one of {', '.join(BANDS)}, "
                                f"got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PriorityError(f"priority must be an integer, got {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise PriorityError(f"priority {value} is outside {MIN_PRIORITY}..{MAX_PRIORITY}")
    return value
