"""Dynamic reservations (RESERVE and UNRESERVE operations in an accept), pure.

The master alone keeps them (`MasterAgent.reservations`): the agent knows only
its static reservations (from `--resources`), so a task on dynamically reserved
resources is sent to its agent as unreserved (`for_agent`). That is also why a
(resource, role) an agent reserves statically cannot be reserved dynamically
too: the agent could not tell the two apart. Reservations are not in the
registry; after a failover agents re-register with their static resources only
(docs/operations.md names this limit).
"""

from __future__ import annotations

import attrs

from dyad.messages import TaskInfo
from dyad.resources import UNRESERVED, Resources
from master.allocator import allowed_roles
from master.model import MasterAgent


def reservation_problem(offer_role: str | None, agent: MasterAgent, resources: Resources,
                        remaining: Resources, reserve: bool) -> str:
    """Why a RESERVE (or UNRESERVE) of `resources` out of what `remaining` of an
    offer made to `offer_role` cannot apply ('' if it can). Dynamic reservations
    are scalar, to the role the offer was made in (an UNRESERVE may also release
    the role's ancestors'), and never of a (resource, role) the agent also
    reserves statically."""
    if resources.is_empty():
        return "no resources given"
    if set(resources.scalar_items()) != resources.names():
        return "only scalar resources (cpus, mem, disk, gpus, ...) can be reserved dynamically"
    roles = resources.roles()
    if UNRESERVED in roles:
        return f"resources must name the role, like cpus(role):1; got {resources}"
    if offer_role is None or (roles != {offer_role} if reserve
                              else not roles <= set(allowed_roles(offer_role))):
        return (f"the offer was made to role {offer_role}, which cannot "
                f"{'reserve' if reserve else 'unreserve'} for {', '.join(sorted(roles))}")
    if reserve:
        if not resources.flatten() <= remaining:
            return f"{resources.flatten()} is not unreserved in what remains of the offer"
        for name in resources.names():
            for reserved in roles:
                if agent.info.resources.reserved(reserved).get_milli(name):
                    return (f"agent {agent.id} reserves {name} to {reserved} statically; "
                            "a dynamic reservation of the same resource and role is not "
                            "supported")
        return ""
    if not resources <= remaining:
        return f"{resources} is not in what remains of the offer"
    if not resources <= agent.reservations:
        return f"{resources} is not dynamically reserved (static reservations stay)"
    return ""


def for_agent(agent: MasterAgent, task: TaskInfo) -> TaskInfo:
    """The task as its agent must see it: dynamically reserved amounts go to it as
    unreserved (the master alone keeps the roles of those)."""
    if not agent.reservations:
        return task
    dynamic = agent.reservations.roles()

    def strip(resources: Resources) -> Resources:
        moved = Resources()
        for role in dynamic & resources.roles():
            part = resources.reserved(role)
            keep = part.names() & agent.info.resources.reserved(role).names()
            for name in part.names() - keep:
                moved = moved + Resources.scalar_milli(name, part.get_milli(name), role)
        return resources - moved + moved.flatten() if moved else resources

    executor = task.executor
    if executor is not None:
        executor = attrs.evolve(executor, resources=strip(executor.resources))
    return attrs.evolve(task, resources=strip(task.resources), executor=executor)
