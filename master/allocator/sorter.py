"""Sorters: in which order clients (roles, or frameworks inside a role) are offered.

A sorter knows nothing of agents, offers or time. It keeps, per client, what is
allocated to it (scalar amounts in milli, by kind), how many allocations it got,
whether it is active, and the cluster total; `sort()` answers the order in which
active clients should be offered resources. The hierarchical allocator owns one
sorter over roles and one per role over the frameworks subscribed to it.

Clients are paths: ``eng/ml`` sits under ``eng``. The tree has one *structural*
node per path prefix and one *leaf* per client, hung under the structural node of
its own path (so client ``eng`` and client ``eng/ml`` are siblings under node
``eng``, the way Mesos' virtual leaf works). A structural node's allocation is
its whole subtree's, and a weight set for a path scales that node's share (and the
leaf of the client of the same name). Siblings are ordered, and the order is read
depth first, so a subtree's clients come out together.

DRF order among siblings: lower ``share`` first, where share is the largest over
`SHARE_KINDS` of allocated/total, divided by the weight; then fewer allocations;
then path. The `DRFSorter` keeps every sibling list sorted incrementally (bisect on
each change), so the per-allocation cost is O(depth x log siblings) and reading
the order is lazy: the allocator usually stops at the first client it can use.
`RandomSorter` orders siblings by a weighted shuffle from a seeded generator
instead; both share the bookkeeping in `_Tree` and pass one test suite.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator, Mapping
from typing import Protocol

from dyad.resources import SHARE_KINDS

__all__ = ["DRFSorter", "RandomSorter", "Sorter", "SorterError", "check_weight"]

Scalars = Mapping[str, int]
"""Scalar amounts in milli by resource name (`Resources.scalar_items()`)."""

Key = tuple[float, int, str]


class SorterError(ValueError):
    """A sorter was asked about a client it does not have, or given a bad weight."""


class Sorter(Protocol):
    """What the allocator asks of a sorter; see the module docstring."""

    def add(self, client: str) -> None: ...

    def remove(self, client: str) -> None: ...

    def contains(self, client: str) -> bool: ...

    def activate(self, client: str) -> None: ...

    def deactivate(self, client: str) -> None: ...

    def allocated(self, client: str, scalars: Scalars) -> None: ...

    def unallocated(self, client: str, scalars: Scalars) -> None: ...

    def update_weight(self, path: str, weight: float) -> None: ...

    def add_total(self, scalars: Scalars) -> None: ...

    def remove_total(self, scalars: Scalars) -> None: ...

    def allocation(self, path: str) -> dict[str, int]: ...

    def client_allocation(self, client: str) -> dict[str, int]: ...

    def share(self, path: str) -> float: ...

    def sort(self) -> list[str]: ...

    def iter_sorted(self) -> Iterator[str]: ...

    def any_active(self) -> bool: ...


def check_weight(weight: float) -> None:
    """Weights are finite and positive; raise `SorterError` otherwise."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise SorterError(f"weight must be a number, got {weight!r}")
    if not math.isfinite(weight) or weight <= 0:
        raise SorterError(f"weight must be finite and positive, got {weight!r}")


class _Node:
    """A structural node (path prefix) or a client's leaf."""

    __slots__ = ("path", "parent", "leaf", "children", "keys", "alloc", "count",
                 "weight", "key", "active")

    def __init__(self, path: str, parent: _Node | None, leaf: bool, weight: float) -> None:
        self.path = path
        self.parent = parent
        self.leaf = leaf
        self.children: list[_Node] = []
        self.keys: list[Key] = []  # parallel to children, kept sorted by DRFSorter
        self.alloc: dict[str, int] = {}
        self.count = 0  # allocations made to this subtree
        self.weight = weight
        self.key: Key = (0.0, 0, path)
        # Leaf: the client is active. Structural: number of active leaves below.
        self.active = 0


