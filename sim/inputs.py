"""Reading the simulator's input files, with errors that say file and line.

A cell spec and a policy are JSON documents; a workload is JSON Lines. Every
object read here remembers the line it starts on (`Obj.line`), so a value that
parses but makes no sense is reported where it is, e.g.
``cell.json:14: agent_groups[1].count: must be an integer >= 1, got 0``.
Unknown fields are errors too: a misspelt knob must not be silently ignored.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dyad.resources import Resources, ResourcesError

T = TypeVar("T")


class InputError(ValueError):
    """Malformed input; the message starts with ``file:line:``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class Obj(dict[str, Any]):
    """A JSON object that knows the file and line it came from."""

    source: str = "?"
    line: int = 0

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


class _LinedDecoder(json.JSONDecoder):
    """`json.JSONDecoder` whose objects are `Obj`s carrying their line. Uses the
    pure-Python scanner (the C one cannot report positions): fine for cell and
    policy files, which are small."""

    def __init__(self, source: str) -> None:
        super().__init__()
        plain = self.parse_object

        def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[Obj, int]:
            text, start = s_and_end
            pairs, end = plain(s_and_end, *args)
            obj = Obj(pairs)
            obj.source = source
            obj.line = text.count("\n", 0, start) + 1
            return obj, end

        self.parse_object = parse_object  # type: ignore[assignment]
        self.scan_once = json.scanner.py_make_scanner(self)


def load_document(path: Path) -> Obj:
    """One JSON object from `path`, every object in it an `Obj`."""
    text = _read(path)
    try:
        value = _LinedDecoder(str(path)).decode(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}", f"not JSON: {exc.msg} (column {exc.colno})"
                         ) from None
    if not isinstance(value, Obj):
        raise InputError(f"{path}:1", "must be a JSON object")
    return value


def parse_line(path: Path, number: int, text: str) -> Obj:
    """One JSON Lines record."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{number}", f"not JSON: {exc.msg} (column {exc.colno})"
                         ) from None
    if not isinstance(value, dict):
        raise InputError(f"{path}:{number}", "each line must be a JSON object")
    return _tag(value, str(path), number)


def _tag(value: Any, source: str, line: int) -> Any:
    """Make every object in a one-line record an `Obj` of that line."""
    if isinstance(value, dict):
        obj = Obj({k: _tag(v, source, line) for k, v in value.items()})
        obj.source, obj.line = source, line
        return obj
    if isinstance(value, list):
        return [_tag(v, source, line) for v in value]
    return value


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}:0", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}:0", f"not UTF-8: {exc.reason}") from None


# ----------------------------------------------------------------- field reading


class Fields:
    """Reads the fields of one object, naming `path` (``agent_groups[1]``) in
    errors; `done()` refuses any field nobody read."""

    def __init__(self, obj: Obj, path: str = "") -> None:
        self.obj = obj
        self.path = path
        self._seen: set[str] = set()

    def fail(self, key: str | None, message: str) -> InputError:
        name = ".".join(p for p in (self.path, key) if p)
        line = self.obj.get(key).line if isinstance(self.obj.get(key), Obj) else self.obj.line
        return InputError(f"{self.obj.source}:{line}", f"{name}: {message}" if name else message)

    def has(self, key: str) -> bool:
        return key in self.obj

    def get(self, key: str, parse: Callable[[Any], T], default: T) -> T:
        self._seen.add(key)
        if key not in self.obj:
            return default
        try:
            return parse(self.obj[key])
        except InputError:
            raise
        except (ValueError, TypeError) as exc:
            raise self.fail(key, str(exc)) from None

    def need(self, key: str, parse: Callable[[Any], T]) -> T:
        if key not in self.obj:
            self._seen.add(key)
            raise self.fail(None, f"{key!r} is required")
        return self.get(key, parse, None)  # type: ignore[arg-type]

    def obj_field(self, key: str) -> Obj | None:
        self._seen.add(key)
        value = self.obj.get(key)
        if value is None:
            return None
        if not isinstance(value, Obj):
            raise self.fail(key, "must be an object")
        return value

    def sub(self, key: str) -> Fields | None:
        value = self.obj_field(key)
        return None if value is None else Fields(value, ".".join(p for p in (self.path, key) if p))

    def done(self) -> None:
        unknown = sorted(set(self.obj) - self._seen)
        if unknown:
            raise self.fail(None, f"unknown field{'s' if len(unknown) > 1 else ''} "
                                  f"{', '.join(map(repr, unknown))}")


# ------------------------------------------------------------------ value parsers


def number(low: float = 0.0, high: float = math.inf, *, above: bool = False
           ) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"must be a number, got {value!r}")
        if value < low or (above and value == low) or value > high:
            bound = f"> {low:g}" if above else f">= {low:g}"
            if high != math.inf:
                bound += f" and <= {high:g}"
            raise ValueError(f"must be {bound}, got {value!r}")
        return float(value)
    return parse


def integer(low: int = 0, high: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low \
                or (high is not None and value > high):
            bound = f">= {low}" + (f" and <= {high}" if high is not None else "")
            raise ValueError(f"must be an integer {bound}, got {value!r}")
        return value
    return parse


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def resources(value: Any) -> Resources:
    """Dyad's resource text (``cpus:4;mem:8192``) or an object of scalars."""
    try:
        if isinstance(value, str):
            parsed = Resources.parse(value)
        elif isinstance(value, dict):
            parsed = Resources.of(**{k: number()(v) for k, v in value.items()})
        else:
            raise ValueError(f"must be resource text like 'cpus:4;mem:8192' or an object, "
                             f"got {value!r}")
    except ResourcesError as exc:
        raise ValueError(str(exc)) from None
    if parsed.is_empty():
        raise ValueError("must not be empty")
    return parsed
