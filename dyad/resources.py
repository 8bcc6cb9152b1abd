"""Cluster resources as an immutable value with exact arithmetic.

A `Resources` value is a bag of entries keyed by ``(name, role)`` (and a volume, below):

* **scalars** (``cpus``, ``mem``, ``disk``, ``gpus`` and any other name written
  with a number) are held as integers in thousandths ("milli"), so thousands of
  ``+``/``-`` never drift the way floats do;
* **ranges** (``ports`` and any name written ``[a-b,c-d]``) are held as sorted,
  disjoint, coalesced tuples of inclusive ``(begin, end)`` pairs.

The role is the reservation: ``"*"`` means unreserved, ``"eng"`` or ``"eng/ml"``
means reserved to that role (roles form a path tree).

A reserved ``disk`` entry may also name a **persistent volume** (its id), written
``disk(eng){v1}:64``: the 64 MB that volume ``v1`` occupies. A volume is a key of
its own, so ``disk(eng){v1}`` and plain ``disk(eng)`` never mix in arithmetic, and
every query by name or role (``get``, ``scalar_items``, ``reserved``,
``allocatable_for``) counts it as the reserved disk it is. `flatten` drops the
volume with the role. What a volume holds besides its size (container path,
principal) travels apart, in `dyad.volumes.PersistentVolume`.

Invariants every value keeps (they make ``==``, ``hash`` and ``str`` canonical):

* no entry is zero or empty -- it disappears instead;
* a name is either scalar or ranges, never both;
* a range value (say port 31000) appears at most once per name, whatever the
  role: a port cannot be free twice; likewise a volume id appears in one entry. So ``a + b`` raises `ResourcesError` when
  ``a`` and ``b`` share a range value, just as ``a - b`` raises when ``b`` is
  not contained in ``a``. Accounting errors surface where they happen.

The wire form is the text form: ``"cpus:1;mem:128;ports:[31000-31005];cpus(eng):2"``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import NoReturn

__all__ = ["SHARE_KINDS", "UNRESERVED", "VOLUME_KIND", "Resources", "ResourcesError"]

SHARE_KINDS = ("cpus", "mem", "disk", "gpus")
"""Scalar kinds that count towards a DRF dominant share."""

UNRESERVED = "*"
"""The role of resources reserved to nobody."""

Key = tuple[str, str, str]  # (name, role, volume id or "")
Range = tuple[int, int]
RangeList = tuple[Range, ...]

_SCALAR_ONLY = frozenset(SHARE_KINDS)
_RANGES_ONLY = frozenset({"ports"})
_ORDER = {name: i for i, name in enumerate(SHARE_KINDS)}

# Bounds keep hostile wire text from building huge numbers; 10**12 units of
# anything (MB of memory included) is far beyond a real machine.
_MAX_SCALAR_MILLI = 10**15
_MAX_RANGE_VALUE = 2**64 - 1
_MILLI = Decimal("0.001")
# Our own context, so a caller's decimal settings cannot change the rounding.
_DECIMAL = Context(prec=40, rounding=ROUND_HALF_UP, traps=[InvalidOperation])

_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
_ROLE_RE = re.compile(rf"\*|{_SEGMENT}(?:/{_SEGMENT})*")
_NAME_RE = re.compile(_NAME)
_ENTRY_RE = re.compile(
    rf"\s*({_NAME})\s*(?:\(\s*([^()]*?)\s*\))?\s*(?:\{{\s*([^{{}}]*?)\s*\}})?\s*:\s*(.*?)\s*")
_VOLUME_RE = re.compile(_SEGMENT)
VOLUME_KIND = "disk"  # the one kind a persistent volume can be made of
_NUMBER_RE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_RANGE_RE = re.compile(r"\s*(\d{1,20})\s*(?:-\s*(\d{1,20})\s*)?")


class ResourcesError(ValueError):
    """Malformed resource text, or arithmetic that would break an invariant."""


class Resources:
    """An immutable bag of scalar and range resources keyed by (name, role).

    Build one with `parse`/`from_wire` or `of`; combine with ``+``, ``-`` and
    ``<=``. ``Resources()`` is the empty value.
    """

    __slots__ = ("_scalars", "_ranges", "_hash", "_str")

    _scalars: dict[Key, int]
    _ranges: dict[Key, RangeList]
    _hash: int
    _str: str

    def __init__(self) -> None:
        _set(self, "_scalars", {})
        _set(self, "_ranges", {})

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Resources is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Resources is immutable")

    def __reduce__(self) -> tuple[Callable[[str], Resources], tuple[str]]:
        return (Resources.parse, (str(self),))

    # ------------------------------------------------------------------ text

    @classmethod
    def parse(cls, text: str) -> Resources:
        """Parse ``"cpus:1;mem:128;ports:[31000-31005];cpus(eng):2"``.

        Entries are separated by ``;``; a repeated (name, role) adds up. Scalars
        keep three decimals (rounded half up). Raises `ResourcesError`.
        """
        if not isinstance(text, str):
            raise ResourcesError(f"resources must be text, got {type(text).__name__}")
        result = _EMPTY
        for part in text.split(";"):
            if part.strip():
                result = result + _parse_entry(part)
        return result

    @classmethod
    def from_wire(cls, text: str) -> Resources:
        """The wire form is the text form; see `parse`."""
        return cls.parse(text)

    def to_wire(self) -> str:
        """The canonical text form, which `from_wire` reads back to an equal value."""
        return str(self)

    def __str__(self) -> str:
        try:
            return self._str
        except AttributeError:
            pass
        entries = [(_sort_key(k), _entry_text(k, _scalar_text(m))) for k, m in self._scalars.items()]
        entries += [(_sort_key(k), _entry_text(k, _ranges_text(rs))) for k, rs in self._ranges.items()]
        entries.sort()
        text = ";".join(t for _, t in entries)
        _set(self, "_str", text)
        return text

    def __repr__(self) -> str:
        return f"Resources.parse({str(self)!r})"

    @classmethod
    def of(cls, **amounts: float) -> Resources:
        """Unreserved scalars from numbers: ``Resources.of(cpus=0.5, mem=128)``."""
        scalars: dict[Key, int] = {}
        for name, amount in amounts.items():
            _check_scalar_name(name)
            milli = _number_to_milli(name, amount)
            if milli:
                scalars[(name, UNRESERVED, "")] = milli
        return _make(scalars, {})

    @classmethod
    def scalar(cls, name: str, amount: float, role: str = UNRESERVED) -> Resources:
        """One scalar entry from a number: ``Resources.scalar("cpus", 2, "eng")`` is
        ``cpus(eng):2``. Same limits and rounding as `parse`; 0 is empty."""
        return cls.scalar_milli(name, _number_to_milli(name, amount), role)

    @classmethod
    def scalar_milli(cls, name: str, milli: int, role: str = UNRESERVED,
                     volume: str = "") -> Resources:
        """One scalar entry of `milli` thousandths (the unit arithmetic keeps);
        `volume` names the persistent volume the (reserved disk) amount makes."""
        _check_scalar_name(name)
        _check_role(role)
        _check_volume(name, role, volume)
        if isinstance(milli, bool) or not isinstance(milli, int):
            raise ResourcesError(f"{name}: milli amount must be a whole number, got {milli!r}")
        if not 0 <= milli <= _MAX_SCALAR_MILLI:
            raise ResourcesError(f"{name}: {milli} milli is out of range")
        return _make({(name, role, volume): milli} if milli else {}, {})

    @classmethod
    def from_ranges(cls, name: str, ranges: Iterable[Range],
                    role: str = UNRESERVED) -> Resources:
        """One range entry from ``(begin, end)`` pairs (inclusive, in any order;
        adjacent ones merge, overlapping ones are an error):
        ``Resources.from_ranges("ports", [(31000, 31099)])``."""
        if not _NAME_RE.fullmatch(name):
            raise ResourcesError(f"invalid resource name {name!r}")
        _check_role(role)
        if name in _SCALAR_ONLY:
            raise ResourcesError(f"{name} is a scalar, not ranges")
        pieces = []
        for begin, end in ranges:
            if any(isinstance(v, bool) or not isinstance(v, int) for v in (begin, end)):
                raise ResourcesError(f"{name}: range bounds must be whole numbers, "
                                     f"got {begin!r}-{end!r}")
            if not 0 <= begin <= end <= _MAX_RANGE_VALUE:
                raise ResourcesError(f"{name}: invalid range {begin}-{end}")
            pieces.append((begin, end))
        canonical = _canonical(pieces, name) if pieces else ()
        return _make({}, {(name, role, ""): canonical} if canonical else {})

    # ---------------------------------------------------------- value protocol

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resources):
            return NotImplemented
        return self is other or (self._scalars == other._scalars and self._ranges == other._ranges)

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            pass
        h = hash((frozenset(self._scalars.items()), frozenset(self._ranges.items())))
        _set(self, "_hash", h)
        return h

    def __bool__(self) -> bool:
        return bool(self._scalars or self._ranges)

    def is_empty(self) -> bool:
        return not (self._scalars or self._ranges)

    # -------------------------------------------------------------- arithmetic

    def __add__(self, other: Resources) -> Resources:
        """Sum. Raises `ResourcesError` if both hold the same range value, or a
        name is scalar in one and ranges in the other."""
        if not isinstance(other, Resources):
            return NotImplemented
        if not (other._scalars or other._ranges):
            return self
        if not (self._scalars or self._ranges):
            return other
        scalars = self._scalars
        if other._scalars:
            scalars = scalars.copy()
            for key, milli in other._scalars.items():
                old = scalars.get(key)
                if old is not None:
                    scalars[key] = old + milli
                else:
                    _check_kind(key[0], self._ranges)
                    if key[2]:
                        _check_volume_once(key, self._scalars)
                    scalars[key] = milli
        ranges = self._ranges
        if other._ranges:
            ranges = ranges.copy()
            for key, extra in other._ranges.items():
                name = key[0]
                if key not in ranges:
                    _check_kind(name, self._scalars)
                for key2, have in self._ranges.items():
                    if key2[0] == name and key2 != key and _overlap(have, extra):
                        raise ResourcesError(
                            f"cannot add {_entry_text(key, _ranges_text(extra))}: "
                            f"overlaps {_entry_text(key2, _ranges_text(have))}"
                        )
                have = ranges.get(key)
                ranges[key] = extra if have is None else _merge(have, extra, key)
        return _make(scalars, ranges)

    def __sub__(self, other: Resources) -> Resources:
        """Difference. Raises `ResourcesError` unless ``other <= self``; never
        goes negative."""
        if not isinstance(other, Resources):
            return NotImplemented
        taken = other._scalars
        if not (taken or other._ranges):
            return self
        scalars = self._scalars
        if taken:
            scalars = scalars.copy()
            for key, milli in taken.items():
                have = scalars.get(key, 0)
                left = have - milli
                if left > 0:
                    scalars[key] = left
                elif left == 0:
                    del scalars[key]
                else:
                    raise ResourcesError(
                        f"cannot subtract {_entry_text(key, _scalar_text(milli))}: "
                        f"only {_scalar_text(have)} available"
                    )
        ranges = self._ranges
        if other._ranges:
            ranges = ranges.copy()
            for key, gone in other._ranges.items():
                have = ranges.get(key, ())
                left_ranges = _subtract(have, gone)
                if left_ranges is None:
                    raise ResourcesError(
                        f"cannot subtract {_entry_text(key, _ranges_text(gone))}: "
                        f"only {_ranges_text(have)} available"
                    )
                if left_ranges:
                    ranges[key] = left_ranges
                else:
                    del ranges[key]
        return _make(scalars, ranges)

    def __le__(self, other: Resources) -> bool:
        """Containment: every (name, role) entry of self fits in other's."""
        if not isinstance(other, Resources):
            return NotImplemented
        get = other._scalars.get
        for key, milli in self._scalars.items():
            if get(key, 0) < milli:
                return False
        if self._ranges:
            get_ranges = other._ranges.get
            for key, rs in self._ranges.items():
                have = get_ranges(key)
                if have is None or not _contains(have, rs):
                    return False
        return True

    def contains(self, other: Resources) -> bool:
        """``other <= self``."""
        return other <= self

    # ---------------------------------------------------------------- queries

    def get_milli(self, name: str) -> int:
        """Total of ``name`` over all roles in thousandths (1000 per range value)."""
        total = 0
        for (n, _, _), milli in self._scalars.items():
            if n == name:
                total += milli
        if not total:
            for (n, _, _), rs in self._ranges.items():
                if n == name:
                    total += 1000 * _count(rs)
        return total

    def get(self, name: str) -> float:
        """Total of ``name`` over all roles; for ranges, the number of values."""
        return self.get_milli(name) / 1000

    def ranges(self, name: str) -> list[Range]:
        """Merged, sorted ``(begin, end)`` pairs of ``name`` over all roles."""
        pieces = [r for (n, _, _), rs in self._ranges.items() if n == name for r in rs]
        return list(_canonical(pieces, name)) if pieces else []

    def names(self) -> set[str]:
        return {n for n, _, _ in self._scalars} | {n for n, _, _ in self._ranges}

    def roles(self) -> set[str]:
        return {r for _, r, _ in self._scalars} | {r for _, r, _ in self._ranges}

    def volumes(self) -> dict[str, tuple[str, int]]:
        """Persistent volume id -> (role, milli of disk) for every volume entry."""
        return {v: (r, milli) for (_, r, v), milli in self._scalars.items() if v}

    def without_volumes(self) -> Resources:
        """Everything but the entries of persistent volumes."""
        if not any(v for _, _, v in self._scalars):
            return self
        return _make({k: m for k, m in self._scalars.items() if not k[2]}, self._ranges)

    def scalar_items(self) -> dict[str, int]:
        """Scalar name -> total milli over all roles."""
        totals: dict[str, int] = {}
        for (name, _, _), milli in self._scalars.items():
            totals[name] = totals.get(name, 0) + milli
        return totals

    def reserved(self, role: str) -> Resources:
        """The entries reserved to exactly ``role``."""
        return self._keep(lambda r: r == role)

    def unreserved(self) -> Resources:
        """The entries with role ``"*"``."""
        return self.reserved(UNRESERVED)

    def allocatable_for(self, role: str) -> Resources:
        """What a framework in ``role`` may be offered: unreserved entries, and
        those reserved to ``role`` or to one of its ancestors (``eng`` for
        ``eng/ml``)."""
        allowed = {UNRESERVED, role}
        cut = role.rfind("/")
        while cut > 0:
            role = role[:cut]
            allowed.add(role)
            cut = role.rfind("/")
        return self._keep(allowed.__contains__)

    def flatten(self, role: str = UNRESERVED) -> Resources:
        """The same amounts with every entry moved to ``role`` (volumes dropped:
        a volume's disk becomes plain disk)."""
        scalars: dict[Key, int] = {}
        for (name, _, _), milli in self._scalars.items():
            key = (name, role, "")
            scalars[key] = scalars.get(key, 0) + milli
        pieces: dict[Key, list[Range]] = {}
        for (name, _, _), rs in self._ranges.items():
            pieces.setdefault((name, role, ""), []).extend(rs)
        # Range values never repeat across roles, so merging cannot overlap.
        ranges = {key: _canonical(rs, key[0]) for key, rs in pieces.items()}
        return _make(scalars, ranges)

    def take_ports(self, n: int) -> Resources:
        """The ``n`` lowest port values, keeping their roles, so that
        ``r - r.take_ports(n)`` is what stays free."""
        if n < 0:
            raise ResourcesError(f"cannot take a negative number of ports ({n})")
        pieces = sorted((b, e, key) for key, rs in self._ranges.items() if key[0] == "ports" for b, e in rs)
        taken: dict[Key, list[Range]] = {}
        left = n
        for begin, end, key in pieces:
            if not left:
                break
            end = min(end, begin + left - 1)
            taken.setdefault(key, []).append((begin, end))
            left -= end - begin + 1
        if left:
            raise ResourcesError(f"need {n} ports, only {n - left} available")
        return _make({}, {key: tuple(rs) for key, rs in taken.items()})

    def dominant_share(self, total: Resources) -> float:
        """Largest of self/total over `SHARE_KINDS`, skipping kinds the total lacks."""
        mine = self.scalar_items()
        whole = total.scalar_items()
        share = 0.0
        for kind in SHARE_KINDS:
            denominator = whole.get(kind)
            if denominator:
                share = max(share, mine.get(kind, 0) / denominator)
        return share

    def _keep(self, role_ok: Callable[[str], bool]) -> Resources:
        return _make(
            {k: v for k, v in self._scalars.items() if role_ok(k[1])},
            {k: v for k, v in self._ranges.items() if role_ok(k[1])},
        )


