"""Property tests of the wire: whatever bytes arrive, `decode` returns a message or
raises `MessageError` -- nothing else -- and every message it returns survives
`encode` and `decode` again unchanged.

Frames are built from each message type's own annotations (so every type in
`MESSAGE_TYPES` is covered, including types added later), then mutated: a value
somewhere swapped for a nasty one (a bool, a huge or float number, deep nesting, a
lone surrogate...), or the encoded bytes cut, spliced and flipped."""

from __future__ import annotations

import base64
import enum
import json
import types
import typing
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from dyad import messages as m
from dyad.resources import Resources

RESOURCE_TEXTS = ["", "cpus:1", "cpus:0.5;mem:128", "ports:[31000-31005]",
                  "cpus(eng):1;mem:64;disk:10", "cpus:-1", "ports:[5-1]"]


def _optional_inner(tp: Any) -> Any | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner
    return None


def _in_options(field: attrs.Attribute) -> list[Any] | None:
    options = getattr(field.validator, "options", None)
    return sorted(options) if options is not None else None


def shaped(tp: Any) -> st.SearchStrategy[Any]:
    """JSON values of the shape `tp` declares: mostly valid, sometimes not (attrs
    validators and cross-field rules are not modelled, on purpose)."""
    if tp is str:
        return st.text(max_size=12)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-5, 70000)
    if tp is float:
        return st.floats(0, 1e6)
    if tp is bytes:
        return st.binary(max_size=16).map(lambda b: base64.b64encode(b).decode())
    if tp is Resources:
        return st.sampled_from(RESOURCE_TEXTS)
    inner = _optional_inner(tp)
    if inner is not None:
        return st.none() | st.deferred(lambda: shaped(inner))
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return st.lists(st.deferred(lambda: shaped(item)), max_size=2)
    if origin is dict:
        _, value = typing.get_args(tp)
        return st.dictionaries(st.text(max_size=6), st.deferred(lambda: shaped(value)),
                               max_size=2)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(sorted(tp.__members__))
    if attrs.has(tp):
        return _shaped_attrs(tp)
    raise TypeError(f"no strategy for {tp!r}")


def _shaped_attrs(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in attrs.fields(cls):
        options = _in_options(field)
        strategy = st.sampled_from(options) if options else shaped(hints[field.name])
        (required if field.default is attrs.NOTHING else optional)[field.name] = strategy
    return st.fixed_dictionaries(required, optional=optional)


def _frames_of(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return _shaped_attrs(m.MESSAGE_TYPES[name]).map(
        lambda body: {"type": name, "v": m.WIRE_VERSION, "body": body})


envelopes = st.sampled_from(sorted(m.MESSAGE_TYPES)).flatmap(_frames_of)
batches = st.lists(envelopes, min_size=1, max_size=3).map(
    lambda items: {"type": m.BATCH_TYPE, "v": m.WIRE_VERSION, "body": {"messages": items}})

# Values that have escaped decoders before: Python's bool-is-int, numbers past
# float range or the 64-bit range, and containers where scalars belong.
NASTY_VALUES = [True, False, None, 0, -1, 2**63, -(2**63) - 1, 10**30, 1e308, -1e308,
                0.5, "", "x" * 300, [], {}, [[[]]], {"": {}}, "\u00b2", "\U0001f600"]
# Text no JSON encoder writes, spliced in where a value was.
NASTY_TEXT = [b"NaN", b"-Infinity", b"1e999", b"-1e400", b"1" * 4301, b"1" + b"0" * 309,
              b"[" * 1000 + b"]" * 1000, b'"\\ud800"', b'"\\udfff\\ud800"', b"1.0e-99999",
              b'"\\u0000"', b"tru", b"[1,]"]
PLACEHOLDER = "\x00nasty\x00"


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*path, index))
    return found


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replaced(value[head], tuple(rest), new)
    return copy


@st.composite
def value_mutations(draw: st.DrawFn, frames: st.SearchStrategy[Any] = envelopes) -> bytes:
    """A frame with one value (envelope fields included) swapped for a nasty one."""
    envelope = draw(frames)
    path = draw(st.sampled_from(_paths(envelope)))
    if draw(st.booleans()):
        return json.dumps(_replaced(envelope, path, draw(st.sampled_from(NASTY_VALUES)))
                          ).encode()
    text = json.dumps(_replaced(envelope, path, PLACEHOLDER)).encode()
    return text.replace(json.dumps(PLACEHOLDER).encode(), draw(st.sampled_from(NASTY_TEXT)))


