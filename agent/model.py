"""The agent core's vocabulary: its configuration, the events the shell feeds it,
the effects it answers with, and the records it keeps.

Kept apart from `agent.state` (the rules) so the checkpoint, the views and the
shell can name these things without pulling in the rules, and so each module stays
small enough to read in one sitting. Everything here is plain data.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

import attrs

from agent.container_spec import DockerConfig
from agent.qos import QosConfig
from agent.reclaim import ReclaimConfig
from dyad.effects import TimerKey
from dyad.messages import (
    CommandInfo, ExecutorInfo, ExecutorUsage, FrameworkInfo, MasterInfo, Message,
    MessageError, Reason, TaskInfo, TaskState, URI,
)
from dyad.resources import Resources

COMMAND_EXECUTOR_MODULE = "frameworks.executors.command"
# The built-in command executor is a Python process of its own (~40 MiB RSS). It is
# not charged to the offer (docs/protocol.md), but its container's limits must
# leave it room, or a task asking for 32 MiB could never start.
COMMAND_EXECUTOR_CPUS = 0.1
COMMAND_EXECUTOR_MEM_MB = 64
MIB = 1024 * 1024
# Exit status of an executor the agent adopted after a restart: it is not the
# agent's child, so its real status cannot be learnt. Outside both exit codes
# (0..255) and minus signal numbers (-1..-64).
UNKNOWN_EXIT = -256

ISOLATIONS = ("posix", "cgroups")
# How a plain command task runs (docs/agent.md): "direct", by the agent itself through
# its holder process (agent.host_runs), or under a Python command executor of its own.
COMMAND_TASKS = ("direct", "executor")
CONTAINERIZERS = ("process", "docker")

RunKey = tuple[str, str, str]  # (framework_id, executor_id, run_id)

# ------------------------------------------------------------------------- events


@attrs.frozen
class MasterMessage:
    message: Message


@attrs.frozen
class ExecutorMessage:
    """`peer` is the hex identity of the executor's DEALER (how replies find it)."""

    peer: str
    message: Message


@attrs.frozen
class InvalidFrame:
    """A frame that did not decode. `source` is "master" or "executor"."""

    source: str
    peer: str
    error: MessageError


@attrs.frozen
class ExecutorStarted:
    """The run's process exists: `pid`, and its start time (seconds since the
    epoch, as the kernel says) so a recovered agent never mistakes a reused pid."""

    framework_id: str
    executor_id: str
    run_id: str
    pid: int
    started: float


@attrs.frozen
class ExecutorProcessExited:
    """`status` is the exit code, minus the signal number that ended it, or
    `UNKNOWN_EXIT` for an adopted executor; for a direct run it is its command's,
    as its holder reaped it (agent.host_runs). `description` is how the shell names
    the end ("Executor terminated by signal SIGKILL", see
    `agent.containerizer.describe_exit`): naming signals takes the OS, which the
    core does not touch."""

    framework_id: str
    executor_id: str
    run_id: str
    status: int
    description: str = ""


@attrs.frozen
class ExecutorLaunchFailed:
    """The run never started; `status_reason` is what its tasks fail with."""

    framework_id: str
    executor_id: str
    run_id: str
    reason: str
    status_reason: str = Reason.CONTAINER_LAUNCH_FAILED


@attrs.frozen
class MasterDetected:
    master_info: MasterInfo


@attrs.frozen
class Shutdown:
    """The agent is stopping: shut every executor down, then `Exit`."""


@attrs.frozen
class Drain:
    """An operator asked to drain this agent (`POST /drain`)."""


@attrs.frozen
class RunSample:
    """One measurement of a run's processes (or cgroup). Times are cumulative
    seconds; `oom` says the kernel found the cgroup out of memory; `mem_peak_bytes`
    is the cgroup's high-water mark where the kernel keeps one (else 0)."""

    framework_id: str
    executor_id: str
    run_id: str
    timestamp: float
    cpus_user_time: float
    cpus_system_time: float
    mem_rss_bytes: int
    processes: int
    cpus_nr_throttled: int = 0
    cpus_throttled_time: float = 0.0
    mem_peak_bytes: int = 0
    oom: bool = False


@attrs.frozen
class UsageSampled:
    """The shell sampled every run; it also says what the fetcher cache holds."""

    samples: tuple[RunSample, ...]
    cached_uris: tuple[str, ...] = ()


# ------------------------------------------------------------------------ effects


