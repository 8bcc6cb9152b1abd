"""The built-in command executor: runs one task's command and reports its fate.

The agent starts it as ``python -m frameworks.executors.command`` for every task
that carries a plain `CommandInfo` (executor id = task id). It runs
``CommandInfo.shell`` under ``/bin/sh -c`` or ``CommandInfo.argv`` directly, in a
session (process group) of its own, with the sandbox as working directory and
stdout/stderr inherited (the agent points them at the sandbox's ``stdout`` and
``stderr`` files). Updates: TASK_STARTING, TASK_RUNNING, then TASK_FINISHED (exit
0), TASK_FAILED ("Command exited with status N" / "Command terminated by signal
SIGX", or why it could not start) or, after a kill, TASK_KILLING and TASK_KILLED.

A kill sends SIGTERM to the task's process group and SIGKILL after the grace period
(the task's ``kill_grace_period``, else the kill's, else 3 s). When the command ends,
whatever is left of its process group is SIGKILLed, so a task leaves no processes
behind unless they started sessions of their own. The executor exits once the
agent has acknowledged the terminal update (or after `ACK_TIMEOUT`). While the
agent is away (restarting), the task keeps running and a terminal update waits
for the agent to come back; the driver's recovery timeout bounds that wait.

Shutdown (from the agent) kills the task with its own kill grace period, keeping
`REPORT_MARGIN` of the agent's grace period to report TASK_KILLED before the agent
signals the executor itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import signal
import sys

from dyad import processes
from dyad.processes import signal_group
from dyad.messages import Reason, TaskInfo, TaskState, TaskStatus
from frameworks.driver_core import DriverStatus
from frameworks.executor import Executor, ExecutorDriver
from frameworks.executor_core import ExecutorEnvironmentError

log = logging.getLogger("frameworks.executors.command")

DEFAULT_KILL_GRACE_PERIOD = 3.0
ACK_TIMEOUT = 10.0
"""Longest wait for a connected agent to acknowledge the terminal update."""
REPORT_MARGIN = 1.0


class LaunchError(Exception):
    """The task's command cannot be started as asked."""


def describe_exit(returncode: int) -> str:
    """'Command exited with status 3' or 'Command terminated by SIGKILL'."""
    return processes.describe_exit(returncode, "Command")


def command_argv(task: TaskInfo) -> list[str]:
    """The argv that runs the task's command; raises `LaunchError`."""
    command = task.command
    if command is None:
        raise LaunchError("task has no command (it names a custom executor)")
    if command.user and command.user != pwd.getpwuid(os.getuid()).pw_name:
        raise LaunchError(f"cannot run as user {command.user!r}: the command executor "
                          "does not switch users")
    if command.shell is not None:
        return ["/bin/sh", "-c", command.shell]
    assert command.argv is not None
    return list(command.argv)


def command_environment(task: TaskInfo) -> dict[str, str]:
    environment = dict(os.environ)
    if task.command is not None:
        environment.update(task.command.environment)
    environment["DYAD_TASK_ID"] = environment["MESOS_TASK_ID"] = task.task_id
    return environment


