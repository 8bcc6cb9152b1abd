"""Tests for dyad.resources: parsing, canonical text, exact arithmetic, roles."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.resources import SHARE_KINDS, Resources, ResourcesError, is_valid_role

ROLES = ("*", "eng", "eng/ml", "eng/ml/x", "ops")
SCALAR_NAMES = ("cpus", "mem", "disk", "gpus", "zeta")
RANGE_NAMES = ("ports", "alpha")
RANGE_UNIVERSE = 64

# A model: (name, role) -> milli for scalars, (name, role) -> set of ints for ranges.
Model = tuple[dict[tuple[str, str], int], dict[tuple[str, str], frozenset[int]]]


def to_ranges(values: set[int] | frozenset[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ints, written independently of the module."""
    out: list[list[int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return [(b, e) for b, e in out]


def to_set(ranges: list[tuple[int, int]]) -> set[int]:
    return {v for b, e in ranges for v in range(b, e + 1)}


def entry(name: str, role: str, value: str) -> str:
    return f"{name}:{value}" if role == "*" else f"{name}({role}):{value}"


def build(model: Model) -> Resources:
    """Build through the public text form, in a shuffled-looking (reverse) order."""
    scalars, ranges = model
    parts = [entry(n, r, f"{m // 1000}.{m % 1000:03d}") for (n, r), m in scalars.items()]
    for (n, r), values in ranges.items():
        body = ",".join(f"{b}-{e}" for b, e in to_ranges(values))
        parts.append(entry(n, r, f"[{body}]"))
    return Resources.parse(" ; ".join(reversed(parts)))


SCALAR_MAPS = st.dictionaries(
    st.tuples(st.sampled_from(SCALAR_NAMES), st.sampled_from(ROLES)), st.integers(0, 10**7), max_size=4
)
RANGE_PIECES = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(ROLES), st.integers(0, 2**RANGE_UNIVERSE - 1)), max_size=4
)
RANGE_NAME_SETS = st.sets(st.sampled_from(RANGE_NAMES))


@st.composite
def models(draw: st.DrawFn, count: int = 1) -> list[Model]:
    """`count` (at most 3) models whose range values never collide (per name, over roles)."""
    result: list[Model] = [(draw(SCALAR_MAPS), {}) for _ in range(count)]
    for name in draw(RANGE_NAME_SETS):
        # Each piece is a bitmask over the universe: cheap to draw, and masking
        # out values already claimed keeps the pieces disjoint.
        claimed = 0
        for owner, role, mask in draw(RANGE_PIECES):
            mask &= ~claimed
            claimed |= mask
            values = {v for v in range(RANGE_UNIVERSE) if mask >> v & 1}
            if values:
                ranges = result[owner % count][1]
                ranges[(name, role)] = ranges.get((name, role), frozenset()) | values
    return result


def resources() -> st.SearchStrategy[Resources]:
    return models(1).map(lambda ms: build(ms[0]))


def disjoint(count: int) -> st.SearchStrategy[list[Resources]]:
    return models(count).map(lambda ms: [build(m) for m in ms])