@attrs.frozen
class Limits:
    """What a run may use; 0 means no limit for that kind. `revocable_cpus` is
    the part of `cpus` its revocable tasks hold: those add no CPU weight."""

    cpus: float = 0.0
    mem_bytes: int = 0
    revocable_cpus: float = 0.0

    @property
    def weight_share(self) -> float:
        """The share of its normal CPU weight the run gets: the non-revocable part
        of its cpus (docs/oversubscription.md: revocable work yields to owners)."""
        if self.cpus <= 0:
            return 1.0
        return max(0.0, self.cpus - self.revocable_cpus) / self.cpus


@attrs.frozen
class LaunchExecutor:
    """Fetch `uris` into `sandbox_dir` (created), then start `command` in a new
    session with cwd `sandbox_dir`, `env` on top of the agent's environment, and
    `limits` enforced; report `ExecutorStarted`, then `ExecutorProcessExited` (or
    `ExecutorLaunchFailed`) exactly once for this run."""

    framework_id: str
    executor_id: str
    run_id: str
    command: CommandInfo
    env: dict[str, str]
    sandbox_dir: str
    uris: tuple[URI, ...] = ()
    limits: Limits = Limits()
    user: str = ""  # the Unix user to run as (agent.users); "": the agent's own
    # A direct run (agent.host_runs): `command` is the task's own, started and
    # reaped by the agent's holder (agent.holder); its status is the command's.
    held: bool = False


@attrs.frozen
class KillExecutor:
    """Signal the run's whole process group; `signal` is "TERM" or "KILL"."""

    framework_id: str
    executor_id: str
    run_id: str
    signal: str


@attrs.frozen
class UpdateLimits:
    """The run's tasks changed: enforce `limits` from now on."""

    framework_id: str
    executor_id: str
    run_id: str
    limits: Limits


@attrs.frozen
class ConnectMaster:
    endpoint: str


@attrs.frozen
class DetectMaster:
    """Find the leading master (the shell's detector) and answer `MasterDetected`."""


@attrs.frozen
class Checkpoint:
    """Write `AgentState.saved()` under the work dir before performing the effects
    that follow (acks to executors, messages to the master)."""


@attrs.frozen
class Exit:
    """Every executor is gone (or the deadline passed): the agent may stop."""


# --------------------------------------------------------------------- timer keys
# `AgentState` arms these; its parts arm their own (`agent.master_link`'s
# `RegisterRetry` and `MasterSilent`, `agent.status_updates.UpdateRetry`,
# `agent.health.HealthRound`). `seq` makes
# each arming a new key, so a firing already queued when the timer was re-armed
# is recognised as stale.


@attrs.frozen
class ShutdownDeadline(TimerKey):
    """Executors still run this long after `Shutdown`: exit anyway."""


@attrs.frozen
class ExecutorTimer(TimerKey):
    """Base of the timers of one executor run (at most one armed per run)."""

    framework_id: str
    executor_id: str
    seq: int


@attrs.frozen
class RegistrationTimeout(ExecutorTimer):
    """A launched executor did not register in time: kill it."""


@attrs.frozen
class ReregistrationTimeout(ExecutorTimer):
    """A recovered executor did not re-register after the agent restarted: kill it."""


@attrs.frozen
class TermDue(ExecutorTimer):
    """A shutdown's grace period is over: SIGTERM."""


@attrs.frozen
class KillDue(ExecutorTimer):
    """SIGTERM did not end the run: SIGKILL."""


# ------------------------------------------------------------------------- config


@attrs.frozen(kw_only=True)
class AgentConfig:
    """What the agent is and how patient it is. `port` (HTTP) and `executor_port`
    are the bound ports and `pid` the agent's process; the shell fills them in."""

    hostname: str
    ip: str
    port: int
    executor_port: int
    work_dir: str
    resources: Resources
    python: str  # interpreter for the command executor (the agent's own)
    command_tasks: str = attrs.field(default="direct",
                                     validator=attrs.validators.in_(COMMAND_TASKS))
    attributes: dict[str, str] = attrs.field(factory=dict)
    version: str = "0.1.0"
    pid: int = 0
    isolation: str = attrs.field(default="posix", validator=attrs.validators.in_(ISOLATIONS))
    ping_interval: float = 15.0  # assumed until the master says otherwise
    register_backoff: float = 1.0
    register_backoff_max: float = 30.0
    status_update_backoff: float = 10.0  # first retry of an unacknowledged update
    status_update_backoff_max: float = 600.0
    executor_registration_timeout: float = 60.0
    executor_reregistration_timeout: float = 10.0  # after an agent restart
    executor_shutdown_grace_period: float = 3.0
    executor_kill_delay: float = 3.0  # SIGTERM -> SIGKILL
    recovery_timeout: float = 15 * 60.0  # executors give up on a missing agent
    usage_report_interval: float = 5.0
    shutdown_slack: float = 2.0  # beyond grace + kill delay before exiting anyway
    completed_limit: int = 100  # completed frameworks/executors/tasks kept for /state
    containerizers: tuple[str, ...] = ("process",)  # "docker": runs from images too
    docker: DockerConfig = attrs.field(factory=DockerConfig)  # docs/containers.md
    # Oversubscription (docs/oversubscription.md): what is lent, and when it is taken back.
    reclaim: ReclaimConfig = ReclaimConfig()
    qos: QosConfig = QosConfig()

    @property
    def executor_endpoint(self) -> str:
        return f"tcp://{self.ip}:{self.executor_port}"


