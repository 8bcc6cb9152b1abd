"""Dyad's wire types in Mesos' v1 JSON, and back -- pure.

The Mesos v1 HTTP API (docs/mesos-compat.md) speaks protobuf messages rendered
as JSON: ids are objects (`{"value": "..."}`), resources are lists of `Resource`
objects, bytes are base64 strings, durations are seconds (`*_seconds`) or
`{"nanoseconds": N}`. This module converts each shape to the `dyad.messages`
type the master core already understands and back, so the v1 endpoint
(master/api_v1.py) is a thin shell and every rule of the core holds for HTTP
frameworks exactly as for Dyad's own driver.

Reading (`*_from_mesos`) ignores keys it does not know, as protobuf's JSON
parser does, and raises `MesosJsonError` naming the JSON path of the first bad
value (`accept.operations[0].launch.task_infos[1].resources[2].scalar.value:
expected a number`), never anything else. What Mesos has and Dyad does not
(SET resources, persistent volumes' `disk`, secrets, the default executor) is
refused with the path rather than silently dropped. Writing (`*_to_mesos`)
gives what `*_from_mesos` reads back to an equal value.

Calls and events (whole request and stream bodies) live in dyad/mesos_calls.py.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import math
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from dyad.containers import ContainerInfo, DockerInfo, PortMapping, Volume
from dyad.messages import (
    URI, CommandInfo, ExecutorInfo, Filters, FrameworkInfo, HealthCheck, HealthCheckType,
    MasterInfo, Offer, TaskInfo, TaskState, TaskStatus,
)
from dyad.resources import UNRESERVED, Resources, ResourcesError

MESOS_VERSION = "1.11.0"
"""The Mesos release whose v1 API Dyad answers (`GET /version`, `master_info`)."""

NANOS = 1_000_000_000
_T = TypeVar("_T")


class MesosJsonError(ValueError):
    """Mesos JSON that does not convert; `path` says where, `reason` what is wrong."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


# ------------------------------------------------------------------ reading helpers


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MesosJsonError(path, f"expected an object, got {_kind(value)}")
    return value


def field(data: dict[str, Any], key: str, path: str, read: Callable[[Any, str], _T],
          default: _T) -> _T:
    """`read(data[key])`, or `default` when the key is absent or null."""
    value = data.get(key)
    return default if value is None else read(value, join(path, key))


def required(data: dict[str, Any], key: str, path: str, read: Callable[[Any, str], _T]) -> _T:
    value = data.get(key)
    if value is None:
        raise MesosJsonError(join(path, key), "is required")
    return read(value, join(path, key))


def string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise MesosJsonError(path, f"expected a string, got {_kind(value)}")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise MesosJsonError(path, f"expected true or false, got {_kind(value)}")
    return value


def number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MesosJsonError(path, f"expected a number, got {_kind(value)}")
    try:
        result = float(value)
    except OverflowError:
        raise MesosJsonError(path, "number is too large") from None
    if not math.isfinite(result) or result < 0:
        raise MesosJsonError(path, f"expected a number >= 0, got {value}")
    return result


def integer(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MesosJsonError(path, f"expected a whole number, got {_kind(value)}")
    if not 0 <= value < 2**64:
        raise MesosJsonError(path, f"expected a whole number in 0..2^64-1, got {value}")
    return value


def items(value: Any, path: str, read: Callable[[Any, str], _T]) -> list[_T]:
    if not isinstance(value, list):
        raise MesosJsonError(path, f"expected a list, got {_kind(value)}")
    return [read(item, join(path, i)) for i, item in enumerate(value)]


def id_value(value: Any, path: str) -> str:
    """A Mesos id (`{"value": "..."}`): a non-empty string."""
    text = required(obj(value, path), "value", path, string)
    if not text:
        raise MesosJsonError(join(path, "value"), "must not be empty")
    return text


def b64(value: Any, path: str) -> bytes:
    text = string(value, path)
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise MesosJsonError(path, "expected base64") from None


def b64_text(value: Any, path: str) -> str:
    """Base64 of UTF-8 text (the uuids Dyad hands out)."""
    try:
        return b64(value, path).decode("utf-8")
    except UnicodeDecodeError:
        raise MesosJsonError(path, "is not a uuid this master issued") from None


def nanoseconds(value: Any, path: str) -> float:
    """A Mesos `DurationInfo` (`{"nanoseconds": N}`) in seconds."""
    return required(obj(value, path), "nanoseconds", path, integer) / NANOS


def build(path: str, make: Callable[[], _T]) -> _T:
    """Run a Dyad constructor; its validators' complaints get the path."""
    try:
        return make()
    except MesosJsonError:
        raise
    except (ValueError, TypeError, ResourcesError) as exc:
        raise MesosJsonError(path, str(exc)) from None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), "null")


