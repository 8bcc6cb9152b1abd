"""What the service framework remembers about tasks and deployments, and the JSON
form in which it persists them (so a restarted or standby instance picks up where
the last leader stopped)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import attrs

from dyad.messages import TaskState
from frameworks.service.appdef import AppDefinition, app_from_stored, stored_app

CREATE, SCALE, UPGRADE, RESTART, DELETE, ROLLBACK = (
    "create", "scale", "upgrade", "restart", "delete", "rollback")
AUTO_ROLLBACK_KINDS = frozenset({UPGRADE, RESTART})
"""Deployments that roll back on their own when new tasks never become ready. A
create has nothing to go back to, and a scale waiting for room is not broken."""


def iso_time(seconds: float) -> str:
    """Epoch seconds as Marathon writes times: ``2024-05-01T12:00:00.000Z``."""
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@attrs.define
class AppTask:
    """One task the framework launched (or learned of and adopted)."""

    task_id: str
    app_id: str
    config_version: str
    agent_id: str
    hostname: str
    staged_at: float
    ip: str = ""
    ports: list[int] = attrs.field(factory=list)
    attributes: dict[str, str] = attrs.field(factory=dict)
    health_checked: bool = False
    state: TaskState = TaskState.TASK_STAGING
    started_at: float | None = None
    healthy: bool | None = None
    kill_requested_at: float | None = None
    kill_grace_period: float | None = None
    volume: str = ""  # a resident task's persistent volume (frameworks/service/resident.py)

    @property
    def killing(self) -> bool:
        return self.kill_requested_at is not None

    @property
    def ready(self) -> bool:
        """Counts as one of the app's healthy instances: running, not on its way out,
        and passing its health check if it has one."""
        return (self.state is TaskState.TASK_RUNNING and not self.killing
                and (self.healthy is True or not self.health_checked))

    def to_json(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id, "appId": self.app_id,
            "configVersion": self.config_version, "agentId": self.agent_id,
            "hostname": self.hostname, "ip": self.ip, "ports": list(self.ports),
            "attributes": dict(self.attributes), "healthChecked": self.health_checked,
            "stagedAt": self.staged_at, "startedAt": self.started_at,
            "state": self.state.value, "killRequestedAt": self.kill_requested_at,
            "killGracePeriod": self.kill_grace_period, "volume": self.volume}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> AppTask:
        return cls(
            task_id=body["taskId"], app_id=body["appId"],
            config_version=body["configVersion"], agent_id=body["agentId"],
            hostname=body["hostname"], ip=body["ip"], ports=list(body["ports"]),
            attributes=dict(body["attributes"]), health_checked=body["healthChecked"],
            staged_at=body["stagedAt"], started_at=body["startedAt"],
            state=TaskState(body["state"]), kill_requested_at=body["killRequestedAt"],
            kill_grace_period=body["killGracePeriod"], volume=body.get("volume", ""))


@attrs.define
class Deployment:
    """Moving one app from `original` to `target` (None: the app is being deleted)."""

    id: str
    app_id: str
    kind: str
    target: AppDefinition | None
    original: AppDefinition | None
    version: str
    started_at: float
    progress_at: float
    auto_rollback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "appId": self.app_id, "kind": self.kind,
            "target": stored_app(self.target) if self.target else None,
            "original": stored_app(self.original) if self.original else None,
            "version": self.version, "startedAt": self.started_at,
            "progressAt": self.progress_at, "autoRollback": self.auto_rollback}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Deployment:
        return cls(
            id=body["id"], app_id=body["appId"], kind=body["kind"],
            target=app_from_stored(body["target"]) if body["target"] else None,
            original=app_from_stored(body["original"]) if body["original"] else None,
            version=body["version"], started_at=body["startedAt"],
            progress_at=body["progressAt"], auto_rollback=body["autoRollback"])
