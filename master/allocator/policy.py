"""Operator policy for the allocator: role weights and quota, validated.

Both are plain data the master keeps (and the registry persists): weights map a
role to a positive float, quota maps a role to a `Quota`. This module turns
untrusted JSON into them and checks that a whole set is coherent, raising
`PolicyError` with a reason an operator can act on; nothing here mutates state.

Quota per role (the role's whole subtree counts, `eng/ml` towards `eng`):

* ``guarantee``: offered to the role before any role without an unmet guarantee
  gets anything, and the part not yet allocated is held back from other roles;
* ``limit``: the role's subtree is never offered beyond it.

Amounts are scalars of the DRF kinds (cpus, mem, disk, gpus), kept in milli like
`dyad.resources` so comparisons are exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from dyad.resources import SHARE_KINDS, UNRESERVED, is_valid_role

__all__ = ["PolicyError", "Quota", "check_quotas", "parse_quota", "parse_weights",
           "role_problem"]

_MAX_WEIGHT = 1e6
_MAX_AMOUNT = 10**12  # like dyad.resources: far beyond a real cluster


class PolicyError(ValueError):
    """A weight or quota an operator asked for is invalid; the message says why."""


@attrs.frozen
class Quota:
    """Guarantee and limit of one role, milli by kind; an absent kind means no
    guarantee (0) and no limit (unbounded)."""

    guarantee: Mapping[str, int] = attrs.field(factory=dict)
    limit: Mapping[str, int] = attrs.field(factory=dict)

    def is_empty(self) -> bool:
        return not self.guarantee and not self.limit

    def to_json(self) -> dict[str, dict[str, float]]:
        return {"guarantee": _amounts_json(self.guarantee), "limit": _amounts_json(self.limit)}


def role_problem(role: object) -> str:
    """Why `role` is not a valid role name ('' if it is): a role is valid exactly
    when a resource can be reserved to it."""
    if not isinstance(role, str) or not role:
        return f"a role must be a non-empty string, got {_shown(role)}"
    return "" if is_valid_role(role) else f"invalid role {_shown(role)}"


def parse_weights(body: Any) -> dict[str, float]:
    """``[{"role": "eng", "weight": 2.0}, ...]`` (or one such object) -> weights."""
    items = body if isinstance(body, list) else [body]
    weights: dict[str, float] = {}
    for item in items:
        if not isinstance(item, dict) or set(item) != {"role", "weight"}:
            raise PolicyError('each weight must be an object {"role": ..., "weight": ...}')
        role, weight = item["role"], item["weight"]
        problem = role_problem(role)
        if problem:
            raise PolicyError(problem)
        if not _number_within(weight, 0, _MAX_WEIGHT) or weight == 0:
            raise PolicyError(f"weight of role {role} must be a number in (0, {_MAX_WEIGHT:g}], "
                              f"got {_shown(weight)}")
        if role in weights:
            raise PolicyError(f"role {role} is given twice")
        weights[role] = float(weight)
    if not weights:
        raise PolicyError("no weights given")
    return weights


def parse_quota(body: Any) -> dict[str, Quota]:
    """``{"role": "eng", "guarantee": {"cpus": 2}, "limit": {"cpus": 8}}`` (or a
    list of them) -> quota by role. A role with neither guarantee nor limit gets
    an empty `Quota`, which removes its quota."""
    items = body if isinstance(body, list) else [body]
    quotas: dict[str, Quota] = {}
    for item in items:
        if not isinstance(item, dict) or "role" not in item \
                or not set(item) <= {"role", "guarantee", "limit"}:
            raise PolicyError('each quota must be an object {"role": ..., "guarantee": {...}, '
                              '"limit": {...}}')
        role = item["role"]
        problem = role_problem(role)
        if problem:
            raise PolicyError(problem)
        if role == UNRESERVED:
            raise PolicyError(f"role {UNRESERVED} cannot have quota")
        if role in quotas:
            raise PolicyError(f"role {role} is given twice")
        quotas[role] = Quota(guarantee=_amounts(role, "guarantee", item.get("guarantee", {})),
                             limit=_amounts(role, "limit", item.get("limit", {})))
    if not quotas:
        raise PolicyError("no quota given")
    return quotas


def check_quotas(quotas: Mapping[str, Quota]) -> None:
    """A set of quotas is coherent when each role's guarantee fits its own limit
    and every ancestor's limit, and a role's guarantee covers the sum of its
    descendants' (the allocator counts a subtree towards its root)."""
    for role, quota in quotas.items():
        for kind, milli in quota.guarantee.items():
            for ancestor in _self_and_ancestors(role):
                limit = quotas.get(ancestor, Quota()).limit.get(kind)
                if limit is not None and milli > limit:
                    raise PolicyError(f"role {role}: guarantee {kind}:{milli / 1000:g} exceeds "
                                      f"the limit {limit / 1000:g} of role {ancestor}")
    for role, quota in quotas.items():
        children: dict[str, int] = {}
        for other, other_quota in quotas.items():
            if other.startswith(role + "/") and not _has_quota_between(quotas, role, other):
                for kind, milli in other_quota.guarantee.items():
                    children[kind] = children.get(kind, 0) + milli
        for kind, milli in children.items():
            if milli > quota.guarantee.get(kind, 0) and quota.guarantee:
                raise PolicyError(f"role {role}: guarantee {kind}:"
                                  f"{quota.guarantee.get(kind, 0) / 1000:g} is less than its "
                                  f"sub-roles' guarantees ({milli / 1000:g})")


def _has_quota_between(quotas: Mapping[str, Quota], top: str, role: str) -> bool:
    """Some role strictly between `top` and its descendant `role` has a guarantee
    (then `role` counts towards that one, which counts towards `top`)."""
    return any(ancestor != top and ancestor.startswith(top + "/") and
               quotas.get(ancestor, Quota()).guarantee
               for ancestor in _self_and_ancestors(role)[1:])


def _self_and_ancestors(role: str) -> list[str]:
    parts = role.split("/")
    return ["/".join(parts[:depth]) for depth in range(len(parts), 0, -1)]


def _amounts(role: str, what: str, value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise PolicyError(f"role {role}: {what} must be an object like {{\"cpus\": 2}}")
    amounts: dict[str, int] = {}
    for kind, amount in value.items():
        if kind not in SHARE_KINDS:
            raise PolicyError(f"role {role}: {what} of {_shown(kind)}: quota covers only "
                              f"{', '.join(SHARE_KINDS)}")
        if not _number_within(amount, 0, _MAX_AMOUNT):
            raise PolicyError(f"role {role}: {what} of {kind} must be a number in "
                              f"[0, {_MAX_AMOUNT}], got {_shown(amount)}")
        amounts[kind] = round(amount * 1000)
    return amounts


def _shown(value: Any) -> str:
    """`value` for an error message, short whatever its size (repr of a 5,000-digit
    integer raises, and a megabyte of role name helps nobody)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number_within(value: Any, low: float, high: float) -> bool:
    """`value` is a real number (not a bool) in [low, high]. Compared before any
    conversion: a 400-digit integer is out of range, not an OverflowError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return low <= value <= high


def _amounts_json(amounts: Mapping[str, int]) -> dict[str, float]:
    return {kind: amounts[kind] / 1000 for kind in SHARE_KINDS if kind in amounts}
