"""What an app asks of the autopilot, as written in its definition:

    "autopilot": {"mode": "off" | "recommend" | "auto",
                  "min": {"cpus": 0.1, "mem": 64}, "max": {"cpus": 4, "mem": 4096},
                  "horizontal": {"target": 0.6, "min": 1, "max": 10}}

`mem` is in MiB, as everywhere in app definitions. `horizontal` (optional; absent:
no horizontal sizing) asks for instances sized to a target CPU utilization per
task, within [min, max] (`frameworks.autopilot.horizontal`). Its `min` is at least
1: an app at 0 instances has no usage to measure, so nothing could scale it back. `parse_spec` is the only way that
JSON becomes an `AutopilotSpec`; it names every problem (path, message) at once so
the service API can answer 422 with all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

MIB = 2 ** 20
OFF, RECOMMEND, AUTO = "off", "recommend", "auto"
MODES = (OFF, RECOMMEND, AUTO)
MOST_INSTANCES = 10_000  # an app definition's own cap on `instances`


@attrs.frozen
class Limits:
    """A task's limits: cores and bytes."""

    cpus: float
    mem_bytes: int


@attrs.frozen
class Bounds:
    """Per-app floors and caps; None leaves the autopilot's configured default."""

    min_cpus: float | None = None
    max_cpus: float | None = None
    min_mem_bytes: int | None = None
    max_mem_bytes: int | None = None


@attrs.frozen
class HorizontalSpec:
    """Instances for a target CPU utilization per task, within [min, max]."""

    target: float
    min: int
    max: int


@attrs.frozen
class AutopilotSpec:
    mode: str = attrs.field(default=OFF, validator=attrs.validators.in_(MODES))
    bounds: Bounds = Bounds()
    horizontal: HorizontalSpec | None = None


class SpecInvalid(ValueError):
    """An autopilot block with problems; `details` is ``[(json_path, message), ...]``."""

    def __init__(self, details: list[tuple[str, str]]) -> None:
        self.details = details
        super().__init__("; ".join(f"{path}: {message}" for path, message in details))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _side(obj: Any, path: str, problems: list[tuple[str, str]]) -> tuple[float | None, float | None]:
    if obj is None:
        return None, None
    if not isinstance(obj, Mapping):
        problems.append((path, "must be an object with cpus and/or mem"))
        return None, None
    values: dict[str, float | None] = {"cpus": None, "mem": None}
    for key, value in obj.items():
        if key not in values:
            problems.append((f"{path}/{key}", "unknown field (cpus and mem are known)"))
            continue
        number = _number(value)
        if number is None:
            problems.append((f"{path}/{key}", "must be a positive number"))
        values[key] = number
    return values["cpus"], values["mem"]


def parse_spec(obj: Any, path: str = "/autopilot") -> AutopilotSpec:
    """An `AutopilotSpec` from the JSON of an app's ``autopilot`` field (None: off)."""
    if obj is None:
        return AutopilotSpec()
    if not isinstance(obj, Mapping):
        raise SpecInvalid([(path, "must be an object")])
    problems: list[tuple[str, str]] = []
    for key in obj:
        if key not in ("mode", "min", "max", "horizontal"):
            problems.append((f"{path}/{key}",
                             "unknown field (mode, min, max and horizontal are known)"))
    mode = obj.get("mode", OFF)
    if mode not in MODES:
        problems.append((f"{path}/mode", f"must be one of {', '.join(MODES)}"))
    min_cpus, min_mem = _side(obj.get("min"), f"{path}/min", problems)
    max_cpus, max_mem = _side(obj.get("max"), f"{path}/max", problems)
    for name, low, high in (("cpus", min_cpus, max_cpus), ("mem", min_mem, max_mem)):
        if low is not None and high is not None and low > high:
            problems.append((f"{path}/min/{name}", f"exceeds max ({low:g} > {high:g})"))
    horizontal = _horizontal(obj.get("horizontal"), f"{path}/horizontal", problems)
    if problems:
        raise SpecInvalid(problems)
    return AutopilotSpec(mode, Bounds(min_cpus, max_cpus, _bytes(min_mem), _bytes(max_mem)),
                         horizontal)


def _horizontal(obj: Any, path: str, problems: list[tuple[str, str]]) -> HorizontalSpec | None:
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        problems.append((path, "must be an object with target, min and max"))
        return None
    before = len(problems)
    for key in obj:
        if key not in ("target", "min", "max"):
            problems.append((f"{path}/{key}", "unknown field (target, min and max are known)"))
    target = obj.get("target")
    if target is None:
        problems.append((f"{path}/target", "is required"))
    elif _number(target) is None or target > 1:
        problems.append((f"{path}/target", "must be a number in (0, 1]"))
    counts = []
    for key in ("min", "max"):
        value = obj.get(key)
        if value is None:
            problems.append((f"{path}/{key}", "is required"))
        elif (isinstance(value, bool) or not isinstance(value, int)
              or not 1 <= value <= MOST_INSTANCES):
            problems.append((f"{path}/{key}", f"must be an integer in [1, {MOST_INSTANCES}]"))
        else:
            counts.append(value)
    if len(counts) == 2 and counts[0] > counts[1]:
        problems.append((f"{path}/min", f"exceeds max ({counts[0]} > {counts[1]})"))
    if len(problems) > before:
        return None
    return HorizontalSpec(float(target), counts[0], counts[1])


def _bytes(mib: float | None) -> int | None:
    return None if mib is None else math.ceil(mib * MIB)


def unparse_spec(spec: AutopilotSpec) -> dict[str, Any]:
    """The JSON form `parse_spec` reads back into an equal spec."""
    out: dict[str, Any] = {"mode": spec.mode}
    b = spec.bounds
    for side, cpus, mem in (("min", b.min_cpus, b.min_mem_bytes), ("max", b.max_cpus, b.max_mem_bytes)):
        entry = {k: v for k, v in (("cpus", cpus), ("mem", None if mem is None else mem / MIB))
                 if v is not None}
        if entry:
            out[side] = entry
    h = spec.horizontal
    if h is not None:
        out["horizontal"] = {"target": h.target, "min": h.min, "max": h.max}
    return out
