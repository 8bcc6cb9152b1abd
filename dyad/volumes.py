"""Persistent volumes and dynamic reservations on the wire, and what an agent keeps
of them.

A persistent volume is reserved disk turned into a directory that outlives the
tasks using it. In `Resources` it is the entry ``disk(<role>){<id>}:<size>`` (a
key of its own, so it is offered, used and released whole, like any resource);
`PersistentVolume` carries the rest: where tasks see it and who made it.

`DynamicResources` is everything the master has changed on one agent with offer
operations (RESERVE, UNRESERVE, CREATE, DESTROY): the reservations (volumes'
disk included) and the volumes. Both the master's registry and the agent's
checkpoint hold it, with a `version` the master bumps on every change, so after a
failover or a restart the newer copy wins (`newer`): the registry's if the agent
missed the master's last word, the agent's if the registry missed its last
write.

Pure: the master core, the agent core and frameworks import this.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from dyad.containers import VOLUME_MODES, VolumeMode
from dyad.resources import (
    UNRESERVED,
    VOLUME_KIND,
    Resources,
    ResourcesError,
    is_valid_role,
)

_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
MAX_ID_CHARS = 128


def _volume_id(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if len(value) > MAX_ID_CHARS or not _ID_RE.fullmatch(value):
        raise ValueError(f"volume id {value!r} must be letters, digits, '_', '.' or '-' "
                         f"(not starting with '.' or '-'), at most {MAX_ID_CHARS} characters")


def _role(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value == UNRESERVED or not is_valid_role(value):
        raise ValueError(f"a volume needs a reservation role, got {value!r}")


def container_path_problem(path: str) -> str:
    """Why `path` cannot be where tasks see a volume ('' if it can): it must be
    relative to the sandbox and stay inside it."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) \
            or not set(path).isdisjoint("\0:"):
        return (f"container path {path!r} must be a relative path inside the sandbox "
                "(no '..', '.', empty parts or ':')")
    return ""


def _container_path(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    why = container_path_problem(value)
    if why:
        raise ValueError(why)


def _size(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise ValueError(f"volume size must be positive, got {value}")


@attrs.frozen(kw_only=True)
class PersistentVolume:
    """`size` MB of `disk` reserved to `role`, kept on its agent under
    ``<work_dir>/volumes/roles/<role>/<id>`` and seen by a task that uses it at
    `container_path` (relative: inside the task's sandbox)."""

    id: str = attrs.field(validator=_volume_id)
    container_path: str = attrs.field(validator=_container_path)
    size: float = attrs.field(validator=_size)
    role: str = attrs.field(validator=_role)
    principal: str = ""
    mode: str = attrs.field(default=VolumeMode.RW,
                            validator=attrs.validators.in_(VOLUME_MODES))

    @property
    def resources(self) -> Resources:
        """The disk entry the volume is in offers and tasks: ``disk(role){id}:size``."""
        return Resources.scalar_milli(VOLUME_KIND, _milli(self.size), self.role, self.id)


def _milli(size: float) -> int:
    return Resources.scalar(VOLUME_KIND, size).get_milli(VOLUME_KIND)


@attrs.frozen(kw_only=True)
class DynamicResources:
    """What offer operations changed on one agent; see the module docstring.
    `reservations` includes the disk of every volume (as its volume entry)."""

    version: int = 0
    reservations: Resources = attrs.field(factory=Resources)
    volumes: list[PersistentVolume] = attrs.field(factory=list)

    def is_empty(self) -> bool:
        return self.reservations.is_empty() and not self.volumes

    def volume(self, volume_id: str) -> PersistentVolume | None:
        return next((v for v in self.volumes if v.id == volume_id), None)


def newer(mine: DynamicResources | None, theirs: DynamicResources | None) -> DynamicResources:
    """The copy to keep of two records of one agent (the higher version; `mine`
    on a tie or when `theirs` is absent)."""
    if theirs is None or (mine is not None and mine.version >= theirs.version):
        return mine if mine is not None else DynamicResources()
    return theirs


def total_of(static: Resources, dynamic: DynamicResources) -> Resources:
    """An agent's resources with its dynamic reservations applied: the reserved
    amounts taken from its unreserved ones. Raises `ResourcesError` if they do not
    fit (a damaged record)."""
    if dynamic.reservations.is_empty():
        return static
    return static - dynamic.reservations.flatten() + dynamic.reservations


def problem(static: Resources, dynamic: DynamicResources) -> str:
    """Why `dynamic` cannot be the record of an agent with `static` resources
    ('' if it can): reservations beyond its unreserved resources, or volumes that
    do not match the reservations' volume entries."""
    try:
        total_of(static, dynamic)
    except ResourcesError as exc:
        return f"the reservations do not fit the agent's resources: {exc}"
    entries = dynamic.reservations.volumes()
    ids = [v.id for v in dynamic.volumes]
    if len(set(ids)) != len(ids):
        return "a volume is listed twice"
    for volume in dynamic.volumes:
        if entries.get(volume.id) != (volume.role, volume.resources.get_milli(VOLUME_KIND)):
            return f"volume {volume.id} is not reserved as {volume.resources}"
    if set(entries) != set(ids):
        return f"reserved volume entries {sorted(set(entries) - set(ids))} have no volume"
    return ""
