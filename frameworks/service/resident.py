"""Resident apps: Marathon-style persistent local volumes.

An app with a persistent volume in its container,

    "container": {"volumes": [{"containerPath": "data", "mode": "RW",
                               "persistent": {"size": 64}}]},
    "residency": {"taskLostBehavior": "WAIT_FOREVER"}

gets, for each instance, a reservation and a volume on one agent. The first
launch of an instance accepts its offer with three operations: RESERVE
``cpus(role)``, ``mem(role)`` and ``disk(role)`` for the volume, CREATE the volume,
LAUNCH the task on both. When the task ends, the reservation and the volume stay
on that agent, the master offers them back to the framework's role, and the next
task of the instance is placed only there, on the same volume: its data is still
in ``$MESOS_SANDBOX/<containerPath>``.

Volume ids name the instance: ``<app key>.<n>`` (`volume_id`). The core keeps
which volumes it knows of (`residents`: volume id -> agent id, from the volumes
it creates, the ones offers carry and its live tasks' records), and creates a
new one only while the app has fewer volumes than instances.

Limits (docs/volumes.md): one persistent volume per app; the framework must run
in a role (``dyad-service --role``); reserved cpus and mem of a role on an agent
are shared by that role's resident instances there; scaling down or deleting an
app leaves its reservations and volumes in place (nothing destroys them yet);
after a framework failover, until every agent holding an idle volume has been
offered, a lost instance may be given a new volume elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from dyad.containers import VOLUME_MODES
from dyad.messages import Offer, Operation, OperationType
from dyad.resources import Resources
from dyad.volumes import PersistentVolume, container_path_problem

UNFIT_VOLUME = "InsufficientVolume"
_LOST_BEHAVIOURS = ("WAIT_FOREVER", "RELAUNCH_AFTER_TIMEOUT")
_RESIDENCY_FIELDS = {"taskLostBehavior", "relaunchEscalationTimeoutSeconds"}


class ResidentInvalid(ValueError):
    """What is wrong with a persistent volume or ``residency``, in one sentence."""


@attrs.frozen
class PersistentSpec:
    """The app's persistent volume: where its tasks see it, and its size in MB."""

    container_path: str
    size: float
    mode: str = "RW"


@attrs.frozen
class Residency:
    """Marathon's ``residency``, kept as given: Dyad always waits for the agent
    that holds the volume (``WAIT_FOREVER``)."""

    task_lost_behavior: str = "WAIT_FOREVER"
    relaunch_escalation_timeout_seconds: float = 3600.0


def parse_persistent(where: str, item: Mapping[str, Any]) -> PersistentSpec:
    """One ``container.volumes`` item with ``persistent``."""
    unknown = set(item) - {"containerPath", "mode", "persistent"}
    if unknown:
        raise ResidentInvalid(f"{where}: a persistent volume has no {', '.join(sorted(unknown))}")
    persistent, path, mode = item["persistent"], item.get("containerPath"), item.get("mode", "RW")
    if not isinstance(persistent, dict) or set(persistent) - {"size", "type"} \
            or persistent.get("type", "root") != "root":
        raise ResidentInvalid(f"{where}.persistent must be {{\"size\": MB}} (type root only)")
    size = persistent.get("size")
    if isinstance(size, bool) or not isinstance(size, int | float) or not 0 < size <= 10**9:
        raise ResidentInvalid(f"{where}.persistent.size must be a positive number of MB")
    if not isinstance(path, str) or container_path_problem(path):
        raise ResidentInvalid(f"{where}.containerPath: " + (
            container_path_problem(path) if isinstance(path, str) else "must be a string"))
    if mode not in VOLUME_MODES:
        raise ResidentInvalid(f"{where}.mode must be RW or RO")
    return PersistentSpec(container_path=path, size=float(size), mode=mode)


def persistent_json(spec: PersistentSpec) -> dict[str, Any]:
    return {"containerPath": spec.container_path, "mode": spec.mode,
            "persistent": {"size": spec.size}}


