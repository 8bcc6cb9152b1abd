"""What the master shows: `/state`, the `roles` list and `/metrics/snapshot`,
built from a `MasterState` without changing it. Field names follow Mesos' master
endpoints where Mesos has them, so operators and tools feel at home.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dyad import priority
from dyad.codec import to_json
from dyad.messages import TaskState
from dyad.resources import SHARE_KINDS, UNRESERVED, Resources
from master.allocator import Quota
from master.metrics import COUNTERS
from master.model import (
    CompletedFramework, MasterAgent, MasterFramework, MasterTask, task_counter,
)

if TYPE_CHECKING:
    from master.state import MasterState


def roles_json(state: MasterState) -> list[dict[str, Any]]:
    """Every role with a weight, a quota, frameworks or allocations: its weight,
    quota, what its subtree is allocated (offered + used) and its share."""
    shares = state.allocator.role_shares()
    names = sorted(set(shares) | set(state.weights) | set(state.quota))
    return [{"name": role, "weight": state.weights.get(role, 1.0),
             "quota": state.quota.get(role, Quota()).to_json(),
             "allocated": {kind: milli / 1000 for kind, milli in
                           sorted(state.allocator.role_allocation(role).items())},
             "dominant_share": shares.get(role, 0.0)}
            for role in names]

def snapshot(state: MasterState) -> dict[str, Any]:
    """The `/state` document, with Mesos' field names where Mesos has them."""
    pid = f"master@{state.info.ip}:{state.info.zmq_port}"
    agents = [_agent_json(state, agent) for agent in state.agents.values()]
    return {
        "id": state.info.id,
        "pid": pid,
        "hostname": state.info.hostname,
        "leader": pid,
        "leader_info": to_json(state.info),
        "version": state.info.version,
        "start_time": state.start_time,
        "elected_time": state.start_time,
        "activated_slaves": len(state.agents),
        "deactivated_slaves": 0,
        "unreachable_slaves": len(state.unreachable),
        "agents": agents,
        "slaves": agents,
        "recovering_agents": [
            {"id": aid, "hostname": info.hostname} for aid, info in state.recovering.items()],
        "unreachable_agents": [
            {"id": aid, "hostname": u.info.hostname, "since": u.since}
            for aid, u in state.unreachable.items()],
        "frameworks": [_framework_json(state, f) for f in state.frameworks.values()],
        "roles": roles_json(state),
        "completed_frameworks": [
            _completed_framework_json(c) for c in state.completed_frameworks.values()],
    }

def _agent_json(state: MasterState, agent: MasterAgent) -> dict[str, Any]:
    return {
        "id": agent.id, "hostname": agent.info.hostname, "port": agent.info.port,
        "url": agent.info.url, "pid": f"agent@{agent.info.ip or agent.info.hostname}:{agent.info.port}",
        "resources": resources_json(agent.total),
        "used_resources": resources_json(agent.used),
        "offered_resources": resources_json(agent.offered),
        "unreserved_resources": resources_json(agent.total.unreserved()),
        "reserved_resources": {role: resources_json(agent.total.reserved(role))
                               for role in sorted(agent.total.roles() - {UNRESERVED})},
        "dynamic_reservations": str(agent.reservations),
        "volumes": [to_json(volume) for volume in agent.dynamic.volumes],
        # Oversubscription (docs/oversubscription.md): measured use, the agent's
        # estimate of what its tasks reserve, and what it lends.
        "measured_usage": _measured(state, agent),
        "reservation_estimate": resources_json(agent.reservation),
        "revocable_resources": resources_json(agent.revocable),
        "revocable_offered": resources_json(agent.revocable_offered),
        "revocable_used": resources_json(agent.revocable_used),
        "attributes": dict(agent.info.attributes),
        "registered_time": agent.registered_time,
        "reregistered_time": agent.reregistered_time,
        "active": True,
        "drained": agent.id in state.drained,
        "cached_uris": list(state.cached_uris.get(agent.id, ())),
    }