# ------------------------------------------------------------------ writing helpers


def mesos_id(value: str) -> dict[str, str]:
    return {"value": value}


def to_b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def duration(seconds: float) -> dict[str, int]:
    """Seconds as a Mesos `DurationInfo`."""
    return {"nanoseconds": round(seconds * NANOS)}


def _some(**values: Any) -> dict[str, Any]:
    """The keys whose values are set (protobuf leaves unset optionals out)."""
    return {key: value for key, value in values.items()
            if value is not None and value != "" and value != [] and value != {}}


# ------------------------------------------------------------------------ resources


def resources_to_mesos(resources: Resources) -> list[dict[str, Any]]:
    """One `Resource` per (name, role), reserved ones with `reservations`."""
    out: list[dict[str, Any]] = []
    for role in sorted(resources.roles(), key=lambda r: (r != UNRESERVED, r)):
        part = resources.reserved(role)
        scalars = part.scalar_items()
        reservation: dict[str, Any] = {"role": role}
        if role != UNRESERVED:
            reservation["reservations"] = [{"role": role}]
        for name in sorted(scalars):
            out.append({"name": name, "type": "SCALAR",
                        "scalar": {"value": scalars[name] / 1000}, **reservation})
        for name in sorted(part.names() - scalars.keys()):
            out.append({"name": name, "type": "RANGES", "ranges": {"range": [
                {"begin": begin, "end": end} for begin, end in part.ranges(name)]},
                **reservation})
    return out


def resources_from_mesos(value: Any, path: str) -> Resources:
    total = Resources()
    for i, entry in enumerate(items(value, path, obj)):
        where = join(path, i)
        part = _resource(entry, where)
        total = build(where, lambda: total + part)
    return total


def _resource(value: Any, path: str) -> Resources:
    data = obj(value, path)
    name = required(data, "name", path, string)
    for unsupported in ("disk", "shared", "provider_id"):
        if data.get(unsupported) is not None:
            raise MesosJsonError(join(path, unsupported), "is not supported by Dyad "
                                 "(no persistent volumes or resource providers)")
    role = _resource_role(data, path)
    kind = required(data, "type", path, string)
    if kind == "SCALAR":
        scalar = required(data, "scalar", path, obj)
        amount = required(scalar, "value", join(path, "scalar"), number)
        return build(path, lambda: Resources.scalar(name, amount, role))
    if kind == "RANGES":
        where = join(path, "ranges")
        listed = field(required(data, "ranges", path, obj), "range", where,
                       lambda v, p: items(v, p, _range), [])
        return build(path, lambda: Resources.from_ranges(name, listed, role))
    if kind == "SET":
        raise MesosJsonError(join(path, "type"), "SET resources are not supported by Dyad")
    raise MesosJsonError(join(path, "type"), f"expected SCALAR or RANGES, got {kind!r}")


def _resource_role(data: dict[str, Any], path: str) -> str:
    """The role a resource is reserved to: the last (innermost) of `reservations`,
    else the pre-1.4 `role` field, else unreserved."""
    stack = field(data, "reservations", path, lambda v, p: items(v, p, obj), [])
    if stack:
        where = join(join(path, "reservations"), len(stack) - 1)
        return required(stack[-1], "role", where, string)
    return field(data, "role", path, string, UNRESERVED)


