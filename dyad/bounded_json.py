"""JSON from strangers, with limits: the one parser every boundary uses.

`json.loads` on untrusted bytes has three ways to escape a handler that catches
only `ValueError`: `RecursionError` from deep nesting, `ValueError` (not a
`JSONDecodeError`) from integers beyond Python's 4,300-digit conversion limit,
and `OverflowError` later, when a float such as `1e999` or a 309-digit integer
meets arithmetic. `loads` turns every one of them into `JsonInputError` with a
reason, and enforces limits a sender cannot talk its way past:

- `max_bytes`: checked before parsing;
- `max_depth`: arrays and objects nested deeper are refused (a cheap bracket
  count skips the walk for typical frames);
- `max_number_chars`: integer and float literals longer than this are refused,
  so no number can be too large to convert, and `NaN`/`Infinity` are refused;
- `max_string_chars`: no single string (key or value) longer than this;
- strings must be valid Unicode: lone surrogates (`"\\ud800"`) are refused, so
  nothing decoded here can fail later when it is encoded again.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import attrs
import msgspec


class JsonInputError(ValueError):
    """The input is not JSON within the limits; `reason` says why, for the sender."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.frozen
class JsonLimits:
    max_bytes: int = 4 * 1024 * 1024
    max_depth: int = 32
    max_number_chars: int = 40
    max_string_chars: int = 1024 * 1024


DEFAULT_LIMITS = JsonLimits()
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(data: bytes | bytearray | str, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """Parse `data` or raise `JsonInputError` naming the first broken limit.

    Bytes are parsed first by msgspec (in C, about four times faster), unless a
    run of number characters longer than a number may be is in them: msgspec
    checks none of the limits, but whatever it refuses -- malformed JSON,
    invalid UTF-8, `NaN`, a number out of float range, a lone surrogate, deep
    nesting -- the careful parse below parses again, and only it gives reasons.
    What msgspec parses is what `json` parses, and the checks after the parse
    (depth, strings) are the same for both."""
    if len(data) > limits.max_bytes:
        raise JsonInputError(f"{len(data)} bytes exceeds the limit of {limits.max_bytes}")
    if type(data) is bytes and not _long_number(data, limits):
        try:
            value = _FAST.decode(data)
        except Exception:  # the careful parse decides, and says why
            pass
        else:
            _check_limits(value, data, limits)
            return value
    return _careful(data, limits)


def within_text_limits(data: bytes, limits: JsonLimits = DEFAULT_LIMITS) -> bool:
    """Does `data` break no limit but depth, as far as its text shows: size, no
    number literal too long, no escaped surrogate, no string that could be too
    long? A parser that bounds nesting by itself (msgspec decoding into a typed
    schema, `dyad.codec.typed_decoder`) may then take `data` without `loads`."""
    return (len(data) <= min(limits.max_bytes, limits.max_string_chars)
            and not _long_number(data, limits)
            and _SURROGATE_ESCAPE_BYTES.search(data) is None)


def _careful(data: bytes | bytearray | str, limits: JsonLimits) -> Any:
    """The standard library's parser with hooks for every limit, and reasons."""
    if not isinstance(data, str):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonInputError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value = _decoder(limits).decode(data)
    except RecursionError:
        raise JsonInputError(f"nested deeper than {limits.max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise JsonInputError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                             ) from None
    except ValueError as exc:  # from the hooks below, or int conversion limits
        raise JsonInputError(str(exc)) from None
    _check_limits(value, data, limits)
    return value


def _check_limits(value: Any, data: bytes | str, limits: JsonLimits) -> None:
    """A cheap look at the text says whether a limit may be broken at all: more
    brackets than the depth limit, a string that could be too long, an escaped
    surrogate (raw UTF-8 cannot carry one). Typical frames skip both walks."""
    if isinstance(data, str):
        brackets = data.count("[") + data.count("{")
        escaped = _SURROGATE_ESCAPE.search(data)
    else:
        brackets = data.count(b"[") + data.count(b"{")
        escaped = _SURROGATE_ESCAPE_BYTES.search(data)
    if brackets > limits.max_depth:
        _check_depth(value, limits.max_depth)
    if len(data) > limits.max_string_chars or escaped:
        _check_strings(value, limits)


_FAST = msgspec.json.Decoder()


_NUMBER_CHARS_AS_ONES = bytes(
    ord("1") if chr(c) in "-+.0123456789eE" else ord("0") for c in range(256))


def _long_number(data: bytes, limits: JsonLimits) -> bool:
    """Has `data` a run of number characters longer than a number literal may be
    (it may sit in a string: then the careful parse finds it harmless)? Each
    number character becomes "1", any other "0", and C's substring search looks
    for the run: some 4 ns a byte, where a regex took 40, more than msgspec's
    whole parse and most of the decoding of a driver's batch of acknowledgements
    (issue 19)."""
    return b"1" * (limits.max_number_chars + 1) in data.translate(_NUMBER_CHARS_AS_ONES)


@functools.lru_cache(maxsize=16)
def _decoder(limits: JsonLimits) -> json.JSONDecoder:
    """One decoder per set of limits: `json.loads` with hooks builds a new one per
    call, which costs more than parsing a small frame."""
    return json.JSONDecoder(parse_int=_int_parser(limits), parse_float=_float_parser(limits),
                            parse_constant=_no_constant)


def _int_parser(limits: JsonLimits) -> Any:
    def parse_int(text: str) -> int:
        if len(text) > limits.max_number_chars:
            raise ValueError(f"number of {len(text)} digits exceeds the limit of "
                             f"{limits.max_number_chars}")
        return int(text)
    return parse_int


def _float_parser(limits: JsonLimits) -> Any:
    def parse_float(text: str) -> float:
        if len(text) > limits.max_number_chars:
            raise ValueError(f"number of {len(text)} characters exceeds the limit of "
                             f"{limits.max_number_chars}")
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"number {text} is out of range")
        return value
    return parse_float


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_depth(value: Any, max_depth: int) -> None:
    """Level by level over containers only, so no recursion can overflow and a
    frame of many small objects costs a fraction of its parse. Exact type checks
    suffice (the parser builds plain dicts and lists) and are the fast ones."""
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(max_depth):
        deeper: list[Any] = []
        add = deeper.append
        for item in level:
            for child in (item.values() if type(item) is dict else item):
                kind = type(child)
                if kind is dict or kind is list:
                    add(child)
        if not deeper:
            return
        level = deeper
    raise JsonInputError(f"nested deeper than {max_depth} levels")


def _check_strings(value: Any, limits: JsonLimits) -> None:
    """Every key and string value: its size and that it is valid Unicode."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) > limits.max_string_chars:
                raise JsonInputError(f"string of {len(item)} characters exceeds the limit "
                                     f"of {limits.max_string_chars}")
            if not _encodable(item):
                raise JsonInputError("string is not valid Unicode (lone surrogate)")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
