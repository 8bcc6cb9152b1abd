"""The executor side of a framework: `Executor` (your callbacks) and
`ExecutorDriver` (the connection to the local agent).

An agent starts an executor as a process with ``DYAD_*`` environment variables
saying where the agent listens and who the executor is. The driver registers
(`RegisterExecutor` every second until `ExecutorRegistered`), hands tasks and kills
to the `Executor`, and delivers its status updates reliably: each update keeps its
uuid until the agent's `StatusUpdateAck`, and unacknowledged ones are resent every
5 s.

Agent loss: the driver watches the agent's process -- at first its parent (the
agent started it), after a re-registration the pid the new agent sent in
`ExecutorRegistered` (a restarted agent is no longer our parent). When that
process is gone it calls `disconnected`, offers `ReregisterExecutor` (its
unfinished tasks and unacknowledged updates) every second to whatever agent comes
back on the same endpoint, and shuts the executor down if none answers within
``DYAD_RECOVERY_TIMEOUT`` (default 15 min). Tasks keep running meanwhile.

`ExecutorCore` makes every decision without I/O; `ExecutorDriver` is its shell.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import attrs
import psutil

from dyad.effects import ArmTimer, CancelTimer, Send
from dyad.ids import new_uuid
from dyad.messages import (
    AgentInfo, ExecutorInfo, ExecutorRegistered, ExecutorToFramework, FrameworkInfo,
    FrameworkToExecutor, KillTask, LaunchTask, Message, RegisterExecutor,
    ReregisterExecutor, Rejected, ShutdownExecutor, Source, StatusUpdate,
    StatusUpdateAck, TaskInfo, TaskStatus)
from dyad.units import parse_duration
from frameworks._callbacks import Callback, DriverRuntime, DriverStatus, Finish

log = logging.getLogger(__name__)

REGISTER_RETRY = 1.0
"""Seconds between (re)registration attempts."""

RESEND_INTERVAL = 5.0
"""Seconds between resends of unacknowledged status updates (docs/protocol.md)."""

DEFAULT_RECOVERY_TIMEOUT = 15 * 60.0

_AGENT_PROBE_INTERVAL = 1.0


class Executor:
    """Your executor: override the callbacks you need. Each receives the driver
    first and may be a plain method or ``async def``; they run one at a time on the
    driver's loop, so do long work (the task itself) in a task or thread and report
    progress with ``driver.send_status_update``."""

    def registered(self, driver: Any, executor_info: ExecutorInfo,
                   framework_info: FrameworkInfo, agent_info: AgentInfo) -> Any:
        """The agent accepted us; `launch_task` calls follow."""

    def reregistered(self, driver: Any, agent_info: AgentInfo) -> Any:
        """A recovered agent took us back after `disconnected`."""

    def disconnected(self, driver: Any) -> Any:
        """The agent is gone; we keep running and wait for it to come back."""

    def launch_task(self, driver: Any, task: TaskInfo) -> Any:
        """Start `task` and report its progress (TASK_RUNNING, then a terminal
        state). Return promptly: later callbacks wait for this one."""

    def kill_task(self, driver: Any, task_id: str) -> Any:
        """Stop the task and report TASK_KILLED. ``driver.kill_grace_period(task_id)``
        is the grace period the kill asked for, if any."""

    def framework_message(self, driver: Any, data: bytes) -> Any:
        """Bytes the scheduler sent with `send_framework_message`."""

    def shutdown(self, driver: Any) -> Any:
        """Kill all tasks now; the driver stops when this returns. The agent kills the
        executor's process group ``driver.shutdown_grace_period`` seconds later."""

    def error(self, driver: Any, message: str) -> Any:
        """The agent rejected a message, or one of your callbacks raised."""


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


# ---------------------------------------------------------------------- pure core


class _Timer(enum.Enum):
    REGISTER = "register"
    RECOVERY = "recovery"
    RESEND = "resend"


class _State(enum.Enum):
    REGISTERING = "registering"
    REGISTERED = "registered"
    DISCONNECTED = "disconnected"
    SHUTTING_DOWN = "shutting_down"
    DONE = "done"


@attrs.frozen
class WatchAgent:
    """Effect: from now on the agent is process `pid` (0: unknown; watch the parent)."""

    pid: int


