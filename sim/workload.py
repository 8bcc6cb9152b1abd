"""Dyad's workload format: JSON Lines of arrivals (docs/simulator.md has the schema).

One record per line, `"kind"` first; blank lines and lines starting with ``#``
are skipped; records need not be sorted (they are replayed by `at`, then by
line). Kinds:

- ``job``: a MapReduce job run by the real batch core (one framework per job,
  as `dyad-batch` does): ``maps``, ``reduces``, a ``map`` and a ``reduce`` task
  shape.
- ``app``: a Marathon-style app definition (``app``) put to the real service
  core of ``framework`` (default ``service``); the same id again is a scale or
  an upgrade, as `PUT /v2/apps` is.
- ``app_delete``: ``id`` of an app to delete.
- ``tasks``: ``count`` independent tasks of one shape for a simple greedy
  framework (``framework``) that launches at most ``per_offer`` per offer
  (only on the agent named ``agent``, if given).
- ``roles``: per role an optional ``weight`` and ``quota`` (as in the cell
  spec), set at ``at`` as an operator would.
- ``end``: the simulated span ends at ``at``.

A task shape: ``cpus``, ``mem``, optional ``disk``, ``duration`` (seconds: a
number, a list with one per task, or a distribution ``{"exp": mean}``,
``{"uniform": [lo, hi]}``, ``{"lognormal": [mu, sigma]}``), ``usage`` (per kind
a number, ``{"fraction": f}`` of the allocation, or ``{"steps": [[t, v], ...],
"period": p, "fraction": bool}``; default: uses all it was given) and ``fail``
(the probability that a run ends TASK_FAILED instead of TASK_FINISHED).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import attrs

from dyad.resources import Resources
from frameworks.service.appdef import AppDefinition, AppInvalid, parse_app
from master.allocator import Quota, role_problem
from sim.cell import parse_roles
from sim.inputs import (
    Fields, InputError, Obj, integer, number, parse_line, string,
)
from sim.usage import Curve

DEFAULT_PRIORITY = {"job": 100, "tasks": 100, "app": 200}
"""Borg's bands (issue 13): batch for jobs and tasks, production for apps."""

BANDS = (("best-effort", -math.inf, 100), ("batch", 100, 200), ("production", 200, 360),
         ("monitoring", 360, math.inf))


def band(priority: int) -> str:
    for name, low, high in BANDS:
        if low <= priority < high:
            return name
    raise AssertionError(priority)


# --------------------------------------------------------------------- shapes


@attrs.frozen
class Duration:
    """A fixed time, one per task index, or a distribution drawn per task."""

    fixed: float | None = None
    per_task: tuple[float, ...] = ()
    dist: str = ""
    params: tuple[float, ...] = ()

    def draw(self, index: int, rng: random.Random) -> float:
        if self.fixed is not None:
            return self.fixed
        if self.per_task:
            return self.per_task[index % len(self.per_task)]
        if self.dist == "exp":
            return rng.expovariate(1.0 / self.params[0])
        if self.dist == "uniform":
            return rng.uniform(*self.params)
        return rng.lognormvariate(*self.params)


@attrs.frozen
class UsageSpec:
    """A curve, absolute or as a fraction of what the task was given."""

    curve: Curve | None  # None: all of the allocation
    fraction: bool = False

    def resolve(self, allocated: float) -> Curve:
        if self.curve is None:
            return Curve.constant(allocated)
        if not self.fraction:
            return self.curve
        return attrs.evolve(self.curve, values=tuple(v * allocated for v in self.curve.values))


@attrs.frozen
class Shape:
    cpus: float
    mem: float
    disk: float
    duration: Duration | None  # None: runs until killed
    cpus_usage: UsageSpec
    mem_usage: UsageSpec
    fail: float = 0.0

    @property
    def resources(self) -> Resources:
        amounts = {"cpus": self.cpus, "mem": self.mem}
        if self.disk:
            amounts["disk"] = self.disk
        return Resources.of(**amounts)


# -------------------------------------------------------------------- records


@attrs.frozen
class JobArrival:
    at: float
    where: str
    name: str
    role: str
    priority: int
    maps: int
    reduces: int
    map: Shape
    reduce: Shape
    max_attempts: int = 4
    starvation_timeout: float = 60.0
    executor: Resources = Resources.of(cpus=0.1, mem=64)


@attrs.frozen
class AppArrival:
    at: float
    where: str
    framework: str
    role: str
    priority: int
    app: AppDefinition
    task: Shape  # cpus/mem from the app; duration (None: forever), usage, fail


@attrs.frozen
class AppDeletion:
    at: float
    where: str
    framework: str
    app_id: str


@attrs.frozen
class TasksArrival:
    at: float
    where: str
    framework: str
    role: str
    priority: int
    count: int
    shape: Shape
    per_offer: int = 1
    refuse_seconds: float = 1.0
    agent: str | None = None  # launch only on the agent with this hostname


