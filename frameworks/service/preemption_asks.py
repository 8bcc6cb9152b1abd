"""When the service framework asks the master for room (Borg-style preemption).

A production service that cannot be placed on a cluster full of batch work would
wait until the batch work ends. With `ServiceConfig.preemption_ask_after` set, an
app whose tasks have been waiting that long is asked for: one `Preempt` for one
task's shape at the app's priority (the master frees room on one agent by
killing strictly lower-priority tasks, and offers it), again every
`preemption_ask_after` while the app still waits. The master keeps no request,
so asking again is how a wait that outlasts one answer goes on. Pure: the core
tells it which apps wait, it answers which are due.

Apps with constraints or a persistent volume are never asked for: the master
frees room on an agent of its choosing, which such an app may be unable to use,
and the victims would die for nothing.
"""

from __future__ import annotations


class PreemptionAsks:
    def __init__(self, after: float) -> None:
        self.after = after
        self._since: dict[str, float] = {}  # app id -> waiting since
        self._asked: dict[str, float] = {}  # app id -> last asked

    def waiting(self, apps: set[str], now: float) -> None:
        """The apps waiting now (launchable tasks not placed); any other app's wait
        is over."""
        for app_id in set(self._since) - apps:
            del self._since[app_id]
            self._asked.pop(app_id, None)
        for app_id in apps:
            self._since.setdefault(app_id, now)

    def due(self, now: float) -> list[str]:
        """The apps to ask for now (marked asked), in id order."""
        due = [a for a in sorted(self._since) if self._at(a) <= now]
        for app_id in due:
            self._asked[app_id] = now
        return due

    def next_at(self) -> float | None:
        """When the next ask falls due (None: no app waits)."""
        return min((self._at(a) for a in self._since), default=None)

    def _at(self, app_id: str) -> float:
        asked = self._asked.get(app_id)
        return (self._since[app_id] if asked is None else asked) + self.after