class _Tree:
    """Clients, their subtree allocations, weights and the cluster total. The
    subclasses decide how siblings are ordered."""

    def __init__(self) -> None:
        self._root = _Node("", None, leaf=False, weight=1.0)
        self._nodes: dict[str, _Node] = {}  # structural, by path
        self._leaves: dict[str, _Node] = {}  # by client
        self._weights: dict[str, float] = {}
        self._total: dict[str, int] = {}
        self._denominators: list[tuple[str, int]] = []  # DRF kinds with a total
        self._nested = 0  # clients with a "/" in their path

    # ------------------------------------------------------------- membership

    def add(self, client: str) -> None:
        """Add an inactive client with nothing allocated."""
        if not client or client.startswith("/") or client.endswith("/") or "//" in client:
            raise SorterError(f"invalid client path {client!r}")
        if client in self._leaves:
            raise SorterError(f"client {client} is already present")
        parent = self._root
        parts = client.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            node = self._nodes.get(prefix)
            if node is None:
                node = _Node(prefix, parent, leaf=False, weight=self._weights.get(prefix, 1.0))
                self._nodes[prefix] = node
                self._link(parent, node)
            parent = node
        leaf = _Node(client, parent, leaf=True, weight=self._weights.get(client, 1.0))
        self._leaves[client] = leaf
        self._nested += "/" in client
        self._link(parent, leaf)

    def remove(self, client: str) -> None:
        """Remove a client; what was allocated to it leaves its ancestors' totals."""
        leaf = self._leaf(client)
        if leaf.active:
            self.deactivate(client)
        if leaf.alloc or leaf.count:
            self._change(leaf, dict(leaf.alloc), -leaf.count, -1)
        del self._leaves[client]
        self._nested -= "/" in client
        node = leaf
        while node.parent is not None:
            parent = node.parent
            self._unlink(parent, node)
            if parent.children or parent is self._root:
                break
            del self._nodes[parent.path]
            node = parent

    def contains(self, client: str) -> bool:
        return client in self._leaves

    def activate(self, client: str) -> None:
        leaf = self._leaf(client)
        if not leaf.active:
            leaf.active = 1
            self._bump_active(leaf.parent, 1)

    def deactivate(self, client: str) -> None:
        leaf = self._leaf(client)
        if leaf.active:
            leaf.active = 0
            self._bump_active(leaf.parent, -1)

    def any_active(self) -> bool:
        """Whether some client is active (`sort()` is not empty)."""
        return self._root.active > 0

    def _bump_active(self, node: _Node | None, delta: int) -> None:
        self._order_changed()
        while node is not None:
            node.active += delta
            node = node.parent

    # ------------------------------------------------------------- allocation

    def allocated(self, client: str, scalars: Scalars) -> None:
        """`scalars` more is allocated to `client`; counts as one allocation."""
        self._change(self._leaf(client), scalars, 1)

    def unallocated(self, client: str, scalars: Scalars) -> None:
        """`scalars` allocated to `client` are free again."""
        leaf = self._leaf(client)
        alloc = leaf.alloc
        for kind, milli in scalars.items():
            if alloc.get(kind, 0) < milli:
                raise SorterError(f"client {client} has {alloc.get(kind, 0)} milli "
                                  f"{kind} allocated, cannot release {milli}")
        self._change(leaf, scalars, 0, -1)

    def _change(self, leaf: _Node, scalars: Scalars, count: int, sign: int = 1) -> None:
        """Add `sign` x `scalars` and `count` to the leaf and its ancestors."""
        root = self._root
        node: _Node | None = leaf
        items = scalars.items()
        rekey = self._rekey
        while node is not None and node is not root:
            alloc = node.alloc
            for kind, milli in items:
                # `sign` applied here: no negated copy of the scalars per change.
                left = alloc.get(kind, 0) + milli if sign == 1 else alloc.get(kind, 0) - milli
                if left:
                    alloc[kind] = left
                else:
                    alloc.pop(kind, None)
            node.count += count
            parent = node.parent
            # An only child's key is not kept (`DRFSorter._rekey`): most nodes an
            # allocation reaches are such, and this runs per offer made and returned.
            if len(parent.keys) != 1:  # type: ignore[union-attr]
                rekey(node)
            node = parent

    def allocation(self, path: str) -> dict[str, int]:
        """What is allocated to the subtree at `path` (empty if there is none)."""
        node = self._nodes.get(path)
        return dict(node.alloc) if node is not None else {}

    def client_allocation(self, client: str) -> dict[str, int]:
        """What is allocated to `client` itself, without its descendants."""
        return dict(self._leaf(client).alloc)

    # ----------------------------------------------------------- total/weights

    def add_total(self, scalars: Scalars) -> None:
        for kind, milli in scalars.items():
            self._total[kind] = self._total.get(kind, 0) + milli
        self._total_changed()

    def remove_total(self, scalars: Scalars) -> None:
        for kind, milli in scalars.items():
            left = self._total.get(kind, 0) - milli
            if left < 0:
                raise SorterError(f"total {kind} would go negative")
            if left:
                self._total[kind] = left
            else:
                self._total.pop(kind, None)
        self._total_changed()

    def _total_changed(self) -> None:
        self._denominators = [(kind, self._total[kind]) for kind in SHARE_KINDS
                              if self._total.get(kind)]
        self._reshare()

    def update_weight(self, path: str, weight: float) -> None:
        """Set the weight of `path` (1.0 is the default); applies to the subtree
        there and to the client of that name."""
        check_weight(weight)
        if weight == 1.0:
            self._weights.pop(path, None)
        else:
            self._weights[path] = weight
        for node in (self._nodes.get(path), self._leaves.get(path)):
            if node is not None:
                node.weight = weight
        self._reshare()

    def share(self, path: str) -> float:
        """Weighted dominant share of the subtree at `path` (for a client without
        descendants, its own)."""
        node = self._nodes.get(path)
        if node is None:
            raise SorterError(f"unknown path {path}")
        return self._share(node)

    def _share(self, node: _Node) -> float:
        share = 0.0
        alloc = node.alloc
        if alloc:
            for kind, total in self._denominators:
                value = alloc.get(kind, 0) / total
                if value > share:
                    share = value
        return share / node.weight

    # ------------------------------------------------------------------ order

    def sort(self) -> list[str]:
        """Active clients in the order they should be offered resources."""
        return list(self.iter_sorted())

    def iter_sorted(self) -> Iterator[str]:
        """`sort()`, lazily: stop early and nothing is wasted. Changing the sorter
        while iterating is not supported."""
        stack = [iter(self._ordered(self._root))]
        while stack:
            for node in stack[-1]:
                if not node.active:
                    continue
                if node.leaf:
                    yield node.path
                else:
                    stack.append(iter(self._ordered(node)))
                    break
            else:
                stack.pop()

    # ---------------------------------------------------------- subclass hooks

    def _order_changed(self) -> None:
        """Which clients `iter_sorted` yields, or their order, may have changed."""

    def _link(self, parent: _Node, node: _Node) -> None:
        parent.children.append(node)

    def _unlink(self, parent: _Node, node: _Node) -> None:
        parent.children.remove(node)

    def _rekey(self, node: _Node) -> None:
        """`node`'s allocation changed."""

    def _reshare(self) -> None:
        """Every share may have changed (total or a weight)."""

    def _ordered(self, node: _Node) -> list[_Node]:
        raise NotImplementedError

    def _leaf(self, client: str) -> _Node:
        try:
            return self._leaves[client]
        except KeyError:
            raise SorterError(f"unknown client {client}") from None


