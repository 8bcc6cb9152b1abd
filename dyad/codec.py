"""Turn attrs classes into JSON-able values and back, validating on the way in.

Every wire message and every data type in `dyad.messages` is a frozen attrs class
with type annotations. Instead of hand-writing `to_wire`/`from_wire` for each, this
module walks the annotations once per class and builds a checker, so a new field is
validated the moment it is declared. Supported annotations: `str`, `int`, `float`,
`bool`, `bytes` (base64 on the wire), `X | None`, `list[X]`, `dict[str, X]`,
enums (by member name), `Resources` (its string form) and nested attrs classes.

Errors say *where* the data was wrong (`offers[0].resources: ...`), because the
sender of a bad frame deserves a reason it can act on.

`dumps` writes the same JSON as `json.dumps(to_json(value))`, but with msgspec,
which walks attrs classes in C: about ten times faster on the master's frames
(issue 19, `python -m benchmarks.codec`). `typed_decoder` builds a class from JSON
bytes in C too, and is never less strict than `from_json`, which stays the one
that says where and why.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
import types
import typing
from typing import Annotated, Any, Callable

import attrs
import msgspec

from dyad.resources import Resources, ResourcesError


class CodecError(ValueError):
    """Data did not match the declared shape; `path` says where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path or 'body'}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


Unstructure = Callable[[Any], Any]
Structure = Callable[[Any, str], Any]

_structurers: dict[Any, Structure] = {}
_unstructurers: dict[Any, Unstructure] = {}


def to_json(obj: Any) -> Any:
    """Return the JSON-able form of an attrs instance (or any supported value)."""
    return _unstructurer_for(type(obj))(obj)


def _wire_hook(value: Any) -> Any:
    """What msgspec cannot write itself: as `to_json` writes it."""
    if isinstance(value, Resources):
        return str(value)
    raise TypeError(f"no wire form for {type(value)!r}")


_ENCODER = msgspec.json.Encoder(enc_hook=_wire_hook)


def dumps(value: Any) -> bytes:
    """Compact JSON of `value` (an attrs instance, or a dict or list of them and
    of plain values), equal to `json.dumps(to_json(value))` once parsed.

    msgspec writes enums by value, which equals the name for every enum on the
    wire (a test holds them so). A string it refuses (a lone surrogate) or a
    value it does not know sends the whole value down the slow path, which
    escapes what msgspec cannot write (the receiver judges it)."""
    try:
        return _ENCODER.encode(value)
    except (msgspec.EncodeError, UnicodeEncodeError, TypeError, OverflowError):
        return json.dumps(to_json(value), separators=(",", ":")).encode("utf-8")


def from_json(cls: type, data: Any, path: str = "") -> Any:
    """Build `cls` from JSON-able `data`, raising `CodecError` on any mismatch.

    Two builders per type: a compiled one (`_fast_for`) that tracks no path and
    gives no reason, only success or any exception, and the one that says where
    and why. Whatever the first refuses is built again by the second, so every
    reason is the second's; the first is never less strict (issue 19: an accept
    decoded in a third of the time)."""
    try:
        return _fast_for(cls)(data)
    except Exception:  # the careful builder decides, and says why
        return _structurer_for(cls)(data, path)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    return type(value).__name__


# Wire integers are 64-bit, as in Mesos' protobufs: a larger one is a mistake or an
# attack, and would overflow later when it meets float arithmetic.
INT_MIN, INT_MAX = -2**63, 2**63 - 1


def _primitive(kind: type) -> Structure:
    def structure(value: Any, path: str) -> Any:
        # bool is an int subclass in Python; JSON keeps them apart, so do we.
        if isinstance(value, bool) and kind is not bool:
            raise CodecError(path, f"expected {kind.__name__}, got bool")
        if kind is float and isinstance(value, int):
            return _int_to_float(value, path)
        if not isinstance(value, kind):
            raise CodecError(path, f"expected {kind.__name__}, got {_type_name(value)}")
        if kind is float and not math.isfinite(value):  # nor does NaN or infinity
            raise CodecError(path, f"{value} is not allowed")
        if kind is int and not INT_MIN <= value <= INT_MAX:
            # (no str(value) here: it raises for more than 4,300 digits)
            raise CodecError(path, f"integer of {value.bit_length()} bits is out of the "
                                   "64-bit range")
        return value

    return structure


