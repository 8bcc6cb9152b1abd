"""Marathon's ``container`` of an app definition: its JSON in and out, and the
`ContainerInfo` a placed task carries.

    "container": {"type": "DOCKER",
                  "docker": {"image": "web:2", "network": "BRIDGE",
                             "portMappings": [{"containerPort": 8080, "hostPort": 0}],
                             "forcePullImage": false,
                             "parameters": [{"key": "user", "value": "nobody"}]},
                  "volumes": [{"containerPath": "/data", "hostPath": "data", "mode": "RW"}]}

Under BRIDGE the port mappings are the app's ports: ``hostPort: 0`` (the
default) is any free port of the offer, chosen as for ``portDefinitions``, and
``containerPort: 0`` means "the same as the host port". Newer Marathon's
``container.portMappings`` is read as well. Only the DOCKER type runs images; a
container of type MESOS (or without ``docker``) may hold only persistent volumes
(``{"containerPath", "mode", "persistent": {"size"}}``: frameworks/service/resident.py),
which a DOCKER container may hold too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from dyad.containers import (
    DOCKER, NETWORKS, PROTOCOLS, SUPPORTED_PARAMETERS, VOLUME_MODES, ContainerInfo,
    DockerInfo, Network, PortMapping, Volume, problems,
)
from dyad.resources import Resources
from frameworks.service.resident import (
    PersistentSpec, ResidentInvalid, parse_persistent, persistent_json,
)

MESOS = "MESOS"  # Marathon's name for a container without an image

MAX_MAPPINGS = 100


class ContainerInvalid(ValueError):
    """What is wrong with the ``container`` field, in one sentence."""


@attrs.frozen
class AppPortMapping:
    container_port: int = 0  # 0: the host port chosen
    host_port: int = 0  # 0: any free port of the offer
    protocol: str = "tcp"
    name: str = ""
    labels: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class AppContainer:
    image: str
    network: str = Network.HOST
    port_mappings: tuple[AppPortMapping, ...] = ()
    force_pull: bool = False
    parameters: tuple[tuple[str, str], ...] = ()
    volumes: tuple[Volume, ...] = ()
    persistent: tuple[PersistentSpec, ...] = ()  # "" image: no image, volumes only

    @property
    def bridged_ports(self) -> bool:
        """The port mappings, not ``portDefinitions``, are the app's ports."""
        return self.network == Network.BRIDGE and bool(self.port_mappings)

    def info(self, host_ports: list[int]) -> ContainerInfo:
        """The task's container, its mappings bound to the chosen `host_ports`."""
        mappings = [PortMapping(host_port=port, container_port=m.container_port or port,
                                protocol=m.protocol)
                    for m, port in zip(self.port_mappings, host_ports)] \
            if self.bridged_ports else []
        return ContainerInfo(type=DOCKER, docker=DockerInfo(
            image=self.image, network=self.network, port_mappings=mappings,
            force_pull=self.force_pull, parameters=dict(self.parameters)),
            volumes=list(self.volumes))


_FIELDS = {"type", "docker", "volumes", "portMappings"}
_DOCKER_FIELDS = {"image", "network", "portMappings", "forcePullImage", "parameters",
                  "privileged"}
_MAPPING_FIELDS = {"containerPort", "hostPort", "servicePort", "protocol", "name", "labels"}
_VOLUME_FIELDS = {"containerPath", "hostPath", "mode", "persistent"}


def parse_container(value: Any) -> AppContainer:
    """Marathon's ``container`` object; raises `ContainerInvalid`."""
    if not isinstance(value, dict):
        raise ContainerInvalid("must be an object")
    _known(value, _FIELDS, "")
    kind = value.get("type", DOCKER if "docker" in value else MESOS)
    persistent = _persistent(value.get("volumes", []))
    if kind == MESOS and persistent and "docker" not in value:
        if set(value) - {"type", "volumes"} or len(persistent) != len(value.get("volumes")):
            raise ContainerInvalid("a container without docker holds only persistent volumes")
        return AppContainer(image="", persistent=persistent)
    if kind != DOCKER:
        raise ContainerInvalid(f"type {kind!r} is not supported: only DOCKER containers run "
                               "here (no MESOS containerizer)")
    docker = value.get("docker")
    if not isinstance(docker, dict):
        raise ContainerInvalid("docker must be an object with an image")
    _known(docker, _DOCKER_FIELDS, "docker.")
    image = docker.get("image")
    if not isinstance(image, str) or not image.strip():
        raise ContainerInvalid("docker.image must be a non-empty string")
    if docker.get("privileged", False) is not False:
        raise ContainerInvalid("docker.privileged is not supported")
    network = docker.get("network", Network.HOST)
    if network not in NETWORKS:
        raise ContainerInvalid(f"docker.network must be one of {', '.join(NETWORKS)}")
    force_pull = docker.get("forcePullImage", False)
    if not isinstance(force_pull, bool):
        raise ContainerInvalid("docker.forcePullImage must be true or false")
    raw_mappings = docker.get("portMappings", value.get("portMappings", [])) or []
    mappings = _mappings(raw_mappings)
    if mappings and network != Network.BRIDGE:
        raise ContainerInvalid(f"portMappings need network BRIDGE, not {network}")
    container = AppContainer(image=image, network=network, port_mappings=mappings,
                             force_pull=force_pull,
                             parameters=_parameters(docker.get("parameters", [])),
                             volumes=_volumes(value.get("volumes", [])),
                             persistent=persistent)
    # The wire's own rules for paths and parameters (ports are bound later).
    found = problems(container.info([]), Resources())
    if found:
        raise ContainerInvalid("; ".join(found))
    return container


