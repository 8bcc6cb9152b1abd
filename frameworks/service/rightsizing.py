"""Right-sizing the service framework's apps: the glue between `ServiceCore` and the
pure `frameworks.autopilot.Autopilot` (docs/autopilot.md). No I/O.

`ServiceRuntime` owns one `RightSizing` and feeds it what happens:

- `sync(apps)` after every command and event: each app whose autopilot spec or
  limits changed (created, edited, upgraded, rolled back) becomes an
  `AppConfigured`, each app gone an `AppRemoved`, so the autopilot always knows
  the limits the app's definition asks for now;
- `status(core, status)` before the core sees a status update: a task killed for
  memory (`REASON_CONTAINER_LIMITATION_MEMORY`) becomes a `TaskOomKilled` at the
  limit that task ran with (its own version's, not the app's latest);
- `sampled(rows)` for usage rows the shell read from the master's usage store,
  and `recalled(kill)` for an OOM kill a new leader read back from it (at the
  kill's own time, with the `mem` the store has for that task).

The autopilot's `ApplyLimits` becomes `upgrade(core, apply)`: a `PutApp` with the
new cpus and mem, which the core deploys as a rolling upgrade within the app's
upgrade strategy. It is forced over a deployment the autopilot itself started,
and a raise after an OOM kill over any deployment: tasks that die for memory keep
any deployment from finishing, and the forced one keeps that deployment's target
(the app's current definition) with only its memory raised (never lowered: the
autopilot raises only above the definition's limit). Any other change never
overrides an operator's deployment (or the app's own creation): the limits are
`defer`red and applied once the app is free (`due`), unless its cpus or mem were
changed meanwhile, which then win.

Horizontal sizing's `ApplyInstances` becomes `scale(core, apply)`: a `PutApp` with
the new `instances`, as an operator's scale (a scale deployment, no task
restarted). It is skipped, not deferred, while any deployment holds the app
(counted in `autopilot_scales_skipped`): a count sized on the load of a moment
goes stale, and the autopilot asks again at a later step. For apps with a
horizontal spec `sync` also tells the autopilot the app's instance count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from dyad.messages import Reason, TaskStatus
from frameworks.autopilot import (
    MIB,
    OFF,
    AppConfigured,
    ApplyLimits,
    AppRemoved,
    ApplyInstances,
    Autopilot,
    AutopilotSpec,
    Config,
    Limits,
    Recommendation,
    TaskOomKilled,
    UsageSampled,
    unparse_spec,
)
from frameworks.autopilot.core import Effect
from frameworks.service.appdef import AppDefinition
from frameworks.service.core import PutApp, ServiceCore
from frameworks.service.records import iso_time


@attrs.frozen
class Sample:
    """One usage row of one of the app's tasks, as the usage store answers it.
    `mem_limit_bytes` is the run's limit as the agent enforces it (0: unknown)."""

    app_id: str
    at: float
    cpus: float
    mem_bytes: float
    task_id: str = ""
    mem_limit_bytes: float = 0.0
    cpus_throttled_secs: float = 0.0  # since the run's previous row


@attrs.frozen
class Kill:
    """One of the app's tasks OOM-killed at `at`, as the usage store's
    `task_events` has it; `mem_limit_bytes` is the task's `mem` then."""

    app_id: str
    at: float
    task_id: str
    mem_limit_bytes: int


def limits_of(app: AppDefinition) -> Limits:
    return Limits(cpus=app.cpus, mem_bytes=round(app.mem * MIB))