_set = object.__setattr__


_SETTER = Callable[[object, object], None]
_SET_SCALARS: _SETTER = Resources.__dict__["_scalars"].__set__
_SET_RANGES: _SETTER = Resources.__dict__["_ranges"].__set__


def _make(scalars: dict[Key, int], ranges: dict[Key, RangeList],
          _new: Callable[[type], object] = object.__new__,
          _set_scalars: _SETTER = _SET_SCALARS, _set_ranges: _SETTER = _SET_RANGES,
          ) -> Resources:
    # Trusted constructor: the caller hands over dicts that already keep the
    # invariants and that nobody mutates afterwards. The slots' own setters,
    # bound once: `object.__setattr__` looks each one up again (a quarter of
    # the cost of an `a - b`, which the master makes several times a task).
    r = _new(Resources)
    _set_scalars(r, scalars)
    _set_ranges(r, ranges)
    return r  # type: ignore[return-value]


_EMPTY = Resources()


# ------------------------------------------------------------------ parsing


def _parse_entry(text: str) -> Resources:
    match = _ENTRY_RE.fullmatch(text)
    if match is None:
        raise ResourcesError(f"malformed resource {text.strip()!r}: expected name:value or name(role):value")
    name, role, volume, value = match.groups()
    if role is None:
        role = UNRESERVED
    elif not _ROLE_RE.fullmatch(role):
        raise ResourcesError(f"invalid role {role!r} in {text.strip()!r}")
    volume = volume or ""
    _check_volume(name, role, volume)
    key = (name, role, volume)
    if value.startswith("["):
        if name in _SCALAR_ONLY:
            raise ResourcesError(f"{name} is a scalar, got ranges {value!r}")
        rs = _parse_ranges(name, value)
        return _make({}, {key: rs} if rs else {})
    if name in _RANGES_ONLY:
        raise ResourcesError(f"{name} must be written as ranges like [31000-32000], got {value!r}")
    milli = _text_to_milli(name, value)
    return _make({key: milli} if milli else {}, {})


