"""Offer operations that change an agent's resources -- RESERVE, UNRESERVE,
CREATE and DESTROY -- checked and planned, pure.

`plan_operation` answers why an operation cannot apply, or an `OperationPlan`:
what of the accepted offer it consumes and what it produces in its place (the
same amounts, differently reserved: the allocator's `transform`), and the agent's
`DynamicResources` afterwards (version bumped). `MasterState` applies the plan,
persists the registry and sends the agent `CheckpointResources`.

Rules (docs/protocol.md, "Offer operations"):

- RESERVE and UNRESERVE: `master.reservations.reservation_problem`; neither
  touches a volume's disk (CREATE and DESTROY do).
- CREATE turns dynamically reserved plain disk of the offer, ``disk(eng):64``,
  into a volume, ``disk(eng){v1}:64``. Its role must be one the offer's role may
  use, its id new on the agent (its container path is relative, inside the
  task's sandbox: `PersistentVolume` checks that), and its principal the framework's (filled in if empty).
  Statically reserved disk (``--resources``) cannot hold a volume.
- DESTROY turns a volume in the offer back into plain reserved disk; the agent
  removes its directory. A volume that a task uses is not in any offer, so
  destroying it is refused, naming the tasks.

The module also answers which volumes ride on an offer (`offered_volumes`), which
tasks use each volume (`volume_users`), whether a task uses volumes whole
(`task_volume_problem`), and which record of an agent's dynamic resources to keep
when it registers (`adopted`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from dyad.messages import Operation, OperationType, TaskInfo
from dyad.resources import VOLUME_KIND, Resources
from dyad.volumes import DynamicResources, PersistentVolume, newer, problem
from master.allocator import allowed_roles
from master.model import MasterAgent, MasterFramework
from master.reservations import reservation_problem

COUNTERS = {
    OperationType.RESERVE: "master/operations_reserve",
    OperationType.UNRESERVE: "master/operations_unreserve",
    OperationType.CREATE: "master/operations_create",
    OperationType.DESTROY: "master/operations_destroy",
}


@attrs.frozen
class OperationPlan:
    consumed: Resources
    produced: Resources
    dynamic: DynamicResources


def plan_operation(op: Operation, offer_role: str | None, agent: MasterAgent,
                   principal: str, remaining: Resources,
                   users: Mapping[str, list[str]]) -> OperationPlan | str:
    """Check one non-LAUNCH operation against what `remaining` of the accepted
    offer (made in `offer_role`) holds; `users` maps volume ids to the tasks that
    use them. Returns the plan, or why the operation is refused."""
    dynamic = agent.dynamic
    if op.type in (OperationType.RESERVE, OperationType.UNRESERVE):
        reserve = op.type == OperationType.RESERVE
        if op.resources.volumes():
            return ("a volume's disk is reserved by CREATE and released by DESTROY, "
                    f"not {op.type}")
        why = reservation_problem(offer_role, agent, op.resources, remaining, reserve)
        if why:
            return why
        flat = op.resources.flatten()
        if reserve:
            return _plan(dynamic, flat, op.resources, list(dynamic.volumes))
        return _plan(dynamic, op.resources, flat, list(dynamic.volumes))
    if not op.volumes:
        return f"{op.type} names no volumes"
    if op.type == OperationType.CREATE:
        return _plan_create(op.volumes, offer_role, dynamic, principal, remaining)
    return _plan_destroy(op.volumes, dynamic, remaining, users)


def _plan(dynamic: DynamicResources, consumed: Resources, produced: Resources,
          volumes: list[PersistentVolume]) -> OperationPlan:
    # The record keeps the reserved side of the exchange (RESERVE consumes
    # unreserved amounts, UNRESERVE produces them).
    reservations = (dynamic.reservations - (consumed - consumed.unreserved())
                    + (produced - produced.unreserved()))
    return OperationPlan(consumed, produced, DynamicResources(
        version=dynamic.version + 1, reservations=reservations,
        volumes=sorted(volumes, key=lambda v: v.id)))


def _plan_create(volumes: list[PersistentVolume], offer_role: str | None,
                 dynamic: DynamicResources, principal: str,
                 remaining: Resources) -> OperationPlan | str:
    consumed = produced = Resources()
    made: list[PersistentVolume] = []
    for volume in volumes:
        where = f"volume {volume.id}"
        if dynamic.volume(volume.id) is not None or volume.id in {v.id for v in made}:
            return f"{where} already exists on this agent"
        if offer_role is None or volume.role not in allowed_roles(offer_role):
            return f"{where} is for role {volume.role}, which the offer's role {offer_role} cannot use"
        if volume.principal and volume.principal != principal:
            return f"{where} names principal {volume.principal!r}, not the framework's {principal!r}"
        plain = volume.resources.flatten(volume.role)
        consumed, produced = consumed + plain, produced + volume.resources
        made.append(attrs.evolve(volume, principal=principal))
    if not consumed <= remaining:
        return f"{consumed} (the volumes' disk) is not in what remains of the offer"
    if not consumed <= dynamic.reservations:
        return (f"{consumed} is not dynamically reserved: RESERVE the disk first "
                "(statically reserved disk cannot hold a volume)")
    return _plan(dynamic, consumed, produced, [*dynamic.volumes, *made])


def _plan_destroy(volumes: list[PersistentVolume], dynamic: DynamicResources,
                  remaining: Resources, users: Mapping[str, list[str]]) -> OperationPlan | str:
    consumed = produced = Resources()
    gone: set[str] = set()
    for wanted in volumes:
        volume = dynamic.volume(wanted.id)
        if volume is None or wanted.id in gone:
            return f"volume {wanted.id} does not exist on this agent"
        if users.get(volume.id):
            return (f"volume {volume.id} is in use by task(s) {', '.join(users[volume.id])}; "
                    "kill them first")
        consumed, produced = consumed + volume.resources, produced + volume.resources.flatten(volume.role)
        gone.add(volume.id)
    if not consumed <= remaining:
        return f"{consumed} is not in what remains of the offer (offered elsewhere?)"
    return _plan(dynamic, consumed, produced, [v for v in dynamic.volumes if v.id not in gone])


def offered_volumes(agent: MasterAgent, resources: Resources) -> list[PersistentVolume]:
    """The volumes whose whole disk is in `resources` (an offer of `agent`)."""
    held = resources.volumes()
    return [v for v in agent.dynamic.volumes
            if held.get(v.id) == (v.role, v.resources.get_milli(VOLUME_KIND))]


def volume_users(agent: MasterAgent,
                 frameworks: Mapping[str, MasterFramework]) -> dict[str, list[str]]:
    """Volume id -> the (sorted) live tasks and executors on `agent` whose
    resources hold it."""
    live = [(task_id, frameworks[fid].tasks[task_id].resources)
            for fid, task_id in agent.tasks if task_id in frameworks[fid].tasks]
    live += [(f"executor {eid}", info.resources) for (_, eid), info in agent.executors.items()]
    users: dict[str, list[str]] = {}
    for name, resources in live:
        for volume_id in resources.volumes():
            users.setdefault(volume_id, []).append(name)
    return {k: sorted(v) for k, v in users.items()}


def task_volume_problem(agent: MasterAgent, task: TaskInfo) -> str:
    """Why `task` cannot use the volumes in its resources ('' if it can): a volume
    is used whole, and only one the agent has."""
    wanted = task.resources.volumes()
    if task.executor is not None:
        wanted = {**wanted, **task.executor.resources.volumes()}
    for volume_id, (role, milli) in sorted(wanted.items()):
        volume = agent.dynamic.volume(volume_id)
        if volume is None:
            return f"volume {volume_id} does not exist on agent {agent.id}"
        if milli != volume.resources.get_milli(VOLUME_KIND):
            return f"volume {volume_id} is used whole: {volume.resources}, not a part of it"
    return ""


def adopted(static: Resources, master: DynamicResources | None,
            reported: DynamicResources | None) -> tuple[DynamicResources, str]:
    """The record to keep for an agent that registers with `static` resources:
    the newer of the master's (`master`: in memory or from the registry) and the
    agent's report; a report that does not fit the agent is ignored, and why is
    returned beside."""
    why = problem(static, reported) if reported is not None else ""
    return newer(master, None if why else reported), why
