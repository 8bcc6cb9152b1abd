"""The Autopilot recommender in a simulated service framework.

In production `frameworks.service.runtime.ServiceRuntime` feeds the service
framework's `RightSizing` (frameworks/service/rightsizing.py): the apps after
every command and event, OOM kills before the core sees them, and usage rows it
polls from the master's usage store; it carries `ApplyLimits` out as a
`PutApp` (a rolling upgrade), deferring it while another deployment holds the
app. `Recommender` does the same for `sim.frameworks.ServiceFramework`, with
the engine's timers, and usage rows taken from the real master's `RecordUsage`
effects (`UsageTap`) as they would reach the store. So what is simulated is the
production loop, from agent usage reports through the master's rows to the
rolling upgrade.

With the policy's `recommender.enabled`, every app without its own `autopilot`
block (or, with `recommender.apps`, the apps named) is followed in the policy's
`mode`; an app's own block always wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerFired
from frameworks.autopilot import (
    MIB, OFF, ApplyLimits, AutopilotSpec, Config, Evaluate, Recommendation, Recommended,
)
from frameworks.autopilot.core import Effect
from frameworks.service.appdef import AppDefinition
from frameworks.service.core import Command, CommandResult, ServiceCore, ServiceError
from frameworks.service.rightsizing import RightSizing, Sample
from master.usage.schema import UsageSample
from master.usage_rows import RecordUsage
from sim.nodes import MasterNode

Timer = Callable[[ArmTimer | CancelTimer], None]
Execute = Callable[[Command, float], CommandResult]  # raises ServiceError


@attrs.frozen
class RecommenderPolicy:
    """The policy file's `recommender` section, when enabled."""

    config: Config
    mode: str
    apps: tuple[str, ...] | None  # None: every app without its own block


class Recommender:
    """ServiceRuntime's right-sizing loop for one simulated service framework."""

    def __init__(self, policy: RecommenderPolicy, core: ServiceCore, timer: Timer,
                 execute: Execute) -> None:
        self.sizing = RightSizing(policy.config)
        self.mode = policy.mode
        self.apps = policy.apps
        self.core = core
        self._timer = timer
        self._execute = execute
        self.declared: dict[str, tuple[float, float]] = {}  # app -> first cpus, mem (MiB)
        self.latest: dict[str, Recommendation] = {}

    def follow(self, app: AppDefinition) -> AppDefinition:
        """The app as put: the policy's autopilot block unless it has its own."""
        self.declared.setdefault(app.id, (app.cpus, app.mem))
        if app.autopilot.mode != OFF or (self.apps is not None and app.id not in self.apps):
            return app
        return attrs.evolve(app, autopilot=AutopilotSpec(self.mode))

    def before_status(self, status: Any, now: float) -> list[Effect]:
        return self.sizing.status(self.core, status, now)

    def after(self, now: float, effects: Iterable[Effect] = ()) -> None:
        """After a command or an event: tell the autopilot what the apps are now."""
        self._right_size([*effects, *self.sizing.sync(self.core.apps, now)], now)

    def sampled(self, samples: Iterable[UsageSample], framework_id: str | None,
                now: float) -> None:
        followed = set(self.sizing.followed())
        rows = [Sample(s.who.app, s.at, s.cpus_used, float(s.mem_rss_bytes), s.who.task_id,
                       float(s.mem_limit_bytes), s.cpus_throttled_secs)
                for s in samples
                if s.who.framework_id == framework_id and s.who.app in followed]
        if rows:
            self._right_size(self.sizing.sampled(self.core, rows, now), now)

    def fire(self, key: Evaluate, now: float) -> None:
        self._right_size(self.sizing.pilot.handle(TimerFired(key), now), now)

    def _right_size(self, effects: Iterable[Effect], now: float) -> None:
        for effect in effects:
            if isinstance(effect, ApplyLimits):
                self._apply(effect, now)
            elif isinstance(effect, Recommended):
                self.latest[effect.recommendation.app_id] = effect.recommendation
            else:
                self._timer(effect)
        for deferred in self.sizing.due(self.core):
            self._apply(deferred, now)

    def _apply(self, effect: ApplyLimits, now: float) -> None:
        command = self.sizing.upgrade(self.core, effect)
        if command is None:
            return
        try:
            outcome = self._execute(command, now)
        except ServiceError:  # another deployment holds the app: once it ends
            self.sizing.defer(self.core, effect)
            return
        self.sizing.upgraded(effect.app_id, outcome.deployment_id)

    def report(self) -> dict[str, Any]:
        """Per followed app: what was declared, what it has now, the autopilot's
        latest recommendation; and the loop's counters."""
        apps: dict[str, Any] = {}
        for app_id, (cpus, mem) in sorted(self.declared.items()):
            app = self.core.apps.get(app_id)
            rec = self.latest.get(app_id)
            if app is None or app.autopilot.mode == OFF:
                continue
            apps[app_id] = {
                "mode": app.autopilot.mode,
                "declared": {"cpus": cpus, "mem": mem},
                "final": {"cpus": app.cpus, "mem": app.mem},
                "recommended": None if rec is None else {
                    "ready": rec.ready, "cpus": rec.cpus, "mem": rec.mem_bytes / MIB,
                    "cpu_variant": rec.cpu_variant, "mem_variant": rec.mem_variant,
                    "samples": rec.samples, "ooms": rec.ooms}}
        return {"apps": apps, "counters": dict(sorted(self.sizing.counters.items()))}


class UsageTap(MasterNode):
    """The real master, with its usage-store rows handed to `listeners` (the
    service frameworks' recommenders) instead of a store."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listeners: list[Callable[[tuple[UsageSample, ...], float], None]] = []

    def _other(self, effect: Any) -> None:
        if isinstance(effect, RecordUsage) and effect.samples:
            for listener in self.listeners:
                listener(effect.samples, self.engine.now)
        super()._other(effect)
