"""The allocator's DRF sorters: which roles and frameworks they hold, which of
them are active, and the releases they have not been told of yet.

Apart from `hierarchical` because it is a responsibility of its own: the pass
asks the sorters in what order to offer, and this keeps them true to the
allocations. Without quota, what a release frees is told the sorters at their
next read (`_sort_released`), not at once: tasks end by the dozen between passes,
and a sorter's sums come out the same. So every method that reads or reshapes
the sorters is `told` first (`tests/unit/test_allocator_equivalence.py` holds a
pass to it). Pure: no clock, no I/O.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from master.allocator.sorter import Sorter

_F = TypeVar("_F", bound=Callable[..., Any])


def told(method: _F) -> _F:
    """Tell the sorters what releases kept back before `method` runs."""
    @functools.wraps(method)
    def first_told(self: SorterBooks, *args: Any, **kwargs: Any) -> Any:
        if self._unsorted:
            self._sort_released()
        return method(self, *args, **kwargs)
    return first_told  # type: ignore[return-value]


class _Framework:
    __slots__ = ("roles", "active", "suppressed", "filters", "agents", "charged", "active_in")

    def __init__(self, roles: tuple[str, ...], active: bool) -> None:
        self.roles = roles
        self.active = active
        self.suppressed = False
        self.filters: dict[str, float] = {}  # agent id -> refused until
        self.agents: set[str] = set()  # agents where it holds an allocation
        self.charged: Counter[str] = Counter()  # role -> agents charged to it
        self.active_in: set[str] = set()  # roles whose sorter has it active


class _Role:
    __slots__ = ("sorter", "active", "clients")

    def __init__(self, sorter: Sorter) -> None:
        self.sorter = sorter
        self.active = 0  # frameworks active in `sorter`
        self.clients = 0  # frameworks in `sorter`


class SorterBooks:
    """The sorter part of `HierarchicalAllocator` (which sets every attribute
    below in its `__init__`)."""

    _roles: dict[str, _Role]
    _role_sorter: Sorter
    _frameworks: dict[str, _Framework]
    _total: Counter[str]
    _make_sorter: Callable[[], Sorter]
    # role -> framework -> scalar milli released and not told the sorters yet
    _unsorted: dict[str, dict[str, dict[str, int]]]

    def _sort_released(self) -> None:
        """Tell the sorters what `_release` kept back (`_unsorted`), by role and
        framework in the order first released: before anything reads or reshapes
        them. Sums and counts do not depend on the order they are told in, and
        a sorter's order is a function of them, so it is the order it would be."""
        unsorted, self._unsorted = self._unsorted, {}
        for role, by_framework in unsorted.items():
            total: dict[str, int] = {}
            sorter = self._roles[role].sorter
            for framework_id, scalars in by_framework.items():
                sorter.unallocated(framework_id, scalars)
                for kind, milli in scalars.items():
                    total[kind] = total.get(kind, 0) + milli
            self._role_sorter.unallocated(role, total)

    def _role(self, role: str) -> _Role:
        known = self._roles.get(role)
        if known is None:
            sorter = self._make_sorter()
            sorter.add_total(self._total)
            known = self._roles[role] = _Role(sorter)
            self._role_sorter.add(role)
        return known

    def _sync(self, framework_id: str) -> None:
        """Make the framework active exactly in the sorters of its roles while it is
        active and not suppressed, and a role active while it has such frameworks."""
        framework = self._frameworks[framework_id]
        wanted = framework.active and not framework.suppressed
        for name in framework.roles:
            self._set_active(name, framework, framework_id, wanted)
        for name in list(framework.active_in):
            if name not in framework.roles:
                self._set_active(name, framework, framework_id, False)

    def _set_active(self, name: str, framework: _Framework, framework_id: str, on: bool) -> None:
        if on == (name in framework.active_in):
            return
        role = self._roles[name]
        if on:
            framework.active_in.add(name)
            role.sorter.activate(framework_id)
            role.active += 1
            if role.active == 1:
                self._role_sorter.activate(name)
        else:
            framework.active_in.discard(name)
            role.sorter.deactivate(framework_id)
            role.active -= 1
            if role.active == 0:
                self._role_sorter.deactivate(name)

    @told
    def _forget_client(self, role: str, framework_id: str, leaving: bool) -> None:
        """Drop the framework from `role`'s sorter once it neither subscribes to the
        role (or is `leaving` altogether) nor holds anything charged to it; drop the
        role once no framework is left in it."""
        framework = self._frameworks[framework_id]
        if framework.charged.get(role) or (not leaving and role in framework.roles):
            return
        self._set_active(role, framework, framework_id, False)
        known = self._roles[role]
        known.sorter.remove(framework_id)
        known.clients -= 1
        if not known.clients:
            self._role_sorter.remove(role)
            del self._roles[role]
