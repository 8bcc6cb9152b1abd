"""Containers on the wire: a task or executor that runs from a Docker image.

`ContainerInfo` rides on `TaskInfo` and `ExecutorInfo` (field `container`). The
codec rejects what no framework could mean -- a word outside a closed vocabulary
(`type`, `network`, `protocol`, `mode`) or a port number outside 1..65535 -- with
the path of the bad field. Everything a framework may legitimately get wrong for
one task (no image, a port mapping on a network that has none, a host port the
task was not given) is found by `problems`, so the master and the agent answer
that one task with `TASK_ERROR` instead of refusing the whole accept.

Pure: the master and the agent core import this.
"""

from __future__ import annotations

from typing import Any

import attrs

from dyad.resources import Resources

DOCKER = "DOCKER"
CONTAINER_TYPES = (DOCKER,)


class Network:
    """How a container meets the network (Docker's network modes)."""

    HOST = "HOST"      # the host's stack: the task binds its offered ports itself
    BRIDGE = "BRIDGE"  # its own stack behind the engine's bridge; ports are mapped
    NONE = "NONE"      # loopback only


NETWORKS = (Network.HOST, Network.BRIDGE, Network.NONE)
PROTOCOLS = ("tcp", "udp")


class VolumeMode:
    RW = "RW"
    RO = "RO"


VOLUME_MODES = (VolumeMode.RW, VolumeMode.RO)

SANDBOX_MOUNT = "/mnt/mesos/sandbox"
"""Where every container sees its sandbox (and `MESOS_SANDBOX` says so)."""

SUPPORTED_PARAMETERS = ("user", "workdir", "hostname", "init")
"""`DockerInfo.parameters` the agent honours. Mesos passes any `docker run` flag
through; Dyad does not, because flags such as `privileged` or `volume` would let a
framework escape what the agent allows."""


def _port(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if not 0 < value < 65536:
        raise ValueError(f"{attribute.name} must be in 1..65535, got {value}")


@attrs.frozen(kw_only=True)
class PortMapping:
    """Host port `host_port` (one of the task's `ports`) forwards to
    `container_port` inside a BRIDGE container."""

    host_port: int = attrs.field(validator=_port)
    container_port: int = attrs.field(validator=_port)
    protocol: str = attrs.field(default="tcp", validator=attrs.validators.in_(PROTOCOLS))


@attrs.frozen(kw_only=True)
class Volume:
    """`host_path` seen at `container_path`. An absolute `host_path` must lie under
    a path the agent allows (`--docker-volume-root`); a relative one is inside the
    run's sandbox."""

    container_path: str
    host_path: str
    mode: str = attrs.field(default=VolumeMode.RW, validator=attrs.validators.in_(VOLUME_MODES))


@attrs.frozen(kw_only=True)
class DockerInfo:
    image: str
    network: str = attrs.field(default=Network.HOST, validator=attrs.validators.in_(NETWORKS))
    port_mappings: list[PortMapping] = attrs.field(factory=list)
    force_pull: bool = False
    parameters: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ContainerInfo:
    type: str = attrs.field(default=DOCKER, validator=attrs.validators.in_(CONTAINER_TYPES))
    docker: DockerInfo | None = None
    volumes: list[Volume] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        if self.type == DOCKER and self.docker is None:
            raise ValueError("a DOCKER container needs docker (its image)")


def problems(container: ContainerInfo, resources: Resources) -> list[str]:
    """Why `container` cannot run for a task given `resources` (empty: it can).

    Each reason names the offending field, so a framework author can fix it from
    the `TASK_ERROR` message alone.
    """
    found: list[str] = []
    docker = container.docker
    if docker is not None:
        if not docker.image.strip():
            found.append("container.docker.image is empty: a DOCKER container needs an image")
        found.extend(_port_problems(docker, resources))
        found.extend(f"container.docker.parameters: {name!r} is not supported "
                     f"(supported: {', '.join(SUPPORTED_PARAMETERS)})"
                     for name in sorted(set(docker.parameters) - set(SUPPORTED_PARAMETERS)))
    found.extend(_volume_problems(container.volumes))
    return found


def _port_problems(docker: DockerInfo, resources: Resources) -> list[str]:
    if not docker.port_mappings:
        return []
    if docker.network != Network.BRIDGE:
        return [f"container.docker.port_mappings need network BRIDGE, not {docker.network} "
                f"(under HOST the task binds its ports itself; NONE has no ports)"]
    found = []
    given = resources.ranges("ports")
    seen_host: set[tuple[int, str]] = set()
    seen_container: set[tuple[int, str]] = set()
    for i, mapping in enumerate(docker.port_mappings):
        where = f"container.docker.port_mappings[{i}]"
        if not any(begin <= mapping.host_port <= end for begin, end in given):
            found.append(f"{where}: host port {mapping.host_port} is not among the task's "
                         f"ports ({_ranges_text(given)})")
        if (mapping.host_port, mapping.protocol) in seen_host:
            found.append(f"{where}: host port {mapping.host_port}/{mapping.protocol} "
                         f"is mapped twice")
        if (mapping.container_port, mapping.protocol) in seen_container:
            found.append(f"{where}: container port {mapping.container_port}/"
                         f"{mapping.protocol} is mapped twice")
        seen_host.add((mapping.host_port, mapping.protocol))
        seen_container.add((mapping.container_port, mapping.protocol))
    return found


def _volume_problems(volumes: list[Volume]) -> list[str]:
    found = []
    seen: set[str] = set()
    for i, volume in enumerate(volumes):
        where = f"container.volumes[{i}]"
        target = volume.container_path.rstrip("/") or "/"
        if not _clean_absolute(volume.container_path):
            found.append(f"{where}.container_path {volume.container_path!r} must be an "
                         f"absolute path without '..' or ':'")
        elif target == "/" or target == SANDBOX_MOUNT or target.startswith(SANDBOX_MOUNT + "/"):
            found.append(f"{where}.container_path {volume.container_path!r} would hide "
                         f"the root or the sandbox at {SANDBOX_MOUNT}")
        elif target in seen:
            found.append(f"{where}.container_path {volume.container_path!r} is mounted twice")
        seen.add(target)
        if not volume.host_path or "\0" in volume.host_path or ":" in volume.host_path \
                or ".." in volume.host_path.split("/"):
            found.append(f"{where}.host_path {volume.host_path!r} must be a non-empty path "
                         f"without '..' or ':'")
    return found


def _clean_absolute(path: str) -> bool:
    # ':' separates the parts of an engine bind ("host:container:mode").
    return path.startswith("/") and not {"\0", ":"} & set(path) \
        and ".." not in path.split("/")


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    if not ranges:
        return "none"
    return ",".join(f"{b}" if b == e else f"{b}-{e}" for b, e in ranges)