def _range(value: Any, path: str) -> tuple[int, int]:
    data = obj(value, path)
    return required(data, "begin", path, integer), required(data, "end", path, integer)


# ------------------------------------------------------------------ framework info


def framework_info_to_mesos(info: FrameworkInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"user": info.user, "name": info.name}
    out |= _some(hostname=info.hostname, principal=info.principal, webui_url=info.webui_url)
    if info.id is not None:
        out["id"] = mesos_id(info.id)
    out["failover_timeout"] = info.failover_timeout
    out["checkpoint"] = info.checkpoint
    if len(info.roles) == 1 and "MULTI_ROLE" not in info.capabilities:
        out["role"] = info.roles[0]
    else:
        out["roles"] = list(info.roles)
    if info.capabilities:
        out["capabilities"] = [{"type": kind} for kind in info.capabilities]
    return out


def framework_info_from_mesos(value: Any, path: str) -> FrameworkInfo:
    """A v1 framework always acknowledges updates explicitly (the API has no
    implicit acknowledgements), which `implicit_acknowledgements=False` records."""
    data = obj(value, path)
    roles = field(data, "roles", path, lambda v, p: items(v, p, string), [])
    if not roles:
        roles = [field(data, "role", path, string, UNRESERVED)]
    capabilities = field(data, "capabilities", path,
                         lambda v, p: items(v, p, _capability), [])
    return build(path, lambda: FrameworkInfo(
        name=required(data, "name", path, string),
        user=field(data, "user", path, string, ""),
        id=field(data, "id", path, id_value, None),
        roles=roles,
        hostname=field(data, "hostname", path, string, ""),
        principal=field(data, "principal", path, string, ""),
        webui_url=field(data, "webui_url", path, string, ""),
        failover_timeout=field(data, "failover_timeout", path, number, 0.0),
        checkpoint=field(data, "checkpoint", path, boolean, False),
        capabilities=list(dict.fromkeys(capabilities)),
        implicit_acknowledgements=False))


def _capability(value: Any, path: str) -> str:
    return required(obj(value, path), "type", path, string)


def master_info_to_mesos(info: MasterInfo) -> dict[str, Any]:
    """Mesos' `MasterInfo`: `ip` is the IPv4 address as Mesos packs it (network
    byte order read as a little-endian integer), `port` the HTTP port."""
    try:
        packed = int.from_bytes(ipaddress.IPv4Address(info.ip).packed, "little")
    except ValueError:
        packed = 0
    return {"id": info.id, "ip": packed, "port": info.port,
            "pid": f"master@{info.ip}:{info.port}", "hostname": info.hostname,
            "version": MESOS_VERSION,
            "address": {"hostname": info.address.hostname, "ip": info.address.ip,
                        "port": info.address.port}}


# --------------------------------------------------------------------------- offers


def offer_to_mesos(offer: Offer) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": mesos_id(offer.id), "framework_id": mesos_id(offer.framework_id),
        "agent_id": mesos_id(offer.agent_id), "hostname": offer.hostname,
        "resources": resources_to_mesos(offer.resources),
        "attributes": [{"name": name, "type": "TEXT", "text": {"value": text}}
                       for name, text in sorted(offer.attributes.items())],
        "executor_ids": [mesos_id(eid) for eid in offer.executor_ids],
    }
    url = urllib.parse.urlsplit(offer.url) if offer.url else None
    if url is not None and url.hostname and url.port:
        out["url"] = {"scheme": url.scheme, "address": {
            "hostname": offer.hostname, "ip": url.hostname, "port": url.port},
            "path": url.path or "/"}
    return out