def _framework_json(state: MasterState, framework: MasterFramework) -> dict[str, Any]:
    """One entry of `frameworks`; `completed_frameworks` entries have the same keys."""
    used = [task.resources for task in framework.tasks.values()]
    executors = []
    for agent in state.agents.values():
        for (fid, eid), executor in agent.executors.items():
            if fid == framework.id:
                used.append(executor.resources)
                executors.append({"executor_id": eid, "agent_id": agent.id,
                                  "resources": resources_json(executor.resources)})
    offers = [state.offers[oid] for oid in sorted(framework.offers)]
    info = framework.info
    return {
        "id": framework.id, "name": info.name, "roles": list(info.roles),
        "user": info.user, "hostname": info.hostname, "principal": info.principal,
        "webui_url": info.webui_url, "failover_timeout": info.failover_timeout,
        "capabilities": list(info.capabilities),
        "active": framework.peer is not None, "connected": framework.peer is not None,
        "suppressed": framework.suppressed,
        "registered_time": framework.registered_time,
        "unregistered_time": framework.disconnected_time,
        "used_resources": resources_json(*used),
        "offered_resources": resources_json(*(offer.resources for offer in offers)),
        "dominant_share": state.allocator.share(framework.id),
        "tasks": [_task_json(t) for t in framework.tasks.values()],
        "unreachable_tasks": [_task_json(t) for t in framework.unreachable_tasks.values()],
        "completed_tasks": [_task_json(t) for t in framework.completed.values()],
        "offers": [{"id": o.id, "framework_id": o.framework_id, "agent_id": o.agent_id,
                    "hostname": o.hostname, "resources": resources_json(o.resources),
                    "revocable": resources_json(o.revocable)}
                   for o in offers],
        "executors": executors,
    }

_SUMMED_REVOCABLE = ("revocable", "revocable_offered", "revocable_used")
_SUMMED = tuple((f, ("cpus", "mem")) for f in _SUMMED_REVOCABLE) + \
    tuple((f, SHARE_KINDS) for f in ("total", "used", "offered"))


def _agent_sums(agents: Iterable[MasterAgent]) -> dict[str, float]:
    """``master/<kind>_<field>``: `Resources.get(kind)` of the field summed over the
    agents in their order, each agent's scalars read once (a simulated cell samples
    this for 10,000 agents). Equal to `sum(...)` of those values: adding an empty
    field's 0.0 changes no sum, and a sum over at least one agent is a float."""
    sums: dict[tuple[str, str], float] = {(f, k): 0 for f, kinds in _SUMMED for k in kinds}
    count = 0
    for agent in agents:
        count += 1
        for field, kinds in _SUMMED:
            resources: Resources = getattr(agent, field)
            if not resources:
                continue
            totals = resources.scalar_items()
            for kind in kinds:
                milli = totals.get(kind, 0) or resources.get_milli(kind)
                sums[(field, kind)] += milli / 1000
    order = [(f, k) for k in ("cpus", "mem") for f in _SUMMED_REVOCABLE] + \
        [(f, k) for k in SHARE_KINDS for f in ("total", "used", "offered")]  # as before
    return {f"master/{kind}_{field}": float(sums[(field, kind)]) if count else 0
            for field, kind in order}


