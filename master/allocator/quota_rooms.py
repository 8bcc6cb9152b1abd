"""The quota cut's room caches: what limits and unmet guarantees leave a role.

Apart from `hierarchical` because it is a responsibility of its own: given the
quota, the roles' allocations (from the role sorter) and the cluster's free
unreserved amounts, answer per role how much of each kind it may still be
offered (`_room`), and keep those answers -- rooms, needs, quota chains, the
roles guaranteed below which -- until something they depend on changes. The
allocator inherits it (`QuotaRooms`) and owns the state it reads; nothing here
decides who is offered what. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from dyad.resources import UNRESERVED, VOLUME_KIND, Resources
from master.allocator.policy import Quota
from master.allocator.sorter import Sorter

__all__ = ["QuotaRooms", "allowed_roles"]


def allowed_roles(role: str) -> list[str]:
    """The reservation roles a framework offered resources in `role` may get:
    ``*``, the role and its ancestors (``eng`` for ``eng/ml``), nearest first."""
    roles = [role]
    cut = role.rfind("/")
    while cut > 0:
        role = role[:cut]
        roles.append(role)
        cut = role.rfind("/")
    if roles[0] != UNRESERVED:
        roles.append(UNRESERVED)
    return roles


_Rooms = tuple[dict[str, int], dict[str, int]]  # limit room, unreserved room per kind
# Limited roles of a chain, free amounts held back per kind, what the chain misses.
_Plan = tuple[list[tuple[str, Mapping[str, int]]], list[tuple[str, int]],
              list[tuple[str, int]]]


class QuotaRooms:
    """The quota part of `HierarchicalAllocator` (which sets every attribute
    below in its `__init__`): the rooms `_capped` cuts offers to, and their caches."""

    _quota: dict[str, Quota]
    _role_sorter: Sorter
    _free_unreserved: Counter[str]
    _dirty: dict[str, None]
    _quota_blocked: dict[str, None]
    _rooms: dict[tuple[str, bool], _Rooms | None]
    _below: dict[str, list[str]]
    _chains: dict[str, tuple[list[str], list[tuple[str, Mapping[str, int]]], str | None, bool]]
    _needs: dict[str, dict[str, int]]
    _required: dict[str, int] | None
    _plans: dict[tuple[str, bool], _Plan | tuple[()]]

    def _guarantees_unmet(self) -> bool:
        """Whether some guarantee still misses something. When none does, the
        guarantee stage would offer nothing (every role's cut there is None), so a
        pass skips it. A guaranteed role's need covers its guaranteed sub-roles',
        so the outermost ones tell."""
        return any(milli for role in self._guaranteed_below("")
                   for milli in self._need(role, self._quota[role]).values())

    def _room(self, role: str, guarantees: bool) -> _Rooms | None:
        """For `_capped`: the room per kind under limits, and for unreserved
        amounts. It depends only on quota, role allocations and the cluster's free
        unreserved amounts, so it is kept (`_rooms`) until one of them changes:
        a pass over many agents where few offers are made computes it a few times,
        not once per agent. While a guarantee is unmet every charge changes the
        free amounts, so what does not depend on them is kept apart (`_plan`)."""
        key = (role, guarantees)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(role, guarantees)
        if not plan:
            return None
        limited, offsets, missing = plan
        limit_room: dict[str, int] = {}
        for ancestor, limits in limited:
            used = self._role_sorter.allocation(ancestor)
            for kind, limit in limits.items():
                room = max(0, limit - used.get(kind, 0))
                limit_room[kind] = min(room, limit_room.get(kind, room))
        free = self._free_unreserved
        unreserved_room = {kind: max(0, free[kind] - offset) for kind, offset in offsets}
        for kind, room in missing:
            unreserved_room[kind] = min(room, unreserved_room.get(kind, room))
        return limit_room, unreserved_room

    def _plan(self, role: str, guarantees: bool) -> _Plan | tuple[()]:
        """What `_room` needs that depends only on quota and unmet guarantees: the
        limited roles of `role`'s chain, per kind still missed cluster-wide how
        much of the free amount is held back from `role`, and in the guarantee
        stage what its chain still misses (``()``: it misses nothing). Kept
        (`_plans`) until quota or a need changes (`_guarantee_changed`)."""
        chain, limited, top, _ = self._chain(role)
        required, own = self._headroom(top)
        offsets = [(kind, needed - own.get(kind, 0)) for kind, needed in required.items()
                   if needed]
        missing: list[tuple[str, int]] = []
        if guarantees:
            missing = list(self._missing(chain).items())
            if not missing:
                return ()
        return limited, offsets, missing

    def _missing(self, chain: list[str]) -> dict[str, int]:
        """Per guaranteed kind, the most any quota role in `chain` still misses."""
        missing: dict[str, int] = {}
        for ancestor in chain:
            quota = self._quota.get(ancestor)
            if quota is not None:
                for kind, milli in self._need(ancestor, quota).items():
                    if milli > missing.get(kind, 0):
                        missing[kind] = milli
        return {kind: milli for kind, milli in missing.items() if milli}

    def _chain(self, role: str) -> tuple[list[str], list[tuple[str, Mapping[str, int]]],
                                          str | None, bool]:
        """`role`'s quota chain (itself and its ancestors), those of them with a
        limit, its outermost guaranteed role and whether any of the chain has a
        guarantee; kept (`_chains`) until quota changes."""
        known = self._chains.get(role)
        if known is None:
            chain = allowed_roles(role)[:-1] if role != UNRESERVED else []
            limited = [(a, q.limit) for a in chain
                       if (q := self._quota.get(a)) is not None and q.limit]
            top = self._top_guaranteed(chain[0]) if chain else None
            known = self._chains[role] = (chain, limited, top, top is not None)
        return known

    def _need(self, role: str, quota: Quota) -> dict[str, int]:
        """`_unmet`, kept (`_needs`) until an allocation under a guarantee changes."""
        need = self._needs.get(role)
        if need is None:
            need = self._needs[role] = self._unmet(role, quota)
        return need

    def _unmet(self, role: str, quota: Quota) -> dict[str, int]:
        """What the guarantee of `role` still misses, or its nearest guaranteed
        sub-roles together miss, whichever is more, per kind."""
        used = self._role_sorter.allocation(role)
        need = {kind: max(0, milli - used.get(kind, 0)) for kind, milli in quota.guarantee.items()}
        below: Counter[str] = Counter()
        for child in self._guaranteed_below(role):
            below.update(self._need(child, self._quota[child]))
        for kind, milli in below.items():
            need[kind] = max(need.get(kind, 0), milli)
        return need

    def _top_guaranteed(self, role: str, within: str = "") -> str | None:
        """The outermost role with a guarantee among `role` and its ancestors below
        `within`."""
        top = None
        for ancestor in allowed_roles(role)[:-1]:
            if within and not ancestor.startswith(within + "/"):
                break
            quota = self._quota.get(ancestor)
            if quota is not None and quota.guarantee:
                top = ancestor
        return top

    def _headroom(self, top: str | None) -> tuple[dict[str, int], dict[str, int]]:
        """Unmet guarantees cluster-wide, the kinds still missed only (kept with
        the needs), and the part of them the outermost guaranteed role `top`
        accounts for (not held back from itself)."""
        required = self._required
        if required is None:
            total: Counter[str] = Counter()
            for role in self._guaranteed_below(""):
                total.update(self._need(role, self._quota[role]))
            required = self._required = {kind: milli for kind, milli in total.items() if milli}
        own = self._need(top, self._quota[top]) if top is not None else {}
        return required, own

    def _guaranteed_below(self, role: str) -> list[str]:
        """The nearest roles with a guarantee strictly below `role` (below ``""``:
        the outermost ones). It depends only on quota, so it is kept (`_below`)
        until quota changes."""
        below = self._below.get(role)
        if below is None:
            below = self._below[role] = [
                child for child, quota in self._quota.items()
                if quota.guarantee and (not role or child.startswith(role + "/"))
                and self._top_guaranteed(child, within=role) == child]
        return below

    def _guarantee_changed(self) -> None:
        self._needs.clear()
        self._required = None
        self._plans.clear()

    def _allocation_changed(self, role: str, charged: Mapping[str, int] | None = None,
                            unreserved: Mapping[str, int] | None = None) -> None:
        """`role`'s allocation (so its ancestors') changed. A kept room stays
        when nothing it depends on did: no guarantee is missing anything (so no
        room depends on the free amounts or on needs), `role` is under no
        guarantee, and none of the room's limited roles is `role` or above it.
        `charged` (and its `unreserved` part), when given, is what was just
        charged to `role`: see `_rooms_charged`."""
        chain, _, _, guarded = self._chain(role)
        if guarded:
            if self._needs:
                self._guarantee_changed()
        elif self._rooms and self._required is not None and not self._required:
            rooms = self._rooms
            for key in list(rooms):
                for limited, _ in self._chain(key[0])[1]:
                    if limited in chain:
                        del rooms[key]
                        break
            self._dirty_quota_blocked()
            return
        elif charged is not None and unreserved is not None and self._required:
            self._rooms_charged(chain, charged, unreserved)
            self._dirty_quota_blocked()
            return
        self._consumption_changed()

    def _rooms_charged(self, chain: list[str], charged: Mapping[str, int],
                       unreserved: Mapping[str, int]) -> None:
        """Bring the kept rooms up to date after `charged` went to a role (with
        quota chain `chain`) under no guarantee, while some guarantee misses
        something, instead of recomputing them at the next pick (every charge
        changes the free amounts then). No need changes, so a guarantee-stage
        room that was None stays None. A room is ``max(0, x)`` for an amount
        ``x`` that a charge only lowers, so it becomes ``max(0, room - amount)``
        exactly (0 stays 0); so does a minimum of such rooms when the charge
        lowers each of them. A room that is a minimum with an amount the charge
        does not lower (a guarantee stage's unreserved room, limits of roles
        outside `chain`) is dropped, to be recomputed."""
        rooms = self._rooms
        for key, kept in list(rooms.items()):
            if kept is None:
                continue
            if key[1]:
                del rooms[key]
                continue
            limit_room, unreserved_room = kept
            limited = self._chain(key[0])[1]
            if limited and any(ancestor in chain for ancestor, _ in limited):
                if not all(ancestor in chain for ancestor, _ in limited):
                    del rooms[key]
                    continue
                _lower(limit_room, charged)
            _lower(unreserved_room, unreserved)

    def _consumption_changed(self) -> None:
        self._rooms.clear()
        self._dirty_quota_blocked()

    def _dirty_quota_blocked(self) -> None:
        if self._quota_blocked:
            self._dirty.update(self._quota_blocked)
            self._quota_blocked = {}

def _lower(room: dict[str, int], amounts: Mapping[str, int]) -> None:
    """Each kind of `room` lowered by its amount in `amounts`, not below 0."""
    for kind, left in room.items():
        milli = amounts.get(kind)
        if milli and left:
            room[kind] = max(0, left - milli)


def _cut(resources: Resources, limit_room: Mapping[str, int],
         unreserved_room: Mapping[str, int], totals: Mapping[str, int] | None = None
         ) -> Resources:
    """`resources` with each scalar kind cut to fit: the unreserved part within
    `unreserved_room`, everything within `limit_room`. Reserved amounts are kept
    before unreserved ones (they are the role's own); both are cut deterministically."""
    if not limit_room and not unreserved_room:
        return resources
    if totals is None:
        totals = resources.scalar_items()
    for kind, room in limit_room.items():
        if totals.get(kind, 0) > room:
            break
    else:
        for kind, room in unreserved_room.items():
            if totals.get(kind, 0) > room:
                break
        else:
            return resources  # it all fits: `_cut_entries` would cut nothing
    key = (resources, tuple(limit_room.items()), tuple(unreserved_room.items()))
    cut = _CUTS.get(key)
    if cut is None:
        if len(_CUTS) >= _CUTS_MAX:
            _CUTS.clear()
        cut = _CUTS[key] = _cut_entries(resources, limit_room, unreserved_room)
    return cut


# `_cut_entries` answers `_cut` asked for: once a room is used up, a pass cuts
# agent after agent of the same free resources (whole, then what the cut left)
# to the same room. A pure function's answers, bounded by clearing when full.
_CUTS: dict[tuple[Resources, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]],
            Resources] = {}