# ------------------------------------------------------------------ examples


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("   ", ""),
        ("cpus:1;mem:128", "cpus:1;mem:128"),
        ("mem:128;cpus:0.5", "cpus:0.5;mem:128"),
        ("cpus:0.1", "cpus:0.1"),
        ("cpus:1.250", "cpus:1.25"),
        ("cpus:0.0005", "cpus:0.001"),
        ("cpus:0.00049", ""),
        ("cpus:1e-3", "cpus:0.001"),
        ("cpus:0", ""),
        ("cpus:1;cpus:2", "cpus:3"),
        (" cpus : 1 ;  mem:2 ; ", "cpus:1;mem:2"),
        ("ports:[31000-31005,32000-32000]", "ports:[31000-31005,32000]"),
        ("ports:[32000,31000-31005]", "ports:[31000-31005,32000]"),
        ("ports:[1-2,3-4]", "ports:[1-4]"),
        ("ports:[1-2];ports:[3-3]", "ports:[1-3]"),
        ("ports:[ 1 - 2 , 5 ]", "ports:[1-2,5]"),
        ("ports:[]", ""),
        ("cpus(*):1", "cpus:1"),
        (
            "zeta:1;ports:[1];gpus:1;disk:1;alpha:[3-4];mem:1;cpus(ops):1;cpus(eng):1;cpus:1",
            "cpus:1;cpus(eng):1;cpus(ops):1;mem:1;disk:1;gpus:1;alpha:[3-4];ports:[1];zeta:1",
        ),
        ("cpus(eng/ml):2;cpus(eng):1", "cpus(eng):1;cpus(eng/ml):2"),
    ],
)
def test_parse_canonical_text(text: str, canonical: str) -> None:
    r = Resources.parse(text)
    assert str(r) == canonical
    assert r.to_wire() == canonical
    assert Resources.from_wire(canonical) == r


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cpus", "malformed resource 'cpus'"),
        ("cpus=1", "malformed resource"),
        (":1", "malformed resource"),
        ("cpus(eng:1", "malformed resource"),
        ("cpus():1", "invalid role ''"),
        ("cpus(eng//ml):1", "invalid role 'eng//ml'"),
        ("cpus(/eng):1", "invalid role"),
        ("cpus(..):1", "invalid role"),
        ("cpus:-1", "must not be negative"),
        ("cpus:-0.5", "must not be negative"),
        ("cpus:nan", "must be finite"),
        ("cpus:inf", "must be finite"),
        ("cpus:-Infinity", "must be finite"),
        ("cpus:abc", "cannot parse value 'abc'"),
        ("cpus:1 2", "cannot parse value"),
        ("cpus:0x10", "cannot parse value"),
        ("cpus:", "cannot parse value ''"),
        ("cpus:1e20", "too large"),
        ("cpus:{1}", "cannot parse value"),
        ("cpus:[1-2]", "cpus is a scalar"),
        ("ports:5", "ports must be written as ranges"),
        ("ports:[5-3]", "range 5-3 has begin > end"),
        ("ports:[1-5,3-7]", "overlapping ranges 1-5 and 3-7"),
        ("ports:[1-5,5]", "overlapping ranges"),
        ("ports:[1-2", "malformed ranges"),
        ("ports:[1-2]x", "malformed ranges"),
        ("ports:[a-b]", "malformed range 'a-b'"),
        ("ports:[-1-2]", "malformed range"),
        ("ports:[1,,2]", "malformed range ''"),
        ("ports:[1-99999999999999999999999]", "malformed range"),
        ("ports:[1-18446744073709551616]", "too large"),
        ("ports:[1-5];ports:[5-6]", "overlaps"),
        ("ports:[1-5];ports(eng):[3]", "cannot add ports(eng):[3]: overlaps ports:[1-5]"),
        ("foo:1;foo:[1]", "foo is used both as a scalar and as ranges"),
        ("foo:[1];foo(eng):1", "foo is used both as a scalar and as ranges"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ResourcesError, match=re.escape(message)):
        Resources.parse(text)


def test_error_is_value_error() -> None:
    assert issubclass(ResourcesError, ValueError)
    with pytest.raises(ResourcesError, match="must be text"):
        Resources.parse(None)  # type: ignore[arg-type]


def test_of_builds_unreserved_scalars() -> None:
    assert Resources.of(cpus=1, mem=128) == Resources.parse("cpus:1;mem:128")
    assert Resources.of(cpus=0.1).get_milli("cpus") == 100
    assert Resources.of(cpus=1e-5, mem=0) == Resources()
    assert Resources.of(gpus=2.0005).get_milli("gpus") == 2001


@pytest.mark.parametrize(
    ("amounts", "message"),
    [
        ({"cpus": -1}, "must not be negative"),
        ({"cpus": float("nan")}, "must be finite"),
        ({"cpus": float("inf")}, "must be finite"),
        ({"cpus": True}, "must be a number"),
        ({"cpus": "1"}, "must be a number"),
        ({"ports": 3}, "ports must be written as ranges"),
        ({"cpus": 1e13}, "too large"),
    ],
)
def test_of_errors(amounts: dict[str, object], message: str) -> None:
    with pytest.raises(ResourcesError, match=message):
        Resources.of(**amounts)  # type: ignore[arg-type]


