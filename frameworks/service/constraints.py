"""Placement constraints: which offers an app's tasks may land on.

A constraint is Marathon's triple ``[field, operator, value]``. ``field`` is
``hostname`` (the offer's hostname) or the name of an agent attribute (``rack``,
``zone``, ...). Operators:

- ``UNIQUE``: no two tasks share a value (one task per host, per rack...).
- ``CLUSTER [value]``: every task on that value; without a value, on whatever
  value the app's first task landed on.
- ``GROUP_BY [n]``: spread tasks evenly over the field's values (failure-domain
  spreading). An offer is acceptable when its value holds no more tasks than the
  emptiest known value. The known values are those of every agent the framework
  has had an offer from; with ``n``, fewer than ``n`` known values means the
  missing ones count as empty, so only values without tasks are used until ``n``
  show up.
- ``LIKE regex`` / ``UNLIKE regex``: the value must / must not match the whole
  regex. An agent without the attribute is not LIKE anything, and so is UNLIKE all.
- ``MAX_PER n``: at most ``n`` tasks per value.

An offer without the field (an agent lacking the attribute) satisfies only
``UNLIKE``. Everything here is pure: the caller says how many of the app's tasks
hold each value and which values the cluster is known to have.

Patterns are user input, so they run on RE2 (`google-re2`), whose matching time
is linear in the text: a pattern such as ``(a+)+`` that takes Python's `re` hours
on ``"a" * 40 + "!"`` takes RE2 microseconds. RE2 has no backreferences or
lookaround; a pattern that uses them is refused as invalid. Sizes are bounded too:
a field name at most `MAX_FIELD_LENGTH` characters, a value or pattern at most
`MAX_VALUE_LENGTH`, a count at most `MAX_COUNT_DIGITS` ASCII digits.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence

import attrs
import re2

UNIQUE, CLUSTER, GROUP_BY, LIKE, UNLIKE, MAX_PER = (
    "UNIQUE", "CLUSTER", "GROUP_BY", "LIKE", "UNLIKE", "MAX_PER")
OPERATORS = (UNIQUE, CLUSTER, GROUP_BY, LIKE, UNLIKE, MAX_PER)
HOSTNAME = "hostname"
MAX_FIELD_LENGTH = 128
MAX_VALUE_LENGTH = 256
MAX_COUNT_DIGITS = 6
_FIELD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
# ASCII digits only: "²".isdigit() is true, yet int("²") raises.
_COUNT = re.compile(f"[0-9]{{1,{MAX_COUNT_DIGITS}}}")
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the sender's problem, not our stderr's


class ConstraintError(ValueError):
    """A constraint that cannot be parsed or can never be satisfied."""


@attrs.frozen
class Constraint:
    field: str
    operator: str
    value: str | None = None

    def to_json(self) -> list[str]:
        return [self.field, self.operator] + ([self.value] if self.value is not None else [])

    def __str__(self) -> str:
        return ":".join(self.to_json())


def _shown(text: str) -> str:
    """`text` quoted for an error message, cut short: it is the sender's input."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re2._Regexp:
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(
            exc.args[0], bytes) else str(exc)
        raise ConstraintError(f"regex {_shown(pattern)} is invalid (RE2 syntax): "
                              f"{reason}") from None


def fullmatches(pattern: str, value: str) -> bool:
    """Whether `value` matches all of `pattern`, in time linear in `value`. A
    value that is not valid Unicode (a lone surrogate) matches no pattern."""
    try:
        return _compiled(pattern).fullmatch(value) is not None
    except UnicodeEncodeError:
        return False


def parse_constraint(raw: object) -> Constraint:
    """``["rack", "GROUP_BY", "2"]`` -> `Constraint`; raises `ConstraintError`."""
    if not isinstance(raw, list) or not 2 <= len(raw) <= 3:
        raise ConstraintError("a constraint is [field, operator] or [field, operator, value]")
    if not all(isinstance(part, str) for part in raw[:2]):
        raise ConstraintError("constraint field and operator must be strings")
    field, operator = raw[0], raw[1].upper()
    value = raw[2] if len(raw) == 3 else None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if value is not None and not isinstance(value, str):
        raise ConstraintError("constraint value must be a string")
    if len(field) > MAX_FIELD_LENGTH or not _FIELD.fullmatch(field):
        raise ConstraintError(f"invalid constraint field {_shown(field)} (letters, digits, "
                              f"_ . -; at most {MAX_FIELD_LENGTH} characters)")
    if operator not in OPERATORS:
        raise ConstraintError(f"unknown constraint operator {_shown(raw[1])} "
                              f"(one of {', '.join(OPERATORS)})")
    if value is not None and len(value) > MAX_VALUE_LENGTH:
        raise ConstraintError(f"{operator} value longer than {MAX_VALUE_LENGTH} characters")
    if operator == UNIQUE and value is not None:
        raise ConstraintError("UNIQUE takes no value")
    if operator in (LIKE, UNLIKE):
        if not value:
            raise ConstraintError(f"{operator} needs a regular expression")
        _compiled(value)
    if operator == MAX_PER or (operator == GROUP_BY and value is not None):
        if value is None or not _COUNT.fullmatch(value) or int(value) < 1:
            raise ConstraintError(f"{operator} needs a positive whole number (at most "
                                  f"{MAX_COUNT_DIGITS} digits 0-9)")
    if operator == CLUSTER and value == "":
        raise ConstraintError("CLUSTER value must not be empty")
    return Constraint(field, operator, value)


