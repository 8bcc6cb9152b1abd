"""Dynamic reservations (RESERVE and UNRESERVE operations in an accept): when
one can apply, pure. master/volumes.py plans them with CREATE and DESTROY.

The master keeps them per agent (`MasterAgent.dynamic`), in its registry, and
sends them to the agent, which checkpoints them and reports them when it
re-registers (dyad/volumes.py), so they survive master failover and agent
restarts, and tasks reach the agent with their reserved resources as offered.
A (resource, role) an agent reserves statically cannot also be reserved
dynamically: UNRESERVE could not tell which part it may release.
"""

from __future__ import annotations

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