def offer_from_mesos(value: Any, path: str) -> Offer:
    data = obj(value, path)
    return build(path, lambda: Offer(
        id=required(data, "id", path, id_value),
        framework_id=required(data, "framework_id", path, id_value),
        agent_id=required(data, "agent_id", path, id_value),
        hostname=required(data, "hostname", path, string),
        resources=field(data, "resources", path, resources_from_mesos, Resources()),
        attributes=dict(field(data, "attributes", path,
                              lambda v, p: items(v, p, _attribute), [])),
        executor_ids=field(data, "executor_ids", path, lambda v, p: items(v, p, id_value), []),
        url=field(data, "url", path, _url, "")))


def _attribute(value: Any, path: str) -> tuple[str, str]:
    """Mesos attributes are typed; Dyad's are text, in Mesos' own text forms."""
    data = obj(value, path)
    name = required(data, "name", path, string)
    kind = required(data, "type", path, string)
    if kind == "TEXT":
        return name, required(required(data, "text", path, obj), "value",
                              join(path, "text"), string)
    if kind == "SCALAR":
        amount = required(required(data, "scalar", path, obj), "value",
                          join(path, "scalar"), number)
        return name, f"{amount:g}"
    if kind == "RANGES":
        ranges = field(required(data, "ranges", path, obj), "range", join(path, "ranges"),
                       lambda v, p: items(v, p, _range), [])
        return name, "[" + ",".join(f"{b}-{e}" for b, e in ranges) + "]"
    if kind == "SET":
        chosen = field(required(data, "set", path, obj), "item", join(path, "set"),
                       lambda v, p: items(v, p, string), [])
        return name, "{" + ",".join(chosen) + "}"
    raise MesosJsonError(join(path, "type"), f"unknown attribute type {kind!r}")


def _url(value: Any, path: str) -> str:
    data = obj(value, path)
    address = required(data, "address", path, obj)
    where = join(path, "address")
    host = field(address, "ip", where, string, "") or required(address, "hostname", where,
                                                                 string)
    port = required(address, "port", where, integer)
    tail = field(data, "path", path, string, "")
    return f"{field(data, 'scheme', path, string, 'http')}://{host}:{port}" + (
        tail if tail not in ("", "/") else "")


# --------------------------------------------------------------------------- tasks


def command_to_mesos(command: CommandInfo) -> dict[str, Any]:
    out: dict[str, Any]
    if command.shell is not None:
        out = {"shell": True, "value": command.shell}
    else:
        argv = command.argv or []
        out = {"shell": False, "value": argv[0], "arguments": list(argv)}
    if command.environment:
        out["environment"] = {"variables": [
            {"name": name, "type": "VALUE", "value": value}
            for name, value in sorted(command.environment.items())]}
    if command.uris:
        out["uris"] = [{"value": uri.value, "extract": uri.extract,
                        "executable": uri.executable, "cache": uri.cache,
                        **_some(output_file=uri.output_file)} for uri in command.uris]
    if command.user:
        out["user"] = command.user
    return out


def command_from_mesos(value: Any, path: str) -> CommandInfo:
    """`shell` (default true) runs `value` under /bin/sh -c; otherwise `value` is
    the program, exec'd with `arguments` (whose first is argv[0], as in execv)."""
    data = obj(value, path)
    text = field(data, "value", path, string, "")
    arguments = field(data, "arguments", path, lambda v, p: items(v, p, string), [])
    shell = field(data, "shell", path, boolean, True)
    env = field(data, "environment", path, _environment, {})
    uris = field(data, "uris", path, lambda v, p: items(v, p, _uri), [])
    user = field(data, "user", path, string, "")
    if shell:
        if not text:
            raise MesosJsonError(join(path, "value"), "a shell command needs a value")
        return build(path, lambda: CommandInfo(shell=text, environment=env, uris=uris,
                                               user=user))
    argv = [text, *arguments[1:]] if text else arguments
    if not argv:
        raise MesosJsonError(join(path, "value"), "a command with shell false needs a "
                                                  "value (the program to run)")
    return build(path, lambda: CommandInfo(argv=argv, environment=env, uris=uris, user=user))


