"""App definitions: Marathon's JSON in, validated immutable values out, and back.

`parse_app` is the only way user JSON becomes an `AppDefinition`. It checks every
field and collects every problem into one `AppInvalid` (the API answers 422 with
them all, Marathon-style ``details: [{path, errors}]``), so nothing is created from
a definition that is partly wrong. Unknown fields are refused rather than ignored:
a typo such as ``"instance": 3`` must not silently run one instance. Fields that the
API itself returns (``version``, ``tasksRunning``, ...) are accepted and ignored, so
a definition fetched with GET can be sent back with PUT.

An app id is a path of lowercase segments (``/web``, ``/shop/api``); double slashes
and a missing leading slash are tolerated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from dyad import priority as priorities
from dyad.messages import CommandInfo, HealthCheck, HealthCheckType
from frameworks.autopilot.spec import (
    MOST_INSTANCES, AutopilotSpec, SpecInvalid, parse_spec, unparse_spec)
from frameworks.service.app_container import (
    AppContainer, ContainerInvalid, container_to_json, parse_container)
from frameworks.service.resident import (
    PersistentSpec, Residency, ResidentInvalid, parse_residency, residency_json,
)
from frameworks.service.constraints import (
    Constraint, ConstraintError, check_satisfiable, parse_constraint)

_SEGMENT = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
RESERVED_SEGMENTS = frozenset({"tasks", "restart", "versions", "delay", "recommendation"})
"""Last segments that would make an app's URL ambiguous with its sub-resources."""
MAX_ID_LENGTH = 200
MAX_INSTANCES = MOST_INSTANCES  # the autopilot's horizontal max obeys it too
MAX_PORTS = 100
MAX_SCALAR = 1e9
YOUNGEST_FIRST, OLDEST_FIRST = "YOUNGEST_FIRST", "OLDEST_FIRST"

READ_ONLY_FIELDS = frozenset({
    "version", "versionInfo", "tasksStaged", "tasksRunning", "tasksHealthy",
    "tasksUnhealthy", "deployments", "tasks", "lastTaskFailure", "waiting",
    "waitingReason"})
"""What GET returns besides the definition; accepted and ignored on input."""


class AppInvalid(ValueError):
    """A definition with problems; `details` is ``[(json_path, message), ...]``."""

    def __init__(self, details: list[tuple[str, str]]) -> None:
        self.details = details
        super().__init__("; ".join(f"{path}: {message}" for path, message in details))


class _Bad(Exception):
    """One field's problem; collected into `AppInvalid` by `parse_app`."""


@attrs.frozen
class PortDefinition:
    """A port the task needs: 0 = any free port from the offer, else that host port."""

    port: int = 0
    name: str = ""
    protocol: str = "tcp"
    labels: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class HealthCheckDef:
    """Marathon's health check fields; `to_health_check` makes the agent's form once
    the task's host ports are known. Defaults are Marathon's."""

    protocol: str = "HTTP"
    path: str = "/"
    port_index: int = 0
    command: str | None = None
    grace_period: float = 300.0
    interval: float = 60.0
    timeout: float = 20.0
    max_consecutive_failures: int = 3
    delay: float = 15.0

    def to_health_check(self, ports: list[int]) -> HealthCheck:
        if self.protocol == "COMMAND":
            return HealthCheck(type=HealthCheckType.COMMAND,
                               command=CommandInfo(shell=self.command or "true"),
                               delay=self.delay, interval=self.interval,
                               timeout=self.timeout, grace_period=self.grace_period,
                               consecutive_failures=self.max_consecutive_failures)
        kind = HealthCheckType.TCP if self.protocol == "TCP" else HealthCheckType.HTTP
        return HealthCheck(type=kind, port=ports[self.port_index], path=self.path,
                           scheme="https" if self.protocol == "HTTPS" else "http",
                           delay=self.delay, interval=self.interval, timeout=self.timeout,
                           grace_period=self.grace_period,
                           consecutive_failures=self.max_consecutive_failures)