class DRFSorter(_Tree):
    """Dominant Resource Fairness order, maintained incrementally; see the module
    docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._stale = False  # every key must be recomputed before the next read
        # `sort()`, kept until the order changes: most allocations change a
        # client's key without moving it, and a pass reads the order per agent.
        self._order: list[str] | None = None

    def iter_sorted(self) -> Iterator[str]:
        order = self._order
        if order is None:
            if self._nested:
                order = list(super().iter_sorted())
            else:  # each top node holds one client, its leaf, of the same path
                order = [node.path for node in self._ordered(self._root) if node.active]
            self._order = order
        return iter(order)

    def _order_changed(self) -> None:
        self._order = None

    def _key(self, node: _Node) -> Key:
        return (self._share(node), node.count, node.path)

    def _link(self, parent: _Node, node: _Node) -> None:
        self._order = None
        node.key = self._key(node)
        if self._stale:
            parent.children.append(node)
            parent.keys.append(node.key)
            return
        if len(parent.children) == 1:  # an only child's key is not kept: see `_rekey`
            only = parent.children[0]
            only.key = parent.keys[0] = self._key(only)
        at = bisect.bisect_left(parent.keys, node.key)
        parent.keys.insert(at, node.key)
        parent.children.insert(at, node)

    def _unlink(self, parent: _Node, node: _Node) -> None:
        self._order = None
        at = parent.children.index(node) if self._stale else \
            bisect.bisect_left(parent.keys, node.key)
        del parent.keys[at]
        del parent.children[at]

    def _rekey(self, node: _Node) -> None:
        parent = node.parent
        assert parent is not None
        if self._stale or len(parent.keys) == 1:
            # An only child has no sibling to be ordered against (without nested
            # clients every leaf is one, under its own path's node): its key is
            # computed when a sibling arrives (`_link`).
            return
        old = node.key
        new = (self._share(node), node.count, node.path)  # `_key`, one call less
        if new == old:
            return
        node.key = new
        keys = parent.keys
        at = bisect.bisect_left(keys, old)
        # Most changes keep the node where it is; checking the neighbours first
        # saves two list shifts.
        if (at == 0 or keys[at - 1] < new) and (at + 1 == len(keys) or new < keys[at + 1]):
            keys[at] = new
            return
        del keys[at]
        if node.active:
            self._order = None
        children = parent.children
        moved = children.pop(at)
        to = bisect.bisect_left(keys, new)
        keys.insert(to, new)
        children.insert(to, moved)

    def _reshare(self) -> None:
        self._stale = True
        self._order = None

    def _ordered(self, node: _Node) -> list[_Node]:
        if self._stale:
            self._resort(self._root)
            self._stale = False
        return node.children

    def _resort(self, node: _Node) -> None:
        for child in node.children:
            child.key = self._key(child)
            if not child.leaf:
                self._resort(child)
        node.children.sort(key=lambda child: child.key)
        node.keys = [child.key for child in node.children]


class RandomSorter(_Tree):
    """Siblings in a weighted random order, drawn anew on every read from a
    generator seeded at construction, so a run is reproducible. A sibling of
    weight w comes first with probability proportional to w."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._random = random.Random(seed)

    def _ordered(self, node: _Node) -> list[_Node]:
        # Efraimidis-Spirakis: sorting by u**(1/w), u uniform in (0, 1], is a
        # weighted shuffle.
        draw = self._random.random
        keyed = [((1.0 - draw()) ** (1.0 / child.weight), child.path, child)
                 for child in node.children]
        keyed.sort(key=lambda item: (-item[0], item[1]))
        return [child for _, _, child in keyed]