def _parse_ranges(name: str, text: str) -> RangeList:
    if not text.endswith("]"):
        raise ResourcesError(f"{name}: malformed ranges {text!r}, expected [begin-end,...]")
    body = text[1:-1]
    if not body.strip():
        return ()
    pieces = []
    for item in body.split(","):
        match = _RANGE_RE.fullmatch(item)
        if match is None:
            raise ResourcesError(f"{name}: malformed range {item.strip()!r}, expected begin-end")
        begin = int(match[1])
        end = begin if match[2] is None else int(match[2])
        if begin > end:
            raise ResourcesError(f"{name}: range {begin}-{end} has begin > end")
        if end > _MAX_RANGE_VALUE:
            raise ResourcesError(f"{name}: range value {end} is too large")
        pieces.append((begin, end))
    return _canonical(pieces, name)


def _text_to_milli(name: str, text: str) -> int:
    lowered = text.lower().lstrip("+-")
    if lowered in ("nan", "snan", "inf", "infinity"):
        raise ResourcesError(f"{name}: value must be finite, got {text!r}")
    if text.startswith("-") and _NUMBER_RE.fullmatch(text[1:]):
        raise ResourcesError(f"{name}: value must not be negative, got {text!r}")
    if not _NUMBER_RE.fullmatch(text):
        raise ResourcesError(f"{name}: cannot parse value {text!r}")
    return _decimal_to_milli(name, Decimal(text))