def parse_residency(value: Any) -> Residency:
    if not isinstance(value, dict) or set(value) - _RESIDENCY_FIELDS:
        raise ResidentInvalid(f"must be an object with {', '.join(sorted(_RESIDENCY_FIELDS))}")
    behaviour = value.get("taskLostBehavior", "WAIT_FOREVER")
    timeout = value.get("relaunchEscalationTimeoutSeconds", 3600)
    if behaviour not in _LOST_BEHAVIOURS:
        raise ResidentInvalid(f"taskLostBehavior must be one of {', '.join(_LOST_BEHAVIOURS)}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise ResidentInvalid("relaunchEscalationTimeoutSeconds must be a number >= 0")
    return Residency(behaviour, float(timeout))


def residency_json(residency: Residency) -> dict[str, Any]:
    return {"taskLostBehavior": residency.task_lost_behavior,
            "relaunchEscalationTimeoutSeconds": residency.relaunch_escalation_timeout_seconds}


def volume_id(app_key: str, index: int) -> str:
    return f"{app_key}.{index}"


def owner(volume: str) -> str:
    """The app key a volume id of `volume_id` belongs to."""
    return volume.rsplit(".", 1)[0]


@attrs.frozen
class Resident:
    """A resident task's place: the operations to accept with before launching
    (none when the instance's volume is offered back), what the task takes, and its
    volume."""

    operations: tuple[Operation, ...]
    resources: Resources
    volume: str
    offered: Resources | None = None  # what it takes of the offer, when operations change it


def place(app_key: str, instances: int, cpus: float, mem: float, spec: PersistentSpec,
          role: str, principal: str, offer: Offer, left: Resources, extra: Resources,
          residents: Mapping[str, str], busy: set[str]) -> Resident | str:
    """Where one more task of a resident app goes on `offer` (of which `left`
    remains; `extra` is what else the task takes from its unreserved part, such as
    ports), or why it cannot."""
    if role == "*":
        return "persistent volumes need the framework in a role (dyad-service --role)"
    wanted = Resources.scalar("cpus", cpus, role) + Resources.scalar("mem", mem, role)
    for volume in sorted(offer.volumes, key=lambda v: v.id):
        if owner(volume.id) == app_key and volume.id not in busy and volume.resources <= left:
            taken = _take(left - volume.resources - extra, wanted)
            if taken is None:
                return f"{offer.hostname}: no cpus/mem beside volume {volume.id}"
            return Resident((), taken + volume.resources + extra, volume.id)
    mine = sorted(v for v in residents if owner(v) == app_key)
    if len(mine) >= instances:
        return "waiting for an agent that holds an idle volume of the app"
    plain = left.unreserved() - extra
    disk = Resources.scalar("disk", spec.size)
    need = wanted.flatten() + disk
    if not need <= plain:
        return f"{offer.hostname}: cannot reserve {need} for a new volume"
    index = next(i for i in range(len(mine) + 1) if volume_id(app_key, i) not in residents)
    volume = PersistentVolume(id=volume_id(app_key, index), container_path=spec.container_path,
                              size=spec.size, role=role, principal=principal, mode=spec.mode)
    reserve = wanted + disk.flatten(role)
    return Resident((Operation(type=OperationType.RESERVE, resources=reserve),
                     Operation(type=OperationType.CREATE, volumes=[volume])),
                    wanted + volume.resources + extra, volume.id, need + extra)


def _take(left: Resources, wanted: Resources) -> Resources | None:
    """`wanted` (reserved to a role) out of `left`: the role's reserved amounts
    first, the rest unreserved; None if they do not fit."""
    taken = Resources()
    for name, milli in wanted.scalar_items().items():
        role = next(iter(wanted.roles()))
        own = min(milli, left.reserved(role).without_volumes().get_milli(name))
        rest = milli - own
        if rest > left.unreserved().get_milli(name):
            return None
        taken = taken + Resources.scalar_milli(name, own, role) + Resources.scalar_milli(name, rest)
    return taken
