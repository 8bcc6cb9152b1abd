"""Persistent volumes on the agent, the pure half: where each volume lives, what
the master's `CheckpointResources` changes, and which volumes a task's sandbox
must show. `agent.volumes` (the shell) does the disk work these effects ask for.

A volume lives outside every sandbox, at
``WORK_DIR/volumes/roles/<role>/<id>`` (a '/' in the role written ``%2F``, so
role ``eng/ml`` and a volume ``ml`` of role ``eng`` never share a path), and
survives the tasks that use it and the agent's restarts. A task whose resources
hold ``disk(role){id}`` sees the volume at its `container_path` inside its
sandbox: a symbolic link for a process task (`MountVolumes`).

The agent keeps what the master last sent (`DynamicResources`, in its
checkpoint) and reports it when it registers; it never takes an older version
than the one it has, and refuses to drop a volume a live task still uses.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from dyad.resources import Resources
from dyad.volumes import DynamicResources, PersistentVolume, problem

VOLUMES_DIR = "volumes"


@attrs.frozen
class CreateVolume:
    """Make the volume's directory (if missing)."""

    path: str
    volume: PersistentVolume


@attrs.frozen
class DestroyVolume:
    """Remove the volume's directory and everything in it."""

    path: str
    volume: PersistentVolume


@attrs.frozen
class VolumeMount:
    host_path: str
    container_path: str  # relative to the sandbox
    mode: str


@attrs.frozen
class MountVolumes:
    """Before the task starts: make each volume visible at its container path
    inside `sandbox_dir` (created if missing)."""

    sandbox_dir: str
    mounts: tuple[VolumeMount, ...]


def volume_path(work_dir: str, volume: PersistentVolume) -> str:
    role = volume.role.replace("/", "%2F")
    return f"{work_dir.rstrip('/')}/{VOLUMES_DIR}/roles/{role}/{volume.id}"


def adopt(work_dir: str, static: Resources, mine: DynamicResources, theirs: DynamicResources,
          in_use: Iterable[str]) -> tuple[DynamicResources, list[CreateVolume | DestroyVolume], str]:
    """Take the master's record `theirs` over `mine`: the record to keep, the
    directories to make and remove, and why it was refused ('' if it was not)."""
    if theirs.version < mine.version:
        return mine, [], (f"version {theirs.version} is older than this agent's "
                          f"{mine.version}; kept {mine.version}")
    why = problem(static, theirs)
    if why:
        return mine, [], why
    kept = {v.id for v in theirs.volumes}
    busy = sorted(set(in_use) - kept)
    if busy:
        return mine, [], f"volume(s) {', '.join(busy)} are in use by live tasks"
    effects: list[CreateVolume | DestroyVolume] = [
        DestroyVolume(volume_path(work_dir, v), v) for v in mine.volumes if v.id not in kept]
    effects += [CreateVolume(volume_path(work_dir, v), v) for v in theirs.volumes]
    return theirs, effects, ""


def recreate(work_dir: str, dynamic: DynamicResources) -> list[CreateVolume]:
    """After a restart: make sure every kept volume's directory exists."""
    return [CreateVolume(volume_path(work_dir, v), v) for v in dynamic.volumes]


def mounts(work_dir: str, dynamic: DynamicResources, sandbox_dir: str,
           resources: Iterable[Resources]) -> list[MountVolumes]:
    """The `MountVolumes` a run in `sandbox_dir` needs for `resources` (its task's,
    and its executor's when new), or nothing if they hold no volume."""
    found: dict[str, VolumeMount] = {}
    for held in resources:
        for volume_id in held.volumes():
            volume = dynamic.volume(volume_id)
            if volume is not None:
                found[volume_id] = VolumeMount(volume_path(work_dir, volume),
                                               volume.container_path, volume.mode)
    if not found:
        return []
    return [MountVolumes(sandbox_dir, tuple(found[k] for k in sorted(found)))]


def volumes_in_use(resources: Iterable[Resources]) -> set[str]:
    return {volume_id for held in resources for volume_id in held.volumes()}