_CUTS_MAX = 256


def _cut_entries(resources: Resources, limit_room: Mapping[str, int],
                 unreserved_room: Mapping[str, int]) -> Resources:
    """`_cut`, entry by entry."""
    unreserved = resources.unreserved()
    reserved_roles = sorted(resources.roles() - {UNRESERVED})
    cut = Resources()
    for kind in sorted(set(limit_room) | set(unreserved_room)):
        have_unreserved = unreserved.get_milli(kind)
        have_reserved = resources.get_milli(kind) - have_unreserved
        keep_unreserved = min(have_unreserved, unreserved_room.get(kind, have_unreserved))
        keep_reserved = have_reserved
        if kind in limit_room:
            keep_reserved = min(have_reserved, limit_room[kind])
            keep_unreserved = min(keep_unreserved, limit_room[kind] - keep_reserved)
        if keep_unreserved < have_unreserved:
            cut = cut + Resources.scalar_milli(kind, have_unreserved - keep_unreserved)
        excess = have_reserved - keep_reserved
        for role in reserved_roles:
            if excess <= 0:
                break
            take = min(excess, resources.reserved(role).without_volumes().get_milli(kind))
            if take:
                cut = cut + Resources.scalar_milli(kind, take, role)
                excess -= take
        # A persistent volume is offered whole or not at all.
        for volume, (role, milli) in sorted(resources.volumes().items()):
            if excess <= 0 or kind != VOLUME_KIND:
                break
            cut = cut + Resources.scalar_milli(kind, milli, role, volume)
            excess -= milli
    return resources - cut
