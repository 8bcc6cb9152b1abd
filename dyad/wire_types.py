"""The data types inside Dyad's wire messages: task states and reasons, framework,
agent, task, offer and executor records.

They are apart from `dyad.messages` (the messages themselves and the frame codec)
so that each module reads in one sitting; `dyad.messages` re-exports every name
here, so code imports them from either."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from dyad import priority
from dyad.containers import ContainerInfo
from dyad.resources import Resources
from dyad.volumes import PersistentVolume

# --------------------------------------------------------------------------- enums


class TaskState(enum.Enum):
    """Task states with Mesos' names, so users and tools recognise them."""

    TASK_STAGING = "TASK_STAGING"
    TASK_STARTING = "TASK_STARTING"
    TASK_RUNNING = "TASK_RUNNING"
    TASK_KILLING = "TASK_KILLING"
    TASK_FINISHED = "TASK_FINISHED"
    TASK_FAILED = "TASK_FAILED"
    TASK_KILLED = "TASK_KILLED"
    TASK_ERROR = "TASK_ERROR"
    TASK_LOST = "TASK_LOST"
    TASK_DROPPED = "TASK_DROPPED"
    TASK_UNREACHABLE = "TASK_UNREACHABLE"
    TASK_GONE = "TASK_GONE"
    TASK_UNKNOWN = "TASK_UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({
    TaskState.TASK_FINISHED, TaskState.TASK_FAILED, TaskState.TASK_KILLED,
    TaskState.TASK_ERROR, TaskState.TASK_LOST, TaskState.TASK_DROPPED,
    TaskState.TASK_GONE,
})


class Source:
    """Who produced a TaskStatus (Mesos' `TaskStatus.Source`)."""

    MASTER = "SOURCE_MASTER"
    AGENT = "SOURCE_AGENT"
    EXECUTOR = "SOURCE_EXECUTOR"


class Reason:
    """Reasons carried in TaskStatus.reason; Mesos' names where one exists."""

    INVALID_OFFERS = "REASON_INVALID_OFFERS"
    TASK_INVALID = "REASON_TASK_INVALID"
    AGENT_REMOVED = "REASON_AGENT_REMOVED"
    AGENT_UNREACHABLE = "REASON_AGENT_UNREACHABLE"
    AGENT_UNKNOWN = "REASON_AGENT_UNKNOWN"
    AGENT_RESTARTED = "REASON_AGENT_RESTARTED"
    COMMAND_EXECUTOR_FAILED = "REASON_COMMAND_EXECUTOR_FAILED"
    EXECUTOR_TERMINATED = "REASON_EXECUTOR_TERMINATED"
    EXECUTOR_REGISTRATION_TIMEOUT = "REASON_EXECUTOR_REGISTRATION_TIMEOUT"
    FRAMEWORK_REMOVED = "REASON_FRAMEWORK_REMOVED"
    RECONCILIATION = "REASON_RECONCILIATION"
    TASK_KILLED_DURING_LAUNCH = "REASON_TASK_KILLED_DURING_LAUNCH"
    TASK_UNKNOWN = "REASON_TASK_UNKNOWN"
    CONTAINER_LAUNCH_FAILED = "REASON_CONTAINER_LAUNCH_FAILED"
    CONTAINER_LIMITATION_MEMORY = "REASON_CONTAINER_LIMITATION_MEMORY"
    EXECUTOR_REREGISTRATION_TIMEOUT = "REASON_EXECUTOR_REREGISTRATION_TIMEOUT"
    TASK_HEALTH_CHECK_STATUS_UPDATED = "REASON_TASK_HEALTH_CHECK_STATUS_UPDATED"
    TASK_UNHEALTHY = "REASON_TASK_UNHEALTHY"
    FETCH_FAILED = "REASON_FETCH_FAILED"  # Dyad's own: Mesos folds it into launch failed
    AGENT_DRAINING = "REASON_AGENT_DRAINING"
    # Evicted by the agent's QoS controller (revocable) or preempted by the master.
    CONTAINER_PREEMPTED = "REASON_CONTAINER_PREEMPTED"


# ----------------------------------------------------------------------- data types


