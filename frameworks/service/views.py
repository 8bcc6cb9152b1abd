"""The REST API's JSON, in Marathon's field names, built from the core's state.

Pure functions of `ServiceCore` and the current time; `api` only serialises them.
"""

from __future__ import annotations

from typing import Any

from dyad.messages import TaskState
from frameworks.service.appdef import AppDefinition, app_to_json
from frameworks.service.core import ServiceCore
from frameworks.service.deployment import plan_deployment
from frameworks.service.records import (
    CREATE, DELETE, SCALE, AppTask, Deployment, iso_time)

_ACTIONS = {CREATE: "StartApplication", SCALE: "ScaleApplication",
            DELETE: "StopApplication"}
_STAGED = (TaskState.TASK_STAGING, TaskState.TASK_STARTING)


def task_json(task: AppTask) -> dict[str, Any]:
    """One task, with where to reach it (service discovery)."""
    health = []
    if task.health_checked and task.healthy is not None:
        health = [{"taskId": task.task_id, "alive": task.healthy}]
    return {
        "id": task.task_id, "appId": task.app_id, "host": task.hostname,
        "ipAddresses": [{"ipAddress": task.ip, "protocol": "IPv4"}] if task.ip else [],
        "ports": list(task.ports), "slaveId": task.agent_id, "agentId": task.agent_id,
        "stagedAt": iso_time(task.staged_at),
        "startedAt": iso_time(task.started_at) if task.started_at is not None else None,
        "version": task.config_version, "state": task.state.value,
        "healthCheckResults": health, "killing": task.killing,
    }


def app_json(core: ServiceCore, app: AppDefinition, now: float,
             embed_tasks: bool = False) -> dict[str, Any]:
    tasks = core.tasks_of(app.id)
    body = app_to_json(app)
    body.update({
        "version": app.version,
        "versionInfo": {"lastScalingAt": app.version,
                        "lastConfigChangeAt": app.config_version},
        "tasksStaged": sum(t.state in _STAGED for t in tasks),
        "tasksRunning": sum(t.state is TaskState.TASK_RUNNING for t in tasks),
        "tasksHealthy": sum(t.health_checked and t.healthy is True
                            and t.state is TaskState.TASK_RUNNING for t in tasks),
        "tasksUnhealthy": sum(t.health_checked and t.healthy is False for t in tasks),
        "deployments": [{"id": d.id} for d in [core.deployment_of(app.id)] if d],
        "waitingReason": waiting_reason(core, app.id, now),
    })
    failure = core.runtime(app.id).last_failure
    if failure is not None:
        body["lastTaskFailure"] = failure
    if embed_tasks:
        body["tasks"] = [task_json(t) for t in tasks]
    return body


def waiting_reason(core: ServiceCore, app_id: str, now: float) -> str | None:
    """Why tasks the app wants are not running yet, in a sentence; None if none wait."""
    wanted = core.wanted(app_id)
    if not wanted:
        return None
    runtime = core.runtime(app_id)
    if now < runtime.delay_until:
        return (f"{wanted} task(s) backing off after {runtime.failures} failure(s): "
                f"next launch in {runtime.delay_until - now:.1f}s")
    if runtime.unplaced:
        summary = ", ".join(f"{code} x{n}" for code, n in sorted(runtime.unplaced.items()))
        return (f"{wanted} task(s) waiting: none of the last {runtime.offers_considered} "
                f"offer(s) fit ({summary}); e.g. {runtime.unplaced_example}")
    return f"{wanted} task(s) waiting for offers"


def queue_json(core: ServiceCore, now: float) -> dict[str, Any]:
    """Apps with tasks waiting to launch, and why (Marathon's /v2/queue)."""
    queue = []
    for app_id in sorted(core.apps):
        wanted = core.wanted(app_id)
        if not wanted:
            continue
        runtime = core.runtime(app_id)
        app = core.apps[app_id]
        queue.append({
            "app": {"id": app.id, "version": app.version},
            "count": wanted,
            "delay": {"timeLeftSeconds": max(0.0, round(runtime.delay_until - now, 3)),
                      "overdue": now >= runtime.delay_until},
            "processedOffersSummary": {
                "processedOffersCount": runtime.offers_considered,
                "unusedOffersCount": sum(runtime.unplaced.values()),
                "rejectSummaryLastOffers": [
                    {"reason": code, "declined": n, "processed": runtime.offers_considered}
                    for code, n in sorted(runtime.unplaced.items())]},
            "waitingReason": waiting_reason(core, app_id, now),
        })
    return {"queue": queue}


def deployment_json(core: ServiceCore, deployment: Deployment) -> dict[str, Any]:
    action = _ACTIONS.get(deployment.kind, "RestartApplication")
    tasks = core.tasks_of(deployment.app_id)
    target = deployment.target
    body: dict[str, Any] = {
        "id": deployment.id, "version": deployment.version,
        "affectedApps": [deployment.app_id], "affectedPods": [],
        "steps": [{"actions": [{"action": action, "app": deployment.app_id}]}],
        "currentActions": [{"action": action, "app": deployment.app_id,
                            "readinessCheckResults": []}],
        "currentStep": 1, "totalSteps": 1,
        "kind": deployment.kind, "startedAt": iso_time(deployment.started_at),
        "autoRollback": deployment.auto_rollback,
        "progress": {
            "targetInstances": target.instances if target else 0,
            "newReady": sum(t.ready for t in tasks
                            if target and t.config_version == target.config_version),
            "old": sum(not t.killing for t in tasks
                       if not target or t.config_version != target.config_version),
            "killing": sum(t.killing for t in tasks),
            "waitingToStart": plan_deployment(target, tasks).start,
        },
    }
    if deployment.auto_rollback:
        body["rollbackAt"] = iso_time(deployment.progress_at + core.config.deployment_timeout)
    return body


def tasks_txt(core: ServiceCore) -> str:
    """``/app host:port`` per running task and port: enough for a simple proxy or
    DNS generator. The host is the agent's address when known (what a client can
    connect to), else its hostname."""
    lines = []
    for task in sorted(core.tasks.values(), key=lambda t: (t.app_id, t.task_id)):
        if task.state is TaskState.TASK_RUNNING and not task.killing:
            lines += [f"{task.app_id} {task.ip or task.hostname}:{port}" for port in task.ports]
    return "".join(f"{line}\n" for line in lines)
