"""Registry -> state: a new leader's fresh `MasterState` gets what the registry
held (admitted and unreachable agents, weights, quota, agents' reservations and
volumes) before any event. The
other direction is `master.registry.snapshot_of`. Used by the shell (it imports
the registry module, so the pure core does not import this one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING


from master.allocator import PolicyError, Quota
from master.model import Effect
from master.registry import RegistryData, RegistryError

if TYPE_CHECKING:
    from master.state import MasterState


def restore(state: MasterState, data: RegistryData, now: float) -> list[Effect]:
    """Hand a new leader's fresh `state` what the registry held (before any event)."""
    state.authorizer.restore_owners(data.agent_owners)
    try:
        return state.restore(data.agents, data.unreachable, data.weights,
                             {role: Quota(guarantee=entry.guarantee, limit=entry.limit)
                              for role, entry in data.quota.items()}, now,
                             dynamic=data.dynamic)
    except PolicyError as exc:
        raise RegistryError(f"the registry's weights or quota are invalid: {exc}") from None
