"""`dyad.bounded_json`: everything within the limits parses as `json.loads` does;
everything outside them is refused with a reason, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from dyad.bounded_json import JsonInputError, JsonLimits, loads

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30)


@given(json_values)
def test_values_within_the_limits_parse_as_json_does(value: object) -> None:
    text = json.dumps(value)
    assert loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("data, reason", [
    (b"[" * 1000 + b"]" * 1000, "nested deeper"),
    (b'{"type":"acknowledge","v":' + b"1" * 4301 + b',"body":{}}', "digits"),
    (b'{"weight": 1' + b"0" * 309 + b"}", "digits"),
    (b"1e999", "out of range"),
    (b"[NaN]", "not a JSON number"),
    (b'{"id": "\\ud800"}', "lone surrogate"),
    (b"\xff\xfe", "not UTF-8"),
    (b"{", "not JSON"),
])
def test_known_bad_inputs_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(JsonInputError, match=reason):
        loads(data)


def test_size_and_string_limits() -> None:
    limits = JsonLimits(max_bytes=100, max_string_chars=10)
    with pytest.raises(JsonInputError, match="bytes exceeds"):
        loads(b" " * 101, limits)
    with pytest.raises(JsonInputError, match="string of 11"):
        loads(b'["' + b"a" * 11 + b'"]', limits)
    assert loads(b'["\\ud83d\\ude00"]') == ["\U0001f600"]


@given(st.binary(max_size=200))
def test_arbitrary_bytes_parse_or_raise_json_input_error(data: bytes) -> None:
    try:
        loads(data)
    except JsonInputError:
        pass


@pytest.mark.parametrize("opener, closer", [(b"[", b"]"), (b'{"k":', b"}")])
def test_depth_limit_is_exact(opener: bytes, closer: bytes) -> None:
    limits = JsonLimits(max_depth=5)
    assert loads(opener * 5 + b"1" + closer * 5, limits) is not None
    with pytest.raises(JsonInputError, match="nested deeper than 5 levels"):
        loads(opener * 6 + b"1" + closer * 6, limits)
    # Many shallow containers are not depth: a wide frame passes.
    assert len(loads(b"[" + b",".join([b'{"a":[1]}'] * 100) + b"]", limits)) == 100


def _outcome(parse: object, data: bytes) -> object:
    try:
        return ("value", parse(data, JsonLimits(max_depth=6, max_number_chars=12)))
    except JsonInputError as exc:
        return ("refused", exc.reason)


nasty_texts = st.sampled_from([
    b"NaN", b"1e999", b"-1e400", b"1" * 13, b"1.0e-99999", b'"\\ud800"', b'"\\udfff\\ud800"',
    b'"\\ud83d\\ude00"', b"[" * 7 + b"]" * 7, b"\xff", b"[1,]", b"01", b"-0", b'"\\u0000"'])


@given(json_values, nasty_texts, st.integers(0, 40))
def test_the_fast_parse_agrees_with_the_careful_one(value: object, nasty: bytes,
                                                     at: int) -> None:
    """msgspec parses bytes first; whatever it gives must be what the careful
    parse gives, and whatever it refuses the careful one refuses with its reason."""
    from dyad.bounded_json import _careful
    for data in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()):
        spliced = data[:at] + nasty + data[at:]
        for frame in (data, spliced, nasty):
            assert _outcome(loads, frame) == _outcome(_careful, frame)


@given(st.binary(max_size=200))
def test_the_fast_parse_agrees_on_arbitrary_bytes(data: bytes) -> None:
    from dyad.bounded_json import _careful
    assert _outcome(loads, data) == _outcome(_careful, data)