def _environment(value: Any, path: str) -> dict[str, str]:
    variables = field(obj(value, path), "variables", path,
                      lambda v, p: items(v, p, _variable), [])
    return dict(variables)


def _variable(value: Any, path: str) -> tuple[str, str]:
    data = obj(value, path)
    kind = field(data, "type", path, string, "VALUE")
    if kind != "VALUE":
        raise MesosJsonError(join(path, "type"), f"{kind} variables are not supported by "
                                                 "Dyad (no secret store)")
    return required(data, "name", path, string), field(data, "value", path, string, "")


def _uri(value: Any, path: str) -> URI:
    data = obj(value, path)
    return build(path, lambda: URI(
        value=required(data, "value", path, string),
        extract=field(data, "extract", path, boolean, True),
        executable=field(data, "executable", path, boolean, False),
        cache=field(data, "cache", path, boolean, False),
        output_file=field(data, "output_file", path, string, "")))


def health_check_to_mesos(check: HealthCheck) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": check.type, "delay_seconds": check.delay,
        "interval_seconds": check.interval, "timeout_seconds": check.timeout,
        "grace_period_seconds": check.grace_period,
        "consecutive_failures": check.consecutive_failures}
    if check.command is not None:
        out["command"] = command_to_mesos(check.command)
    if check.type == HealthCheckType.HTTP:
        out["http"] = {"scheme": check.scheme, "port": check.port, "path": check.path}
    elif check.type == HealthCheckType.TCP:
        out["tcp"] = {"port": check.port}
    return out


def health_check_from_mesos(value: Any, path: str) -> HealthCheck:
    data = obj(value, path)
    kind = field(data, "type", path, string, "")
    if not kind:  # before Mesos 1.2 a health check had no type, only a command
        kind = HealthCheckType.COMMAND
    port: int | None = None
    scheme, check_path = "http", "/"
    if kind == HealthCheckType.HTTP:
        http = required(data, "http", path, obj)
        where = join(path, "http")
        port = required(http, "port", where, integer)
        scheme = field(http, "scheme", where, string, "http")
        check_path = field(http, "path", where, string, "/")
    elif kind == HealthCheckType.TCP:
        port = required(required(data, "tcp", path, obj), "port", join(path, "tcp"), integer)
    return build(path, lambda: HealthCheck(
        type=kind, command=field(data, "command", path, command_from_mesos, None),
        port=port, scheme=scheme, path=check_path,
        delay=field(data, "delay_seconds", path, number, 15.0),
        interval=field(data, "interval_seconds", path, number, 10.0),
        timeout=field(data, "timeout_seconds", path, number, 20.0),
        grace_period=field(data, "grace_period_seconds", path, number, 10.0),
        consecutive_failures=field(data, "consecutive_failures", path, integer, 3)))


def container_to_mesos(container: ContainerInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"type": container.type}
    docker = container.docker
    if docker is not None:
        out["docker"] = {
            "image": docker.image, "network": docker.network,
            "force_pull_image": docker.force_pull,
            "port_mappings": [{"host_port": m.host_port, "container_port": m.container_port,
                               "protocol": m.protocol} for m in docker.port_mappings],
            "parameters": [{"key": key, "value": text}
                           for key, text in sorted(docker.parameters.items())]}
    if container.volumes:
        out["volumes"] = [{"container_path": v.container_path, "host_path": v.host_path,
                           "mode": v.mode} for v in container.volumes]
    return out