def test_accessors() -> None:
    r = Resources.parse("cpus:1;cpus(eng):0.5;mem:128;ports:[10-12];ports(eng):[20-21,30]")
    assert r.get("cpus") == 1.5
    assert r.get_milli("cpus") == 1500
    assert r.get("ports") == 6.0
    assert r.get("disk") == 0.0
    assert r.ranges("ports") == [(10, 12), (20, 21), (30, 30)]
    assert r.ranges("nope") == []
    assert r.names() == {"cpus", "mem", "ports"}
    assert r.roles() == {"*", "eng"}
    assert r.scalar_items() == {"cpus": 1500, "mem": 128000}
    assert r.reserved("eng") == Resources.parse("cpus(eng):0.5;ports(eng):[20-21,30]")
    assert r.unreserved() == Resources.parse("cpus:1;mem:128;ports:[10-12]")
    assert r.flatten() == Resources.parse("cpus:1.5;mem:128;ports:[10-12,20-21,30]")
    assert r.flatten("ops") == Resources.parse("cpus(ops):1.5;mem(ops):128;ports(ops):[10-12,20-21,30]")


def test_value_protocol() -> None:
    r = Resources.parse("cpus:1;ports:[1-3]")
    assert r == Resources.parse("ports:[1,2,3];cpus:1.000")
    assert hash(r) == hash(Resources.parse("ports:[1,2,3];cpus:1.000"))
    assert len({r, Resources.parse("cpus:1;ports:[1-3]"), Resources()}) == 2
    assert r != "cpus:1;ports:[1-3]"
    assert bool(r) and not r.is_empty()
    assert not Resources() and Resources().is_empty()
    assert repr(r) == "Resources.parse('cpus:1;ports:[1-3]')"
    assert pickle.loads(pickle.dumps(r)) == r
    with pytest.raises(AttributeError):
        r._scalars = {}  # type: ignore[misc]


def test_subtract_reports_what_is_missing() -> None:
    a = Resources.parse("cpus:1;ports:[10-20]")
    with pytest.raises(ResourcesError, match=r"cannot subtract cpus:2: only 1 available"):
        a - Resources.parse("cpus:2")
    with pytest.raises(ResourcesError, match=r"cannot subtract cpus\(eng\):1: only 0 available"):
        a - Resources.parse("cpus(eng):1")
    with pytest.raises(ResourcesError, match=r"cannot subtract ports:\[20-21\]: only \[10-20\] available"):
        a - Resources.parse("ports:[20-21]")
    assert a - a == Resources()
    assert a - Resources.parse("ports:[12-13]") == Resources.parse("cpus:1;ports:[10-11,14-20]")


def test_add_rejects_mixed_kinds_and_doubled_ports() -> None:
    with pytest.raises(ResourcesError, match="both as a scalar and as ranges"):
        Resources.parse("alpha:1") + Resources.parse("alpha(eng):[1]")
    with pytest.raises(ResourcesError, match="overlaps"):
        Resources.parse("ports:[1-5]") + Resources.parse("ports:[5]")


def test_operators_reject_other_types() -> None:
    r = Resources.parse("cpus:1")
    with pytest.raises(TypeError):
        r + 1  # type: ignore[operator]
    with pytest.raises(TypeError):
        r - "cpus:1"  # type: ignore[operator]
    with pytest.raises(TypeError):
        r <= 1  # type: ignore[operator]


def test_take_ports() -> None:
    r = Resources.parse("cpus:1;ports:[31005-31006,40000];ports(eng):[31000-31002]")
    assert r.take_ports(0) == Resources()
    assert r.take_ports(2) == Resources.parse("ports(eng):[31000-31001]")
    assert r.take_ports(4) == Resources.parse("ports(eng):[31000-31002];ports:[31005]")
    assert r.take_ports(6) == Resources.parse("ports(eng):[31000-31002];ports:[31005-31006,40000]")
    with pytest.raises(ResourcesError, match="need 7 ports, only 6 available"):
        r.take_ports(7)
    with pytest.raises(ResourcesError, match="negative"):
        r.take_ports(-1)


def test_allocatable_for_follows_role_ancestry() -> None:
    r = Resources.parse(
        "cpus:1;cpus(eng):2;cpus(eng/ml):4;cpus(eng/ml/x):8;cpus(engineering):16;cpus(ops):32;ports(eng):[1-2]"
    )
    assert r.allocatable_for("eng/ml").get("cpus") == 7
    assert r.allocatable_for("eng/ml").ranges("ports") == [(1, 2)]
    assert r.allocatable_for("eng").get("cpus") == 3
    assert r.allocatable_for("engineering").get("cpus") == 17
    assert r.allocatable_for("eng/ml/x").get("cpus") == 15
    assert r.allocatable_for("ops/a").get("cpus") == 33
    assert r.allocatable_for("*") == r.unreserved()