def _int_to_float(value: int, path: str) -> float:
    try:
        return float(value)
    except OverflowError:  # beyond about 1.8e308
        raise CodecError(path, "number is too large for a float") from None


def _structure_bytes(value: Any, path: str) -> bytes:
    if not isinstance(value, str):
        raise CodecError(path, f"expected base64 string, got {_type_name(value)}")
    if not value:
        return b""  # most status updates carry no data: skip base64's Python layers
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise CodecError(path, f"invalid base64: {exc}") from None


def _structure_resources(value: Any, path: str) -> Resources:
    if not isinstance(value, str):
        raise CodecError(path, f"expected resources string, got {_type_name(value)}")
    try:
        return Resources.parse(value)
    except ResourcesError as exc:
        raise CodecError(path, str(exc)) from None


def _identity(value: Any) -> Any:
    return value


def _structurer_for(tp: Any) -> Structure:
    found = _structurers.get(tp)
    if found is None:
        found = _build_structurer(tp)
        _structurers[tp] = found
    return found


def _unstructurer_for(tp: Any) -> Unstructure:
    found = _unstructurers.get(tp)
    if found is None:
        found = _build_unstructurer(tp)
        _unstructurers[tp] = found
    return found


def _optional_inner(tp: Any) -> Any | None:
    """Return X for `X | None` / `Optional[X]`, else None."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
        raise TypeError(f"unsupported union {tp!r}")
    return None


def _build_structurer(tp: Any) -> Structure:
    if tp in (str, int, float, bool):
        return _primitive(tp)
    if tp is bytes:
        return _structure_bytes
    if tp is Resources:
        return _structure_resources
    if tp is Any:
        return lambda value, path: value
    inner = _optional_inner(tp)
    if inner is not None:
        inner_s = _structurer_for(inner)
        return lambda value, path: None if value is None else inner_s(value, path)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        item_s = _structurer_for(item_tp)

        def structure_list(value: Any, path: str) -> list[Any]:
            if not isinstance(value, list):
                raise CodecError(path, f"expected list, got {_type_name(value)}")
            return [item_s(v, _join(path, i)) for i, v in enumerate(value)]

        return structure_list
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if key_tp is not str:
            raise TypeError("only dict[str, X] is supported on the wire")
        val_s = _structurer_for(val_tp)

        def structure_dict(value: Any, path: str) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise CodecError(path, f"expected object, got {_type_name(value)}")
            return {k: val_s(v, _join(path, k)) for k, v in value.items()}

        return structure_dict
    if isinstance(tp, type) and issubclass(tp, enum.Enum):

        def structure_enum(value: Any, path: str) -> Any:
            if not isinstance(value, str) or value not in tp.__members__:
                raise CodecError(path, f"expected one of {sorted(tp.__members__)}, got {value!r}")
            return tp[value]

        return structure_enum
    if attrs.has(tp):
        return _build_attrs_structurer(tp)
    raise TypeError(f"no wire form for {tp!r}")


def _build_attrs_structurer(cls: type) -> Structure:
    hints = typing.get_type_hints(cls)
    fields = [(f.name, _structurer_for(hints[f.name]), f.default is attrs.NOTHING)
              for f in attrs.fields(cls) if f.init]
    known = {name for name, _, _ in fields}

    def structure_attrs(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise CodecError(path, f"expected object, got {_type_name(value)}")
        unknown = set(value) - known
        if unknown:
            names = sorted(unknown)
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            raise CodecError(path, f"unknown field(s) {names[:5]}{more}")
        kwargs = {}
        for name, structure, required in fields:
            if name in value:
                kwargs[name] = structure(value[name], _join(path, name))
            elif required:
                raise CodecError(_join(path, name), "missing required field")
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:  # attrs validators speak here
            raise CodecError(path, str(exc)) from None

    return structure_attrs


def _build_unstructurer(tp: Any) -> Unstructure:
    if tp in (str, int, float, bool, type(None)):
        return _identity
    if tp is bytes:
        return lambda value: base64.b64encode(value).decode("ascii")
    if tp is Resources:
        return str
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda value: value.name
    if tp in (list, tuple):
        return lambda value: [to_json(v) for v in value]
    if tp is dict:
        return lambda value: {k: to_json(v) for k, v in value.items()}
    if attrs.has(tp):
        names = [f.name for f in attrs.fields(tp) if f.init]
        return lambda value: {n: to_json(getattr(value, n)) for n in names}
    raise TypeError(f"no wire form for {tp!r}")


# ------------------------------------------------------- the compiled builders

_MISSING = object()
_RESOURCES_CACHE: dict[str, Resources] = {}
_RESOURCES_CACHE_MOST = 4096
"""Resource texts kept parsed (a `Resources` is immutable, so one value serves
every frame that spells it so); texts longer than 512 characters are not kept."""
_fast: dict[Any, Callable[[Any], Any]] = {}


class _Refused(Exception):
    """The compiled builder does not take this; the careful one will say why."""


def _fast_for(tp: Any) -> Callable[[Any], Any]:
    found = _fast.get(tp)
    if found is None:
        found = _fast[tp] = _build_fast(tp)
    return found


def _fast_resources(value: Any) -> Resources:
    found = _RESOURCES_CACHE.get(value) if type(value) is str else None
    if found is None:
        found = _structure_resources(value, "")
        if len(value) <= 512 and len(_RESOURCES_CACHE) < _RESOURCES_CACHE_MOST:
            _RESOURCES_CACHE[value] = found
    return found


def _build_fast(tp: Any) -> Callable[[Any], Any]:
    if tp in (str, int, float, bool) or tp is Any:
        env: dict[str, Any] = {}
        lines = ["def build(v):", *_check_primitive(tp, "v", "    ", env), "    return v"]
        return _compiled(lines, env)
    if tp is bytes:
        return lambda value: _structure_bytes(value, "")
    if tp is Resources:
        return _fast_resources
    inner = _optional_inner(tp)
    if inner is not None:
        inner_f = _fast_for(inner)
        return lambda value: None if value is None else inner_f(value)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        item_f = _fast_for(item_tp)

        def build_list(value: Any) -> list[Any]:
            if type(value) is not list:
                raise _Refused
            return [item_f(item) for item in value]

        return build_list
    if origin is dict:
        val_f = _fast_for(typing.get_args(tp)[1])

        def build_dict(value: Any) -> dict[str, Any]:
            if type(value) is not dict:
                raise _Refused
            return {key: val_f(item) for key, item in value.items()}

        return build_dict
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = tp.__members__

        def build_enum(value: Any) -> Any:
            if type(value) is not str:
                raise _Refused
            return members[value]

        return build_enum
    if attrs.has(tp):
        return _build_fast_attrs(tp)
    raise TypeError(f"no wire form for {tp!r}")


def _check_primitive(tp: Any, name: str, indent: str, env: dict[str, Any]) -> list[str]:
    """Lines that refuse `name` unless it is a `tp` (made a float from an int)."""
    env.update(Refused=_Refused, isfinite=math.isfinite, INT_MIN=INT_MIN, INT_MAX=INT_MAX)
    if tp is Any:
        return []
    if tp is float:
        return [f"{indent}if type({name}) is float:",
                f"{indent}    if not isfinite({name}): raise Refused",
                f"{indent}elif type({name}) is int: {name} = float({name})",
                f"{indent}else: raise Refused"]
    check = f"type({name}) is not {tp.__name__}"
    if tp is int:
        check += f" or not INT_MIN <= {name} <= INT_MAX"
    return [f"{indent}if {check}: raise Refused"]


def _build_fast_attrs(cls: type) -> Callable[[Any], Any]:
    """One function per class, written out field by field: plain type checks
    inline, a call only for what nests."""
    hints = typing.get_type_hints(cls)
    fields = [(f.name, hints[f.name], f.default is attrs.NOTHING)
              for f in attrs.fields(cls) if f.init]
    env: dict[str, Any] = {"cls": cls, "known": frozenset(n for n, _, _ in fields),
                           "MISSING": _MISSING, "Refused": _Refused}
    lines = ["def build(value):",
             "    if type(value) is not dict or not known.issuperset(value): raise Refused",
             "    kw = {}"]
    for i, (name, tp, required) in enumerate(fields):
        lines.append(f"    v = value.get({name!r}, MISSING)")
        if required:
            lines.append("    if v is MISSING: raise Refused")
            indent = "    "
        else:
            lines.append("    if v is not MISSING:")
            indent = "        "
        if tp in (str, int, float, bool) or tp is Any:
            lines += _check_primitive(tp, "v", indent, env)
            lines.append(f"{indent}kw[{name!r}] = v")
        else:
            env[f"f{i}"] = _fast_for(tp)
            lines.append(f"{indent}kw[{name!r}] = f{i}(v)")
    lines.append("    return cls(**kw)")
    return _compiled(lines, env)


def _compiled(lines: list[str], env: dict[str, Any]) -> Callable[[Any], Any]:
    exec("\n".join(lines), env)  # our own text, from declared annotations only
    return env["build"]  # type: ignore[no-any-return]


# ------------------------------------------------ classes built by msgspec, in C

_INT64 = Annotated[int, msgspec.Meta(ge=INT_MIN, le=INT_MAX)]
_mirrors: dict[Any, Any] = {}
_typed: dict[type, Callable[[Any], Any] | None] = {}


def typed_decoder(cls: type) -> Callable[[Any], Any] | None:
    """A function building `cls` from JSON bytes (or a `msgspec.Raw`) in C, about
    three times faster than parsing and `from_json` (issue 19), or None when a
    field of `cls` is one msgspec cannot judge as `from_json` does.

    Two passes, both msgspec's. The first checks the JSON against a mirror of
    `cls`: a `msgspec.Struct` per attrs class with the same fields, refusing
    unknown ones (msgspec ignores unknown fields of attrs classes), integers
    held to 64 bits, resources as strings. The second builds `cls` itself, with
    its defaults and validators. The function raises on anything it refuses; the
    caller then asks `from_json`, which says why. It never takes what `from_json`
    refuses (`tests/unit/test_wire_properties.py`), given the text limits of
    `dyad.bounded_json` checked first (numbers, surrogates): a mirror nests no
    deeper than its class, so the depth limit holds by itself."""
    if cls not in _typed:
        try:
            check = msgspec.json.Decoder(_mirror(cls)).decode
        except TypeError:
            _typed[cls] = None
        else:
            build = msgspec.json.Decoder(cls, dec_hook=_typed_hook).decode

            def decode(data: Any) -> Any:
                check(data)
                return build(data)

            _typed[cls] = decode
    return _typed[cls]


def _typed_hook(tp: Any, value: Any) -> Any:
    if tp is Resources:
        return _fast_resources(value)
    raise NotImplementedError


def _mirror(tp: Any) -> Any:
    """The type msgspec checks JSON against for `tp`; TypeError for a type it
    cannot check as strictly as the careful builder."""
    found = _mirrors.get(tp)
    if found is None:
        found = _mirrors[tp] = _build_mirror(tp)
    return found


def _build_mirror(tp: Any) -> Any:
    if tp is int:
        return _INT64
    if tp in (str, float, bool, bytes):  # msgspec refuses infinite floats and bad base64
        return tp
    if tp is Resources:
        return str
    inner = _optional_inner(tp)
    if inner is not None:
        return typing.Optional[_mirror(inner)]
    origin = typing.get_origin(tp)
    if origin is list:
        return list[_mirror(typing.get_args(tp)[0])]  # type: ignore[misc]
    if origin is dict and typing.get_args(tp)[0] is str:
        return dict[str, _mirror(typing.get_args(tp)[1])]  # type: ignore[misc]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if any(member.value != name for name, member in tp.__members__.items()):
            raise TypeError(f"{tp!r}: msgspec reads enums by value, the wire by name")
        return tp
    if attrs.has(tp):
        hints = typing.get_type_hints(tp)
        fields = [(f.name, _mirror(hints[f.name])) if f.default is attrs.NOTHING
                  else (f.name, _mirror(hints[f.name]), None)
                  for f in attrs.fields(tp) if f.init]
        return msgspec.defstruct(f"Wire{tp.__name__}", fields, forbid_unknown_fields=True)
    raise TypeError(f"no typed decoder for {tp!r}")  # Any, among others
