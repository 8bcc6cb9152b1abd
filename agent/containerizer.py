"""Starting, signalling and reaping executor processes (POSIX, no isolation yet).

Each run is started in a new session, so it leads its own process group: a signal
to the group reaches the executor and everything it spawned (the command
executor's task, a task's own children), which is how the agent stops a run without
leaving orphans. When the run's leader exits, whatever is left of its group is
SIGKILLed -- the run is over, as when Mesos destroys a container.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Callable

import attrs

from agent.state import LaunchExecutor

log = logging.getLogger(__name__)

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}

RunKey = tuple[str, str, str]  # (framework_id, executor_id, run_id)


class LaunchError(Exception):
    """The run could not be started (bad command, unwritable sandbox)."""


@attrs.define
class _Run:
    process: asyncio.subprocess.Process
    waiter: asyncio.Task[None] | None = None


class Containerizer:
    """Launches runs and calls `on_exit(framework_id, executor_id, run_id, status)`
    once per run when its process ends (status < 0: killed by signal -status)."""

    def __init__(self, on_exit: Callable[[str, str, str, int], None],
                 base_env: dict[str, str] | None = None) -> None:
        self._on_exit = on_exit
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._runs: dict[RunKey, _Run] = {}

    @property
    def pids(self) -> list[int]:
        return [run.process.pid for run in self._runs.values()]

    async def launch(self, effect: LaunchExecutor) -> int:
        """Start the run and return its pid; raises `LaunchError`."""
        command = effect.command
        argv = command.argv if command.argv is not None else ["/bin/sh", "-c", command.shell or ""]
        env = {**self._base_env, **effect.env}
        try:
            os.makedirs(effect.sandbox_dir, exist_ok=True)
            with open(os.path.join(effect.sandbox_dir, "stdout"), "ab") as out, \
                    open(os.path.join(effect.sandbox_dir, "stderr"), "ab") as err:
                process = await asyncio.create_subprocess_exec(
                    *argv, cwd=effect.sandbox_dir, env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True)
        except (OSError, ValueError) as exc:
            raise LaunchError(f"{argv[0]}: {exc}") from exc
        key = (effect.framework_id, effect.executor_id, effect.run_id)
        run = self._runs[key] = _Run(process)
        run.waiter = asyncio.ensure_future(self._reap(key, run))
        log.info("launched executor %s of framework %s: pid %d in %s", effect.executor_id,
                 effect.framework_id, process.pid, effect.sandbox_dir)
        return process.pid

    def kill(self, framework_id: str, executor_id: str, run_id: str, sig: str) -> None:
        run = self._runs.get((framework_id, executor_id, run_id))
        if run is not None:
            _signal_group(run.process.pid, SIGNALS[sig])

    def kill_all(self) -> None:
        """Last resort when the agent stops: SIGKILL every group still running."""
        for run in self._runs.values():
            _signal_group(run.process.pid, signal.SIGKILL)

    async def wait_all(self) -> None:
        waiters = [run.waiter for run in self._runs.values() if run.waiter is not None]
        if waiters:
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _reap(self, key: RunKey, run: _Run) -> None:
        status = await run.process.wait()
        _signal_group(run.process.pid, signal.SIGKILL)  # leftovers of a finished run
        del self._runs[key]
        log.info("executor %s (pid %d) ended with status %d", key[1], run.process.pid, status)
        self._on_exit(*key, status)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already gone
    except PermissionError:
        # The pid of a group whose members all exited was reused by a process that
        # is not ours; nothing of this run is left to signal.
        log.debug("not allowed to signal group %d", pgid)
