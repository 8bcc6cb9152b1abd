"""What a simulated task does: how long it runs, what it uses, how it ends.

A `TaskPlan` stands in for the executor and the process: the simulated agent
asks the framework's model for one when a task launches (`RunTask`) and then
plays it out. Usage is a `Curve` per resource kind, in the units of
`dyad.resources` (cores, MB), as a function of seconds since the task started.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import attrs

from dyad.messages import TaskState


@attrs.frozen
class Curve:
    """A step function of the seconds since a task started: `values[i]` holds
    from `times[i]` until the next time (`times[0]` is 0). With `period`, the
    steps repeat every `period` seconds (a daily cycle)."""

    times: tuple[float, ...] = (0.0,)
    values: tuple[float, ...] = (0.0,)
    period: float | None = None

    def __attrs_post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.values) or self.times[0] != 0:
            raise ValueError("a curve needs one value per time, starting at time 0")
        if any(b <= a for a, b in zip(self.times, self.times[1:])):
            raise ValueError("curve times must increase")
        if any(v < 0 for v in self.values):
            raise ValueError("usage must not be negative")
        if self.period is not None and self.period <= self.times[-1]:
            raise ValueError("a curve's period must be longer than its last time")

    @classmethod
    def constant(cls, value: float) -> Curve:
        return cls((0.0,), (float(value),))

    @classmethod
    def steps(cls, points: Sequence[tuple[float, float]], period: float | None = None) -> Curve:
        return cls(tuple(float(t) for t, _ in points), tuple(float(v) for _, v in points), period)

    @property
    def is_constant(self) -> bool:
        return len(self.values) == 1

    @property
    def peak(self) -> float:
        return max(self.values)

    def at(self, elapsed: float) -> float:
        if len(self.values) == 1:
            return self.values[0]
        if self.period is not None:
            elapsed %= self.period
        return self.values[bisect.bisect_right(self.times, elapsed) - 1]

    def first_above(self, limit: float) -> float | None:
        """The first time the curve exceeds `limit` (an OOM for memory), or None."""
        for time, value in zip(self.times, self.values):
            if value > limit + 1e-9:
                return time
        return None


@attrs.frozen
class TaskPlan:
    """How one launched task plays out. `duration` None: it runs until killed.
    `end` is its state when it ends by itself (TASK_FINISHED or TASK_FAILED) and
    `data` the final update's data (what the batch core reads as a result)."""

    duration: float | None
    cpus: Curve
    mem: Curve
    end: TaskState = TaskState.TASK_FINISHED
    data: bytes = b""
    message: str = ""