def _known(value: dict[str, Any], fields: set[str], where: str) -> None:
    unknown = set(value) - fields
    if unknown:
        raise ContainerInvalid(f"{where}unknown field(s) {', '.join(sorted(unknown))} "
                               "(not supported by Dyad)")


def _objects(items: list[Any], name: str,
             fields: set[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each item of a list of objects with its path, checked to be an object of
    known fields."""
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise ContainerInvalid(f"{where} must be an object")
        _known(item, fields, f"{where}.")
        yield where, item


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ContainerInvalid(f"{where} must be a port number 0..65535")
    return value


def _mappings(value: Any) -> tuple[AppPortMapping, ...]:
    if not isinstance(value, list) or len(value) > MAX_MAPPINGS:
        raise ContainerInvalid(f"portMappings must be a list of at most {MAX_MAPPINGS}")
    result = []
    for where, item in _objects(value, "portMappings", _MAPPING_FIELDS):
        protocol = item.get("protocol", "tcp")
        if protocol not in PROTOCOLS:
            raise ContainerInvalid(f"{where}.protocol must be tcp or udp")
        name, labels = item.get("name", ""), item.get("labels", {})
        if not isinstance(name, str) or not isinstance(labels, dict) or not all(
                isinstance(v, str) for v in labels.values()):
            raise ContainerInvalid(f"{where}: name must be a string, labels strings")
        result.append(AppPortMapping(
            container_port=_port(item.get("containerPort", 0), f"{where}.containerPort"),
            host_port=_port(item.get("hostPort", 0), f"{where}.hostPort"),
            protocol=protocol, name=name, labels=dict(labels)))
    fixed = [m.host_port for m in result if m.host_port]
    if len(fixed) != len(set(fixed)):
        raise ContainerInvalid("portMappings: a hostPort is listed twice")
    return tuple(result)


def _parameters(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not all(
            isinstance(p, dict) and set(p) == {"key", "value"}
            and isinstance(p["key"], str) and isinstance(p["value"], str) for p in value):
        raise ContainerInvalid('docker.parameters must be a list of {"key", "value"} strings')
    for p in value:
        if p["key"] not in SUPPORTED_PARAMETERS:
            raise ContainerInvalid(f"docker.parameters: {p['key']!r} is not supported "
                                   f"(supported: {', '.join(SUPPORTED_PARAMETERS)})")
    return tuple((p["key"], p["value"]) for p in value)


def _volumes(value: Any) -> tuple[Volume, ...]:
    if not isinstance(value, list):
        raise ContainerInvalid("volumes must be a list")
    result = []
    for where, item in _objects(value, "volumes", _VOLUME_FIELDS):
        if "persistent" in item:
            continue  # `_persistent`'s
        mode = item.get("mode", "RW")
        paths = (item.get("containerPath"), item.get("hostPath"))
        if mode not in VOLUME_MODES or not all(isinstance(p, str) for p in paths):
            raise ContainerInvalid(f"{where} needs containerPath and hostPath strings and "
                                   "mode RW or RO")
        result.append(Volume(container_path=paths[0], host_path=paths[1], mode=mode))
    return tuple(result)


def _persistent(value: Any) -> tuple[PersistentSpec, ...]:
    if not isinstance(value, list):
        raise ContainerInvalid("volumes must be a list")
    try:
        return tuple(parse_persistent(where, item)
                     for where, item in _objects(value, "volumes", _VOLUME_FIELDS)
                     if "persistent" in item)
    except ResidentInvalid as exc:
        raise ContainerInvalid(str(exc)) from None


def container_to_json(container: AppContainer) -> dict[str, Any]:
    """What `parse_container` reads back."""
    persistent = [persistent_json(p) for p in container.persistent]
    if not container.image:
        return {"type": MESOS, "volumes": persistent}
    return {"type": DOCKER, "docker": {
        "image": container.image, "network": container.network,
        "portMappings": [{"containerPort": m.container_port, "hostPort": m.host_port,
                          "protocol": m.protocol, "name": m.name, "labels": dict(m.labels)}
                         for m in container.port_mappings],
        "forcePullImage": container.force_pull,
        "parameters": [{"key": k, "value": v} for k, v in container.parameters]},
        "volumes": [{"containerPath": v.container_path, "hostPath": v.host_path,
                     "mode": v.mode} for v in container.volumes] + persistent}