class RightSizing:
    """The autopilot and what it was last told about each app."""

    def __init__(self, config: Config = Config()) -> None:
        self.pilot = Autopilot(config)
        self.counters: Counter[str] = Counter()
        self._told: dict[str, tuple[AutopilotSpec, Limits, int | None]] = {}
        self._deployments: dict[str, str] = {}  # app id -> the autopilot's last deployment
        self._pending: dict[str, tuple[ApplyLimits, Limits]] = {}  # deferred, app's limits

    def followed(self) -> list[str]:
        return self.pilot.followed()

    def sync(self, apps: Mapping[str, AppDefinition], now: float) -> list[Effect]:
        effects: list[Effect] = []
        for app_id in sorted(set(self._told) - set(apps)):
            del self._told[app_id]
            self._deployments.pop(app_id, None)
            self._pending.pop(app_id, None)
            effects += self.pilot.handle(AppRemoved(app_id), now)
        for app_id in sorted(apps):
            app = apps[app_id]
            # The count matters only to horizontal sizing: other apps are not told
            # of every scale.
            told = (app.autopilot, limits_of(app),
                    None if app.autopilot.horizontal is None else app.instances)
            if self._told.get(app_id) == told or (
                    app.autopilot.mode == OFF and app_id not in self._told):
                continue
            self._told[app_id] = told
            effects += self.pilot.handle(AppConfigured(app_id, *told), now)
        return effects

    def status(self, core: ServiceCore, status: TaskStatus, now: float) -> list[Effect]:
        if status.reason != Reason.CONTAINER_LIMITATION_MEMORY:
            return []
        task = core.tasks.get(status.task_id)
        if task is None:
            return []
        self.counters["autopilot_oom_kills"] += 1
        limit = _version_mem(core, task.app_id, task.config_version)
        return self.pilot.handle(TaskOomKilled(task.app_id, task.task_id, now, limit), now)

    def recalled(self, kill: Kill, now: float) -> list[Effect]:
        """An OOM kill read back from the master's store (a new leader's history):
        the limit is the one the store has for that task."""
        self.counters["autopilot_oom_kills_recalled"] += 1
        return self.pilot.handle(TaskOomKilled(kill.app_id, kill.task_id, kill.at,
                                               kill.mem_limit_bytes), now)

    def sampled(self, core: ServiceCore, samples: Iterable[Sample],
                now: float) -> list[Effect]:
        """Feed usage rows. What a run's limit allows beyond its task's `mem` (a
        command executor's 64 MiB, whose RSS the row counts too) is passed on as
        the sample's allowance, so the autopilot sizes `mem` in `mem`'s terms."""
        effects: list[Effect] = []
        for s in samples:
            self.counters["autopilot_samples"] += 1
            task = core.tasks.get(s.task_id)
            mem = _version_mem(core, s.app_id, task.config_version) if task else 0
            allowance = max(0.0, s.mem_limit_bytes - mem) if mem and s.mem_limit_bytes else 0.0
            effects += self.pilot.handle(UsageSampled(s.app_id, s.at, s.cpus, s.mem_bytes,
                                                      allowance, s.task_id,
                                                      s.cpus_throttled_secs), now)
        return effects

    def upgrade(self, core: ServiceCore, apply: ApplyLimits) -> PutApp | None:
        """The command that rolls the app to the autopilot's limits (None: app gone)."""
        app = core.apps.get(apply.app_id)
        if app is None:
            return None
        running = core.deployment_of(app.id)
        ours = running is not None and self._deployments.get(app.id) == running.id
        return PutApp(attrs.evolve(app, cpus=apply.limits.cpus,
                                   mem=apply.limits.mem_bytes / MIB),
                      force=ours or (apply.oom and running is not None))

    def scale(self, core: ServiceCore, apply: ApplyInstances) -> PutApp | None:
        """The command that scales the app to the autopilot's count (None: the app
        is gone, already at that count, or under a deployment: skipped)."""
        app = core.apps.get(apply.app_id)
        if app is None or app.instances == apply.instances:
            return None
        if core.deployment_of(app.id) is not None:
            self.counters["autopilot_scales_skipped"] += 1
            return None
        return PutApp(attrs.evolve(app, instances=apply.instances))

    def defer(self, core: ServiceCore, apply: ApplyLimits) -> None:
        """The app is locked by a deployment not ours: apply once it is free."""
        app = core.apps.get(apply.app_id)
        if app is not None:
            self.counters["autopilot_upgrades_deferred"] += 1
            self._pending[app.id] = (apply, limits_of(app))

    def due(self, core: ServiceCore) -> list[ApplyLimits]:
        """Deferred limits whose app is free now, and unchanged since."""
        ready = []
        for app_id in sorted(self._pending):
            app = core.apps.get(app_id)
            if app is not None and core.deployment_of(app_id) is not None:
                continue
            apply, limits = self._pending.pop(app_id)
            if app is not None and limits_of(app) == limits:
                ready.append(apply)
        return ready

    def upgraded(self, app_id: str, deployment_id: str | None) -> None:
        """The autopilot's upgrade of `app_id` started as `deployment_id`."""
        self.counters["autopilot_upgrades"] += 1
        if deployment_id is not None:
            self._deployments[app_id] = deployment_id


def _version_mem(core: ServiceCore, app_id: str, config_version: str) -> int:
    """The memory limit tasks of that version of the app run with, in bytes."""
    app = core.apps.get(app_id)
    deployment = core.deployment_of(app_id)
    for candidate in (app, deployment.original if deployment else None):
        if candidate is not None and candidate.config_version == config_version:
            return limits_of(candidate).mem_bytes
    return limits_of(app).mem_bytes if app is not None else 0


def recommendation_json(app: AppDefinition, rec: Recommendation | None) -> dict[str, Any]:
    """`GET /v2/apps/{id}/recommendation`: current vs recommended (mem in MiB, as in
    app definitions), the variants chosen, the evidence and the reasons; with a
    horizontal spec, `instances`: current vs recommended count and why."""
    body: dict[str, Any] = {"appId": app.id, "autopilot": unparse_spec(app.autopilot),
                            "current": {"cpus": app.cpus, "mem": app.mem}}
    if rec is None:
        return {**body, "recommendation": None}
    slack = rec.slack_removed
    return {**body, "recommendation": {
        "ready": rec.ready, "at": iso_time(rec.at), "cpus": rec.cpus,
        "mem": rec.mem_bytes / MIB, "cpuVariant": rec.cpu_variant,
        "memVariant": rec.mem_variant, "samples": rec.samples, "ooms": rec.ooms,
        "slackRemoved": {"cpus": round(slack.cpus, 6), "mem": slack.mem_bytes / MIB},
        "reasons": list(rec.reasons), **_instances_json(app, rec)}}


def _instances_json(app: AppDefinition, rec: Recommendation) -> dict[str, Any]:
    advice = rec.instances
    if advice is None:
        return {}
    return {"instances": {"ready": advice.ready, "current": app.instances,
                          "recommended": advice.instances, "reason": advice.explain}}
