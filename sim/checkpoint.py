"""A live cluster as a starting point: save a master's `/state`, replay from it.

`dyad sim checkpoint --master URL --out FILE` saves what the leading master
serves at `GET /state` (agents with their resources, reservations and
attributes; frameworks with their roles and live tasks; every role's weight and
quota) in a small envelope:

    {"format": "dyad-checkpoint/1", "master": URL, "state": {.../state...}}

Given to `dyad sim run --cell FILE`, it becomes:

- a cell: one agent per registered agent, with its total resources (dynamic
  reservations become static ones: the allocator treats both alike) and its
  attributes, and the roles' weights and quota;
- a start for the workload: every live task, at time 0, pinned to the agent it
  runs on, for a greedy framework named ``checkpoint:<framework name>`` in the
  framework's first role, running until the end (a checkpoint does not know
  when a task will finish), using what its last usage report said (or all it
  was given).

What a checkpoint cannot carry: which of a multi-role framework's roles a task
is charged to (the first is assumed), tasks' remaining durations, outstanding
offers and filters, and the frameworks' own state (a service framework's apps
and deployments are not in `/state`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dyad.resources import Resources, ResourcesError
from master.allocator import PolicyError, Quota, check_quotas, parse_quota
from sim.cell import AgentGroup, Cell
from sim.inputs import InputError, Obj
from sim.usage import Curve
from sim.cell import parse_cell
from sim.inputs import load_document
from sim.workload import Shape, TasksArrival, UsageSpec, Workload

FORMAT = "dyad-checkpoint/1"
LIVE = {"TASK_STAGING", "TASK_STARTING", "TASK_RUNNING", "TASK_KILLING"}


def save(master: str, out: Path, timeout: float = 10.0) -> dict[str, Any]:
    """Fetch `master`'s /state (an http(s) URL or host:port) into `out`."""
    url = master if master.startswith(("http://", "https://")) else f"http://{master}"
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/state", timeout=timeout) as answer:
            state = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InputError(f"{url}:0", f"cannot read /state: {exc}") from None
    document = {"format": FORMAT, "master": url, "state": state}
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return document


def is_checkpoint(obj: Obj) -> bool:
    return obj.get("format") == FORMAT


def load_start(path: Path, workload: Workload | None) -> tuple[Cell, Workload]:
    """A cell spec or a checkpoint, and the workload to run on it: a checkpoint's
    live tasks come first, at time 0."""
    document = load_document(path)
    workload = workload or Workload((), None)
    if not is_checkpoint(document):
        return parse_cell(document), workload
    start = tuple(tasks_from_checkpoint(document))
    return cell_from_checkpoint(document), Workload(start + workload.arrivals, workload.end)


def cell_from_checkpoint(obj: Obj) -> Cell:
    state = _state(obj)
    groups = []
    for i, agent in enumerate(state.get("agents", [])):
        hostname = _hostname(agent, i)
        groups.append(AgentGroup(name=hostname, count=1, hostname=hostname,
                                 resources=_agent_resources(obj, agent),
                                 attributes={k: str(v) for k, v in
                                             dict(agent.get("attributes", {})).items()}))
    if not groups:
        raise InputError(obj.where, "the checkpoint has no registered agents")
    weights: dict[str, float] = {}
    quota: dict[str, Quota] = {}
    for role in state.get("roles", []):
        name = role.get("name")
        if role.get("weight", 1.0) != 1.0:
            weights[name] = float(role["weight"])
        body = role.get("quota") or {}
        if body.get("guarantee") or body.get("limit"):
            try:
                quota.update(parse_quota({"role": name, **body}))
            except PolicyError as exc:
                raise InputError(obj.where, f"role {name}: {exc}") from None
    try:
        check_quotas(quota)
    except PolicyError as exc:
        raise InputError(obj.where, str(exc)) from None
    return Cell(name=f"checkpoint of {obj.get('master', 'a master')}", groups=tuple(groups),
                weights=weights, quota=quota)


def tasks_from_checkpoint(obj: Obj) -> list[TasksArrival]:
    state = _state(obj)
    hostnames = {a.get("id"): _hostname(a, i) for i, a in enumerate(state.get("agents", []))}
    arrivals = []
    for framework in state.get("frameworks", []):
        roles = framework.get("roles") or ["*"]
        for task in framework.get("tasks", []):
            if task.get("state") not in LIVE or task.get("agent_id") not in hostnames:
                continue
            given = task.get("resources", {})
            cpus, mem = float(given.get("cpus", 0.0)), float(given.get("mem", 0.0))
            usage = task.get("usage") or {}
            shape = Shape(
                cpus=max(cpus, 0.001), mem=max(mem, 1.0), disk=float(given.get("disk", 0.0)),
                duration=None,
                cpus_usage=_used(usage.get("cpus_used")), mem_usage=_used(usage.get("mem_rss_mb")))
            arrivals.append(TasksArrival(
                at=0.0, where=obj.where, framework=f"checkpoint:{framework.get('name')}",
                role=roles[0], priority=100, count=1, shape=shape, per_offer=1000,
                agent=hostnames[task["agent_id"]]))
    return arrivals


def _state(obj: Obj) -> dict[str, Any]:
    state = obj.get("state")
    if not isinstance(state, dict) or not isinstance(state.get("agents"), list):
        raise InputError(obj.where, "a checkpoint holds a master's /state under 'state'")
    return state


def _hostname(agent: dict[str, Any], index: int) -> str:
    name = str(agent.get("hostname") or f"agent-{index + 1}")
    return "".join(c if c.isalnum() or c in "-." else "-" for c in name)


def _agent_resources(obj: Obj, agent: dict[str, Any]) -> Resources:
    """Unreserved plus per-role reserved resources, from `/state`'s JSON forms."""
    parts = [_text(agent.get("unreserved_resources", agent.get("resources", {})), "")]
    for role, reserved in sorted(dict(agent.get("reserved_resources", {})).items()):
        parts.append(_text(reserved, role))
    text = ";".join(p for p in parts if p)
    try:
        return Resources.parse(text)
    except ResourcesError as exc:
        raise InputError(obj.where, f"agent {agent.get('hostname')}: {exc}") from None


def _text(amounts: dict[str, Any], role: str) -> str:
    suffix = f"({role})" if role else ""
    items = []
    for name, value in sorted(amounts.items()):
        if isinstance(value, str):
            if value not in ("", "[]"):
                items.append(f"{name}{suffix}:{value}")
        elif value:
            items.append(f"{name}{suffix}:{value:g}")
    return ";".join(items)


def _used(value: Any) -> UsageSpec:
    if isinstance(value, (int, float)) and value >= 0:
        return UsageSpec(Curve.constant(float(value)))
    return UsageSpec(None)