def test_dominant_share() -> None:
    total = Resources.parse("cpus:10;mem:1000;disk:100;ports:[1-10]")
    assert Resources.parse("cpus:1;mem:500").dominant_share(total) == 0.5
    assert Resources.parse("cpus(eng):5;cpus:1;mem:10").dominant_share(total) == 0.6
    # gpus: zero total is ignored; ports never count.
    assert Resources.parse("gpus:1;ports:[1-10]").dominant_share(total) == 0.0
    assert Resources().dominant_share(total) == 0.0
    assert Resources.parse("cpus:1").dominant_share(Resources()) == 0.0


def test_many_tenths_return_exactly() -> None:
    start = Resources.parse("cpus:1;mem:256")
    step = Resources.parse("cpus:0.1;mem:0.001")
    r = start
    for _ in range(5000):
        r = r + step
    assert r.get("cpus") == 501.0
    assert r.get_milli("mem") == 261000
    for _ in range(5000):
        r = r - step
    assert r == start
    assert str(r) == "cpus:1;mem:256"
    tenth = Resources.of(cpus=0.1)
    assert (tenth + tenth + tenth).get("cpus") == 0.3


# ------------------------------------------------------------------ properties


@settings(max_examples=50)
@given(models(1))
def test_text_round_trip_matches_model(ms: list[Model]) -> None:
    scalars, ranges = ms[0]
    r = build(ms[0])
    assert Resources.parse(str(r)) == r
    assert Resources.from_wire(r.to_wire()) == r
    assert hash(Resources.parse(str(r))) == hash(r)
    for name in SCALAR_NAMES:
        assert r.get_milli(name) == sum(m for (n, _), m in scalars.items() if n == name)
    for name in RANGE_NAMES:
        union = set().union(*(v for (n, _), v in ranges.items() if n == name))
        assert r.ranges(name) == to_ranges(union)
        assert r.get(name) == float(len(union))
    assert r.roles() == {role for (_, role), m in scalars.items() if m} | {role for _, role in ranges}


@settings(max_examples=40)
@given(disjoint(2))
def test_add_then_subtract(rs: list[Resources]) -> None:
    a, b = rs
    assert (a + b) - b == a
    assert (a + b) - a == b
    assert a <= a + b and b <= a + b
    assert (a + b).contains(a)
    assert a - a == Resources()
    assert a + Resources() == a == Resources() + a


@settings(max_examples=40)
@given(disjoint(3))
def test_add_commutes_and_associates(rs: list[Resources]) -> None:
    a, b, c = rs
    assert a + b == b + a
    assert hash(a + b) == hash(b + a)
    assert (a + b) + c == a + (b + c)
    assert str((a + b) + c) == str(c + (b + a))


def model_contains(big: Model, small: Model) -> bool:
    return all(m <= big[0].get(k, 0) for k, m in small[0].items()) and all(
        v <= big[1].get(k, frozenset()) for k, v in small[1].items()
    )


@settings(max_examples=40)
@given(models(1), models(1))
def test_contains_matches_model(x: list[Model], y: list[Model]) -> None:
    a, b = build(x[0]), build(y[0])
    assert (b <= a) == model_contains(x[0], y[0])
    assert a.contains(b) == (b <= a)
    assert a >= b if b <= a else not a >= b


@settings(max_examples=40)
@given(disjoint(2), resources(), st.booleans())
def test_subtract_raises_iff_not_contained(parts: list[Resources], other: Resources, part: bool) -> None:
    a = parts[0] + parts[1]
    b = parts[0] if part else other
    if b <= a:
        assert (a - b) + b == a
        assert a.contains(b)
    else:
        with pytest.raises(ResourcesError, match="cannot subtract"):
            a - b


range_lists = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=8,
)