@attrs.frozen
class RolesChange:
    """An operator's `PUT /weights` and `PUT /quota` at `at` (roles not named keep
    theirs)."""

    at: float
    where: str
    weights: dict[str, float]
    quota: dict[str, Quota]


Arrival = JobArrival | AppArrival | AppDeletion | TasksArrival | RolesChange


@attrs.frozen
class Workload:
    arrivals: tuple[Arrival, ...]
    end: float | None  # an `end` record's time

    @property
    def last_arrival(self) -> float:
        return max((a.at for a in self.arrivals), default=0.0)

    def task_count(self) -> int:
        count = 0
        for a in self.arrivals:
            if isinstance(a, JobArrival):
                count += a.maps + a.reduces
            elif isinstance(a, TasksArrival):
                count += a.count
            elif isinstance(a, AppArrival):
                count += a.app.instances
        return count


def load_workload(path: Path, strict: bool = True) -> tuple[Workload, list[InputError]]:
    """Read a workload. With `strict`, the first malformed record raises; without,
    malformed records are skipped and returned."""
    arrivals: list[Arrival] = []
    skipped: list[InputError] = []
    end: float | None = None
    frameworks: dict[str, tuple[str, str]] = {}  # name -> (kind, role)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}:0", f"cannot read: {exc}") from None
    for number_, text in enumerate(lines, 1):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            record = _record(parse_line(path, number_, text), frameworks)
        except InputError as exc:
            if strict:
                raise
            skipped.append(exc)
            continue
        if isinstance(record, float):
            end = record
        else:
            arrivals.append(record)
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i].at, i))
    return Workload(tuple(arrivals[i] for i in order), end), skipped


def _record(obj: Obj, frameworks: dict[str, tuple[str, str]]) -> Arrival | float:
    fields = Fields(obj)
    kind = fields.need("kind", string)
    at = fields.need("at", number())
    if kind == "end":
        fields.done()
        return at
    if kind == "job":
        record: Arrival = _job(fields, at)
        _claim(fields, frameworks, f"dyad-batch:{record.name}", "job", record.role)
    elif kind == "app":
        record = _app(fields, at)
        _claim(fields, frameworks, record.framework, "service", record.role)
    elif kind == "app_delete":
        framework = fields.get("framework", string, "service")
        if frameworks.get(framework, ("",))[0] != "service":
            raise fields.fail("framework", f"no app framework {framework!r} before this line")
        record = AppDeletion(at=at, where=obj.where, framework=framework,
                             app_id=fields.need("id", string))
    elif kind == "tasks":
        record = _tasks(fields, at)
        _claim(fields, frameworks, record.framework, "tasks", record.role)
    elif kind == "roles":
        weights, quota = parse_roles(fields)
        record = RolesChange(at=at, where=obj.where, weights=weights, quota=quota)
    else:
        raise fields.fail("kind", f"unknown kind {kind!r} "
                                  "(job, app, app_delete, tasks, roles, end)")
    fields.done()
    return record


def _claim(fields: Fields, frameworks: dict[str, tuple[str, str]], name: str, kind: str,
           role: str) -> None:
    """One framework name, one kind and one role (a framework subscribes once)."""
    known = frameworks.setdefault(name, (kind, role))
    if known != (kind, role):
        raise fields.fail(None, f"framework {name!r} was first given as a {known[0]} "
                                f"framework in role {known[1]!r}")


def _role(value: Any) -> str:
    problem = role_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _job(fields: Fields, at: float) -> JobArrival:
    name = fields.need("name", string)
    maps = fields.need("maps", integer(1, 1_000_000))
    reduces = fields.get("reduces", integer(1, 100_000), 1)
    return JobArrival(
        at=at, where=fields.obj.where, name=name, role=fields.get("role", _role, "*"),
        priority=fields.get("priority", integer(-1_000_000), DEFAULT_PRIORITY["job"]),
        maps=maps, reduces=reduces,
        map=_shape(fields.sub("map"), "map", fields, count=maps),
        reduce=_shape(fields.sub("reduce"), "reduce", fields, count=reduces),
        max_attempts=fields.get("max_attempts", integer(1, 1000), 4),
        starvation_timeout=fields.get("starvation_timeout", number(above=True), 60.0))


def _app(fields: Fields, at: float) -> AppArrival:
    body = fields.obj_field("app")
    if body is None:
        raise fields.fail(None, "'app' (a Marathon-style app definition) is required")
    app = app_from_json(body, "app")
    task = fields.sub("task")
    shape = _shape(task, "task", fields, count=0, base=(app.cpus, app.mem, app.disk),
                   forever=True)
    return AppArrival(at=at, where=fields.obj.where,
                      framework=fields.get("framework", string, "service"),
                      role=fields.get("role", _role, "*"),
                      priority=fields.get("priority", integer(-1_000_000),
                                          DEFAULT_PRIORITY["app"]),
                      app=app, task=shape)


