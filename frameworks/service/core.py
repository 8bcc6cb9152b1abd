"""The service framework's brain: apps, their tasks and deployments, no I/O.

Two ways in, both ending in the same bookkeeping:

- ``handle(event, now) -> effects`` for what happens to the framework: it
  registered, offers or a status update arrived, an agent was lost, the wake-up
  timer fired;
- ``execute(command, now) -> CommandResult`` for what users ask through the REST API:
  put, delete or restart an app, kill tasks, cancel a deployment, reset a backoff.
  A command that cannot be done raises `NotFound` or `Conflict` *before* changing
  anything, so a refused request leaves no trace.

After either, the core walks every app (`deployment.plan_deployment` for apps being
deployed, `plan_steady` for the rest) to decide kills and how many tasks each app
wants launched; launches happen when offers come. It revives offers whenever some
app wants more than before and suppresses them when nobody wants any, so it never
sits on offers it cannot use. Unsuitable offers are declined with a filter.

Effects are small frozen values the shell performs in order: talk to the driver
(the shared `frameworks.effects`: `LaunchTasks`, `DeclineOffers`, `RequestKill`,
`ReviveOffers`, `SuppressOffers`, `ReconcileTasks`), write the store (`Persist`,
always before the launch it covers), and arm the single wake-up timer
(`ArmTimer`/`CancelTimer` with key `Wake()`) for backoff expiry, deployment
deadlines and retries.

Failure handling: a task that ends without being asked to (failed, finished,
killed by its agent's health check...) is replaced after the app's backoff
delay ``backoffSeconds x backoffFactor^(failures-1)``, capped at
``maxLaunchDelaySeconds``. A task that ran for `ServiceConfig.backoff_reset_after`
seconds before failing starts the count afresh, as does a new app version. Lost
tasks (agent gone, unknown to the master) are replaced at once: not the app's fault.

After (re)registration the core reconciles: explicitly for every task it knows
(the master answers TASK_LOST for ones it does not, which are then replaced) and
implicitly, to find tasks it does not know, which it kills. Known tasks count as
instances until the master says otherwise, so a restarted framework starts no
duplicates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerFired, TimerKey, UnknownTimer
from dyad.messages import Offer, Operation, OperationType, TaskInfo, TaskState, TaskStatus
from dyad.resources import Resources
from frameworks.effects import (
    AcceptOffer, AskPreemption, DeclineOffers, DriverEffect, LaunchTasks, ReconcileTasks,
    RequestKill, ReviveOffers, SuppressOffers)
from frameworks.service.appdef import AppDefinition, app_from_stored, stored_app
from frameworks.service.deployment import plan_deployment, plan_steady
from frameworks.service.placement import (
    Fit, Spread, Unfit, agent_ip, fit, resident_fit, task_info, task_shape,
)
from frameworks.service.preemption_asks import PreemptionAsks
from frameworks.service.records import (
    AUTO_ROLLBACK_KINDS, CREATE, DELETE, RESTART, ROLLBACK, SCALE, UPGRADE, AppTask,
    Deployment, iso_time)

BACKOFF_STATES = frozenset({TaskState.TASK_FAILED, TaskState.TASK_FINISHED,
                            TaskState.TASK_ERROR, TaskState.TASK_KILLED})
"""Unrequested ends that are the app's doing and so delay its next launch."""


# ----------------------------------------------------------------------- events


@attrs.frozen
class Registered:
    framework_id: str


@attrs.frozen
class Reregistered:
    pass


@attrs.frozen
class Disconnected:
    pass


@attrs.frozen
class OffersReceived:
    offers: tuple[Offer, ...]


@attrs.frozen
class StatusReceived:
    status: TaskStatus


@attrs.frozen
class AgentLost:
    agent_id: str


Event = (Registered | Reregistered | Disconnected | OffersReceived | StatusReceived
         | AgentLost | TimerFired)


@attrs.frozen
class Wake(TimerKey):
    """The one timer the core arms: the earliest backoff expiry, deployment
    deadline, kill retry or reconciliation retry."""


# --------------------------------------------------------------------- commands


@attrs.frozen
class PutApp:
    """Create or change an app. ``create_only`` (POST) refuses an existing id."""

    app: AppDefinition
    force: bool = False
    create_only: bool = False


@attrs.frozen
class DeleteApp:
    app_id: str
    force: bool = False


@attrs.frozen
class RestartApp:
    app_id: str
    force: bool = False