def _number_to_milli(name: str, amount: float) -> int:
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise ResourcesError(f"{name}: amount must be a number, got {amount!r}")
    if isinstance(amount, float) and not math.isfinite(amount):
        raise ResourcesError(f"{name}: value must be finite, got {amount!r}")
    if amount < 0:
        raise ResourcesError(f"{name}: value must not be negative, got {amount!r}")
    # repr() is the shortest text that reads back as the same float: 0.1 -> "0.1".
    return _decimal_to_milli(name, Decimal(amount) if isinstance(amount, int) else Decimal(repr(amount)))


def _decimal_to_milli(name: str, amount: Decimal) -> int:
    if amount and amount.adjusted() >= 13:
        raise ResourcesError(f"{name}: value {amount} is too large")
    try:
        milli = int(amount.quantize(_MILLI, context=_DECIMAL).scaleb(3, context=_DECIMAL))
    except InvalidOperation:
        raise ResourcesError(f"{name}: cannot represent value {amount}") from None
    if milli > _MAX_SCALAR_MILLI:
        raise ResourcesError(f"{name}: value {amount} is too large")
    return milli


def is_valid_role(role: object) -> bool:
    """Whether `role` can name a reservation: ``*``, or ``/``-separated segments of
    letters, digits, ``_``, ``.`` and ``-`` (not starting with ``.`` or ``-``)."""
    return isinstance(role, str) and _ROLE_RE.fullmatch(role) is not None


