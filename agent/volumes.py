"""Persistent volumes on the agent, the disk half: make and remove volume
directories, and show volumes inside sandboxes (`agent.persistent` decides).

A process task sees its volume through a symbolic link at the volume's container
path in its sandbox. Removing a finished sandbox (agent.gc, `shutil.rmtree`)
removes the link, never what it points to. Blocking calls: the shell runs these in
a thread.
"""

from __future__ import annotations

import logging
import os
import shutil

from agent.persistent import CreateVolume, DestroyVolume, MountVolumes

log = logging.getLogger(__name__)


class VolumeError(Exception):
    """A volume directory or link could not be made or removed."""


def create(effect: CreateVolume) -> None:
    try:
        os.makedirs(effect.path, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise VolumeError(f"cannot make volume {effect.volume.id} at {effect.path}: {exc}") from None


def destroy(effect: DestroyVolume) -> None:
    if os.path.islink(effect.path):
        raise VolumeError(f"volume {effect.volume.id}: {effect.path} is a link; left alone")
    try:
        shutil.rmtree(effect.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise VolumeError(f"cannot remove volume {effect.volume.id} at {effect.path}: {exc}") from None
    log.info("removed volume %s (%s)", effect.volume.id, effect.path)


def mount(effect: MountVolumes) -> None:
    """Link each volume at its container path inside the sandbox. Container paths
    are relative without '..' (dyad.volumes checks), and no existing part of the
    path may be a link: a task cannot aim a later mount outside its sandbox."""
    for volume in effect.mounts:
        target = os.path.join(effect.sandbox_dir, volume.container_path)
        parent = os.path.dirname(target)
        try:
            os.makedirs(parent, exist_ok=True)
            _no_links_between(effect.sandbox_dir, parent)
            if os.path.islink(target) and os.readlink(target) == volume.host_path:
                continue  # a second task of the same executor
            os.symlink(volume.host_path, target, target_is_directory=True)
        except OSError as exc:
            raise VolumeError(f"cannot show volume {volume.host_path} at {target}: {exc}") from None


def _no_links_between(root: str, path: str) -> None:
    relative = os.path.relpath(path, root)
    here = root
    for part in [] if relative == "." else relative.split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            raise VolumeError(f"{here} is a link: a volume is never mounted through one")
