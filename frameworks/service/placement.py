"""Does one more task of an app fit on an offer, and what exactly would it take?

`fit` answers for resources (cpus, mem, disk and ports: 0 asks for any free port
of the offer, a non-zero port for that very host port) and `Spread` for
placement constraints. `task_info` turns a placement into the `TaskInfo` the
master gets: the app's command with ``$PORT0..``, ``$PORTS``, ``$PORT`` and
``$HOST`` in its environment, its health check bound to the chosen ports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

import attrs

from dyad.messages import CommandInfo, Offer, Operation, TaskInfo
from dyad.resources import Resources, ResourcesError
from frameworks.service import resident
from frameworks.service.appdef import AppDefinition
from frameworks.service.constraints import field_value, unmet

INSUFFICIENT_CPUS = "InsufficientCpus"
INSUFFICIENT_MEMORY = "InsufficientMemory"
INSUFFICIENT_DISK = "InsufficientDisk"
INSUFFICIENT_PORTS = "InsufficientPorts"
UNFULFILLED_CONSTRAINT = "UnfulfilledConstraint"


@attrs.frozen
class Unfit:
    """Why an offer cannot take a task: a Marathon-style code and a sentence."""

    code: str
    message: str


@attrs.frozen
class Fit:
    resources: Resources
    ports: tuple[int, ...]
    # A resident app's (frameworks/service/resident.py): the RESERVE and CREATE to
    # accept with first, the volume the task uses, and what all that takes of the
    # offer as it was made (the task's `resources` exist only once reserved).
    operations: tuple[Operation, ...] = ()
    volume: str = ""
    offered: Resources | None = None

    @property
    def taken(self) -> Resources:
        """What this placement takes out of the offer's resources."""
        return self.resources if self.offered is None else self.offered


def task_shape(app: AppDefinition) -> Resources:
    """One task's cpus, mem and disk (its ports are chosen per offer)."""
    return Resources.of(**{k: v for k, v in (("cpus", app.cpus), ("mem", app.mem),
                                              ("disk", app.disk)) if v})


def fit(app: AppDefinition, available: Resources) -> Fit | Unfit:
    """The resources one task of `app` would take out of `available`."""
    for name, want, code in (("cpus", app.cpus, INSUFFICIENT_CPUS),
                             ("mem", app.mem, INSUFFICIENT_MEMORY),
                             ("disk", app.disk, INSUFFICIENT_DISK)):
        have = available.get(name)
        if want > 0 and have + 1e-9 < want:
            return Unfit(code, f"{name}: need {want:g}, offer has {have:g}")
    ports = _choose_ports(app.host_ports, available.ranges("ports"))
    if isinstance(ports, Unfit):
        return ports
    need = task_shape(app)
    if ports:
        need = need + Resources.parse("ports:[" + ",".join(f"{p}-{p}" for p in sorted(ports)) + "]")
    try:
        available - need
    except ResourcesError as exc:  # e.g. a role mismatch: say so rather than crash
        return Unfit(INSUFFICIENT_PORTS if ports else INSUFFICIENT_CPUS, str(exc))
    return Fit(need, tuple(ports))


def resident_fit(app: AppDefinition, role: str, principal: str, offer: Offer,
                 left: Resources, residents: Mapping[str, str], busy: set[str]) -> Fit | Unfit:
    """Like `fit`, for an app with a persistent volume: on its idle volume if the
    offer has one, else on a new reservation and volume."""
    spec = app.persistent
    assert spec is not None
    ports = _choose_ports(app.host_ports, left.unreserved().ranges("ports"))
    if isinstance(ports, Unfit):
        return ports
    extra = Resources.of(disk=app.disk) if app.disk else Resources()
    if ports:
        extra = extra + Resources.parse("ports:[" + ",".join(f"{p}-{p}" for p in sorted(ports)) + "]")
    if not extra <= left.unreserved():
        return Unfit(INSUFFICIENT_DISK, f"disk: need {app.disk:g} beside the volume")
    placed = resident.place(app.key, app.instances, app.cpus, app.mem, spec, role, principal,
                            offer, left, extra, residents, busy)
    if isinstance(placed, str):
        return Unfit(resident.UNFIT_VOLUME, placed)
    return Fit(placed.resources, tuple(ports), placed.operations, placed.volume, placed.offered)