def container_from_mesos(value: Any, path: str) -> ContainerInfo | None:
    """DOCKER containers as Docker's; a MESOS container from a Docker image runs
    from that image under Docker too; a MESOS container without an image is no
    container at all (the agent's plain process launch)."""
    data = obj(value, path)
    kind = required(data, "type", path, string)
    volumes = field(data, "volumes", path, lambda v, p: items(v, p, _volume), [])
    if kind == "MESOS":
        image = field(field(data, "mesos", path, obj, {}), "image", join(path, "mesos"),
                      obj, None)
        if image is None:
            if volumes:
                raise MesosJsonError(join(path, "volumes"), "volumes need an image")
            return None
        where = join(join(path, "mesos"), "image")
        if field(image, "type", where, string, "DOCKER") != "DOCKER":
            raise MesosJsonError(join(where, "type"), "only DOCKER images are supported")
        name = required(required(image, "docker", where, obj), "name",
                        join(where, "docker"), string)
        return build(path, lambda: ContainerInfo(docker=DockerInfo(image=name),
                                                 volumes=volumes))
    if kind != "DOCKER":
        raise MesosJsonError(join(path, "type"), f"expected DOCKER or MESOS, got {kind!r}")
    return build(path, lambda: ContainerInfo(
        docker=required(data, "docker", path, _docker), volumes=volumes))


def _docker(value: Any, path: str) -> DockerInfo:
    data = obj(value, path)
    if field(data, "privileged", path, boolean, False):
        raise MesosJsonError(join(path, "privileged"), "privileged containers are not "
                                                       "supported by Dyad")
    parameters = field(data, "parameters", path, lambda v, p: items(v, p, _label), [])
    return build(path, lambda: DockerInfo(
        image=required(data, "image", path, string),
        network=field(data, "network", path, string, "HOST"),
        port_mappings=field(data, "port_mappings", path,
                            lambda v, p: items(v, p, _port_mapping), []),
        force_pull=field(data, "force_pull_image", path, boolean, False),
        parameters=dict(parameters)))


def _port_mapping(value: Any, path: str) -> PortMapping:
    data = obj(value, path)
    return build(path, lambda: PortMapping(
        host_port=required(data, "host_port", path, integer),
        container_port=required(data, "container_port", path, integer),
        protocol=field(data, "protocol", path, string, "tcp")))


def _volume(value: Any, path: str) -> Volume:
    data = obj(value, path)
    return build(path, lambda: Volume(
        container_path=required(data, "container_path", path, string),
        host_path=required(data, "host_path", path, string),
        mode=field(data, "mode", path, string, "RW")))


def _label(value: Any, path: str) -> tuple[str, str]:
    data = obj(value, path)
    return required(data, "key", path, string), field(data, "value", path, string, "")


def _labels(value: Any, path: str) -> dict[str, str]:
    return dict(field(obj(value, path), "labels", path, lambda v, p: items(v, p, _label), []))


def executor_to_mesos(executor: ExecutorInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"executor_id": mesos_id(executor.executor_id),
                           "type": "CUSTOM", "command": command_to_mesos(executor.command),
                           "resources": resources_to_mesos(executor.resources)}
    if executor.name:
        out["name"] = executor.name
    if executor.framework_id is not None:
        out["framework_id"] = mesos_id(executor.framework_id)
    return out


def executor_from_mesos(value: Any, path: str) -> ExecutorInfo:
    data = obj(value, path)
    if field(data, "type", path, string, "CUSTOM") != "CUSTOM":
        raise MesosJsonError(join(path, "type"), "only CUSTOM executors are supported "
                                                 "(Dyad has no default executor for task "
                                                 "groups)")
    if data.get("container") is not None:
        raise MesosJsonError(join(path, "container"), "executor containers are not "
                                                      "supported over the v1 API yet")
    return build(path, lambda: ExecutorInfo(
        executor_id=required(data, "executor_id", path, id_value),
        command=required(data, "command", path, command_from_mesos),
        resources=field(data, "resources", path, resources_from_mesos, Resources()),
        name=field(data, "name", path, string, ""),
        framework_id=field(data, "framework_id", path, id_value, None)))


_TASK_HAS_CONTAINER = "container" in attrs.fields_dict(TaskInfo)


