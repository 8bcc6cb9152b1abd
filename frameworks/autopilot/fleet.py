"""What the fleet's memory jumps say about an app that has shown few.

An app's own jumps are thin evidence of how far it may spike: one that has jumped
once by 15% may next jump by 45%. The apps one autopilot follows are a sample of
the same kind of software run the same way, so their jumps say more together.
`FleetJumps` keeps, per app, the largest jump event in its window (as its
`jumps.JumpLog` sees it) and answers a quantile of those across the apps that have
jumped: a memory variant with a `prior` makes at least that much room for any
app that has jumped (`recommenders.MemoryRecommender`). Apps that have not jumped
get none: nothing says they will.
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