def _check_role(role: str) -> None:
    if not is_valid_role(role):
        raise ResourcesError(f"invalid role {role!r}")


def _check_volume(name: str, role: str, volume: str) -> None:
    if not volume:
        return
    if not _VOLUME_RE.fullmatch(volume):
        raise ResourcesError(f"invalid volume id {volume!r}")
    if name != VOLUME_KIND or role == UNRESERVED:
        raise ResourcesError(f"a persistent volume ({volume}) is made of reserved "
                             f"{VOLUME_KIND}, not {name}({role})")


def _check_volume_once(key: Key, scalars: Mapping[Key, int]) -> None:
    for other in scalars:
        if other[2] == key[2]:
            raise ResourcesError(f"volume {key[2]} cannot be both {_entry_text(other, '...')} "
                                 f"and {_entry_text(key, '...')}")


def _check_scalar_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name):
        raise ResourcesError(f"invalid resource name {name!r}")
    if name in _RANGES_ONLY:
        raise ResourcesError(f"{name} must be written as ranges, not a number")


def _check_kind(name: str, other_kind: Mapping[Key, object]) -> None:
    for n, _, _ in other_kind:
        if n == name:
            raise ResourcesError(f"{name} is used both as a scalar and as ranges")


# ------------------------------------------------------------------ ranges