def task_info_to_mesos(task: TaskInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"name": task.name, "task_id": mesos_id(task.task_id),
                           "agent_id": mesos_id(task.agent_id),
                           "resources": resources_to_mesos(task.resources)}
    if task.command is not None:
        out["command"] = command_to_mesos(task.command)
    if task.executor is not None:
        out["executor"] = executor_to_mesos(task.executor)
    container = getattr(task, "container", None)
    if container is not None:
        out["container"] = container_to_mesos(container)
    if task.data:
        out["data"] = to_b64(task.data)
    if task.labels:
        out["labels"] = {"labels": [{"key": key, "value": text}
                                    for key, text in sorted(task.labels.items())]}
    if task.kill_grace_period is not None:
        out["kill_policy"] = {"grace_period": duration(task.kill_grace_period)}
    if task.health_check is not None:
        out["health_check"] = health_check_to_mesos(task.health_check)
    return out


def task_info_from_mesos(value: Any, path: str) -> TaskInfo:
    data = obj(value, path)
    extra: dict[str, Any] = {}
    container = field(data, "container", path, container_from_mesos, None)
    if container is not None:
        if not _TASK_HAS_CONTAINER:
            raise MesosJsonError(join(path, "container"), "containers are not supported "
                                                          "by this master")
        extra["container"] = container
    kill_policy = field(data, "kill_policy", path, obj, {})
    return build(path, lambda: TaskInfo(
        task_id=required(data, "task_id", path, id_value),
        name=required(data, "name", path, string),
        agent_id=required(data, "agent_id", path, id_value),
        resources=field(data, "resources", path, resources_from_mesos, Resources()),
        command=field(data, "command", path, command_from_mesos, None),
        executor=field(data, "executor", path, executor_from_mesos, None),
        data=field(data, "data", path, b64, b""),
        labels=field(data, "labels", path, _labels, {}),
        kill_grace_period=field(kill_policy, "grace_period", join(path, "kill_policy"),
                                nanoseconds, None),
        health_check=field(data, "health_check", path, health_check_from_mesos, None),
        **extra))


def kill_grace(value: Any, path: str) -> float | None:
    """A `KillPolicy`'s grace period in seconds (None: the task's own)."""
    return field(obj(value, path), "grace_period", path, nanoseconds, None)


def filters_from_mesos(value: Any, path: str) -> Filters:
    data = obj(value, path)
    return build(path, lambda: Filters(
        refuse_seconds=field(data, "refuse_seconds", path, number, 5.0)))


# ------------------------------------------------------------------- task status


def task_status_to_mesos(status: TaskStatus) -> dict[str, Any]:
    out: dict[str, Any] = {"task_id": mesos_id(status.task_id), "state": status.state.value,
                           "timestamp": status.timestamp}
    out |= _some(source=status.source, reason=status.reason, message=status.message)
    if status.agent_id:
        out["agent_id"] = mesos_id(status.agent_id)
    if status.executor_id:
        out["executor_id"] = mesos_id(status.executor_id)
    if status.uuid:  # only updates that carry a uuid are acknowledged
        out["uuid"] = to_b64(status.uuid.encode("utf-8"))
    if status.healthy is not None:
        out["healthy"] = status.healthy
    if status.data:
        out["data"] = to_b64(status.data)
    return out


def task_status_from_mesos(value: Any, path: str) -> TaskStatus:
    data = obj(value, path)
    state_name = required(data, "state", path, string)
    if state_name not in TaskState.__members__:
        raise MesosJsonError(join(path, "state"), f"unknown task state {state_name[:40]!r}")
    return build(path, lambda: TaskStatus(
        task_id=required(data, "task_id", path, id_value),
        state=TaskState[state_name],
        reason=field(data, "reason", path, string, ""),
        message=field(data, "message", path, string, ""),
        source=field(data, "source", path, string, ""),
        agent_id=field(data, "agent_id", path, id_value, ""),
        executor_id=field(data, "executor_id", path, id_value, ""),
        uuid=field(data, "uuid", path, b64_text, ""),
        healthy=field(data, "healthy", path, boolean, None),
        timestamp=field(data, "timestamp", path, number, 0.0),
        data=field(data, "data", path, b64, b"")))