@attrs.frozen
class KillTasks:
    """Kill some of an app's tasks; with ``scale`` lower its instances to match."""

    app_id: str
    task_ids: tuple[str, ...]
    scale: bool = False
    force: bool = False


@attrs.frozen
class CancelDeployment:
    """Roll the deployment back (a new deployment), or with ``force`` just drop it."""

    deployment_id: str
    force: bool = False


@attrs.frozen
class ResetDelay:
    app_id: str


Command = PutApp | DeleteApp | RestartApp | KillTasks | CancelDeployment | ResetDelay


# ---------------------------------------------------------------------- effects


@attrs.frozen
class Persist:
    """Write (or with ``value`` None delete) ``kind/key`` in the store. Kinds:
    ``apps``, ``deployments``, ``tasks``, ``framework``."""

    kind: str
    key: str
    value: Any


Effect = DriverEffect | Persist | ArmTimer | CancelTimer


@attrs.frozen
class CommandResult:
    """What a command did: its effects, and the deployment and version it made."""

    effects: list[Effect]
    deployment_id: str | None = None
    version: str | None = None


class ServiceError(Exception):
    """A command that cannot be carried out; `message` is for the API's answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ServiceError):
    pass


class Conflict(ServiceError):
    def __init__(self, message: str, deployment_ids: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.deployment_ids = list(deployment_ids)


# ------------------------------------------------------------------------ state


@attrs.frozen
class ServiceConfig:
    deployment_timeout: float = 300.0
    """A rollback-able deployment none of whose new tasks became ready for this
    long is rolled back."""
    refuse_seconds: float = 30.0
    """Filter on declined (and partly used) offers. Any new need revives offers,
    which clears filters, so this only delays offers nobody is waiting for."""
    kill_retry: float = 30.0
    """A kill without a terminal update after this plus the grace period is resent."""
    reconcile_retry: float = 30.0
    """Tasks whose reconciliation got no answer in this long are asked about again."""
    backoff_reset_after: float = 60.0
    """A task that ran this long before failing restarts the failure count."""
    role: str = "*"
    """The framework's role: what resident apps reserve their resources to."""
    principal: str = ""
    preemption_ask_after: float | None = None
    """Ask the master to preempt for an app waiting this long (preemption_asks)."""


@attrs.define
class AppRuntime:
    """What the framework knows about an app beyond its definition; not persisted,
    so a restarted framework forgets backoffs."""

    failures: int = 0
    delay_until: float = 0.0
    last_failure: dict[str, Any] | None = None
    unplaced: Counter[str] = attrs.field(factory=Counter)
    unplaced_example: str = ""
    offers_considered: int = 0


@attrs.frozen
class Snapshot:
    """What the store holds, as `Persist` wrote it."""

    framework_id: str | None = None
    apps: dict[str, Any] = attrs.field(factory=dict)
    deployments: dict[str, Any] = attrs.field(factory=dict)
    tasks: dict[str, Any] = attrs.field(factory=dict)