@settings(max_examples=80)
@given(range_lists, range_lists)
def test_ranges_match_set_model(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> None:
    def text(pieces: list[tuple[int, int]]) -> str:
        return "ports:[" + ",".join(f"{b}-{e}" for b, e in pieces) + "]"

    def parse_or_none(pieces: list[tuple[int, int]]) -> Resources | None:
        overlapping = sum(e - b + 1 for b, e in pieces) != len(to_set(pieces))
        if overlapping:
            with pytest.raises(ResourcesError, match="overlapping"):
                Resources.parse(text(pieces))
            return None
        return Resources.parse(text(pieces))

    a, b = parse_or_none(xs), parse_or_none(ys)
    if a is None or b is None:
        return
    sa, sb = to_set(xs), to_set(ys)
    assert a.ranges("ports") == to_ranges(sa)
    assert (b <= a) == (sb <= sa)
    if sa & sb:
        with pytest.raises(ResourcesError, match="overlaps"):
            a + b
    else:
        assert (a + b).ranges("ports") == to_ranges(sa | sb)
    if sb <= sa:
        assert (a - b).ranges("ports") == to_ranges(sa - sb)
    else:
        with pytest.raises(ResourcesError):
            a - b
    for n in range(len(sa) + 2):
        if n <= len(sa):
            assert to_set(a.take_ports(n).ranges("ports")) == set(sorted(sa)[:n])
        else:
            with pytest.raises(ResourcesError):
                a.take_ports(n)


@settings(max_examples=40)
@given(resources(), st.sampled_from(ROLES + ("eng/mlx", "engx", "ops/y")))
def test_allocatable_for_is_role_ancestry(r: Resources, role: str) -> None:
    got = r.allocatable_for(role)
    assert got <= r
    expected = Resources()
    for held in r.roles():
        if held == "*" or held == role or role.startswith(held + "/"):
            expected = expected + r.reserved(held)
    assert got == expected
    assert got + (r - got) == r


@settings(max_examples=40)
@given(disjoint(2))
def test_dominant_share_is_max_ratio(rs: list[Resources]) -> None:
    used, free = rs
    total = used + free
    share = used.dominant_share(total)
    ratios = [used.get_milli(k) / total.get_milli(k) for k in SHARE_KINDS if total.get_milli(k)]
    assert share == max(ratios, default=0.0)
    assert 0.0 <= share <= 1.0
    assert used.flatten().dominant_share(total) == share


# ------------------------------------------- constructors from numbers and roles

role_names = st.sampled_from(ROLES) | st.from_regex(
    r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,6}(/[A-Za-z0-9_][A-Za-z0-9_.\-]{0,6}){0,2}", fullmatch=True)


@settings(max_examples=100)
@given(st.sampled_from(["cpus", "mem", "disk", "gpus", "custom.x"]),
       st.integers(0, 10**12) | st.floats(0, 10**9, allow_nan=False), role_names)
def test_scalar_constructors_match_parse(name: str, amount: float, role: str) -> None:
    text = f"{name}({role}):{amount!r}"
    assert Resources.scalar(name, amount, role) == Resources.parse(text)
    milli = Resources.parse(text).get_milli(name)
    assert Resources.scalar_milli(name, milli, role) == Resources.parse(text)
    assert Resources.scalar(name, amount) == Resources.parse(f"{name}:{amount!r}")


@settings(max_examples=100)
@given(range_lists, role_names)
def test_from_ranges_matches_parse(pieces: list[tuple[int, int]], role: str) -> None:
    text = f"ports({role}):[" + ",".join(f"{b}-{e}" for b, e in pieces) + "]"
    try:
        expected = Resources.parse(text)
    except ResourcesError:
        with pytest.raises(ResourcesError, match="overlapping"):
            Resources.from_ranges("ports", pieces, role)
        return
    assert Resources.from_ranges("ports", pieces, role) == expected


@settings(max_examples=100)
@given(st.text(max_size=12) | role_names)
def test_is_valid_role_matches_parse(role: str) -> None:
    try:
        Resources.parse(f"cpus({role}):1")
        parses = "(" not in role and ")" not in role and role == role.strip()
    except ResourcesError:
        parses = False
    assert is_valid_role(role) == parses


@pytest.mark.parametrize(("call", "message"), [
    (lambda: Resources.scalar("ports", 2), "must be written as ranges"),
    (lambda: Resources.scalar("cpus", -1), "must not be negative"),
    (lambda: Resources.scalar("cpus", float("inf")), "finite"),
    (lambda: Resources.scalar("cpus", 1, "no good"), "invalid role"),
    (lambda: Resources.scalar("9x", 1), "invalid resource name"),
    (lambda: Resources.scalar_milli("cpus", 1.5), "whole number"),  # type: ignore[arg-type]
    (lambda: Resources.scalar_milli("cpus", 10**16), "out of range"),
    (lambda: Resources.from_ranges("cpus", [(1, 2)]), "is a scalar"),
    (lambda: Resources.from_ranges("ports", [(5, 2)]), "invalid range"),
    (lambda: Resources.from_ranges("ports", [(1, 2**64)]), "invalid range"),
])
def test_constructor_errors(call: object, message: str) -> None:
    with pytest.raises(ResourcesError, match=message):
        call()  # type: ignore[operator]