def app_from_json(body: Obj, name: str = "") -> AppDefinition:
    """A Marathon-style app definition, validated by the service framework's own
    parser; `cmd` may be left out (nothing runs in a simulation)."""
    definition = dict(body)
    if "cmd" not in definition and "args" not in definition:
        definition["cmd"] = "sim"
    try:
        return parse_app(definition)
    except AppInvalid as exc:
        details = "; ".join(f"{where}: {why}" for where, why in exc.details)
        raise InputError(body.where, f"{name}: {details}" if name else details) from None


def _tasks(fields: Fields, at: float) -> TasksArrival:
    count = fields.need("count", integer(1, 10_000_000))
    return TasksArrival(
        at=at, where=fields.obj.where, framework=fields.need("framework", string),
        role=fields.get("role", _role, "*"),
        priority=fields.get("priority", integer(-1_000_000), DEFAULT_PRIORITY["tasks"]),
        count=count, shape=_shape(fields.sub("task"), "task", fields, count=count,
                                  optional_duration=True),
        per_offer=fields.get("per_offer", integer(1), 1),
        refuse_seconds=fields.get("refuse_seconds", number(), 1.0),
        agent=fields.get("agent", string, None))


def _shape(fields: Fields | None, name: str, parent: Fields, *, count: int,
           base: tuple[float, float, float] | None = None, forever: bool = False,
           optional_duration: bool = False) -> Shape:
    """A task shape. Apps take their size from the app (`base`) and run until
    killed unless a duration is given; greedy tasks may say ``"duration": null``
    (run until the end)."""
    if fields is None:
        if base is None:
            raise parent.fail(None, f"{name!r} (a task shape) is required")
        fields = Fields(Obj(), name)
    if base is None:
        cpus = fields.need("cpus", number(above=True))
        mem = fields.need("mem", number(above=True))
        disk = fields.get("disk", number(), 0.0)
    else:
        cpus, mem, disk = base
    if forever:
        duration = fields.get("duration", lambda v: None if v is None else _duration(v, 0),
                              None)
    elif optional_duration and fields.has("duration") and fields.obj["duration"] is None:
        duration = fields.get("duration", lambda v: None, None)
    else:
        duration = fields.need("duration", lambda v: _duration(v, count))
    usage = fields.sub("usage")
    cpus_usage = mem_usage = UsageSpec(None)
    if usage is not None:
        cpus_usage = usage.get("cpus", _usage, UsageSpec(None))
        mem_usage = usage.get("mem", _usage, UsageSpec(None))
        usage.done()
    shape = Shape(cpus=cpus, mem=mem, disk=disk, duration=duration, cpus_usage=cpus_usage,
                  mem_usage=mem_usage, fail=fields.get("fail", number(0, 1), 0.0))
    fields.done()
    return shape


def _duration(value: Any, count: int) -> Duration:
    if isinstance(value, list):
        values = tuple(number()(v) for v in value)
        if count and len(values) != count:
            raise ValueError(f"a list of durations needs one per task ({count}), "
                             f"got {len(values)}")
        if not values:
            raise ValueError("a list of durations must not be empty")
        return Duration(per_task=values)
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError('a distribution is one of {"exp": mean}, {"uniform": [lo, hi]}, '
                             '{"lognormal": [mu, sigma]}')
        (dist, params), = value.items()
        if dist == "exp":
            return Duration(dist=dist, params=(number(above=True)(params),))
        if dist in ("uniform", "lognormal") and isinstance(params, list) and len(params) == 2:
            a, b = (number(-math.inf)(p) for p in params)
            if dist == "uniform" and not 0 <= a <= b:
                raise ValueError("uniform bounds need 0 <= lo <= hi")
            if dist == "lognormal" and b < 0:
                raise ValueError("lognormal sigma must not be negative")
            return Duration(dist=dist, params=(a, b))
        raise ValueError(f"unknown distribution {dist!r} or bad parameters {params!r}")
    return Duration(fixed=number()(value))


def _usage(value: Any) -> UsageSpec:
    if not isinstance(value, dict):
        return UsageSpec(Curve.constant(number()(value)))
    if set(value) == {"fraction"}:
        return UsageSpec(Curve.constant(number()(value["fraction"])), fraction=True)
    unknown = set(value) - {"steps", "period", "fraction"}
    if unknown or "steps" not in value:
        raise ValueError('usage is a number, {"fraction": f} or {"steps": [[t, v], ...], '
                         '"period": p, "fraction": bool}')
    steps = value["steps"]
    if not isinstance(steps, list) or not steps or not all(
            isinstance(p, list) and len(p) == 2 for p in steps):
        raise ValueError("steps must be a non-empty list of [seconds, value] pairs")
    points = [(number()(t), number()(v)) for t, v in steps]
    period = value.get("period")
    fraction = value.get("fraction", False)
    if not isinstance(fraction, bool):
        raise ValueError("fraction must be true or false")
    return UsageSpec(Curve.steps(points, None if period is None else number(above=True)(period)),
                     fraction=fraction)