class CommandExecutor(Executor):
    """Runs exactly one task; see the module docstring."""

    def __init__(self) -> None:
        self._task: TaskInfo | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._escalations: list[asyncio.Task[None]] = []
        self._killing = False
        self._shutting_down = False

    def _update(self, driver: ExecutorDriver, task: TaskInfo, state: TaskState,
                message: str = "", reason: str = "") -> None:
        driver.send_status_update(TaskStatus(task_id=task.task_id, state=state,
                                             message=message, reason=reason))

    async def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        if self._task is not None:
            self._update(driver, task, TaskState.TASK_FAILED,
                         f"the command executor runs one task and already runs "
                         f"{self._task.task_id}", Reason.COMMAND_EXECUTOR_FAILED)
            return
        self._task = task
        self._update(driver, task, TaskState.TASK_STARTING)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *command_argv(task), cwd=driver.sandbox_directory,
                env=command_environment(task), start_new_session=True)
        except (LaunchError, OSError) as exc:
            log.error("task %s could not start: %s", task.task_id, exc)
            self._update(driver, task, TaskState.TASK_FAILED,
                         f"Failed to launch command: {exc}", Reason.COMMAND_EXECUTOR_FAILED)
            await self._exit(driver)
            return
        log.info("task %s started as pid %d", task.task_id, self._process.pid)
        self._update(driver, task, TaskState.TASK_RUNNING)
        self._watcher = asyncio.create_task(self._watch(driver, task, self._process))

    async def _watch(self, driver: ExecutorDriver, task: TaskInfo,
                     process: asyncio.subprocess.Process) -> None:
        returncode = await process.wait()
        signal_group(process.pid, signal.SIGKILL)  # whatever the command left behind
        for escalation in self._escalations:
            escalation.cancel()
        outcome = describe_exit(returncode)
        log.info("task %s: %s", task.task_id, outcome)
        if self._killing:
            state = TaskState.TASK_KILLED
        elif returncode == 0:
            state = TaskState.TASK_FINISHED
        else:
            state = TaskState.TASK_FAILED
        self._update(driver, task, state, outcome)
        await self._exit(driver)

    async def _exit(self, driver: ExecutorDriver) -> None:
        while not await driver.wait_acknowledged(ACK_TIMEOUT):
            if driver.connected or self._shutting_down:
                log.warning("terminal update not acknowledged within %.0fs; exiting anyway",
                            ACK_TIMEOUT)
                break
            log.info("the agent is away; the terminal update waits for it to return")
        if not self._shutting_down:  # shutdown stops the driver itself
            driver.stop()

    def _running(self, task_id: str | None = None) -> bool:
        return (self._process is not None and self._process.returncode is None
                and self._task is not None
                and (task_id is None or task_id == self._task.task_id))

    def kill_task(self, driver: ExecutorDriver, task_id: str) -> None:
        if not self._running(task_id):
            log.warning("kill of %s ignored: not running here", task_id)
            return
        if self._killing:
            return
        assert self._task is not None
        grace = next((g for g in (self._task.kill_grace_period,
                                  driver.kill_grace_period(task_id)) if g is not None),
                     DEFAULT_KILL_GRACE_PERIOD)
        self._kill(driver, grace)

    def _kill(self, driver: ExecutorDriver, grace: float) -> None:
        assert self._task is not None and self._process is not None
        if not self._killing:
            self._killing = True
            self._update(driver, self._task, TaskState.TASK_KILLING)
            log.info("killing task %s (SIGKILL in %.1fs)", self._task.task_id, grace)
            signal_group(self._process.pid, signal.SIGTERM)
        self._escalations.append(asyncio.create_task(self._escalate(self._process, grace)))

    async def _escalate(self, process: asyncio.subprocess.Process, grace: float) -> None:
        try:
            await asyncio.wait_for(process.wait(), grace)
        except asyncio.TimeoutError:
            log.warning("task still running %.1fs after SIGTERM; sending SIGKILL", grace)
            signal_group(process.pid, signal.SIGKILL)

    async def shutdown(self, driver: ExecutorDriver) -> None:
        self._shutting_down = True
        if not self._running():
            return
        assert self._task is not None and self._watcher is not None
        wanted = self._task.kill_grace_period
        agent_grace = driver.shutdown_grace_period or DEFAULT_KILL_GRACE_PERIOD
        budget = max(agent_grace - REPORT_MARGIN, agent_grace / 2)
        self._kill(driver, min(DEFAULT_KILL_GRACE_PERIOD if wanted is None else wanted, budget))
        await self._watcher

    def terminate(self, driver: ExecutorDriver) -> None:
        """We were signalled: kill the task outright and end the driver."""
        if self._process is not None and self._process.returncode is None:
            signal_group(self._process.pid, signal.SIGKILL)
        driver.abort()


async def serve(driver: ExecutorDriver, executor: CommandExecutor) -> DriverStatus:
    """Run the driver; SIGTERM/SIGINT take the task down with us."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, executor.terminate, driver)
    return await driver.run_async()


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s command-executor %(levelname)s %(message)s")
    executor = CommandExecutor()
    try:
        driver = ExecutorDriver(executor)
    except ExecutorEnvironmentError as exc:
        print(f"command executor: {exc}", file=sys.stderr)
        return 2
    status = asyncio.run(serve(driver, executor))
    return 0 if status is DriverStatus.STOPPED else 1


if __name__ == "__main__":
    sys.exit(main())
