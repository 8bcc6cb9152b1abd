"""The asyncio shell around `ServiceCore`: scheduler callbacks and API commands in,
driver calls, store writes and the wake-up timer out.

Everything runs on one event loop (the driver's callbacks, the aiohttp handlers and
the timer), so the core needs no locks. Store writes for a batch of effects go out
before the first driver call that follows them: a task is on disk before its launch
is sent, so a framework that dies in between finds it and asks the master about it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from dyad.clock import Clock
from dyad.effects import ArmTimer, CancelTimer, TimerFired
from dyad.messages import MasterInfo, Offer, TaskStatus
from dyad.timers import TimerTable
from frameworks.autopilot import ApplyInstances, ApplyLimits, Config, Evaluate, Recommended
from frameworks.autopilot.core import Effect as AutopilotEffect
from frameworks.scheduler import Scheduler
from frameworks.effects import perform
from frameworks.service.core import (
    AgentLost, Command, CommandResult, Disconnected, Effect, Event, OffersReceived, Persist,
    Registered, Reregistered, ServiceCore, ServiceError, StatusReceived)
from frameworks.service.rightsizing import Kill, RightSizing, Sample
from frameworks.service.store import Store, StoreError

log = logging.getLogger(__name__)


class Watcher(Protocol):
    """Told around each event and command (frameworks/service/events_stream.py)."""

    def before(self, core: ServiceCore, event: Event, now: float) -> None: ...

    def after(self, core: ServiceCore, command: Command | None, now: float) -> None: ...


class ServiceRuntime:
    """Performs the core's effects. ``driver`` is a `SchedulerDriver` (or a
    `FakeSchedulerDriver` in tests); ``on_fatal`` is called once if the store fails."""

    def __init__(self, core: ServiceCore, store: Store, clock: Clock,
                 on_fatal: Callable[[Exception], None] | None = None,
                 autopilot: Config = Config()) -> None:
        self.core = core
        self.store = store
        self.clock = clock
        self.driver: Any = None
        self.on_fatal = on_fatal
        self.failed: Exception | None = None
        self.master_url: str | None = None  # the leading master's HTTP API, once known
        self._timers = TimerTable(clock.now, self._fire)
        # Told of the apps at the first event (registration), inside the loop its
        # timers need.
        self.rightsizing = RightSizing(autopilot)
        self.watchers: list[Watcher] = []

    def handle(self, event: Event) -> None:
        """Feed a driver or timer event. After a store failure every event raises
        (an update then goes unacknowledged and reaches the next leader)."""
        self._check()
        now = self.clock.now()
        oom = (self.rightsizing.status(self.core, event.status, now)
               if isinstance(event, StatusReceived) else [])
        for watcher in self.watchers:
            watcher.before(self.core, event, now)
        self._perform(self.core.handle(event, now))
        self._right_size(oom + self.rightsizing.sync(self.core.apps, now))
        for watcher in self.watchers:
            watcher.after(self.core, None, now)

    def execute(self, command: Command) -> CommandResult:
        """Run an API command; raises `ServiceError` (nothing done) or `StoreError`."""
        self._check()
        outcome = self.core.execute(command, self.clock.now())
        self._perform(outcome.effects)
        for watcher in self.watchers:
            watcher.after(self.core, command, self.clock.now())
        self._right_size(self.rightsizing.sync(self.core.apps, self.clock.now()))
        return outcome

    def sampled(self, samples: Sequence[Sample]) -> None:
        """Usage rows of followed apps, read from the master's usage store."""
        self._right_size(self.rightsizing.sampled(self.core, samples, self.clock.now()))

    def recalled(self, kill: Kill) -> None:
        """An OOM kill read back from the master's usage store."""
        self._right_size(self.rightsizing.recalled(kill, self.clock.now()))

    def _right_size(self, effects: Sequence[AutopilotEffect]) -> None:
        for effect in effects:
            if isinstance(effect, ApplyLimits):
                self._apply(effect)
            elif isinstance(effect, ApplyInstances):
                self._scale(effect)
            elif isinstance(effect, Recommended):
                log.debug("autopilot: %s", effect.recommendation)
            else:
                self._timers.perform(effect)
        for deferred in self.rightsizing.due(self.core):
            self._apply(deferred)

    def _apply(self, effect: ApplyLimits) -> None:
        command = self.rightsizing.upgrade(self.core, effect)
        if command is None or self.failed is not None:
            return
        try:
            outcome = self.execute(command)
        except ServiceError as exc:  # another deployment holds the app: once it ends
            self.rightsizing.defer(self.core, effect)
            log.info("autopilot: %s resized once it is free (%s)", effect.app_id, exc.message)
            return
        self.rightsizing.upgraded(effect.app_id, outcome.deployment_id)
        log.info("autopilot: %s to cpus %.3f mem %.0f MiB (deployment %s): %s",
                 effect.app_id, effect.limits.cpus, effect.limits.mem_bytes / 2 ** 20,
                 outcome.deployment_id, effect.reason)

    def _scale(self, effect: ApplyInstances) -> None:
        command = self.rightsizing.scale(self.core, effect)
        if command is None or self.failed is not None:
            return
        outcome = self.execute(command)  # no deployment holds the app: cannot conflict
        self.rightsizing.counters["autopilot_scales"] += 1
        log.info("autopilot: %s to %d instances (deployment %s): %s", effect.app_id,
                 effect.instances, outcome.deployment_id, effect.reason)

    def _check(self) -> None:
        if self.failed is not None:
            raise StoreError(f"the service stopped after a store failure: {self.failed}")

    def _perform(self, effects: Sequence[Effect]) -> None:
        pending: list[Persist] = []
        for effect in effects:
            if isinstance(effect, Persist):
                pending.append(effect)
                continue
            self._write(pending)
            pending = []
            self._act(effect)
        self._write(pending)

    def _write(self, changes: list[Persist]) -> None:
        if not changes:
            return
        try:
            self.store.apply(changes)
        except StoreError as exc:
            if self.failed is None:
                self.failed = exc
                log.error("store failure, stopping: %s", exc)
                if self.on_fatal is not None:
                    self.on_fatal(exc)
            raise

    def _act(self, effect: Effect) -> None:
        if isinstance(effect, (ArmTimer, CancelTimer)):
            self._timers.perform(effect)
        else:
            perform(effect, self.driver)  # Persist never reaches here: see _perform

    def _fire(self, key: Hashable) -> None:
        try:
            if isinstance(key, Evaluate):
                self._right_size(self.rightsizing.pilot.handle(TimerFired(key),
                                                               self.clock.now()))
            else:
                self.handle(TimerFired(key))
        except StoreError:
            pass  # already reported through on_fatal

    def close(self) -> None:
        self._timers.cancel_all()


class ServiceScheduler(Scheduler):
    """The framework's `Scheduler`: every callback becomes a core event. Offers are
    answered within the callback, so a rescinded offer needs nothing from us."""

    def __init__(self, runtime: ServiceRuntime) -> None:
        self.runtime = runtime
        self.errors = 0
        self.last_error = ""

    def registered(self, driver: Any, framework_id: str, master_info: MasterInfo) -> None:
        log.info("registered as framework %s with master %s", framework_id, master_info.id)
        self.runtime.master_url = master_info.http_url
        self.runtime.handle(Registered(framework_id))

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        log.info("re-registered with master %s", master_info.id)
        self.runtime.master_url = master_info.http_url
        self.runtime.handle(Reregistered())

    def disconnected(self, driver: Any) -> None:
        log.warning("disconnected from the master")
        self.runtime.handle(Disconnected())

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        self.runtime.handle(OffersReceived(tuple(offers)))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        self.runtime.handle(StatusReceived(status))

    def agent_lost(self, driver: Any, agent_id: str) -> None:
        self.runtime.handle(AgentLost(agent_id))

    def error(self, driver: Any, message: str) -> None:
        self.errors += 1
        self.last_error = message
        log.error("driver reported: %s", message)
