"""What Marathon's event bus would say about what the service did -- pure.

`MarathonEvents` watches the service core around each event and command
(`before` sees a status update while the task it names is still on record;
`after` compares the core with what it saw last) and returns Marathon's events as
JSON documents: `status_update_event`, `health_status_changed_event`,
`api_post_event`, `deployment_info`, `deployment_success`, `deployment_failed`,
`group_change_success`, `app_terminated_event`. The SSE shell
(frameworks/service/events_stream.py) streams them from `GET /v2/events`.

It also remembers the app definitions of the versions it saw, which
`/v2/apps/{id}/versions` lists: the versions made since this instance began to
lead (and the current one), newest first, at most `max_versions` per app. The
history is not persisted: a new leader knows the current versions only.

Groups: Dyad has no group objects, but app ids are paths, and Marathon's groups
are exactly the folders of those paths; `group_tree` builds them.
"""

from __future__ import annotations

from typing import Any

from frameworks.service import marathon_shape, views
from frameworks.service.appdef import AppDefinition, app_to_json
from frameworks.service.core import CancelDeployment, Command, Event, ServiceCore, StatusReceived
from frameworks.service.records import Deployment, iso_time

MAX_VERSIONS = 50


def definition(app: AppDefinition) -> dict[str, Any]:
    """The app as `/v2/apps/{id}/versions/{version}` answers: its definition in
    Marathon's shape, without the status of its tasks."""
    return marathon_shape.app({**app_to_json(app), "version": app.version, "versionInfo": {
        "lastScalingAt": app.version, "lastConfigChangeAt": app.config_version}})


def _event(kind: str, now: float, **fields: Any) -> dict[str, Any]:
    return {"eventType": kind, "timestamp": iso_time(now), **fields}


def _group(group_id: str, apps: list[dict[str, Any]], version: str) -> dict[str, Any]:
    return {"id": group_id, "apps": apps, "groups": [], "pods": [], "dependencies": [],
            "version": version}


def _plan(core: ServiceCore, deployment: Deployment) -> dict[str, Any]:
    body = marathon_shape.deployment(views.deployment_json(core, deployment))
    states = [[definition(app)] if app is not None else []
              for app in (deployment.original, deployment.target)]
    return {"id": body["id"], "version": body["version"], "steps": body["steps"],
            "original": _group("/", states[0], deployment.version),
            "target": _group("/", states[1], deployment.version)}


class MarathonEvents:
    """Marathon's events for what the core did, and the app versions seen."""

    def __init__(self, max_versions: int = MAX_VERSIONS) -> None:
        self.max_versions = max_versions
        self._versions: dict[str, dict[str, AppDefinition]] = {}  # app -> version -> app
        self._deployments: dict[str, Deployment] = {}

    def prime(self, core: ServiceCore) -> None:
        """Start from `core` as it is (a new leader's): nothing in it is news."""
        self._versions = {}
        for app in core.apps.values():
            self._remember(app)
        self._deployments = dict(core.deployments)

    def before(self, core: ServiceCore, event: Event, now: float) -> list[dict[str, Any]]:
        if not isinstance(event, StatusReceived):
            return []
        status = event.status
        task = core.tasks.get(status.task_id)
        if task is None:
            return []  # not one of ours: Marathon reports its own tasks only
        events = [_event(
            "status_update_event", now, slaveId=task.agent_id, taskId=task.task_id,
            taskStatus=status.state.value, message=status.message, appId=task.app_id,
            host=task.hostname, ports=list(task.ports), version=task.config_version,
            ipAddresses=[{"ipAddress": task.ip, "protocol": "IPv4"}] if task.ip else [])]
        if task.health_checked and status.healthy is not None and status.healthy != task.healthy:
            events.append(_event("health_status_changed_event", now, appId=task.app_id,
                                 taskId=task.task_id, instanceId=task.task_id,
                                 version=task.config_version, alive=status.healthy))
        return events

    def after(self, core: ServiceCore, command: Command | None,
              now: float) -> list[dict[str, Any]]:
        """`command`: the API command just executed (None: a driver event or timer)."""
        events: list[dict[str, Any]] = []
        for app in core.apps.values():
            if app.version not in self._versions.get(app.id, {}):
                self._remember(app)
                if command is not None:
                    events.append(_event("api_post_event", now, clientIp=None,
                                         uri=f"/v2/apps{app.id}",
                                         appDefinition=definition(app)))
        for app_id in [a for a in self._versions if a not in core.apps]:
            del self._versions[app_id]
            events.append(_event("app_terminated_event", now, appId=app_id))
        started = [d for i, d in core.deployments.items() if i not in self._deployments]
        for deployment_id in [i for i in self._deployments if i not in core.deployments]:
            gone = self._deployments.pop(deployment_id)
            events += self._ended(core, gone, command, started, now)
        for deployment in started:
            self._deployments[deployment.id] = deployment
            plan = _plan(core, deployment)
            events.append(_event("deployment_info", now, plan=plan,
                                 currentStep=plan["steps"][0]))
        return events

    def _ended(self, core: ServiceCore, gone: Deployment, command: Command | None,
               started: list[Deployment], now: float) -> list[dict[str, Any]]:
        app = core.apps.get(gone.app_id)
        reached = (app is None if gone.target is None else
                   app is not None and app.config_version == gone.target.config_version)
        replaced = any(d.app_id == gone.app_id for d in started)  # rolled back
        if reached and not replaced and not isinstance(command, CancelDeployment):
            return [_event("deployment_success", now, id=gone.id),
                    _event("group_change_success", now, groupId="/", version=gone.version)]
        return [_event("deployment_failed", now, id=gone.id)]

    def _remember(self, app: AppDefinition) -> None:
        versions = self._versions.setdefault(app.id, {})
        versions[app.version] = app
        while len(versions) > self.max_versions:
            del versions[next(iter(versions))]

    # ------------------------------------------------------------- versions

    def versions(self, core: ServiceCore, app_id: str) -> list[str]:
        """The versions of `app_id` known here, newest first (empty: no such app)."""
        known = dict(self._versions.get(app_id, {}))
        app = core.apps.get(app_id)
        if app is not None:
            known[app.version] = app
        return sorted(known, reverse=True)

    def version(self, core: ServiceCore, app_id: str, version: str) -> AppDefinition | None:
        app = core.apps.get(app_id)
        if app is not None and app.version == version:
            return app
        return self._versions.get(app_id, {}).get(version)


def group_tree(core: ServiceCore, now: float, group_id: str = "/") -> dict[str, Any] | None:
    """The group `group_id` (a folder of app ids) with its apps and subgroups, in
    Marathon's shape; None when no app lies under it."""
    prefix = group_id.rstrip("/") + "/"
    under = sorted(a for a in core.apps if a.startswith(prefix))
    if not under and group_id != "/":
        return None
    apps, children = [], []
    for app_id in under:
        rest = app_id[len(prefix):]
        if "/" not in rest:
            apps.append(marathon_shape.app(views.app_json(core, core.apps[app_id], now)))
        else:
            child = prefix + rest.split("/", 1)[0]
            if child not in children:
                children.append(child)
    groups = [group_tree(core, now, child) for child in children]
    version = max((core.apps[a].version for a in under), default=iso_time(now))
    return {**_group(group_id if group_id == "/" else group_id.rstrip("/"), apps, version),
            "groups": groups}