def metrics(state: MasterState) -> dict[str, float]:
    """Flat counters and gauges for `/metrics/snapshot`."""
    result: dict[str, float] = {name: 0 for name in COUNTERS}
    result.update(state.counters.items())
    live: collections.Counter[TaskState] = collections.Counter()
    unreachable = 0
    connected = 0
    for framework in state.frameworks.values():
        live.update(task.state for task in framework.tasks.values())
        unreachable += len(framework.unreachable_tasks)
        connected += framework.peer is not None
    for task_state in (TaskState.TASK_STAGING, TaskState.TASK_STARTING,
                       TaskState.TASK_RUNNING, TaskState.TASK_KILLING):
        result[task_counter(task_state)] = live[task_state]
    result["master/tasks_unreachable"] = unreachable
    result.update(_agent_sums(state.agents.values()))
    result.update({
        "master/agents_active": len(state.agents),
        "master/agents_unreachable": len(state.unreachable),
        "master/agents_recovering": len(state.recovering),
        "master/frameworks_active": connected,
        "master/frameworks_connected": connected,
        "master/frameworks_disconnected": len(state.frameworks) - connected,
        "master/frameworks_completed": len(state.completed_frameworks),
        "master/outstanding_offers": len(state.offers),
        "master/offers_waiting": len(state.admission),
        "master/offers_held": state.admission.held,
        "master/admission_in_flight": state.admission.in_flight(state._now),
        "master/admission_allowed": state.admission.allowed,
        "master/admission_cuts": state.admission.cuts,
        "allocator/agents_considered": state.allocator.last_considered,
        "allocator/allocation_run_ms": state.allocation_ms.last,
        "allocator/allocation_run_ms_p50": state.allocation_ms.percentile(50),
        "allocator/allocation_run_ms_p99": state.allocation_ms.percentile(99),
    })
    for role, share in state.allocator.role_shares().items():
        result[f"allocator/roles/{role}/shares/dominant"] = share
    return result







def _measured(state: MasterState, agent: MasterAgent) -> dict[str, float]:
    """What the agent's runs were last measured to use (cpus, MB), summed once
    per executor (the tasks of one executor share its measurement)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for framework_id, task_id in agent.tasks:
        usage = state.frameworks[framework_id].tasks[task_id].usage
        if usage is not None:
            seen[(framework_id, usage["executor_id"])] = usage
    return {"cpus": round(sum(u["cpus_used"] for u in seen.values()), 3),
            "mem": round(sum(u["mem_rss_mb"] for u in seen.values()), 1)}


def resources_json(*parts: Resources) -> dict[str, float | str]:
    """Resources as `/state` shows them: scalars summed over roles (and over
    `parts`) as floats, the DRF kinds always present; ranges as Mesos'
    ``"[31000-32000]"`` text. Parts may come from different agents, so their
    ranges are united rather than added (each agent has its own port 31000)."""
    scalars: collections.Counter[str] = collections.Counter()
    ranges: dict[str, list[tuple[int, int]]] = {}
    for resources in parts:
        scalars.update(resources.scalar_items())
        for name in resources.names() - set(resources.scalar_items()):
            ranges.setdefault(name, []).extend(resources.ranges(name))
    out: dict[str, float | str] = {kind: 0.0 for kind in SHARE_KINDS}
    out.update({name: milli / 1000 for name, milli in scalars.items()})
    for name in sorted(ranges):
        out[name] = "[" + ",".join(f"{b}-{e}" for b, e in _union(ranges[name])) + "]"
    return out


def _union(pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(pieces):
        if merged and begin <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


def _completed_framework_json(framework: CompletedFramework) -> dict[str, Any]:
    info = framework.info
    return {
        "id": info.id, "name": info.name, "roles": list(info.roles), "user": info.user,
        "hostname": info.hostname, "principal": info.principal, "webui_url": info.webui_url,
        "failover_timeout": info.failover_timeout, "capabilities": list(info.capabilities),
        "active": False, "connected": False, "suppressed": False,
        "registered_time": framework.registered_time,
        "unregistered_time": framework.removed_time, "removal_reason": framework.reason,
        "used_resources": resources_json(), "offered_resources": resources_json(),
        "dominant_share": 0.0, "tasks": [], "unreachable_tasks": [],
        "completed_tasks": [_task_json(t) for t in framework.tasks], "offers": [],
        "executors": [],
    }


def _task_json(task: MasterTask) -> dict[str, Any]:
    return {
        "id": task.task_id, "name": task.name, "framework_id": task.framework_id,
        "agent_id": task.agent_id, "slave_id": task.agent_id, "executor_id": task.executor_id,
        "state": task.state.name, "resources": resources_json(task.resources),
        "labels": dict(task.labels),
        "statuses": [{"state": s.name, "timestamp": t} for s, t in task.statuses],
        "healthy": task.healthy, "usage": task.usage,
        "priority": task.priority, "band": priority.band(task.priority),
        "revocable": task.revocable,
    }