def nonempty(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")


def nonnegative(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must not be negative")


def priority_field(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{attribute.name} must be an integer")
    priority.check_priority(value)


@attrs.frozen(kw_only=True)
class Address:
    hostname: str
    ip: str
    port: int


@attrs.frozen(kw_only=True)
class MasterInfo:
    """What a master says about itself: HTTP `/master/info` and the ZooKeeper znode."""

    id: str
    hostname: str
    ip: str
    port: int
    zmq_port: int
    version: str
    address: Address
    # The master's CURVE public key (Z85), "" without CURVE: clients that pin no
    # key learn it here, as they learn the address (docs/security.md says when
    # that is trusted); a client that pins keys refuses any other.
    curve_key: str = ""

    @property
    def http_url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    @property
    def zmq_endpoint(self) -> str:
        return f"tcp://{self.ip}:{self.zmq_port}"


@attrs.frozen(kw_only=True)
class FrameworkInfo:
    name: str = attrs.field(validator=nonempty)
    roles: list[str] = attrs.field(factory=lambda: ["*"])
    id: str | None = None
    user: str = ""
    hostname: str = ""
    principal: str = ""
    webui_url: str = ""
    failover_timeout: float = attrs.field(default=0.0, validator=nonnegative)
    checkpoint: bool = False
    capabilities: list[str] = attrs.field(factory=list)
    implicit_acknowledgements: bool = True

    @property
    def partition_aware(self) -> bool:
        return "PARTITION_AWARE" in self.capabilities

    @property
    def revocable_resources(self) -> bool:
        """Offers may carry revocable resources (docs/oversubscription.md)."""
        return "REVOCABLE_RESOURCES" in self.capabilities


@attrs.frozen(kw_only=True)
class URI:
    """Something the agent's fetcher puts in the sandbox before launch."""

    value: str = attrs.field(validator=nonempty)
    extract: bool = True
    executable: bool = False
    cache: bool = False
    output_file: str = ""


@attrs.frozen(kw_only=True)
class CommandInfo:
    """A command: `shell` runs under /bin/sh -c, `argv` is exec'd directly."""

    shell: str | None = None
    argv: list[str] | None = None
    environment: dict[str, str] = attrs.field(factory=dict)
    uris: list[URI] = attrs.field(factory=list)
    user: str = ""

    def __attrs_post_init__(self) -> None:
        if (self.shell is None) == (self.argv is None):
            raise ValueError("command needs exactly one of shell or argv")
        if self.argv is not None and not self.argv:
            raise ValueError("command argv must not be empty")


class HealthCheckType:
    COMMAND = "COMMAND"
    HTTP = "HTTP"
    TCP = "TCP"


@attrs.frozen(kw_only=True)
class HealthCheck:
    """How the agent checks a task's health; defaults are Mesos' (seconds).

    COMMAND runs `command` (healthy on exit 0); HTTP GETs `scheme://host:port/path`
    (healthy on 2xx/3xx); TCP connects to `port`. Failures during `grace_period`
    after launch do not count; `consecutive_failures` outside it kill the task.
    """

    type: str = attrs.field(validator=attrs.validators.in_(
        [HealthCheckType.COMMAND, HealthCheckType.HTTP, HealthCheckType.TCP]))
    command: CommandInfo | None = None
    port: int | None = None
    path: str = "/"
    scheme: str = "http"
    delay: float = attrs.field(default=15.0, validator=nonnegative)
    interval: float = attrs.field(default=10.0, validator=nonnegative)
    timeout: float = attrs.field(default=20.0, validator=nonnegative)
    grace_period: float = attrs.field(default=10.0, validator=nonnegative)
    consecutive_failures: int = attrs.field(default=3, validator=nonnegative)

    def __attrs_post_init__(self) -> None:
        if self.type == HealthCheckType.COMMAND and self.command is None:
            raise ValueError("a COMMAND health check needs a command")
        if self.type != HealthCheckType.COMMAND and not (
                self.port is not None and 0 < self.port < 65536):
            raise ValueError(f"a {self.type} health check needs a port in 1..65535")
        if self.scheme not in ("http", "https"):
            raise ValueError("health check scheme must be http or https")


@attrs.frozen(kw_only=True)
class ExecutorInfo:
    executor_id: str = attrs.field(validator=nonempty)
    command: CommandInfo
    resources: Resources = attrs.field(factory=Resources)
    name: str = ""
    framework_id: str | None = None
    container: ContainerInfo | None = None  # run the executor from an image


@attrs.frozen(kw_only=True)
class TaskInfo:
    """What a framework asks to run. Exactly one of `command` or `executor`."""

    task_id: str
    name: str
    agent_id: str
    resources: Resources
    command: CommandInfo | None = None
    executor: ExecutorInfo | None = None
    data: bytes = b""
    labels: dict[str, str] = attrs.field(factory=dict)
    kill_grace_period: float | None = attrs.field(default=None, validator=nonnegative)
    health_check: HealthCheck | None = None
    container: ContainerInfo | None = None  # a command task run from an image
    # Higher is more important; bands in dyad/priority.py. Decides eviction and
    # preemption order, never offer order.
    priority: int = attrs.field(default=priority.DEFAULT, validator=priority_field)
    # Launched on the offer's revocable resources (docs/oversubscription.md).
    revocable: bool = False


@attrs.frozen(kw_only=True)
class TaskStatus:
    task_id: str
    state: TaskState
    reason: str = ""
    message: str = ""
    source: str = ""
    agent_id: str = ""
    executor_id: str = ""
    uuid: str = ""
    healthy: bool | None = None
    timestamp: float = 0.0
    data: bytes = b""


@attrs.frozen(kw_only=True)
class Filters:
    refuse_seconds: float = attrs.field(default=5.0, validator=nonnegative)


@attrs.frozen(kw_only=True)
class Offer:
    id: str
    framework_id: str
    agent_id: str
    hostname: str
    resources: Resources
    attributes: dict[str, str] = attrs.field(factory=dict)
    executor_ids: list[str] = attrs.field(factory=list)
    url: str = ""  # the agent's HTTP base URL (its /files API serves sandboxes)
    # URIs the agent's fetcher cache holds: prefer agents that already have a
    # task's packages (Borg's package locality).
    cached_uris: list[str] = attrs.field(factory=list)
    # Offered apart from `resources`, only to frameworks with REVOCABLE_RESOURCES:
    # lent from what other tasks reserve but do not use, and taken back (the
    # task killed) when the owners need it. Never counted in DRF shares or quota.
    revocable: Resources = attrs.field(factory=Resources)
    # The persistent volumes whose disk (disk(role){id}) is in `resources`.
    volumes: list[PersistentVolume] = attrs.field(factory=list)


class OperationType:
    LAUNCH = "LAUNCH"
    RESERVE = "RESERVE"
    UNRESERVE = "UNRESERVE"
    CREATE = "CREATE"
    DESTROY = "DESTROY"


@attrs.frozen(kw_only=True)
class Operation:
    """One step of `accept`: LAUNCH `tasks`; RESERVE or UNRESERVE `resources`;
    CREATE or DESTROY `volumes` (docs/protocol.md, "Offer operations")."""

    type: str = attrs.field(validator=attrs.validators.in_(
        [OperationType.LAUNCH, OperationType.RESERVE, OperationType.UNRESERVE,
         OperationType.CREATE, OperationType.DESTROY]))
    tasks: list[TaskInfo] = attrs.field(factory=list)
    resources: Resources = attrs.field(factory=Resources)
    volumes: list[PersistentVolume] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class AgentInfo:
    hostname: str
    port: int
    resources: Resources
    attributes: dict[str, str] = attrs.field(factory=dict)
    id: str | None = None
    ip: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.ip or self.hostname}:{self.port}"


@attrs.frozen(kw_only=True)
class Task:
    """A task as the master and agents know it (what a re-registering agent reports)."""

    task_id: str
    framework_id: str
    agent_id: str
    executor_id: str
    name: str
    state: TaskState
    resources: Resources
    status_uuid: str = ""
    labels: dict[str, str] = attrs.field(factory=dict)
    priority: int = attrs.field(default=priority.DEFAULT, validator=priority_field)
    revocable: bool = False


@attrs.frozen(kw_only=True)
class ReconcileTask:
    task_id: str
    agent_id: str | None = None


@attrs.frozen(kw_only=True)
class ExecutorUsage:
    """What one executor (its whole process tree or cgroup) used, sampled by the
    agent. `cpus_used` is cores over the last sampling interval; times are
    cumulative seconds; limits are what the agent enforces (0: none)."""

    framework_id: str
    executor_id: str
    task_ids: list[str] = attrs.field(factory=list)
    timestamp: float = 0.0
    cpus_used: float = 0.0
    cpus_user_time_secs: float = 0.0
    cpus_system_time_secs: float = 0.0
    cpus_limit: float = 0.0
    cpus_nr_throttled: int = 0
    cpus_throttled_time_secs: float = 0.0
    mem_rss_bytes: int = 0
    mem_limit_bytes: int = 0
    processes: int = 0