def _choose_ports(wanted: list[int], free: list[tuple[int, int]]) -> tuple[int, ...] | Unfit:
    def is_free(port: int) -> bool:
        return any(begin <= port <= end for begin, end in free)

    fixed = [p for p in wanted if p]
    missing = [p for p in fixed if not is_free(p)]
    if missing:
        return Unfit(INSUFFICIENT_PORTS, f"host port(s) {missing} not offered")
    taken = set(fixed)
    chosen: list[int] = []
    candidates = (port for begin, end in free for port in range(begin, end + 1)
                  if port not in taken)
    for port in wanted:
        if port:
            chosen.append(port)
            continue
        picked = next(candidates, None)
        if picked is None:
            return Unfit(INSUFFICIENT_PORTS, f"need {len(wanted)} ports, offer has fewer free")
        chosen.append(picked)
    return tuple(chosen)


class Spread:
    """How one app's tasks (of the version being placed) spread over the values of
    each field its constraints name, and which values the known agents have. Kept
    up to date while a batch of offers is placed, so each check costs the number
    of constraints, not the number of tasks."""

    def __init__(self, app: AppDefinition, placed: Iterable[tuple[str, Mapping[str, str]]],
                 agents: Iterable[tuple[str, Mapping[str, str]]]) -> None:
        self.app = app
        fields = {c.field for c in app.constraints}
        agents = list(agents)
        self.counts: dict[str, Counter[str]] = {f: Counter() for f in fields}
        self.known = {f: {v for h, a in agents if (v := field_value(f, h, a)) is not None}
                      for f in fields}
        for hostname, attributes in placed:
            self.add(hostname, attributes)

    def add(self, hostname: str, attributes: Mapping[str, str]) -> None:
        for field, counts in self.counts.items():
            value = field_value(field, hostname, attributes)
            if value is not None:
                counts[value] += 1

    def unmet(self, offer: Offer) -> Unfit | None:
        """The first constraint one more task on `offer` would break."""
        for constraint in self.app.constraints:
            value = field_value(constraint.field, offer.hostname, offer.attributes)
            reason = unmet(constraint, value, self.counts[constraint.field],
                           self.known[constraint.field])
            if reason is not None:
                return Unfit(UNFULFILLED_CONSTRAINT, reason)
        return None


def agent_ip(offer: Offer) -> str:
    """The address clients can reach the agent's tasks on: the host of the agent's
    URL, else its hostname."""
    return (urlsplit(offer.url).hostname or offer.hostname) if offer.url else offer.hostname


def task_info(app: AppDefinition, task_id: str, offer: Offer, placement: Fit) -> TaskInfo:
    ports = list(placement.ports)
    env = dict(app.env)
    env.update({f"PORT{i}": str(p) for i, p in enumerate(ports)})
    if ports:
        env["PORT"] = str(ports[0])
    env.update({"PORTS": ",".join(map(str, ports)), "HOST": offer.hostname,
                "MARATHON_APP_ID": app.id, "MARATHON_APP_VERSION": app.config_version})
    if app.cmd is not None:
        command = CommandInfo(shell=app.cmd, environment=env, user=app.user)
    else:
        command = CommandInfo(argv=list(app.args or ()), environment=env, user=app.user)
    check = app.health_checks[0].to_health_check(ports) if app.health_checks else None
    return TaskInfo(task_id=task_id, name=app.id, agent_id=offer.agent_id,
                    resources=placement.resources, command=command,
                    labels={**app.labels, "DYAD_APP_ID": app.id,
                            "DYAD_APP_VERSION": app.config_version},
                    kill_grace_period=app.task_kill_grace_period_seconds,
                    health_check=check, priority=app.priority,
                    container=app.container.info(ports)
                    if app.container and app.container.image else None)