@attrs.frozen
class UpgradeStrategy:
    minimum_health_capacity: float = 1.0
    maximum_over_capacity: float = 1.0

    def bounds(self, instances: int) -> tuple[int, int]:
        """(fewest ready tasks, most tasks) a deployment to `instances` may pass
        through. Rounding favours safety: the floor of healthy tasks rounds up, the
        ceiling of all tasks rounds down."""
        least = min(instances, math.ceil(self.minimum_health_capacity * instances - 1e-9))
        most = max(instances, math.floor((1 + self.maximum_over_capacity) * instances + 1e-9))
        return least, most


@attrs.frozen
class AppDefinition:
    """What the user asked for. ``config_version`` changes with anything but
    ``instances``: tasks carry it, and a deployment replaces the tasks whose
    version differs. ``version`` changes with every change, scaling included."""

    id: str
    cmd: str | None = None
    args: tuple[str, ...] | None = None
    instances: int = 1
    cpus: float = 1.0
    mem: float = 128.0
    disk: float = 0.0
    ports: tuple[PortDefinition, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    constraints: tuple[Constraint, ...] = ()
    health_checks: tuple[HealthCheckDef, ...] = ()
    upgrade_strategy: UpgradeStrategy = UpgradeStrategy()
    backoff_seconds: float = 1.0
    backoff_factor: float = 1.15
    max_launch_delay_seconds: float = 300.0
    kill_selection: str = YOUNGEST_FIRST
    task_kill_grace_period_seconds: float | None = None
    user: str = ""
    autopilot: AutopilotSpec = AutopilotSpec()  # right-sizing (docs/autopilot.md)
    container: AppContainer | None = None  # a Docker image (frameworks/service/app_container)
    residency: Residency | None = None  # persistent volumes (frameworks/service/resident)
    priority: int = priorities.DEFAULT_PRODUCTION  # a service is production by default
    version: str = ""
    config_version: str = ""

    @property
    def host_ports(self) -> list[int]:
        """The host ports a task asks for (0: any): its bridged port mappings', or
        its port definitions'."""
        if self.container is not None and self.container.bridged_ports:
            return [m.host_port for m in self.container.port_mappings]
        return [p.port for p in self.ports]

    @property
    def persistent(self) -> PersistentSpec | None:
        """The app's persistent volume, if it is resident."""
        return self.container.persistent[0] if self.container and self.container.persistent \
            else None

    @property
    def key(self) -> str:
        """The id as one token (``/shop/api`` -> ``shop_api``): task id prefix and
        store key. Segments never contain ``_``, so keys never collide."""
        return self.id.strip("/").replace("/", "_")

    def same_config(self, other: AppDefinition) -> bool:
        """True when only `instances`, `autopilot` (or versions) differ: nothing the
        tasks run with, so a scale, not an upgrade."""
        def blank(app: AppDefinition) -> AppDefinition:
            return attrs.evolve(app, instances=0, autopilot=AutopilotSpec(), version="",
                                config_version="")
        return blank(self) == blank(other)


# ------------------------------------------------------------------------- ids


def normalize_app_id(raw: object) -> str:
    """``web``, ``/web``, ``//shop//api/`` -> ``/web``, ``/shop/api``; raises
    `AppInvalid` for anything else."""
    if not isinstance(raw, str):
        raise AppInvalid([("/id", "must be a string")])
    segments = [s for s in raw.split("/") if s]
    problems = []
    if not segments:
        problems.append("must not be empty")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            problems.append(f"segment {segment!r} may hold only lowercase letters, digits "
                            "and inner hyphens")
    if segments and segments[-1] in RESERVED_SEGMENTS:
        problems.append(f"may not end in {segments[-1]!r} (reserved by the API)")
    result = "/" + "/".join(segments)
    if len(result) > MAX_ID_LENGTH:
        problems.append(f"longer than {MAX_ID_LENGTH} characters")
    if problems:
        raise AppInvalid([("/id", p) for p in problems])
    return result


# ---------------------------------------------------------------- field parsers


def _number(low: float, high: float = MAX_SCALAR, *, above: bool = False) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad("must be a number")
        # Only floats can be infinite; an int is compared exactly (math.isfinite
        # of a 309-digit int would raise OverflowError converting it to float).
        if isinstance(value, float) and not math.isfinite(value):
            raise _Bad("must be finite")
        if value < low or (above and value == low):
            raise _Bad(f"must be {'greater than' if above else 'at least'} {low:g}")
        if value > high:
            raise _Bad(f"must be at most {high:g}")
        return float(value)
    return parse


def _integer(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise _Bad("must be a whole number")
        if not low <= value <= high:
            raise _Bad(f"must be between {low} and {high}")
        return value
    return parse


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad("must be a string")
    return value


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _Bad("must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise _Bad(f"{key!r} must be a string")
    return dict(value)


def _env(value: Any) -> dict[str, str]:
    env = _string_map(value)
    for key in env:
        if not key or "=" in key or "\0" in key:
            raise _Bad(f"invalid variable name {key!r}")
    return env


def _args(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise _Bad("must be a non-empty list of strings")
    return tuple(value)


def _ports(value: Any) -> tuple[PortDefinition, ...]:
    if not isinstance(value, list):
        raise _Bad("must be a list of port numbers")
    if len(value) > MAX_PORTS:
        raise _Bad(f"at most {MAX_PORTS} ports")
    return tuple(PortDefinition(port=_integer(0, 65535)(p)) for p in value)


_PORT_DEFINITION_FIELDS = {"port", "name", "protocol", "labels"}


def _port_definitions(value: Any) -> tuple[PortDefinition, ...]:
    if not isinstance(value, list):
        raise _Bad("must be a list of objects")
    if len(value) > MAX_PORTS:
        raise _Bad(f"at most {MAX_PORTS} ports")
    result = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _Bad(f"[{i}] must be an object")
        unknown = set(item) - _PORT_DEFINITION_FIELDS
        if unknown:
            raise _Bad(f"[{i}] unknown field(s) {', '.join(sorted(unknown))}")
        protocol = _string(item.get("protocol", "tcp"))
        if protocol not in ("tcp", "udp", "udp,tcp", "tcp,udp"):
            raise _Bad(f"[{i}] protocol must be tcp, udp or udp,tcp")
        result.append(PortDefinition(port=_integer(0, 65535)(item.get("port", 0)),
                                     name=_string(item.get("name", "")), protocol=protocol,
                                     labels=_string_map(item.get("labels", {}))))
    return tuple(result)


def _constraints(value: Any) -> tuple[Constraint, ...]:
    if not isinstance(value, list):
        raise _Bad("must be a list of [field, operator, value?]")
    try:
        return tuple(parse_constraint(c) for c in value)
    except ConstraintError as exc:
        raise _Bad(str(exc)) from None


_PROTOCOLS = {"HTTP": "HTTP", "MESOS_HTTP": "HTTP", "HTTPS": "HTTPS", "MESOS_HTTPS": "HTTPS",
              "TCP": "TCP", "MESOS_TCP": "TCP", "COMMAND": "COMMAND"}
_HEALTH_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "path": ("path", _string),
    "portIndex": ("port_index", _integer(0, MAX_PORTS - 1)),
    "gracePeriodSeconds": ("grace_period", _number(0, 86400)),
    "intervalSeconds": ("interval", _number(0, 86400, above=True)),
    "timeoutSeconds": ("timeout", _number(0, 86400, above=True)),
    "maxConsecutiveFailures": ("max_consecutive_failures", _integer(0, 1000)),
    "delaySeconds": ("delay", _number(0, 86400)),
}


def _health_checks(value: Any) -> tuple[HealthCheckDef, ...]:
    if not isinstance(value, list):
        raise _Bad("must be a list")
    if len(value) > 1:
        raise _Bad("Dyad's agents run one health check per task; give at most one")
    result = []
    for item in value:
        if not isinstance(item, dict):
            raise _Bad("[0] must be an object")
        fields: dict[str, Any] = {}
        for key, raw in item.items():
            if key == "protocol":
                protocol = _PROTOCOLS.get(raw) if isinstance(raw, str) else None
                if protocol is None:
                    raise _Bad(f"[0].protocol must be one of {', '.join(_PROTOCOLS)}")
                fields["protocol"] = protocol
            elif key == "command":
                if not isinstance(raw, dict) or not isinstance(raw.get("value"), str) \
                        or set(raw) != {"value"}:
                    raise _Bad('[0].command must be {"value": "shell command"}')
                fields["command"] = raw["value"]
            elif key in _HEALTH_FIELDS:
                name, parse = _HEALTH_FIELDS[key]
                try:
                    fields[name] = parse(raw)
                except _Bad as exc:
                    raise _Bad(f"[0].{key} {exc}") from None
            else:
                raise _Bad(f"[0] unknown field {key!r}")
        check = HealthCheckDef(**fields)
        if check.protocol == "COMMAND" and not check.command:
            raise _Bad("[0] a COMMAND health check needs command.value")
        result.append(check)
    return tuple(result)


def _upgrade_strategy(value: Any) -> UpgradeStrategy:
    if not isinstance(value, dict):
        raise _Bad("must be an object")
    unknown = set(value) - {"minimumHealthCapacity", "maximumOverCapacity"}
    if unknown:
        raise _Bad(f"unknown field(s) {', '.join(sorted(unknown))}")
    fraction = _number(0, 1)
    try:
        strategy = UpgradeStrategy(
            minimum_health_capacity=fraction(value.get("minimumHealthCapacity", 1.0)),
            maximum_over_capacity=fraction(value.get("maximumOverCapacity", 1.0)))
    except _Bad as exc:
        raise _Bad(f"capacities {exc}") from None
    if strategy.minimum_health_capacity == 1 and strategy.maximum_over_capacity == 0:
        raise _Bad("minimumHealthCapacity 1 with maximumOverCapacity 0 leaves a rolling "
                   "upgrade no room to start or stop anything")
    return strategy


def _kill_selection(value: Any) -> str:
    if value not in (YOUNGEST_FIRST, OLDEST_FIRST):
        raise _Bad(f"must be {YOUNGEST_FIRST} or {OLDEST_FIRST}")
    return str(value)


def _residency(value: Any) -> Residency:
    try:
        return parse_residency(value)
    except ResidentInvalid as exc:
        raise _Bad(str(exc)) from None


def _container(value: Any) -> AppContainer:
    try:
        return parse_container(value)
    except ContainerInvalid as exc:
        raise _Bad(str(exc)) from None


def _priority(value: Any) -> int:
    try:
        return priorities.check_priority(value)
    except priorities.PriorityError as exc:
        raise _Bad(str(exc)) from None


def _optional_cmd(value: Any) -> str:
    text = _string(value)
    if not text.strip():
        raise _Bad("must not be empty")
    return text


_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "cmd": ("cmd", _optional_cmd),
    "args": ("args", _args),
    "instances": ("instances", _integer(0, MAX_INSTANCES)),
    "cpus": ("cpus", _number(0)),
    "mem": ("mem", _number(0)),
    "disk": ("disk", _number(0)),
    "ports": ("ports", _ports),
    "portDefinitions": ("ports", _port_definitions),
    "env": ("env", _env),
    "labels": ("labels", _string_map),
    "constraints": ("constraints", _constraints),
    "healthChecks": ("health_checks", _health_checks),
    "upgradeStrategy": ("upgrade_strategy", _upgrade_strategy),
    "backoffSeconds": ("backoff_seconds", _number(0, 3600)),
    "backoffFactor": ("backoff_factor", _number(1, 100)),
    "maxLaunchDelaySeconds": ("max_launch_delay_seconds", _number(0, 86400)),
    "killSelection": ("kill_selection", _kill_selection),
    "taskKillGracePeriodSeconds": ("task_kill_grace_period_seconds", _number(0, 3600)),
    "user": ("user", _string),
    "autopilot": ("autopilot", parse_spec),
    "container": ("container", _container),
    "residency": ("residency", _residency),
    "priority": ("priority", _priority),
}


# ------------------------------------------------------------------- the parser


def parse_app(body: Any, *, app_id: str | None = None,
              base: AppDefinition | None = None) -> AppDefinition:
    """Validate a Marathon app JSON object.

    ``app_id`` (from the URL) wins over a body ``id``, which must then agree.
    ``base`` makes this a partial update (PUT): fields in `body` replace the base's,
    the rest are kept; giving ``cmd`` drops the base's ``args`` and vice versa,
    and ``ports``/``portDefinitions`` replace each other likewise.
    """
    if not isinstance(body, dict):
        raise AppInvalid([("/", "an app definition must be a JSON object")])
    details: list[tuple[str, str]] = []
    fields: dict[str, Any] = {}
    the_id = _resolve_id(body, app_id, details)
    for key, raw in body.items():
        if key == "id" or key in READ_ONLY_FIELDS:
            continue
        if key == "ports" and "portDefinitions" in body:
            continue  # the richer form wins; the two are compared below
        spec = _FIELDS.get(key)
        if spec is None:
            details.append((f"/{key}", "unknown field (not supported by Dyad)"))
            continue
        name, parse = spec
        if raw is None and name in ("cmd", "args", "task_kill_grace_period_seconds",
                                    "container", "residency"):
            fields[name] = None
            continue
        if name == "autopilot":  # its parser names every problem with its own path
            try:
                fields[name] = parse_spec(raw)
            except SpecInvalid as exc:
                details.extend(exc.details)
            continue
        try:
            fields[name] = parse(raw)
        except _Bad as exc:
            details.append((f"/{key}", str(exc)))
    if "ports" in body and "portDefinitions" in body:
        if _ports_of(body["ports"]) != _ports_of(body["portDefinitions"]):
            details.append(("/ports", "ports and portDefinitions disagree; give one"))
    if details:
        raise AppInvalid(details)
    if base is not None:
        if "cmd" in fields and "args" not in fields:
            fields["args"] = None
        if "args" in fields and "cmd" not in fields:
            fields["cmd"] = None
        kept = {k: v for k, v in attrs.asdict(base, recurse=False).items()
                if k not in ("id", "version", "config_version")}
        fields = {**kept, **fields}
    app = AppDefinition(id=the_id or "", **fields)
    if app.persistent is not None and app.residency is None:
        app = attrs.evolve(app, residency=Residency())  # as Marathon does
    _check_whole(app, details)
    if details:
        raise AppInvalid(details)
    return app


def _resolve_id(body: dict[str, Any], app_id: str | None, details: list[tuple[str, str]]) -> str | None:
    try:
        body_id = normalize_app_id(body["id"]) if "id" in body else None
        if app_id is None and body_id is None:
            details.append(("/id", "is required"))
            return None
        if app_id is not None and body_id is not None and body_id != app_id:
            details.append(("/id", f"{body_id} does not match the URL's {app_id}"))
        return app_id or body_id
    except AppInvalid as exc:
        details.extend(exc.details)
        return None


def _ports_of(raw: Any) -> list[int] | None:
    if not isinstance(raw, list):
        return None
    return [p.get("port", 0) if isinstance(p, dict) else p for p in raw]


def _check_whole(app: AppDefinition, details: list[tuple[str, str]]) -> None:
    """Rules that involve more than one field."""
    if (app.cmd is None) == (app.args is None):
        details.append(("/cmd", "give exactly one of cmd or args"))
    if app.cpus <= 0 and app.mem <= 0:
        details.append(("/cpus", "an app needs some cpus or mem"))
    least, most = app.upgrade_strategy.bounds(app.instances)
    if app.instances and least >= app.instances and most <= app.instances:
        details.append(("/upgradeStrategy", f"for {app.instances} instances it allows "
                        "neither an extra task nor one fewer healthy task, so an upgrade "
                        "could never make progress"))
    fixed = [p.port for p in app.ports if p.port]
    if len(fixed) != len(set(fixed)):
        details.append(("/ports", "a host port is listed twice"))
    if app.container is not None and len(app.container.persistent) > 1:
        details.append(("/container/volumes", "one persistent volume per app (Dyad's limit)"))
    if app.residency is not None and app.persistent is None:
        details.append(("/residency", "residency needs a persistent volume in the container"))
    if app.container is not None and app.container.bridged_ports and app.ports:
        details.append(("/container", "give portMappings or portDefinitions, not both"))
    for check in app.health_checks:
        if check.protocol != "COMMAND" and check.port_index >= len(app.host_ports):
            details.append(("/healthChecks", f"portIndex {check.port_index} but the app "
                            f"has {len(app.host_ports)} port(s)"))
    try:
        check_satisfiable(app.constraints, app.instances)
    except ConstraintError as exc:
        details.append(("/constraints", str(exc)))


# ------------------------------------------------------------------ to JSON


def app_to_json(app: AppDefinition) -> dict[str, Any]:
    """The definition in Marathon's field names (what `parse_app` reads back)."""
    body: dict[str, Any] = {"id": app.id}
    if app.cmd is not None:
        body["cmd"] = app.cmd
    if app.args is not None:
        body["args"] = list(app.args)
    body.update({
        "instances": app.instances, "cpus": app.cpus, "mem": app.mem, "disk": app.disk,
        "ports": [p.port for p in app.ports],
        "portDefinitions": [{"port": p.port, "name": p.name, "protocol": p.protocol,
                             "labels": dict(p.labels)} for p in app.ports],
        "env": dict(app.env), "labels": dict(app.labels),
        "constraints": [c.to_json() for c in app.constraints],
        "healthChecks": [_health_json(h) for h in app.health_checks],
        "upgradeStrategy": {
            "minimumHealthCapacity": app.upgrade_strategy.minimum_health_capacity,
            "maximumOverCapacity": app.upgrade_strategy.maximum_over_capacity},
        "backoffSeconds": app.backoff_seconds, "backoffFactor": app.backoff_factor,
        "maxLaunchDelaySeconds": app.max_launch_delay_seconds,
        "killSelection": app.kill_selection,
        "taskKillGracePeriodSeconds": app.task_kill_grace_period_seconds,
        "user": app.user, "priority": app.priority, "autopilot": unparse_spec(app.autopilot),
    })
    if app.container is not None:
        body["container"] = container_to_json(app.container)
    if app.residency is not None:
        body["residency"] = residency_json(app.residency)
    return body


def _health_json(check: HealthCheckDef) -> dict[str, Any]:
    body: dict[str, Any] = {
        "protocol": check.protocol, "gracePeriodSeconds": check.grace_period,
        "intervalSeconds": check.interval, "timeoutSeconds": check.timeout,
        "maxConsecutiveFailures": check.max_consecutive_failures,
        "delaySeconds": check.delay}
    if check.protocol == "COMMAND":
        body["command"] = {"value": check.command}
    else:
        body.update({"path": check.path, "portIndex": check.port_index})
    return body


def app_from_stored(body: dict[str, Any]) -> AppDefinition:
    """An app as `stored_app` wrote it (definition plus its versions)."""
    app = parse_app(body["app"])
    return attrs.evolve(app, version=body["version"], config_version=body["configVersion"])


def stored_app(app: AppDefinition) -> dict[str, Any]:
    return {"app": app_to_json(app), "version": app.version,
            "configVersion": app.config_version}