Effect = Send | ArmTimer | CancelTimer | Callback | Finish | WatchAgent


def _send(message: Message) -> Send:
    return Send(to="agent", message=message)


class ExecutorCore:
    """Decides what the executor driver does; no I/O. `now` is clock seconds."""

    def __init__(self, env: ExecutorEnvironment) -> None:
        self.env = env
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

    def start(self, now: float) -> list[Effect]:
        return [*self._register(now),
                ArmTimer(_Timer.RECOVERY, now + self.env.recovery_timeout)]

    def _register(self, now: float) -> list[Effect]:
        if self._state is _State.DISCONNECTED:
            message: Message = ReregisterExecutor(
                framework_id=self.env.framework_id, executor_id=self.env.executor_id,
                tasks=list(self.tasks.values()), updates=list(self.pending.values()))
        else:
            message = RegisterExecutor(framework_id=self.env.framework_id,
                                       executor_id=self.env.executor_id)
        return [_send(message), ArmTimer(_Timer.REGISTER, now + REGISTER_RETRY)]

    def agent_lost(self, now: float) -> list[Effect]:
        """The shell saw the agent go away."""
        if self._state is not _State.REGISTERED:
            return []
        log.warning("agent lost; waiting up to %.0fs for it to come back",
                    self.env.recovery_timeout)
        self._state = _State.DISCONNECTED
        return [CancelTimer(_Timer.RESEND), Callback("disconnected"), *self._register(now),
                ArmTimer(_Timer.RECOVERY, now + self.env.recovery_timeout)]

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key is _Timer.REGISTER and self._state in (_State.REGISTERING, _State.DISCONNECTED):
            return self._register(now)
        if key is _Timer.RECOVERY and self._state in (_State.REGISTERING, _State.DISCONNECTED):
            log.error("no agent for %.0fs; shutting down", self.env.recovery_timeout)
            self._state = _State.DONE
            return [Callback("shutdown"), Finish(DriverStatus.ABORTED)]
        if key is _Timer.RESEND and self.registered:
            return [*map(_send, self.pending.values()),
                    ArmTimer(_Timer.RESEND, now + RESEND_INTERVAL)]
        return []

    def on_message(self, message: Message, now: float) -> list[Effect]:
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
        effects: list[Effect] = [CancelTimer(_Timer.REGISTER), CancelTimer(_Timer.RECOVERY),
                                 ArmTimer(_Timer.RESEND, now + RESEND_INTERVAL),
                                 WatchAgent(message.agent_pid)]
        if self._ever_registered:
            effects.append(Callback("reregistered", (message.agent,)))
        else:
            self._ever_registered = True
            effects.append(Callback("registered",
                                    (message.executor, message.framework, message.agent)))
        return effects + [_send(u) for u in self.pending.values()]

    def send_update(self, status: TaskStatus, uuid: str, now: float) -> list[Effect]:
        """Stamp the update as ours and send it (or hold it until registered)."""
        update = StatusUpdate(framework_id=self.env.framework_id, status=attrs.evolve(
            status, uuid=uuid, timestamp=now, source=Source.EXECUTOR,
            agent_id=self.env.agent_id, executor_id=self.env.executor_id))
        self.pending[uuid] = update
        if status.state.is_terminal:
            self.tasks.pop(status.task_id, None)
        return [_send(update)] if self.registered else []

    def send_framework_message(self, data: bytes) -> list[Effect]:
        if not self.registered:
            log.warning("framework message dropped: not registered with the agent")
            return []
        return [_send(ExecutorToFramework(
            framework_id=self.env.framework_id, agent_id=self.env.agent_id,
            executor_id=self.env.executor_id, data=data))]


# --------------------------------------------------------------------- the shell


def _parent_alive() -> Callable[[], bool]:
    """A probe that is true while the process that started us is alive: the agent
    is our parent, and an orphan is re-parented (so getppid changes)."""
    parent = os.getppid()
    return lambda: os.getppid() == parent


def _process_alive(pid: int) -> Callable[[], bool]:
    """A probe that is true while process `pid` -- the very one, not a later process
    that got its pid -- runs (a zombie counts as gone)."""
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return lambda: False

    def alive() -> bool:
        try:
            return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    return alive


