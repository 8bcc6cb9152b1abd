"""Level one of the two levels: deciding which framework is offered what.

The master talks to an allocator only through the `Allocator` protocol below;
`HierarchicalAllocator` (hierarchical DRF over roles and frameworks, with weights,
quota, reservations and filters) is the one it uses. Allocators are pure: no clock
(time comes in as `now`), no I/O. docs/allocator.md explains the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from dyad.resources import Resources
from master.allocator.hierarchical import (
    Allocation, AllocatorError, HierarchicalAllocator, allowed_roles,
)
from master.allocator.policy import (
    PolicyError, Quota, check_quotas, parse_quota, parse_weights, role_problem,
)
from master.allocator.sorter import DRFSorter, RandomSorter, Sorter, SorterError

__all__ = ["Allocation", "Allocator", "AllocatorError", "DRFSorter", "HierarchicalAllocator",
           "PolicyError", "Quota", "RandomSorter", "Sorter", "SorterError", "allowed_roles",
           "check_quotas", "parse_quota", "parse_weights", "role_problem"]


class Allocator(Protocol):
    """What the master tells an allocator, and what it asks of it.

    Allocated means offered or used; the master reports every change, and an
    inconsistent report raises `AllocatorError` (a master bug, never input).
    """

    last_considered: int
    """Agents the last `allocate` looked at (for metrics)."""

    def add_agent(self, agent_id: str, total: Resources) -> None: ...

    def remove_agent(self, agent_id: str) -> None: ...

    def transform(self, agent_id: str, framework_id: str, consumed: Resources,
                  produced: Resources) -> None: ...

    def add_framework(self, framework_id: str, roles: Iterable[str], active: bool = True) -> None: ...

    def remove_framework(self, framework_id: str) -> None: ...

    def activate(self, framework_id: str) -> None: ...

    def deactivate(self, framework_id: str) -> None: ...

    def suppress(self, framework_id: str) -> None: ...

    def revive(self, framework_id: str) -> None: ...

    def request(self, framework_id: str, requests: Iterable[tuple[Resources, int]]) -> None: ...

    def add_filter(self, framework_id: str, agent_id: str, until: float) -> None: ...

    def add_filters(self, framework_id: str, agent_ids: Iterable[str], until: float) -> None: ...

    def set_weight(self, role: str, weight: float) -> None: ...

    def set_quota(self, role: str, quota: Quota | None) -> None: ...

    def update_used(self, agent_id: str, framework_id: str, delta: Resources) -> None: ...

    def release(self, agent_id: str, framework_id: str, resources: Resources) -> None: ...

    def close_offer(self, framework_id: str, agent_id: str, returned: Resources) -> None: ...

    def close_offers(self, framework_id: str,
                     returned: Iterable[tuple[str, Resources]]) -> None: ...

    def free(self, agent_id: str) -> Resources: ...

    def allocated(self, agent_id: str, framework_id: str) -> Resources: ...

    def allocation_role(self, agent_id: str, framework_id: str) -> str | None: ...

    def share(self, framework_id: str) -> float: ...

    def role_shares(self) -> dict[str, float]: ...

    def role_allocation(self, role: str) -> dict[str, int]: ...

    def allocate(self, now: float) -> list[Allocation]: ...