def check_satisfiable(constraints: Sequence[Constraint], instances: int) -> None:
    """Raise `ConstraintError` for combinations no cluster could ever satisfy."""
    by_field: dict[str, list[Constraint]] = {}
    for constraint in constraints:
        by_field.setdefault(constraint.field, []).append(constraint)
    for field, group in by_field.items():
        clusters = {c.value for c in group if c.operator == CLUSTER}
        if len(clusters) > 1:
            raise ConstraintError(f"{field}: CLUSTER on more than one value")
        pinned = bool(clusters)
        likes = {c.value for c in group if c.operator == LIKE}
        unlikes = {c.value for c in group if c.operator == UNLIKE}
        if likes & unlikes:
            raise ConstraintError(f"{field}: LIKE and UNLIKE the same regex")
        cluster_value = next(iter(clusters), None)
        if cluster_value is not None:
            for c in group:
                if c.operator == LIKE and not fullmatches(c.value or "", cluster_value):
                    raise ConstraintError(f"{field}: CLUSTER {cluster_value} is not LIKE {c.value}")
                if c.operator == UNLIKE and fullmatches(c.value or "", cluster_value):
                    raise ConstraintError(f"{field}: CLUSTER {cluster_value} is UNLIKE {c.value}")
        if not pinned:
            continue
        for c in group:
            if c.operator == UNIQUE and instances > 1:
                raise ConstraintError(f"{field}: UNIQUE and CLUSTER allow one task, "
                                      f"not {instances}")
            if c.operator == MAX_PER and instances > int(c.value or 0):
                raise ConstraintError(f"{field}: CLUSTER with MAX_PER {c.value} allows "
                                      f"{c.value} tasks, not {instances}")
            if c.operator == GROUP_BY and c.value is not None and int(c.value) > 1 \
                    and instances > 1:
                raise ConstraintError(f"{field}: cannot GROUP_BY {c.value} values "
                                      "while CLUSTERed on one")


def field_value(field: str, hostname: str, attributes: Mapping[str, str]) -> str | None:
    """The value an agent has for a constraint field (None when it lacks it)."""
    return hostname if field == HOSTNAME else attributes.get(field)


def unmet(constraint: Constraint, value: str | None, counts: Mapping[str, int],
          known: Iterable[str]) -> str | None:
    """Why an agent whose field has `value` cannot take one more task, or None.

    ``counts`` says how many of the app's tasks (of the version being placed) hold
    each value of the field; ``known`` lists the values seen on agents.
    """
    op, wanted = constraint.operator, constraint.value
    if op == UNLIKE:
        return None if value is None or not fullmatches(wanted or "", value) \
            else f"{constraint}: {value} matches"
    if value is None:
        return f"{constraint}: agent has no {constraint.field}"
    here = counts.get(value, 0)
    if op == UNIQUE:
        return f"{constraint}: {value} already has a task" if here else None
    if op == LIKE:
        return None if fullmatches(wanted or "", value) else f"{constraint}: {value} does not match"
    if op == MAX_PER:
        return f"{constraint}: {value} has {here}" if here >= int(wanted or 0) else None
    if op == CLUSTER:
        target = wanted if wanted is not None else next((v for v, n in counts.items() if n), None)
        return None if target is None or value == target else f"{constraint}: {value} is not {target}"
    # GROUP_BY: never put more on this value than on the emptiest group.
    groups = set(known) | {v for v, n in counts.items() if n} | {value}
    emptiest = min(counts.get(g, 0) for g in groups)
    if wanted is not None and len(groups) < int(wanted):
        emptiest = 0
    if here > emptiest:
        return f"{constraint}: {value} has {here}, another group has {emptiest}"
    return None
