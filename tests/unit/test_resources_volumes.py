"""Persistent volumes inside `Resources` (``disk(role){id}:size``): the arithmetic
stays exact and a volume's disk never mixes with plain disk; checked against a
model with hypothesis. Also the wire types of dyad/volumes.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.resources import Resources, ResourcesError
from dyad.volumes import DynamicResources, PersistentVolume, newer, problem, total_of
from master.allocator.hierarchical import _cut

ROLES = ("*", "eng", "eng/ml")
VOLUMES = ("", "v1", "v2", "data.0")

# (name, role, volume) -> milli; volumes only on reserved disk.
Model = dict[tuple[str, str, str], int]

KEYS = st.one_of(
    st.tuples(st.sampled_from(("cpus", "disk")), st.sampled_from(ROLES), st.just("")),
    st.tuples(st.just("disk"), st.sampled_from(ROLES[1:]), st.sampled_from(VOLUMES[1:])),
)
MODELS = st.dictionaries(KEYS, st.integers(1, 10**6), max_size=5).filter(
    lambda m: len([k for k in m if k[2]]) == len({k[2] for k in m if k[2]}))  # ids are unique


def text(key: tuple[str, str, str], milli: int) -> str:
    name, role, volume = key
    amount = f"{milli // 1000}.{milli % 1000:03d}"
    if role == "*":
        return f"{name}:{amount}"
    return f"{name}({role}){{{volume}}}:{amount}" if volume else f"{name}({role}):{amount}"


def build(model: Model) -> Resources:
    return Resources.parse(";".join(text(k, m) for k, m in reversed(model.items())))


def merged(a: Model, b: Model) -> Model:
    return {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}


@settings(max_examples=40)
@given(MODELS)
def test_volumes_read_back_and_count_as_reserved_disk(model: Model) -> None:
    r = build(model)
    assert Resources.parse(str(r)) == r and hash(Resources.parse(r.to_wire())) == hash(r)
    assert r.get_milli("disk") == sum(m for (n, _, _), m in model.items() if n == "disk")
    assert r.volumes() == {v: (role, m) for (_, role, v), m in model.items() if v}
    assert r.without_volumes() == build({k: m for k, m in model.items() if not k[2]})
    for role in ROLES:
        assert r.reserved(role) == build({k: m for k, m in model.items() if k[1] == role})
    flat = r.flatten()
    assert not flat.volumes() and flat.scalar_items() == r.scalar_items()


def test_a_volume_id_is_in_one_entry_only() -> None:
    with pytest.raises(ResourcesError, match="volume v1 cannot be both"):
        Resources.parse("disk(eng){v1}:1;disk(ops){v1}:1")


@settings(max_examples=40)
@given(MODELS, MODELS)
def test_arithmetic_matches_the_model(x: Model, y: Model) -> None:
    ids = {k[2]: k for k in x if k[2]}
    if any(ids.get(k[2], k) != k for k in y if k[2]):
        return  # the same volume in two roles: refused, as tested above
    a, b = build(x), build(y)
    assert a + b == b + a == build(merged(x, y))
    assert (a + b) - b == a
    assert (b <= a) == all(m <= x.get(k, 0) for k, m in y.items())
    if b <= a:
        assert (a - b) + b == a
    else:
        with pytest.raises(ResourcesError, match="cannot subtract"):
            a - b


@settings(max_examples=40)
@given(MODELS, st.sampled_from(ROLES[1:]), st.sampled_from(VOLUMES[1:]), st.integers(1, 10**5))
def test_create_then_destroy_gives_back_the_same_resources(model: Model, role: str, volume: str,
                                                           milli: int) -> None:
    """What CREATE and DESTROY do to an offer (and to the allocator's agent)."""
    plain = Resources.scalar_milli("disk", milli, role)
    made = Resources.scalar_milli("disk", milli, role, volume)
    if volume in build(model).volumes():
        return  # that volume id is already there
    r = build(model) + plain
    created = r - plain + made
    assert created.flatten() == r.flatten()  # the allocator's transform holds amounts
    assert created.get_milli("disk") == r.get_milli("disk")
    assert created - made + plain == r
    with pytest.raises(ResourcesError):
        created - made - made  # a volume is there once


def test_plain_disk_never_takes_a_volumes_disk() -> None:
    r = Resources.parse("disk(eng){v1}:64")
    assert not Resources.parse("disk(eng):1") <= r
    with pytest.raises(ResourcesError, match=r"cannot subtract disk\(eng\):64"):
        r - Resources.parse("disk(eng):64")


@pytest.mark.parametrize("bad,message", [
    ("disk{v1}:64", "reserved disk"),
    ("cpus(eng){v1}:1", "reserved disk"),
    ("disk(eng){/x}:1", "invalid volume id"),
    ("ports(eng){v1}:[1-2]", "reserved disk"),
])
def test_volumes_only_on_reserved_disk(bad: str, message: str) -> None:
    with pytest.raises(ResourcesError, match=message):
        Resources.parse(bad)


@settings(max_examples=40)
@given(MODELS, st.dictionaries(st.just("disk"), st.integers(0, 10**6)))
def test_the_allocators_quota_cut_keeps_volumes_whole(model: Model, room: dict[str, int]) -> None:
    r = build(model)
    kept = _cut(r, room, {})
    assert kept <= r
    for volume, entry in kept.volumes().items():
        assert r.volumes()[volume] == entry
    if "disk" in room:
        assert kept.get_milli("disk") <= room["disk"]


# ------------------------------------------------------------------ wire types


def test_a_volume_is_its_disk_entry() -> None:
    volume = PersistentVolume(id="v1", container_path="data", size=64.5, role="eng")
    assert str(volume.resources) == "disk(eng){v1}:64.5"


@pytest.mark.parametrize("kwargs", [
    {"id": "../x"}, {"id": ""}, {"role": "*"}, {"role": "bad role"}, {"size": 0}, {"mode": "RX"},
    {"container_path": "/abs"}, {"container_path": "a/../b"}, {"container_path": ""},
    {"container_path": "a//b"}, {"container_path": "a:b"},
])
def test_bad_volumes_do_not_construct(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PersistentVolume(**{"id": "v1", "container_path": "d", "size": 1, "role": "eng", **kwargs})


def test_newer_and_problem() -> None:
    one = DynamicResources(version=1)
    two = DynamicResources(version=2)
    assert newer(one, two) is two and newer(two, one) is two and newer(one, None) is one
    assert newer(None, None) == DynamicResources()
    static = Resources.parse("cpus:4;disk:100")
    volume = PersistentVolume(id="v1", container_path="d", size=64, role="eng")
    good = DynamicResources(version=1, reservations=Resources.parse("disk(eng){v1}:64"),
                            volumes=[volume])
    assert problem(static, good) == ""
    assert total_of(static, good) == Resources.parse("cpus:4;disk:36;disk(eng){v1}:64")
    assert "do not fit" in problem(static, DynamicResources(
        reservations=Resources.parse("disk(eng):101")))
    assert "not reserved" in problem(static, DynamicResources(volumes=[volume]))
    assert "no volume" in problem(static, DynamicResources(
        reservations=Resources.parse("disk(eng){v1}:64")))
    assert "twice" in problem(static, DynamicResources(
        reservations=Resources.parse("disk(eng){v1}:64"), volumes=[volume, volume]))