def _canonical(pieces: Iterable[Range], name: str) -> RangeList:
    """Sort and coalesce adjacent ranges; overlapping ones are an error."""
    out: list[Range] = []
    for begin, end in sorted(pieces):
        if out:
            last_begin, last_end = out[-1]
            if begin <= last_end:
                raise ResourcesError(
                    f"{name}: overlapping ranges {_range_text((last_begin, last_end))} "
                    f"and {_range_text((begin, end))}"
                )
            if begin == last_end + 1:
                out[-1] = (last_begin, end)
                continue
        out.append((begin, end))
    return tuple(out)


def _merge(a: RangeList, b: RangeList, key: Key) -> RangeList:
    try:
        return _canonical(a + b, key[0])
    except ResourcesError:
        raise ResourcesError(
            f"cannot add {_entry_text(key, _ranges_text(b))}: overlaps {_entry_text(key, _ranges_text(a))}"
        ) from None


def _overlap(a: RangeList, b: RangeList) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] < b[j][0]:
            i += 1
        elif b[j][1] < a[i][0]:
            j += 1
        else:
            return True
    return False


def _contains(have: RangeList, want: RangeList) -> bool:
    # `have` is coalesced, so each wanted range must sit inside a single one.
    i = 0
    for begin, end in want:
        while i < len(have) and have[i][1] < begin:
            i += 1
        if i == len(have) or have[i][0] > begin or have[i][1] < end:
            return False
    return True


def _subtract(have: RangeList, gone: RangeList) -> RangeList | None:
    """``have`` minus ``gone``, or None if ``gone`` is not inside ``have``."""
    if not _contains(have, gone):
        return None
    out: list[Range] = []
    j = 0
    for begin, end in have:
        while j < len(gone) and gone[j][0] <= end:
            g_begin, g_end = gone[j]
            if g_begin > begin:
                out.append((begin, g_begin - 1))
            begin = g_end + 1
            j += 1
        if begin <= end:
            out.append((begin, end))
    return tuple(out)


def _count(rs: RangeList) -> int:
    return sum(end - begin + 1 for begin, end in rs)


# ------------------------------------------------------------------ printing


def _sort_key(key: Key) -> tuple[int, str, bool, str, str]:
    name, role, volume = key
    return (_ORDER.get(name, len(_ORDER)), name, role != UNRESERVED, role, volume)


def _entry_text(key: Key, value: str) -> str:
    name, role, volume = key
    if role == UNRESERVED:
        return f"{name}:{value}"
    return f"{name}({role}){{{volume}}}:{value}" if volume else f"{name}({role}):{value}"


def _scalar_text(milli: int) -> str:
    units, frac = divmod(milli, 1000)
    return f"{units}.{frac:03d}".rstrip("0") if frac else str(units)


def _range_text(r: Range) -> str:
    begin, end = r
    return str(begin) if begin == end else f"{begin}-{end}"


def _ranges_text(rs: RangeList) -> str:
    return "[" + ",".join(map(_range_text, rs)) + "]"