# -------------------------------------------------------------------------- records

DETECTING, REGISTERING, REGISTERED = "DETECTING", "REGISTERING", "REGISTERED"
LAUNCHING, RECOVERING, RUNNING = "LAUNCHING", "RECOVERING", "RUNNING"
TERMINATING, TERMINATED = "TERMINATING", "TERMINATED"
EXECUTOR_PHASES = (LAUNCHING, RECOVERING, RUNNING, TERMINATING, TERMINATED)


@attrs.frozen
class TaskEnd:
    """How a task the agent is ending must be reported, whatever its executor says
    (killed for failing health checks, or by a drain)."""

    state: TaskState
    reason: str
    message: str


@attrs.define
class AgentTask:
    info: TaskInfo
    framework_id: str
    executor_id: str
    state: TaskState = TaskState.TASK_STAGING
    status_uuid: str = ""
    seen_uuids: set[str] = attrs.field(factory=set)  # executor resends are dropped
    kill_as: TaskEnd | None = None

    @property
    def task_id(self) -> str:
        return self.info.task_id


@attrs.define
class AgentExecutor:
    framework_id: str
    info: ExecutorInfo
    run_id: str
    directory: str
    is_command: bool
    phase: str = LAUNCHING
    peer: str | None = None
    timer: ExecutorTimer | None = None  # (re)registration timeout, or the next signal
    pid: int | None = None
    started: float | None = None
    queued: dict[str, AgentTask] = attrs.field(factory=dict)  # until registration
    launched: dict[str, AgentTask] = attrs.field(factory=dict)  # non-terminal
    terminated: dict[str, AgentTask] = attrs.field(factory=dict)  # terminal, unacked
    completed: deque[AgentTask] = attrs.field(factory=deque)
    pending_kills: dict[str, float | None] = attrs.field(factory=dict)  # while recovering
    limits: Limits = Limits()
    last_sample: RunSample | None = None
    usage: ExecutorUsage | None = None
    status: int | None = None  # exit status once gone
    container_id: str | None = None  # a run from an image, once its container started
    log_since_nanos: int = 0  # engine time of the last log line copied into the sandbox
    host_direct: bool = False  # a command task the agent runs itself (agent.host_runs)

    @property
    def executor_id(self) -> str:
        return self.info.executor_id

    @property
    def direct(self) -> bool:
        """A command task with no executor process: the agent plays its executor,
        in a container (agent.containers_core) or on the host (agent.host_runs)."""
        return self.is_command and (self.info.container is not None or self.host_direct)

    @property
    def key(self) -> RunKey:
        return (self.framework_id, self.executor_id, self.run_id)

    def live_tasks(self) -> Iterator[AgentTask]:
        yield from self.queued.values()
        yield from self.launched.values()

    def find(self, task_id: str) -> AgentTask | None:
        return (self.queued.get(task_id) or self.launched.get(task_id)
                or self.terminated.get(task_id))


@attrs.define
class AgentFramework:
    info: FrameworkInfo
    executors: dict[str, AgentExecutor] = attrs.field(factory=dict)
    completed_executors: deque[AgentExecutor] = attrs.field(factory=deque)

    @property
    def id(self) -> str:
        assert self.info.id is not None
        return self.info.id


def mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


def resources_dict(resources: Resources) -> dict[str, float | str]:
    """`{"cpus": 1.0, "ports": "[31000-32000]"}`: the shape operators know from Mesos."""
    scalars = resources.scalar_items()
    out: dict[str, float | str] = {}
    for name in sorted(resources.names()):
        if name in scalars:
            out[name] = scalars[name] / 1000
        else:
            out[name] = "[" + ",".join(f"{b}-{e}" for b, e in resources.ranges(name)) + "]"
    return out
