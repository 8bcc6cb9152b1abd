"""`ExecutorCore`: every decision of the executor driver, without I/O.

One way in, `handle(event, now) -> effects`. Events are what the shell saw (the
driver started, a message arrived from the agent, a timer fired, the agent's
process is gone) and what the user called (`SendStatusUpdateCall`,
`SendToSchedulerCall`). `now` is seconds on the driver's injected clock.

It registers (`RegisterExecutor` every `register_retry` seconds until
`ExecutorRegistered`), keeps each status update until the agent acknowledges it
(resending every `resend_interval`), and after an agent loss offers
`ReregisterExecutor` until an agent answers or the recovery timeout passes.

`ExecutorEnvironment` lives here too: what the agent tells an executor through
its environment, parsed from a plain mapping (the shell passes `os.environ`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Hashable, Mapping
from typing import Any

import attrs

from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    ExecutorRegistered, ExecutorToFramework, FrameworkToExecutor, KillTask, LaunchTask,
    Message, RegisterExecutor, Rejected, ReregisterExecutor, ShutdownExecutor, Source,
    StatusUpdate, StatusUpdateAck, TaskInfo, TaskStatus)
from dyad.units import parse_duration
from frameworks.driver_core import Callback, DriverStatus, Finish, Received, Started

log = logging.getLogger("frameworks.executor")

DEFAULT_RECOVERY_TIMEOUT = 15 * 60.0


@attrs.frozen
class ExecutorTimings:
    """How often the driver retries; the defaults are the protocol's."""

    register_retry: float = 1.0
    """Seconds between (re)registration attempts."""
    resend_interval: float = 5.0
    """Seconds between resends of unacknowledged status updates (docs/protocol.md)."""


class ExecutorEnvironmentError(RuntimeError):
    """The process was not started by a Dyad agent (DYAD_* variables missing/bad)."""


_ENV_VARIABLES = {
    "agent_endpoint": "DYAD_AGENT_ENDPOINT",
    "agent_id": "DYAD_AGENT_ID",
    "framework_id": "DYAD_FRAMEWORK_ID",
    "executor_id": "DYAD_EXECUTOR_ID",
    "sandbox_directory": "DYAD_SANDBOX_DIRECTORY",
}


@attrs.frozen
class ExecutorEnvironment:
    """What the agent tells an executor through its environment."""

    agent_endpoint: str
    agent_id: str
    framework_id: str
    executor_id: str
    sandbox_directory: str
    recovery_timeout: float = DEFAULT_RECOVERY_TIMEOUT

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ExecutorEnvironment:
        missing = [var for var in _ENV_VARIABLES.values() if not environ.get(var)]
        if missing:
            raise ExecutorEnvironmentError(
                f"missing {', '.join(missing)}: executors are started by a Dyad agent, "
                "which sets these variables")
        values: dict[str, Any] = {field: environ[var] for field, var in _ENV_VARIABLES.items()}
        timeout = environ.get("DYAD_RECOVERY_TIMEOUT")
        if timeout:
            try:
                values["recovery_timeout"] = parse_duration(timeout)
            except ValueError as exc:
                raise ExecutorEnvironmentError(f"DYAD_RECOVERY_TIMEOUT: {exc}") from None
        return cls(**values)


# ------------------------------------------------------------------ events


@attrs.frozen
class AgentLost:
    """The shell saw the agent's process go away."""


@attrs.frozen
class SendStatusUpdateCall:
    """The user reported a task's state; `uuid` is the one the call returned."""

    status: TaskStatus
    uuid: str


@attrs.frozen
class SendToSchedulerCall:
    data: bytes


Event = Started | Received | TimerFired | AgentLost | SendStatusUpdateCall | SendToSchedulerCall

# ------------------------------------------------------------------ effects


@attrs.frozen
class WatchAgent:
    """Effect: from now on the agent is process `pid` (0: unknown; watch the parent)."""

    pid: int


Effect = Send | ArmTimer | CancelTimer | Callback | Finish | WatchAgent

# -------------------------------------------------------------- timer keys


@attrs.frozen
class RegisterRetry(TimerKey):
    """Time to send (Re)RegisterExecutor again."""


@attrs.frozen
class RecoveryTimeout(TimerKey):
    """No agent took us (back) in time: shut down."""


@attrs.frozen
class ResendUpdates(TimerKey):
    """Time to resend the updates the agent has not acknowledged."""


class _State(enum.Enum):
    REGISTERING = "registering"
    REGISTERED = "registered"
    DISCONNECTED = "disconnected"
    SHUTTING_DOWN = "shutting_down"
    DONE = "done"


def _send(message: Message) -> Send:
    return Send(to="agent", message=message)


