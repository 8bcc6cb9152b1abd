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

`frameworks.executor_core.ExecutorCore` makes every decision without I/O;
`ExecutorDriver` is its shell.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dyad.clock import Clock
from dyad.ids import new_uuid
from dyad.messages import AgentInfo, ExecutorInfo, FrameworkInfo, TaskInfo, TaskStatus
from frameworks._callbacks import DriverRuntime
from frameworks._security import client_from_env
from frameworks.driver_core import DriverStatus
from frameworks.executor_core import (
    AgentLost, ExecutorCore, ExecutorEnvironment, ExecutorTimings,
    SendStatusUpdateCall, SendToSchedulerCall, WatchAgent)

log = logging.getLogger(__name__)

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


# --------------------------------------------------------------------- the shell


def _parent_alive() -> Callable[[], bool]:
    """A probe that is true while the process that started us is alive: the agent
    is our parent, and an orphan is re-parented (so getppid changes)."""
    parent = os.getppid()
    return lambda: os.getppid() == parent


def _endpoint_alive(address: str) -> Callable[[], bool]:
    """A probe for an executor in a container, where the agent's pid means nothing
    (another pid namespace) and the container's init is our parent: true while the
    agent's HTTP port (`MESOS_AGENT_ENDPOINT`, ``ip:port``) accepts connections.
    Its HTTP port, not its executor socket: a bare connect there is a broken ZMQ
    handshake every second, on a socket whose broken handshakes a secured agent
    counts as refusals. The executor shares the host's
    network, so the connect is local and answers at once."""
    host, _, port = address.rpartition(":")

    def alive() -> bool:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
                return True
        except (OSError, ValueError):
            return False

    return alive


def _process_alive(pid: int) -> Callable[[], bool]:
    """A probe that is true while process `pid` -- the very one, not a later process
    that got its pid -- runs (a zombie counts as gone)."""
    import psutil  # only after an agent restart: most executors never need it

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


class ExecutorDriver(DriverRuntime[ExecutorCore]):
    """Connects an `Executor` to the agent that started this process.

    Reads ``DYAD_AGENT_ENDPOINT``, ``DYAD_AGENT_ID``, ``DYAD_FRAMEWORK_ID``,
    ``DYAD_EXECUTOR_ID``, ``DYAD_SANDBOX_DIRECTORY`` and optionally
    ``DYAD_RECOVERY_TIMEOUT`` from `environ` (default ``os.environ``); raises
    `ExecutorEnvironmentError` naming what is missing. Every method may be called
    from a callback or from any thread. ``clock`` (default: wall-clock seconds) and
    ``timings`` (`ExecutorTimings`) are for tests.
    """

    def __init__(self, executor: Executor, *, environ: Mapping[str, str] | None = None,
                 clock: Clock | None = None, timings: ExecutorTimings | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.environment = ExecutorEnvironment.from_environ(environ)
        super().__init__(executor, log,
                         ExecutorCore(self.environment, timings or ExecutorTimings()), clock,
                         client_from_env(environ))
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
        self._on_loop("send_status_update",
                      lambda: self._handle(SendStatusUpdateCall(status, uuid)))
        return uuid

    def send_framework_message(self, data: bytes) -> None:
        """Send bytes to the scheduler (best effort: may be lost)."""
        self._on_loop("send_framework_message",
                      lambda: self._handle(SendToSchedulerCall(bytes(data))))

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
        self._agent_alive = self._agent_probe(0)
        self._spawn(self._watch_agent())

    async def _watch_agent(self) -> None:
        """Probe the agent every second; `AgentLost` only acts while registered, so
        a dead agent is reported once per loss."""
        while True:
            await asyncio.sleep(_AGENT_PROBE_INTERVAL)
            if not self._agent_alive():
                self._handle(AgentLost())

    def _perform_other(self, effect: Any) -> None:
        if not isinstance(effect, WatchAgent):
            super()._perform_other(effect)
        else:
            self._agent_alive = self._agent_probe(effect.pid)

    def _agent_probe(self, pid: int) -> Callable[[], bool]:
        if os.environ.get("DYAD_CONTAINER"):
            return _endpoint_alive(os.environ.get("MESOS_AGENT_ENDPOINT", ""))
        return _process_alive(pid) if pid > 0 else _parent_alive()

    def _apply(self, effects: Iterable[Any]) -> None:
        super()._apply(effects)
        if self._core.pending:
            self._all_acknowledged.clear()
        else:
            self._all_acknowledged.set()
