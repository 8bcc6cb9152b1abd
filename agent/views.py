"""What the agent shows: `/state`, `/monitor/statistics` and `/metrics/snapshot`,
built from an `AgentState` without changing it. Field names follow Mesos' agent
endpoints where Mesos has them, so operators and tools feel at home.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from agent.model import (
    REGISTERED, TERMINATED, AgentExecutor, AgentFramework, AgentTask, resources_dict,
)
from dyad.codec import to_json
from dyad.messages import TaskState

if TYPE_CHECKING:
    from agent.state import AgentState


def snapshot(state: AgentState) -> dict[str, Any]:
    c = state.config
    return {
        "id": state.agent_id, "hostname": c.hostname, "ip": c.ip, "port": c.port,
        "pid": c.pid, "version": c.version, "registered": state.phase == REGISTERED,
        "master": to_json(state.master) if state.master else None,
        "isolation": c.isolation, "drain_state": state.drain_state,
        "resources": resources_dict(c.resources),
        "used_resources": resources_dict(state.used),
        "oversubscription": _oversubscription(state),
        "attributes": dict(c.attributes),
        "cached_uris": list(state.cached_uris),
        "frameworks": [_framework(state, f) for f in state.frameworks.values()],
        "completed_frameworks": [_framework(state, f) for f in state.completed_frameworks],
    }


def _framework(state: AgentState, framework: AgentFramework) -> dict[str, Any]:
    return {
        "id": framework.id, "name": framework.info.name, "roles": framework.info.roles,
        "executors": [_executor(state, e) for e in framework.executors.values()],
        "completed_executors": [_executor(state, e) for e in framework.completed_executors],
    }


def _executor(state: AgentState, executor: AgentExecutor) -> dict[str, Any]:
    return {
        "id": executor.executor_id, "name": executor.info.name,
        "framework_id": executor.framework_id, "run_id": executor.run_id,
        "directory": executor.directory, "state": executor.phase, "pid": executor.pid,
        "container_id": executor.container_id,
        "resources": resources_dict(executor.info.resources), "exit_status": executor.status,
        "limits": {"cpus": executor.limits.cpus, "mem_bytes": executor.limits.mem_bytes},
        "statistics": _statistics(executor),
        "tasks": [_task(state, t) for t in (*executor.launched.values(),
                                            *executor.terminated.values())],
        "queued_tasks": [_task(state, t) for t in executor.queued.values()],
        "completed_tasks": [_task(state, t) for t in executor.completed],
    }


def _task(state: AgentState, task: AgentTask) -> dict[str, Any]:
    return {
        "id": task.task_id, "name": task.info.name, "framework_id": task.framework_id,
        "executor_id": task.executor_id, "agent_id": state.agent_id, "state": task.state.name,
        "resources": resources_dict(task.info.resources), "labels": dict(task.info.labels),
        "healthy": state.health.health(task.framework_id, task.task_id),
        "priority": task.info.priority, "revocable": task.info.revocable,
    }


def _oversubscription(state: AgentState) -> dict[str, Any]:
    """What the agent lends (docs/oversubscription.md), in cpus and MB."""
    last = state.oversubscription.last
    return {"enabled": state.config.reclaim.enabled,
            "revocable": attrs.asdict(last.revocable),
            "reservation": attrs.asdict(last.reservation),
            "allocation": attrs.asdict(last.allocation),
            "evicted": state.oversubscription.evicted}


def _statistics(executor: AgentExecutor) -> dict[str, Any] | None:
    usage = executor.usage
    if usage is None:
        return None
    out: dict[str, Any] = to_json(usage)
    for key in ("framework_id", "executor_id", "task_ids"):
        out.pop(key)
    return out


def statistics(state: AgentState) -> list[dict[str, Any]]:
    """Mesos' `/monitor/statistics`: one entry per live executor with a sample."""
    entries = []
    for framework in state.frameworks.values():
        for executor in framework.executors.values():
            stats = _statistics(executor)
            if stats is None or executor.phase == TERMINATED:
                continue
            entries.append({"executor_id": executor.executor_id,
                            "executor_name": executor.info.name,
                            "framework_id": executor.framework_id,
                            "source": executor.executor_id,
                            "task_ids": sorted(t.task_id for t in executor.live_tasks()),
                            "statistics": stats})
    return entries


def metrics(state: AgentState) -> dict[str, float]:
    executors = [e for f in state.frameworks.values() for e in f.executors.values()]
    running = sum(t.state == TaskState.TASK_RUNNING
                  for e in executors for t in e.launched.values())
    out: dict[str, float] = {f"agent/{name}": 0 for name in (
        "messages_received", "messages_invalid", "tasks_finished", "tasks_failed",
        "tasks_killed", "tasks_lost", "executors_memory_limited", "tasks_killed_unhealthy")}
    out.update({f"agent/{name}": value for name, value in state.counters.items()})
    out.update({
        "agent/registered": int(state.phase == REGISTERED),
        "agent/draining": int(state.draining),
        "agent/executors_running": sum(e.phase != TERMINATED for e in executors),
        "agent/tasks_running": running,
        "agent/status_updates_sent": state.updates.sent,
        "agent/status_updates_retried": state.updates.retried,
        "agent/status_updates_acked": state.updates.acked,
        "agent/status_updates_stale_acks": state.updates.stale_acks,
        "agent/status_updates_pending": len(state.updates.pending()),
        "agent/health_checks_run": state.health.checks_run,
        "agent/health_checks_failed": state.health.checks_failed,
    })
    return out