class ExecutorCore:
    """Decides what the executor driver does; no I/O."""

    def __init__(self, env: ExecutorEnvironment,
                 timings: ExecutorTimings = ExecutorTimings()) -> None:
        self.env = env
        self.timings = timings
        self._state = _State.REGISTERING
        self._ever_registered = False
        # Updates not yet acknowledged by the agent, by uuid, in the order sent.
        self.pending: dict[str, StatusUpdate] = {}
        # Tasks launched here with no terminal update sent yet.
        self.tasks: dict[str, TaskInfo] = {}
        self.kill_grace_periods: dict[str, float | None] = {}
        self.shutdown_grace_period: float | None = None

    @property
    def registered(self) -> bool:
        return self._state in (_State.REGISTERED, _State.SHUTTING_DOWN)

    def handle(self, event: Event, now: float) -> list[Effect]:
        """Apply one event at time `now`; return what the shell must do, in order."""
        match event:
            case Started():
                return [*self._register(now),
                        ArmTimer(RecoveryTimeout(), now + self.env.recovery_timeout)]
            case Received(message):
                return self._on_message(message, now)
            case TimerFired(key):
                return self._on_timer(key, now)
            case AgentLost():
                return self._agent_lost(now)
            case SendStatusUpdateCall(status, uuid):
                return self._send_update(status, uuid, now)
            case SendToSchedulerCall(data):
                return self._send_to_scheduler(data)
            case _:
                raise TypeError(f"ExecutorCore cannot handle {event!r}")

    def _register(self, now: float) -> list[Effect]:
        if self._state is _State.DISCONNECTED:
            message: Message = ReregisterExecutor(
                framework_id=self.env.framework_id, executor_id=self.env.executor_id,
                tasks=list(self.tasks.values()), updates=list(self.pending.values()))
        else:
            message = RegisterExecutor(framework_id=self.env.framework_id,
                                       executor_id=self.env.executor_id)
        return [_send(message), ArmTimer(RegisterRetry(), now + self.timings.register_retry)]

    def _agent_lost(self, now: float) -> list[Effect]:
        if self._state is not _State.REGISTERED:
            return []  # reported once per loss
        log.warning("agent lost; waiting up to %.0fs for it to come back",
                    self.env.recovery_timeout)
        self._state = _State.DISCONNECTED
        return [CancelTimer(ResendUpdates()), Callback("disconnected"), *self._register(now),
                ArmTimer(RecoveryTimeout(), now + self.env.recovery_timeout)]

    def _on_timer(self, key: Hashable, now: float) -> list[Effect]:
        # A key of a known kind that fires in the wrong state is stale: ignored.
        waiting = self._state in (_State.REGISTERING, _State.DISCONNECTED)
        match key:
            case RegisterRetry():
                return self._register(now) if waiting else []
            case RecoveryTimeout():
                if not waiting:
                    return []
                log.error("no agent for %.0fs; shutting down", self.env.recovery_timeout)
                self._state = _State.DONE
                return [Callback("shutdown"), Finish(DriverStatus.ABORTED)]
            case ResendUpdates():
                if not self.registered:
                    return []
                return [*map(_send, self.pending.values()),
                        ArmTimer(ResendUpdates(), now + self.timings.resend_interval)]
            case _:
                raise UnknownTimer("ExecutorCore", key)

    def _on_message(self, message: Message, now: float) -> list[Effect]:
        if self._state is _State.DONE:
            return []
        if isinstance(message, ExecutorRegistered):
            return self._on_registered(message, now)
        if isinstance(message, StatusUpdateAck):
            update = self.pending.pop(message.uuid, None)
            if update is not None and update.status.state.is_terminal:
                self.tasks.pop(update.status.task_id, None)
                self.kill_grace_periods.pop(update.status.task_id, None)
            return []
        if isinstance(message, Rejected):
            what = message.message_type or "a message"
            return [Callback("error", (f"agent rejected {what}: {message.reason}",))]
        if isinstance(message, ShutdownExecutor):
            self._state = _State.SHUTTING_DOWN
            self.shutdown_grace_period = message.grace_period
            return [Callback("shutdown"), Finish(DriverStatus.STOPPED)]
        if self._state is _State.SHUTTING_DOWN:
            return []
        if isinstance(message, LaunchTask):
            self.tasks[message.task.task_id] = message.task
            return [Callback("launch_task", (message.task,))]
        if isinstance(message, KillTask):
            self.kill_grace_periods[message.task_id] = message.kill_grace_period
            return [Callback("kill_task", (message.task_id,))]
        if isinstance(message, FrameworkToExecutor):
            return [Callback("framework_message", (message.data,))]
        log.warning("unexpected %s from the agent ignored", type(message).__name__)
        return []

    def _on_registered(self, message: ExecutorRegistered, now: float) -> list[Effect]:
        if self._state not in (_State.REGISTERING, _State.DISCONNECTED):
            return []  # an answer to a retried registration
        self._state = _State.REGISTERED
        effects: list[Effect] = [CancelTimer(RegisterRetry()), CancelTimer(RecoveryTimeout()),
                                 ArmTimer(ResendUpdates(), now + self.timings.resend_interval),
                                 WatchAgent(message.agent_pid)]
        if self._ever_registered:
            effects.append(Callback("reregistered", (message.agent,)))
        else:
            self._ever_registered = True
            effects.append(Callback("registered",
                                    (message.executor, message.framework, message.agent)))
        return effects + [_send(u) for u in self.pending.values()]

    def _send_update(self, status: TaskStatus, uuid: str, now: float) -> list[Effect]:
        """Stamp the update as ours and send it (or hold it until registered)."""
        update = StatusUpdate(framework_id=self.env.framework_id, status=attrs.evolve(
            status, uuid=uuid, timestamp=now, source=Source.EXECUTOR,
            agent_id=self.env.agent_id, executor_id=self.env.executor_id))
        self.pending[uuid] = update
        if status.state.is_terminal:
            self.tasks.pop(status.task_id, None)
        return [_send(update)] if self.registered else []

    def _send_to_scheduler(self, data: bytes) -> list[Effect]:
        if not self.registered:
            log.warning("framework message dropped: not registered with the agent")
            return []
        return [_send(ExecutorToFramework(
            framework_id=self.env.framework_id, agent_id=self.env.agent_id,
            executor_id=self.env.executor_id, data=data))]