@st.composite
def byte_mutations(draw: st.DrawFn, frames: st.SearchStrategy[Any] = envelopes) -> bytes:
    """A frame with a few byte-level edits: cuts, insertions, flips, duplications."""
    data = bytearray(json.dumps(draw(frames)).encode())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["cut", "insert", "flip", "repeat"]))
        if edit == "cut":
            del data[at:at + draw(st.integers(1, 8))]
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4)
                               | st.sampled_from([b"[", b"{", b'"', b"\\", b"\\ud800", b"9e9"]))
        elif edit == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "repeat":
            data[at:at] = data[at:at + draw(st.integers(1, 16))]
    return bytes(data)


def decode_or_reject(frame: bytes) -> m.Message | None:
    """The property itself: a Message, or MessageError with a reason (any other
    exception fails the test), and a decoded message round-trips."""
    try:
        message = m.decode(frame)
    except m.MessageError as exc:
        assert exc.reason and len(exc.reason) < 600
        return None
    assert m.decode(m.encode(message)) == message
    return message


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_arbitrary_bytes(frame: bytes) -> None:
    decode_or_reject(frame)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes.map(lambda e: json.dumps(e).encode()))
def test_shaped_frames_decode_or_are_rejected(frame: bytes) -> None:
    decode_or_reject(frame)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(value_mutations())
def test_frames_with_a_nasty_value(frame: bytes) -> None:
    decode_or_reject(frame)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(byte_mutations())
def test_frames_with_byte_edits(frame: bytes) -> None:
    decode_or_reject(frame)


@pytest.mark.parametrize("name", sorted(m.MESSAGE_TYPES))
def test_every_type_is_reached_valid(name: str) -> None:
    """The generators are not only producing rejects: each type decodes somewhere."""
    frame = find(_frames_of(name).map(lambda e: json.dumps(e).encode()),
                 lambda f: decode_or_reject(f) is not None,
                 settings=settings(max_examples=2000, database=None,
                                   phases=[Phase.generate]))
    assert m.decode(frame).TYPE == name


def _both_builders(frame: bytes) -> None:
    """The compiled builder (`dyad.codec._fast_for`) never takes what the careful
    one refuses, and builds the same value when both take it: `from_json` then
    gives every reason from the careful one."""
    from dyad import bounded_json, codec
    try:
        envelope = bounded_json.loads(frame, m.WIRE_LIMITS)
    except bounded_json.JsonInputError:
        return
    if not isinstance(envelope, dict) or not isinstance(envelope.get("type"), str) \
            or envelope["type"] not in m.MESSAGE_TYPES:
        return
    cls, body = m.MESSAGE_TYPES[envelope["type"]], envelope.get("body", {})
    try:
        fast = codec._fast_for(cls)(body)
    except Exception:
        return  # refused: the careful one decides (and says why)
    assert codec._structurer_for(cls)(body, "") == fast


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(value_mutations() | envelopes.map(lambda e: json.dumps(e).encode()))
def test_the_compiled_builder_is_never_less_strict(frame: bytes) -> None:
    _both_builders(frame)


def _typed_against_careful(frame: bytes) -> None:
    """msgspec's typed decoding (`dyad.messages._decode_typed`, taken when the
    text limits hold) never takes a frame the careful path refuses, and builds
    the same message when both take it, batches included."""
    from dyad import bounded_json
    if not bounded_json.within_text_limits(frame, m.WIRE_LIMITS):
        return
    try:
        typed = m._decode_typed(frame)
    except Exception:
        return  # refused: the careful path decides (and says why)
    careful = m._from_envelope(bounded_json.loads(frame, m.WIRE_LIMITS))
    assert careful == typed


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(value_mutations() | value_mutations(batches) | byte_mutations(batches)
       | (envelopes | batches).map(lambda e: json.dumps(e).encode()))
def test_the_typed_decoder_is_never_less_strict(frame: bytes) -> None:
    _typed_against_careful(frame)


@pytest.mark.parametrize("name", sorted(m.MESSAGE_TYPES))
def test_every_type_has_a_typed_decoder(name: str) -> None:
    """No message falls back to the slow path for want of a mirror (a field type
    msgspec cannot check as the careful builder does)."""
    from dyad.codec import typed_decoder
    assert typed_decoder(m.MESSAGE_TYPES[name]) is not None
