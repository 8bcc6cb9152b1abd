"""What the fleet's memory jumps say about an app that has shown few.

An app's own jumps are thin evidence of how far it may spike: one that has jumped
once by 15% may next jump by 45%. The apps one autopilot follows are a sample of
the same kind of software run the same way, so their jumps say more together.
`FleetJumps` keeps, per app, the largest jump event in its window (as its
`jumps.JumpLog` sees it) and answers a quantile of those across the apps that have
jumped: a memory variant with a `prior` makes at least that much room for any
app that has jumped (`recommenders.MemoryRecommender`).

It also keeps when each app was first seen and when it first jumped (by at least
the variant's `prior_from`), which says how likely an app that has not jumped yet
is to jump soon: `first_jump_rate` is the share of the apps that had not jumped
by a given age that did within the next `horizon` (a survival estimate over the
fleet). While that rate is high, an app that has not jumped may still be one that
will; once most apps that jump have shown it, it is low, and a quiet app is most
likely one that never jumps.
"""

from __future__ import annotations

import math

PRIOR_APPS = 5
"""No prior until this many apps have jumped: a quantile of fewer is no evidence."""


class FleetJumps:
    def __init__(self) -> None:
        self._largest: dict[str, float] = {}  # per app: its largest jump in its window
        self._answers: dict[float, float] = {}  # quantiles since the last change
        self.version = 0  # moves on every change, so answers kept elsewhere can tell
        self._first_seen: dict[str, float] = {}
        self._first_jump: dict[str, float] = {}  # per app: its age at its first jump
        self._class: dict[str, int] = {}  # per app: its latest swing class
        self._rates: dict[tuple[float, float, int | None], float] = {}  # at `_rates_at`
        self._rates_at: float | None = None
        self._calm: dict[str, tuple[float, float]] = {}  # per app: calm peak, cover's room
        self._covered: frozenset[str] = frozenset()  # the apps covered at `_covered_at`
        self._covered_at: tuple[float, float] | None = None  # (now, budget)
        self._typical: tuple[float, float] | None = None  # (now, median calm peak)

    def seen(self, app: str, at: float, alike: int = 0) -> None:
        """A sample of the app at `at` (its first sets its age); `alike`: the class
        of apps it is like now (`shape.swing_class`)."""
        self._class[app] = alike
        first = self._first_seen.get(app)
        if first is None or at < first:
            self._first_seen[app] = at
            self._rates.clear()
            self.version += 1  # first-jump rates move: answers kept elsewhere too

    def jumped(self, app: str, at: float) -> None:
        """The app jumped at `at` (by at least the prior's threshold)."""
        if app not in self._first_jump and app in self._first_seen:
            self._first_jump[app] = max(0.0, at - self._first_seen[app])
            self._rates.clear()
            self.version += 1

    def has_jumped(self, app: str) -> bool:
        return app in self._first_jump

    def first_jump_rate(self, now: float, age: float, horizon: float,
                        alike: int | None = None) -> float:
        """The share of the apps seen for at least `age` by `now` that had not jumped
        by ``age - horizon`` and first jumped by `age` (0 while fewer than
        `PRIOR_APPS` were at risk: no evidence); with `alike`, of the apps of that
        class only."""
        if now != self._rates_at:
            self._rates.clear()
            self._rates_at = now
        key = (age, horizon, alike)
        rate = self._rates.get(key)
        if rate is None:
            start = age - horizon
            risk = events = 0
            for app, first in self._first_seen.items():
                if now - first < age or (alike is not None and self._class[app] != alike):
                    continue  # not yet seen that long, or not alike
                jump = self._first_jump.get(app)
                if jump is None or jump > start:
                    risk += 1
                    events += jump is not None and jump <= age
            rate = self._rates[key] = events / risk if risk >= PRIOR_APPS else 0.0
        return rate

    def calm(self, app: str, peak: float, room: float = 0.0) -> None:
        """The app's calm peak now and, if it is a candidate for cover (room for
        two jumps at once), the room over that peak the cover would add (0: none)."""
        self._calm[app] = (peak, room)

    def typical_calm(self, now: float) -> float:
        """The median of the apps' calm peaks told by `calm` (0: none). Fixed for one
        `now`, like `covered`."""
        if self._typical is None or self._typical[0] != now:
            peaks = sorted(peak for peak, _ in self._calm.values())
            self._typical = (now, peaks[len(peaks) // 2] if peaks else 0.0)
        return self._typical[1]

    def covered(self, app: str, now: float, budget: float) -> bool:
        """Whether the app is among the candidates that get cover: the cheapest
        first (calm peak × room), while their rooms sum to at most `budget` of all
        the apps' calm peaks. Room costs bytes and a kill costs an app, so the
        cover goes where it is cheapest. Fixed for one `now`."""
        if self._covered_at != (now, budget):
            self._covered_at = (now, budget)
            total = sum(peak for peak, _ in self._calm.values())
            spent, names = 0.0, []
            for cost, name in sorted((p * r, a) for a, (p, r) in self._calm.items() if r > 0):
                spent += cost
                if spent > budget * total:
                    break
                names.append(name)
            self._covered = frozenset(names)
        return app in self._covered

    def report(self, app: str, largest: float) -> None:
        """The app's largest jump in its window now (0: none)."""
        if self._largest.get(app, 0.0) == largest:
            return
        if largest > 0:
            self._largest[app] = largest
        else:
            del self._largest[app]
        self._changed()

    def forget(self, app: str) -> None:
        self._first_seen.pop(app, None)
        self._first_jump.pop(app, None)
        self._class.pop(app, None)
        self._calm.pop(app, None)
        self._covered_at = self._typical = None
        self._rates.clear()
        if self._largest.pop(app, None) is not None:
            self._changed()

    def _changed(self) -> None:
        self._answers.clear()
        self.version += 1

    def quantile(self, q: float) -> float:
        """The `q` quantile (0 < q <= 1, nearest rank) of the apps' largest jumps;
        0 while fewer than `PRIOR_APPS` apps have jumped."""
        answer = self._answers.get(q)
        if answer is None:
            sizes = sorted(self._largest.values())
            answer = (0.0 if len(sizes) < PRIOR_APPS
                      else sizes[max(0, math.ceil(q * len(sizes)) - 1)])
            self._answers[q] = answer
        return answer

    def __len__(self) -> int:
        return len(self._largest)