class ServiceCore:
    """All decisions of the service framework. ``new_id`` makes task-id suffixes and
    deployment ids (tests pass a counter)."""

    def __init__(self, config: ServiceConfig, new_id: Callable[[], str],
                 snapshot: Snapshot | None = None) -> None:
        self.config = config
        self._new_id = new_id
        snapshot = snapshot or Snapshot()
        self.framework_id = snapshot.framework_id
        self.apps: dict[str, AppDefinition] = {}
        for body in snapshot.apps.values():
            app = app_from_stored(body)
            self.apps[app.id] = app
        self.deployments: dict[str, Deployment] = {
            d.id: d for d in map(Deployment.from_json, snapshot.deployments.values())}
        self.tasks: dict[str, AppTask] = {
            t.task_id: t for t in map(AppTask.from_json, snapshot.tasks.values())}
        # Persistent volumes of resident apps: volume id -> agent id
        # (frameworks/service/resident.py).
        self.residents: dict[str, str] = {t.volume: t.agent_id for t in self.tasks.values()
                                          if t.volume}
        self.connected = False
        self.counters: Counter[str] = Counter()
        self._runtime: dict[str, AppRuntime] = {}
        self._agents: dict[str, tuple[str, dict[str, str]]] = {}
        self._wanted: dict[str, int] = {}
        self._demand: dict[str, int] = {}
        self._suppressed = False
        self._ever_registered = False
        self._wake: float | None = None
        self._unconfirmed: set[str] = set()
        self._reconciled_at = 0.0
        self._last_stamp_ms = 0
        self._asks = (None if config.preemption_ask_after is None
                      else PreemptionAsks(config.preemption_ask_after))

    # ------------------------------------------------------------ queries

    def tasks_of(self, app_id: str) -> list[AppTask]:
        return sorted((t for t in self.tasks.values() if t.app_id == app_id),
                      key=lambda t: (t.staged_at, t.task_id))

    def deployment_of(self, app_id: str) -> Deployment | None:
        return next((d for d in self.deployments.values() if d.app_id == app_id), None)

    def runtime(self, app_id: str) -> AppRuntime:
        return self._runtime.setdefault(app_id, AppRuntime())

    def wanted(self, app_id: str) -> int:
        """Tasks the app still needs launched (backoff or not)."""
        return self._wanted.get(app_id, 0)

    def launchable(self, app_id: str, now: float) -> int:
        """Tasks the app would launch on a fitting offer right now."""
        wanted = self._wanted.get(app_id, 0)
        runtime = self._runtime.get(app_id)
        if wanted and runtime is not None and now < runtime.delay_until:
            return 0
        return wanted

    def validate(self) -> None:
        """Invariants; tests call this after every step."""
        apps_deploying = [d.app_id for d in self.deployments.values()]
        assert len(apps_deploying) == len(set(apps_deploying)), "two deployments for one app"
        for deployment in self.deployments.values():
            if deployment.target is None:
                assert deployment.app_id not in self.apps, deployment.app_id
            else:
                assert self.apps.get(deployment.app_id) == deployment.target, deployment.id
        for task in self.tasks.values():
            assert not task.state.is_terminal, task.task_id

    # ---------------------------------------------------------- way in: events

    def handle(self, event: Event, now: float) -> list[Effect]:
        if isinstance(event, OffersReceived):
            effects = self._on_offers(list(event.offers), now)
        elif isinstance(event, StatusReceived):
            effects = self._on_status(event.status, now)
        elif isinstance(event, Registered):
            effects = self._on_registered(event.framework_id, now)
        elif isinstance(event, Reregistered):
            effects = self._on_subscribed(now)
        elif isinstance(event, Disconnected):
            self.connected = False
            effects = []
        elif isinstance(event, AgentLost):
            self._agents.pop(event.agent_id, None)
            effects = []
        elif isinstance(event, TimerFired):
            match event.key:
                case Wake():
                    self._wake = None
                    effects = self._on_tick(now)
                case key:
                    raise UnknownTimer("ServiceCore", key)
        else:
            raise TypeError(f"not a service event: {event!r}")
        return self._settle(effects, now)

    # -------------------------------------------------------- way in: commands

    def execute(self, command: Command, now: float) -> CommandResult:
        effects: list[Effect] = []
        deployment: Deployment | None = None
        if isinstance(command, PutApp):
            deployment = self._put_app(command, now, effects)
        elif isinstance(command, DeleteApp):
            app = self._app(command.app_id)
            self._unlocked(app.id, command.force, effects)
            del self.apps[app.id]
            effects.append(Persist("apps", app.key, None))
            self._runtime.pop(app.id, None)
            deployment = self._deploy(DELETE, app.id, None, app, now, effects)
        elif isinstance(command, RestartApp):
            app = self._app(command.app_id)
            self._unlocked(app.id, command.force, effects)
            stamp = self._stamp(now)
            deployment = self._change(attrs.evolve(app, version=stamp, config_version=stamp),
                                      RESTART, app, now, effects)
        elif isinstance(command, KillTasks):
            deployment = self._kill_tasks(command, now, effects)
        elif isinstance(command, CancelDeployment):
            found = self.deployments.get(command.deployment_id)
            if found is None:
                raise NotFound(f"deployment {command.deployment_id} does not exist")
            if command.force:
                self._drop(found, effects)
            else:
                deployment = self._rollback(found, now, effects)
        elif isinstance(command, ResetDelay):
            runtime = self.runtime(self._app(command.app_id).id)
            runtime.failures, runtime.delay_until = 0, 0.0
        else:
            raise TypeError(f"not a service command: {command!r}")
        effects = self._settle(effects, now)
        if deployment is None:
            return CommandResult(effects)
        return CommandResult(effects, deployment.id, deployment.version)

    def _app(self, app_id: str) -> AppDefinition:
        app = self.apps.get(app_id)
        if app is None:
            raise NotFound(f"App '{app_id}' does not exist")
        return app

    def _unlocked(self, app_id: str, force: bool, effects: list[Effect]) -> None:
        """Refuse to touch an app under deployment unless forced; forcing drops
        the running deployment (its tasks stay and the next one takes over)."""
        running = self.deployment_of(app_id)
        if running is None:
            return
        if not force:
            raise Conflict(
                "App is locked by one or more deployments. Override with the option "
                f"'?force=true'. View details at '/v2/deployments/{running.id}'.",
                [running.id])
        self._drop(running, effects)

    def _put_app(self, command: PutApp, now: float, effects: list[Effect]) -> Deployment:
        app = command.app
        existing = self.apps.get(app.id)
        if existing is not None and command.create_only:
            raise Conflict(f"An app with id [{app.id}] already exists.")
        self._unlocked(app.id, command.force, effects)
        stamp = self._stamp(now)
        if existing is None:
            return self._change(attrs.evolve(app, version=stamp, config_version=stamp),
                                CREATE, None, now, effects)
        if existing.same_config(app):
            return self._change(attrs.evolve(app, version=stamp,
                                             config_version=existing.config_version),
                                SCALE, existing, now, effects)
        return self._change(attrs.evolve(app, version=stamp, config_version=stamp),
                            UPGRADE, existing, now, effects)

    def _change(self, app: AppDefinition, kind: str, original: AppDefinition | None,
                now: float, effects: list[Effect]) -> Deployment:
        self.apps[app.id] = app
        effects.append(Persist("apps", app.key, stored_app(app)))
        if kind != SCALE:
            runtime = self.runtime(app.id)
            runtime.failures, runtime.delay_until = 0, 0.0
        return self._deploy(kind, app.id, app, original, now, effects)

    def _deploy(self, kind: str, app_id: str, target: AppDefinition | None,
                original: AppDefinition | None, now: float,
                effects: list[Effect]) -> Deployment:
        deployment = Deployment(
            id=self._new_id(), app_id=app_id, kind=kind, target=target, original=original,
            version=target.version if target else self._stamp(now), started_at=now,
            progress_at=now, auto_rollback=kind in AUTO_ROLLBACK_KINDS)
        self.deployments[deployment.id] = deployment
        effects.append(Persist("deployments", deployment.id, deployment.to_json()))
        self.counters[f"deployments_{kind}"] += 1
        return deployment

    def _drop(self, deployment: Deployment, effects: list[Effect]) -> None:
        del self.deployments[deployment.id]
        effects.append(Persist("deployments", deployment.id, None))

    def _rollback(self, deployment: Deployment, now: float,
                  effects: list[Effect]) -> Deployment:
        """Replace `deployment` by one back to its original (a delete when the
        original is nothing, i.e. the app was being created)."""
        self._drop(deployment, effects)
        self.counters["deployments_rolled_back"] += 1
        original, app_id = deployment.original, deployment.app_id
        self._runtime.pop(app_id, None)
        if original is None:
            removed = self.apps.pop(app_id, None)
            if removed is not None:
                effects.append(Persist("apps", removed.key, None))
            return self._deploy(DELETE, app_id, None, deployment.target, now, effects)
        restored = attrs.evolve(original, version=self._stamp(now))
        self.apps[app_id] = restored
        effects.append(Persist("apps", restored.key, stored_app(restored)))
        return self._deploy(ROLLBACK, app_id, restored, deployment.target, now, effects)

    def _kill_tasks(self, command: KillTasks, now: float,
                    effects: list[Effect]) -> Deployment | None:
        app = self._app(command.app_id)
        tasks = []
        for task_id in command.task_ids:
            task = self.tasks.get(task_id)
            if task is None or task.app_id != app.id:
                raise NotFound(f"Task '{task_id}' of app '{app.id}' does not exist")
            tasks.append(task)
        if command.scale:
            self._unlocked(app.id, command.force, effects)
        effects.extend(self._kill([t for t in tasks if not t.killing], now))
        if not command.scale:
            return None
        scaled = attrs.evolve(app, instances=max(0, app.instances - len(tasks)),
                              version=self._stamp(now))
        return self._change(scaled, SCALE, app, now, effects)

    # ----------------------------------------------------------------- events

    def _on_registered(self, framework_id: str, now: float) -> list[Effect]:
        effects: list[Effect] = []
        if framework_id != self.framework_id:
            self.framework_id = framework_id
            effects.append(Persist("framework", "id", framework_id))
        if not self._ever_registered:
            # Nobody watched deployments while no leader ran: give them a full deadline.
            self._ever_registered = True
            for deployment in self.deployments.values():
                deployment.progress_at = max(deployment.progress_at, now)
        self._suppressed = False  # a new driver starts unsuppressed
        self._demand = {}
        return effects + self._on_subscribed(now)

    def _on_subscribed(self, now: float) -> list[Effect]:
        self.connected = True
        self._unconfirmed = set(self.tasks)
        self._reconciled_at = now
        effects: list[Effect] = []
        if self.tasks:
            effects.append(ReconcileTasks(self._reconcile_list(self._unconfirmed)))
        effects.append(ReconcileTasks(()))
        return effects

    def _reconcile_list(self, task_ids: Iterable[str]) -> tuple[tuple[str, str], ...]:
        return tuple((t, self.tasks[t].agent_id) for t in sorted(task_ids) if t in self.tasks)

    def _on_status(self, status: TaskStatus, now: float) -> list[Effect]:
        self._unconfirmed.discard(status.task_id)
        task = self.tasks.get(status.task_id)
        if task is None:
            if status.state.is_terminal or status.state is TaskState.TASK_UNKNOWN:
                return []
            self.counters["orphans_killed"] += 1
            return [RequestKill(status.task_id)]
        if status.state.is_terminal:
            return self._ended(task, status, now)
        effects: list[Effect] = []
        was_ready = task.ready
        task.state = status.state
        if status.healthy is not None:
            task.healthy = status.healthy
        if status.state is TaskState.TASK_RUNNING and task.started_at is None:
            task.started_at = now
            effects.append(Persist("tasks", task.task_id, task.to_json()))
        if task.ready and not was_ready:
            deployment = self.deployment_of(task.app_id)
            if deployment is not None and deployment.target is not None \
                    and deployment.target.config_version == task.config_version:
                deployment.progress_at = now
        return effects

    def _ended(self, task: AppTask, status: TaskStatus, now: float) -> list[Effect]:
        del self.tasks[task.task_id]
        self.counters[f"tasks_{status.state.value[5:].lower()}"] += 1
        effects: list[Effect] = [Persist("tasks", task.task_id, None)]
        if task.killing:
            return effects
        runtime = self.runtime(task.app_id)
        runtime.last_failure = {
            "appId": task.app_id, "taskId": task.task_id, "state": status.state.value,
            "message": status.message, "reason": status.reason, "host": task.hostname,
            "version": task.config_version, "timestamp": iso_time(now)}
        app = self.apps.get(task.app_id)
        if app is None or status.state not in BACKOFF_STATES:
            return effects
        ran = now - task.started_at if task.started_at is not None else 0.0
        if ran >= self.config.backoff_reset_after:
            runtime.failures = 0
        runtime.failures += 1
        delay = min(app.backoff_seconds * app.backoff_factor ** (runtime.failures - 1),
                    app.max_launch_delay_seconds)
        runtime.delay_until = now + delay
        return effects

    def _on_tick(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for deployment in list(self.deployments.values()):
            if deployment.auto_rollback and \
                    now >= deployment.progress_at + self.config.deployment_timeout:
                self._rollback(deployment, now, effects)
        for task in self.tasks.values():
            if task.kill_requested_at is not None and now >= self._kill_due(task):
                task.kill_requested_at = now
                self.counters["kills_retried"] += 1
                effects.append(RequestKill(task.task_id, task.kill_grace_period))
        if self._unconfirmed and now >= self._reconciled_at + self.config.reconcile_retry:
            self._reconciled_at = now
            self._unconfirmed &= set(self.tasks)
            if self._unconfirmed:
                effects.append(ReconcileTasks(self._reconcile_list(self._unconfirmed)))
        return effects

    def _kill_due(self, task: AppTask) -> float:
        assert task.kill_requested_at is not None
        return task.kill_requested_at + self.config.kill_retry + (task.kill_grace_period or 0.0)

    # ---------------------------------------------------------------- offers

    def _on_offers(self, offers: list[Offer], now: float) -> list[Effect]:
        self.counters["offers_received"] += len(offers)
        for offer in offers:
            self._agents[offer.agent_id] = (offer.hostname, dict(offer.attributes))
            self.residents.update({v.id: offer.agent_id for v in offer.volumes})
        demand = {a: n for a in sorted(self._wanted) if (n := self.launchable(a, now)) > 0}
        targets = {a: self._launch_target(a) for a in self._wanted}
        spreads = {a: Spread(app, self._placed(app), self._agents.values())
                   for a, app in targets.items()}
        left = {offer.id: offer.resources for offer in offers}
        launches: dict[str, list[TaskInfo]] = {offer.id: [] for offer in offers}
        operations: dict[str, list[Operation]] = {offer.id: [] for offer in offers}
        effects: list[Effect] = []
        # Round robin, one task per offer per round, so an app spreads over the
        # offered agents instead of filling the first one.
        progress = True
        while progress and demand:
            progress = False
            for offer in offers:
                for app_id in demand:
                    app = targets[app_id]
                    placement = self._place(app, offer, left[offer.id], spreads[app_id])
                    if isinstance(placement, Unfit):
                        continue
                    info = self._launch(app, offer, placement, now, effects)
                    operations[offer.id] += placement.operations
                    if placement.volume:
                        self.residents[placement.volume] = offer.agent_id
                    spreads[app_id].add(offer.hostname, offer.attributes)
                    launches[offer.id].append(info)
                    left[offer.id] = left[offer.id] - placement.taken
                    demand[app_id] -= 1
                    if not demand[app_id]:
                        del demand[app_id]
                    progress = True
                    break
        for app_id, app in targets.items():
            self._explain(app, offers, left, demand.get(app_id, 0), spreads[app_id])
        for offer in offers:
            if operations[offer.id]:
                effects.append(AcceptOffer(offer.id, (*operations[offer.id], Operation(
                    type=OperationType.LAUNCH, tasks=launches[offer.id])),
                    self.config.refuse_seconds))
            elif launches[offer.id]:
                effects.append(LaunchTasks(offer.id, tuple(launches[offer.id]),
                                           self.config.refuse_seconds))
        unused = tuple(offer.id for offer in offers if not launches[offer.id])
        if unused:
            self.counters["offers_declined"] += len(unused)
            effects.append(DeclineOffers(unused, self.config.refuse_seconds))
        return effects

    def _launch_target(self, app_id: str) -> AppDefinition:
        deployment = self.deployment_of(app_id)
        if deployment is not None and deployment.target is not None:
            return deployment.target
        return self.apps[app_id]

    def _placed(self, app: AppDefinition) -> list[tuple[str, dict[str, str]]]:
        """Where the app's live tasks of the version being placed run: what its
        constraints count (so a rolling upgrade may put a new task beside the old
        one it replaces). Nothing to collect for an app without constraints."""
        if not app.constraints:
            return []
        return [(t.hostname, t.attributes) for t in self.tasks.values()
                if t.app_id == app.id and not t.killing
                and t.config_version == app.config_version]

    def _place(self, app: AppDefinition, offer: Offer, left: Resources,
               spread: Spread) -> Fit | Unfit:
        if app.persistent is not None:
            busy = {t.volume for t in self.tasks.values() if t.volume}
            placement = resident_fit(app, self.config.role, self.config.principal, offer,
                                     left, self.residents, busy)
        else:
            placement = fit(app, left.unreserved())
        if isinstance(placement, Unfit) or not app.constraints:
            return placement
        unmet = spread.unmet(offer)
        return unmet if unmet is not None else placement

    def _launch(self, app: AppDefinition, offer: Offer, placement: Fit, now: float,
                effects: list[Effect]) -> TaskInfo:
        task_id = f"{app.key}.{self._new_id()}"
        record = AppTask(
            task_id=task_id, app_id=app.id, config_version=app.config_version,
            agent_id=offer.agent_id, hostname=offer.hostname, staged_at=now,
            ip=agent_ip(offer), ports=list(placement.ports),
            attributes=dict(offer.attributes), health_checked=bool(app.health_checks),
            kill_grace_period=app.task_kill_grace_period_seconds, volume=placement.volume)
        self.tasks[task_id] = record
        self.counters["tasks_launched"] += 1
        effects.append(Persist("tasks", task_id, record.to_json()))
        return task_info(app, task_id, offer, placement)

    def _explain(self, app: AppDefinition, offers: list[Offer], left: dict[str, Resources],
                 unplaced: int, spread: Spread) -> None:
        """Remember why the app's remaining tasks found no room in these offers."""
        runtime = self.runtime(app.id)
        runtime.unplaced, runtime.unplaced_example = Counter(), ""
        runtime.offers_considered = len(offers)
        if not unplaced:
            return
        for offer in offers:
            placement = self._place(app, offer, left[offer.id], spread)
            if isinstance(placement, Unfit):
                runtime.unplaced[placement.code] += 1
                runtime.unplaced_example = runtime.unplaced_example or \
                    f"{offer.hostname}: {placement.message}"

    # ----------------------------------------------------------- the app walk

    def _settle(self, effects: list[Effect], now: float) -> list[Effect]:
        """After any change: plan every app, then revive/suppress and re-arm."""
        effects += self._drive(now)
        effects += self._offer_interest(now)
        effects += self._ask_preemption(now)
        effects += self._arm(now)
        return effects

    def _drive(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        by_app: dict[str, list[AppTask]] = {}
        for task in self.tasks.values():
            by_app.setdefault(task.app_id, []).append(task)
        self._wanted = {}
        deploying = set()
        for deployment in list(self.deployments.values()):
            deploying.add(deployment.app_id)
            plan = plan_deployment(deployment.target, by_app.get(deployment.app_id, []))
            effects += self._kill(plan.kill, now)
            if plan.done:
                self._drop(deployment, effects)
                self.counters["deployments_finished"] += 1
            elif plan.start:
                self._wanted[deployment.app_id] = plan.start
        for app_id, app in self.apps.items():
            if app_id not in deploying:
                plan = plan_steady(app, by_app.get(app_id, []))
                effects += self._kill(plan.kill, now)
                if plan.start:
                    self._wanted[app_id] = plan.start
        for app_id, tasks in by_app.items():
            if app_id not in self.apps and app_id not in deploying:
                effects += self._kill([t for t in tasks if not t.killing], now)
        return effects

    def _kill(self, tasks: Iterable[AppTask], now: float) -> list[Effect]:
        effects: list[Effect] = []
        for task in tasks:
            task.kill_requested_at = now
            self.counters["kills_requested"] += 1
            effects.append(Persist("tasks", task.task_id, task.to_json()))
            effects.append(RequestKill(task.task_id, task.kill_grace_period))
        return effects

    def _offer_interest(self, now: float) -> list[Effect]:
        if not self.connected:
            return []
        demand = {a: n for a in self._wanted if (n := self.launchable(a, now)) > 0}
        grew = any(n > self._demand.get(a, 0) for a, n in demand.items())
        self._demand = demand
        if grew:
            self._suppressed = False
            return [ReviveOffers()]
        if not demand and not self._suppressed:
            self._suppressed = True
            return [SuppressOffers()]
        return []

    def _ask_preemption(self, now: float) -> list[Effect]:
        """Room asked of the master for the apps waiting `preemption_ask_after`
        (frameworks/service/preemption_asks.py: not for constrained or resident apps)."""
        if self._asks is None or not self.connected:
            return []
        apps = {a: self._launch_target(a) for a in self._demand}
        self._asks.waiting({a for a, app in apps.items()
                            if not app.constraints and app.persistent is None}, now)
        due = self._asks.due(now)
        self.counters["preemption_asks"] += len(due)
        return [AskPreemption(task_shape(apps[a]), apps[a].priority) for a in due]

    def _arm(self, now: float) -> list[Effect]:
        times = [runtime.delay_until for app_id, runtime in self._runtime.items()
                 if self._wanted.get(app_id) and runtime.delay_until > now]
        if self._asks is not None and (ask := self._asks.next_at()) is not None:
            times.append(ask)
        times += [d.progress_at + self.config.deployment_timeout
                  for d in self.deployments.values() if d.auto_rollback]
        times += [self._kill_due(t) for t in self.tasks.values() if t.killing]
        if self._unconfirmed:
            times.append(self._reconciled_at + self.config.reconcile_retry)
        wake = min(times) if times else None
        if wake == self._wake:
            return []
        self._wake = wake
        return [CancelTimer(Wake())] if wake is None else [ArmTimer(Wake(), wake)]

    def _stamp(self, now: float) -> str:
        """A version: the time, in milliseconds, strictly later than the last one
        so two changes in one millisecond still differ."""
        self._last_stamp_ms = max(round(now * 1000), self._last_stamp_ms + 1)
        return iso_time(self._last_stamp_ms / 1000)
