"""Drive a `ServiceCore` without a cluster: fake agents, offers, updates and time.

    sim = ServiceSim(agents=3)
    sim.register()
    sim.command(PutApp(parse_app({"id": "/web", "cmd": "sleep 1000", "instances": 3})))
    sim.offer_all()                 # launches on the fake agents
    sim.run_all("/web")             # every task of /web TASK_RUNNING (healthy)
    assert not sim.core.deployments

Every step checks the core's invariants (`ServiceCore.validate`), keeps the
store the `Persist` effects describe (`snapshot()` restarts a core from it) and
records the effects of the last step in `last`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from dyad.clock import FakeClock
from dyad.effects import TimerFired
from dyad.messages import Offer, TaskState, TaskStatus
from dyad.resources import Resources
from frameworks.effects import LaunchTasks, RequestKill
from frameworks.service.core import (
    Command, CommandResult, Effect, Event, OffersReceived, Persist, Registered, ServiceConfig,
    ServiceCore, Snapshot, StatusReceived, Wake)
from frameworks.service.records import AppTask


class ServiceSim:
    """A core, a fake clock, ``agents`` fake agents (``agent0..``, racks r1/r2
    alternating, 1000 ports each) and the store its effects describe."""

    def __init__(self, agents: int = 3, config: ServiceConfig | None = None,
                 snapshot: Snapshot | None = None,
                 resources: str = "cpus:4;mem:4096;disk:10000") -> None:
        self.clock = FakeClock()
        self._ids = itertools.count(1)
        self.core = ServiceCore(config or ServiceConfig(), lambda: f"{next(self._ids):04d}",
                                snapshot)
        self.store: dict[str, dict[str, Any]] = {
            "framework": {}, "apps": {}, "deployments": {}, "tasks": {}}
        if snapshot is not None:
            self.store.update(apps=dict(snapshot.apps), deployments=dict(snapshot.deployments),
                              tasks=dict(snapshot.tasks))
            if snapshot.framework_id:
                self.store["framework"]["id"] = snapshot.framework_id
        self.agents = agents
        self.resources = resources
        self.last: list[Effect] = []
        self._offers = itertools.count(1)

    @property
    def now(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------- stepping

    def step(self, event: Event) -> list[Effect]:
        return self._record(self.core.handle(event, self.now))

    def command(self, command: Command) -> CommandResult:
        outcome = self.core.execute(command, self.now)
        self._record(outcome.effects)
        return outcome

    def _record(self, effects: list[Effect]) -> list[Effect]:
        for effect in effects:
            if isinstance(effect, Persist):
                if effect.value is None:
                    self.store[effect.kind].pop(effect.key, None)
                else:
                    self.store[effect.kind][effect.key] = effect.value
        self.core.validate()
        self.last = effects
        return effects

    def advance(self, seconds: float) -> list[Effect]:
        """Move time on and fire the wake-up timer if it came due."""
        self.clock.advance(seconds)
        return self.step(TimerFired(Wake()))

    def register(self, framework_id: str = "framework-1") -> list[Effect]:
        return self.step(Registered(framework_id))

    # --------------------------------------------------------------- offers

    def offer(self, index: int) -> Offer:
        low = 31000 + index * 1000
        return Offer(id=f"offer-{next(self._offers)}", framework_id="framework-1",
                     agent_id=f"agent-{index}", hostname=f"agent{index}",
                     resources=Resources.parse(f"{self.resources};ports:[{low}-{low + 999}]"),
                     attributes={"rack": f"r{index % 2 + 1}"},
                     url=f"http://127.0.0.{index + 1}:5051")

    def offer_all(self) -> list[Effect]:
        return self.step(OffersReceived(tuple(self.offer(i) for i in range(self.agents))))

    def launched(self, effects: Iterable[Effect] | None = None) -> list[Any]:
        """TaskInfos launched by `effects` (default: the last step's)."""
        return [task for e in (self.last if effects is None else effects)
                if isinstance(e, LaunchTasks) for task in e.tasks]

    def killed(self, effects: Iterable[Effect] | None = None) -> list[str]:
        return [e.task_id for e in (self.last if effects is None else effects)
                if isinstance(e, RequestKill)]

    # -------------------------------------------------------------- updates

    def update(self, task_id: str, state: TaskState, healthy: bool | None = None,
               **fields: Any) -> list[Effect]:
        task = self.core.tasks.get(task_id)
        status = TaskStatus(task_id=task_id, state=state, healthy=healthy,
                            agent_id=task.agent_id if task else "", uuid="u", **fields)
        return self.step(StatusReceived(status))

    def tasks(self, app_id: str) -> list[AppTask]:
        return self.core.tasks_of(app_id)

    def run_all(self, app_id: str, healthy: bool | None = True) -> None:
        """Every task of the app that is not yet running becomes TASK_RUNNING."""
        for task in self.tasks(app_id):
            if task.state is not TaskState.TASK_RUNNING and not task.killing:
                self.update(task.task_id, TaskState.TASK_RUNNING,
                            healthy if task.health_checked else None)

    def finish_kills(self) -> None:
        """Every task being killed reports TASK_KILLED."""
        for task in list(self.core.tasks.values()):
            if task.killing:
                self.update(task.task_id, TaskState.TASK_KILLED)

    def snapshot(self) -> Snapshot:
        """What a restarted framework would load from the store."""
        return Snapshot(framework_id=self.store["framework"].get("id"),
                        apps=dict(self.store["apps"]),
                        deployments=dict(self.store["deployments"]),
                        tasks=dict(self.store["tasks"]))