class ExecutorDriver(DriverRuntime):
    """Connects an `Executor` to the agent that started this process.

    Reads ``DYAD_AGENT_ENDPOINT``, ``DYAD_AGENT_ID``, ``DYAD_FRAMEWORK_ID``,
    ``DYAD_EXECUTOR_ID``, ``DYAD_SANDBOX_DIRECTORY`` and optionally
    ``DYAD_RECOVERY_TIMEOUT`` from `environ` (default ``os.environ``); raises
    `ExecutorEnvironmentError` naming what is missing. Every method may be called
    from a callback or from any thread.
    """

    def __init__(self, executor: Executor, *, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(executor, log)
        self.environment = ExecutorEnvironment.from_environ(
            os.environ if environ is None else environ)
        self._core = ExecutorCore(self.environment)
        self._all_acknowledged = asyncio.Event()
        self._all_acknowledged.set()
        self._agent_alive: Callable[[], bool] = lambda: True

    @property
    def framework_id(self) -> str:
        return self.environment.framework_id

    @property
    def executor_id(self) -> str:
        return self.environment.executor_id

    @property
    def agent_id(self) -> str:
        return self.environment.agent_id

    @property
    def sandbox_directory(self) -> str:
        return self.environment.sandbox_directory

    @property
    def shutdown_grace_period(self) -> float | None:
        """From the agent's ShutdownExecutor, once it came."""
        return self._core.shutdown_grace_period

    def kill_grace_period(self, task_id: str) -> float | None:
        """The grace period the agent's KillTask for `task_id` asked for, if any."""
        return self._core.kill_grace_periods.get(task_id)

    @property
    def unacknowledged(self) -> int:
        """Status updates the agent has not acknowledged yet."""
        return len(self._core.pending)

    @property
    def connected(self) -> bool:
        """Registered with a live agent (False while waiting for one to come back)."""
        return self._core.registered

    def stop(self) -> DriverStatus:
        """Stop after the running callback returns. Unacknowledged updates are not
        waited for: `await wait_acknowledged()` first if they matter."""
        self._on_loop("stop", self._request_stop)
        return DriverStatus.STOPPED

    def send_status_update(self, status: TaskStatus) -> str:
        """Send a task's new state; the driver fills uuid, timestamp, source,
        agent_id and executor_id, and resends it until the agent acknowledges.
        Returns the update's uuid."""
        uuid = new_uuid()
        self._on_loop("send_status_update", lambda: self._apply(
            self._core.send_update(status, uuid, self._clock.now())))
        return uuid

    def send_framework_message(self, data: bytes) -> None:
        """Send bytes to the scheduler (best effort: may be lost)."""
        self._on_loop("send_framework_message",
                      lambda: self._apply(self._core.send_framework_message(bytes(data))))

    async def wait_acknowledged(self, timeout: float | None = None) -> bool:
        """On the driver's loop: wait until every update sent so far is acknowledged
        by the agent; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._all_acknowledged.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ shell hooks

    async def _open(self) -> None:
        assert self._dealer is not None
        self._dealer.connect(self.environment.agent_endpoint)
        self._agent_alive = _parent_alive()
        self._spawn(self._watch_agent())

    async def _watch_agent(self) -> None:
        """Probe the agent every second; `agent_lost` only acts while registered, so
        a dead agent is reported once per loss."""
        while True:
            await asyncio.sleep(_AGENT_PROBE_INTERVAL)
            if not self._agent_alive():
                self._apply(self._core.agent_lost(self._clock.now()))

    def _perform_other(self, effect: Any) -> None:
        if not isinstance(effect, WatchAgent):
            super()._perform_other(effect)
        elif effect.pid > 0:
            self._agent_alive = _process_alive(effect.pid)
        else:
            self._agent_alive = _parent_alive()

    def _apply(self, effects: Iterable[Any]) -> None:
        super()._apply(effects)
        if self._core.pending:
            self._all_acknowledged.clear()
        else:
            self._all_acknowledged.set()

    def _begin(self, now: float) -> list[Any]:
        return self._core.start(now)

    def _on_message(self, message: Message, now: float) -> list[Any]:
        return self._core.on_message(message, now)

    def _on_timer(self, key: Hashable, now: float) -> list[Any]:
        return self._core.on_timer(key, now)
