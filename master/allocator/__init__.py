"""Level one of the two levels: deciding which framework is offered what.

The master talks to an allocator only through the `Allocator` protocol below, so
the hierarchical DRF allocator can replace `SimpleAllocator` without touching
`master.state`. Allocators are pure: no clock (time comes in as `now`), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from dyad.resources import Resources
from master.allocator.simple import Allocation, AllocatorError, SimpleAllocator

__all__ = ["Allocation", "Allocator", "AllocatorError", "SimpleAllocator"]


class Allocator(Protocol):
    """What the master tells an allocator, and what it asks of it.

    Allocated means offered or used; the master reports every change, and an
    inconsistent report raises `AllocatorError` (a master bug, never input).
    """

    def add_agent(self, agent_id: str, total: Resources) -> None: ...

    def remove_agent(self, agent_id: str) -> None: ...

    def add_framework(self, framework_id: str, roles: Iterable[str], active: bool = True) -> None: ...

    def remove_framework(self, framework_id: str) -> None: ...

    def activate(self, framework_id: str) -> None: ...

    def deactivate(self, framework_id: str) -> None: ...

    def suppress(self, framework_id: str) -> None: ...

    def revive(self, framework_id: str) -> None: ...

    def add_filter(self, framework_id: str, agent_id: str, until: float) -> None: ...

    def update_used(self, agent_id: str, framework_id: str, delta: Resources) -> None: ...

    def recover(self, agent_id: str, framework_id: str, resources: Resources) -> None: ...

    def close_offer(self, framework_id: str, agent_id: str, returned: Resources) -> None: ...

    def free(self, agent_id: str) -> Resources: ...

    def allocated(self, agent_id: str, framework_id: str) -> Resources: ...

    def share(self, framework_id: str) -> float: ...

    def allocate(self, now: float) -> list[Allocation]: ...
