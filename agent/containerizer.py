"""Starting, limiting, measuring, signalling and reaping executor processes.

Each run is started in a new session, so it leads its own process group: SIGTERM
to the group reaches the executor and what it spawned in that group, which is how
the agent asks a run to stop. SIGKILL goes further: to the group *and* every
process the isolator knows for the run (its cgroup, or the process tree seen at
the last sample), because the command executor starts its task in a session of
its own. When the run's leader exits, whatever is left of it is SIGKILLed -- the
run is over, as when Mesos destroys a container.

With ``switch_user`` (``--switch-user``, on by default when the agent is root)
a run whose `LaunchExecutor.user` is another user runs as that user
(`agent.users`); a user that cannot be had fails the launch with the reason.

A run is either started here (`launch`: the agent's child, reaped with its exit
status) or *adopted* after an agent restart (`adopt`: watched through a pidfd; it
is no longer our child, so its exit status is unknown). Adoption checks the
process start time, so a pid reused by something else is never taken for an
executor. A direct run (a command task the agent runs itself, `agent.host_runs`)
is started, parented and reaped by the agent's holder (`agent.holder`, reached
through `agent.held`), which outlives the agent and tells a restarted one how
its runs ended. Every other run is started through `agent.spawn` (vfork on a
worker thread, the end watched by a pidfd on the loop), not asyncio's subprocess
machinery.

If the holder dies, its runs that still live are watched by pidfd and end with no
exit status (`UNKNOWN_EXIT`, "its holder died"); runs it had reaped are read from
its exit log; starts waiting for it fail; the next start starts a new holder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
from typing import Callable, Collection, Iterable

import attrs
import psutil

from dyad.processes import describe_exit as describe_process_exit
from dyad.processes import leads_a_group, signal_group

from agent import holder, sandbox_dirs, spawn, users
from agent.held import HolderGone, HolderLink, run_key
from agent.checkpoint import SavedExecutor
from agent.isolation import Isolator, IsolationError, PosixIsolator, processes
from agent.model import UNKNOWN_EXIT, LaunchExecutor, Limits, RunKey, RunSample
from agent.run_log import RunLog
from agent.trips import Batches, Together

log = logging.getLogger(__name__)

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
# Start times come from clock ticks (`holder.start_time`); the same process always
# reads the same value, a different one almost never within this.
START_TIME_SLACK = 0.05

OnExit = Callable[[RunKey, int, RunSample | None, str], None]
SIGNAL_BASE = 128  # a shell reports death by signal n as status 128 + n
# Starts go to the worker threads in trips of START_CHUNK runs, and (START_LANES:
# in effect, all of them) are queued there at once. A checkpoint the core asks for
# meanwhile waits behind them, so the core's next batch holds the ExecutorStarted
# of every run queued before it: a flood of tasks is handled in a few large
# batches, each one checkpoint and one round of updates. Measured (500 at once,
# load 15-20): with starts held back to 4-6 trips at a time the agent wrote 75-180
# checkpoints instead of 20-30, and agent, master and driver spent 1-3 ms more CPU
# a task between them.
START_LANES = 64
START_CHUNK = 16
# The longest a held run's start waits for the others started with it (agent.trips).
HELD_LONGEST = 0.5


class LaunchError(Exception):
    """The run could not be started (bad command, unwritable sandbox, no cgroup)."""


@attrs.define
class _Run:
    pid: int
    started: float
    process: subprocess.Popen[bytes] | None  # None when adopted
    waiter: asyncio.Future[None] | None = None
    seen: list[psutil.Process] = attrs.field(factory=list)  # at the last sample
    held: bool = False  # a direct run: the holder's child, or adopted from a dead holder
    exit: asyncio.Future[int] | None = None  # held by a live holder: its status, when told
    # Its end (`Containerizer._final`) begun before its launch returned (`_held_exited`).
    final: asyncio.Future[RunSample | None] | None = None


# What `_start` is given: the run, its launch, its argv and environment, its user.
_Start = tuple[RunKey, LaunchExecutor, list[str], dict[str, str], "users.RunAs | None"]


def describe_exit(status: int) -> str:
    """How an executor's end is reported in its tasks' failures."""
    if status == UNKNOWN_EXIT:
        return "Executor is gone; its exit status is unknown (adopted after an agent restart)"
    return describe_process_exit(status, "Executor")


def describe_command_exit(status: int) -> str:
    """How a direct run's command ended, as its holder reaped it. A shell (a
    task's `shell` command) reports its own child's death by signal n as 128 + n."""
    if status == UNKNOWN_EXIT:
        return "Command is gone and its exit status is unknown (the agent's holder died)"
    if SIGNAL_BASE < status <= SIGNAL_BASE + 64:
        try:
            name = signal.Signals(status - SIGNAL_BASE).name
        except ValueError:
            name = str(status - SIGNAL_BASE)
        return f"Command exited with status {status} (signal {name}, or an exit with that status)"
    return describe_process_exit(status, "Command")


def stop_unrecorded(sandboxes: Collection[str]) -> set[str]:
    """SIGKILL the runs of direct tasks whose agent died between starting them and
    checkpointing their pids: a process working in one of their sandboxes (the
    holder starts the command there) is one of them, found in one
    walk of /proc for all. The sandboxes whose runs were killed, by their real
    paths."""
    wanted = {os.path.realpath(sandbox) for sandbox in sandboxes}
    killed: set[str] = set()
    for process in psutil.process_iter(["cwd"]) if wanted else ():
        cwd = process.info["cwd"]
        if cwd not in wanted:
            continue
        try:
            if os.getpgid(process.pid) == process.pid:  # the run's leader: its group too
                signal_group(process.pid, signal.SIGKILL)
            process.kill()
        except (OSError, psutil.Error):
            continue
        killed.add(cwd)
        log.warning("killed the unrecorded run in %s (pid %d): its agent died as it "
                    "started it", cwd, process.pid)
    return killed


class Containerizer:
    """Runs executors; calls `on_exit(key, status, final_sample, description)` once
    per run when its process ends (status < 0: killed by signal -status;
    `UNKNOWN_EXIT` for an adopted run; a direct run's: its command's, as the holder
    reaped it). `final_sample` is the isolator's last word on the run (it says
    whether the kernel killed it for memory), or None."""

    def __init__(self, on_exit: OnExit, base_env: dict[str, str] | None = None,
                 isolator: Isolator | None = None, switch_user: bool = False,
                 work_dir: str = "") -> None:
        self._on_exit = on_exit
        self.switch_user = switch_user
        self._base_env = dict(os.environ if base_env is None else base_env)
        self.isolator: Isolator = isolator or PosixIsolator()
        self._runs: dict[RunKey, _Run] = {}
        self._starting: dict[RunKey, Limits] = {}  # launch in progress: latest limits
        self._doomed: set[RunKey] = set()  # SIGKILLed while starting
        self._watcher = spawn.Watcher()
        # Worker-thread trips in batches (`agent.trips`): the ends of the runs that
        # ended together in one; starts in up to START_LANES at once, each a chunk.
        self._ends: Batches[tuple[RunKey, _Run, int], RunSample | None] = Batches(self._final)
        self._starts: Batches[_Start, tuple[subprocess.Popen[bytes], float]] = Batches(
            self._start, START_LANES, START_CHUNK)
        # Direct runs: their sandboxes and cgroups in the same trips, then the holder.
        self._prepares: Batches[_Start, None] = Batches(self._prepare, START_LANES, START_CHUNK)
        self._holder = HolderLink(work_dir, self._base_env, self._held_exited,
                                  self._holder_gone) if work_dir else None
        self._home: list[str] | None = None  # the holder's own cgroups, made once
        self._together = Together(HELD_LONGEST)  # held starts answered together
        self._answered: dict[RunKey, _Run] = {}  # held runs started, their launch held back
        self.run_log = RunLog(log, lambda delay, callback:
                              asyncio.get_running_loop().call_later(delay, callback))

    @property
    def pids(self) -> list[int]:
        return [run.pid for run in self._runs.values()]

    def running(self, key: RunKey) -> bool:
        return key in self._runs

    async def launch(self, effect: LaunchExecutor) -> tuple[int, float]:
        """Start the run; return its pid and start time. Raises `LaunchError`."""
        key = (effect.framework_id, effect.executor_id, effect.run_id)
        self._starting[key] = effect.limits
        try:
            return await self._launch(key, effect)
        finally:
            self._starting.pop(key, None)
            self._doomed.discard(key)

    async def _launch(self, key: RunKey, effect: LaunchExecutor) -> tuple[int, float]:
        command = effect.command
        argv = command.argv if command.argv is not None else ["/bin/sh", "-c", command.shell or ""]
        env = dict(effect.env)  # over the base environment
        try:
            run_as = users.resolve(effect.user, self.switch_user)
            if run_as is not None:
                argv = users.command(run_as, argv)
                env.update(users.environment(run_as))
        except users.UserError as exc:
            raise LaunchError(str(exc)) from None
        if effect.held:  # the holder has the base environment
            pid, started = await self._launch_held(key, effect, argv, env, run_as)
        else:
            # One trip to a worker thread for all of the start, shared with the starts
            # queued with it: the cgroup, the logs and the vfork, which holds its
            # thread (not the loop) until the child has exec'ed.
            process, started = await self._starts.run(
                (key, effect, argv, {**self._base_env, **env}, run_as))
            pid = process.pid
            run = self._runs[key] = _Run(pid, started, process)
            run.waiter = asyncio.ensure_future(self._reap(key, run))
        self.run_log.launched(key, pid, effect.sandbox_dir, self.isolator.name)
        if key in self._doomed:
            self.kill(key, "KILL")
        return pid, started

    async def _launch_held(self, key: RunKey, effect: LaunchExecutor, argv: list[str],
                           env: dict[str, str], run_as: users.RunAs | None) -> tuple[int, float]:
        """A direct run: its sandbox and cgroups on a worker thread (in trips shared
        with the starts queued with it), then started by the holder, which joins
        the cgroups itself, unless the run is another user's (then a joining
        shell is exec'ed first: the join needs the agent's rights)."""
        if self._holder is None:
            raise LaunchError("direct runs need the agent's holder: no work dir given")
        try:
            run = await self._together.run(self._hold(key, effect, argv, env, run_as))
        except (OSError, HolderGone) as exc:
            # The holder may have started it before it went: nobody must keep it.
            unsure = [effect.sandbox_dir] if isinstance(exc, HolderGone) else []
            await asyncio.to_thread(self._undo, key, unsure)
            raise LaunchError(f"{argv[0]}: {exc}") from exc
        finally:
            self._answered.pop(key, None)
        self._runs[key] = run
        assert run.exit is not None
        if not run.exit.done() and key not in self._holder.live:  # its holder died since
            asyncio.ensure_future(self._orphaned({key: run}))
        run.waiter = asyncio.ensure_future(self._reap(key, run))
        return run.pid, run.started

    async def _hold(self, key: RunKey, effect: LaunchExecutor, argv: list[str],
                    env: dict[str, str], run_as: users.RunAs | None) -> _Run:
        """The run, started; a run that ends while its launch is held back (with the
        rest of its flood) has its end begun at once (`_held_exited`)."""
        assert self._holder is not None
        await self._prepares.run((key, effect, argv, env, run_as))
        join = self.isolator.join_files(key) if run_as is None else None
        pid, started = await self._holder.start(
            key, argv if join is not None else self.isolator.wrap(key, argv),
            effect.sandbox_dir, env, join or [], (self._home or []) if join else [])
        run = self._answered[key] = _Run(pid, started, None, held=True,
                                         exit=asyncio.get_running_loop().create_future())
        if key in self._holder.ended:  # it ended before we heard it started
            self._held_exited(key, self._holder.ended[key])
        return run

    def _prepare(self, start: _Start) -> None:
        """A direct run's sandbox, logs and cgroups (blocking: off the loop). The
        logs are made here, on the worker threads, not by the run's process
        before its exec: the holder waits for that exec (vfork), and making two
        files on this VM's ext4 cost 0.3-0.6 ms, which the holder would wait out
        one run after another."""
        key, effect, argv, _, run_as = start
        try:
            sandbox_dirs.make(effect.sandbox_dir)
            for name in ("stdout", "stderr"):
                os.close(os.open(os.path.join(effect.sandbox_dir, name),
                                 holder.OPEN_FLAGS | os.O_CLOEXEC, 0o644))
            self.isolator.prepare(key, self._starting[key])
            if self._home is None:
                self._home = self.isolator.home_files()
            if run_as is not None:  # the whole sandbox, logs too
                users.hand_over(run_as, effect.sandbox_dir)
        except (OSError, IsolationError) as exc:
            self.isolator.cleanup(key)
            raise LaunchError(f"{argv[0]}: {exc}") from exc

    def _undo(self, key: RunKey, sandboxes: list[str]) -> None:
        stop_unrecorded(sandboxes)
        self.isolator.cleanup(key)

    def _held_exited(self, key: RunKey, status: int) -> None:
        """A held run ended. One whose launch is still held back (the rest of its
        flood is being started) is ended at once -- its last sample, its leftovers
        killed, its cgroups gone -- on a worker thread while the holder goes on
        starting the others, not after the flood's starts, where every end
        waited for them: its end is told only once its launch was (`_reap`)."""
        run = self._runs.get(key) or self._answered.get(key)
        if run is None or run.exit is None or run.exit.done():
            return
        run.exit.set_result(status)
        if key not in self._runs:
            run.final = asyncio.ensure_future(self._ends.run((key, run, status)))

    def _holder_gone(self, live: dict[RunKey, tuple[int, float]]) -> None:
        held = {key: run for key, run in self._runs.items()
                if run.exit is not None and not run.exit.done()}
        if held:
            log.error("the holder died: %d runs it held lose their exit status unless they "
                      "had ended (its log)", len(held))
            asyncio.ensure_future(self._orphaned(held))

    async def _orphaned(self, held: dict[RunKey, _Run]) -> None:
        """Runs whose holder died: ended ones end by its log; live ones (init's
        children now) are watched by pidfd and end with no status."""
        assert self._holder is not None
        logged = await asyncio.to_thread(holder.read_log, self._holder.work_dir)
        for key, run in held.items():
            assert run.exit is not None
            status = logged.get(run_key(key))
            if status is not None:
                run.exit.set_result(status)
                continue
            descriptor = self._pidfd(run.pid, run.started)
            if descriptor < 0:
                run.exit.set_result(UNKNOWN_EXIT)
            else:
                asyncio.ensure_future(self._orphan_ended(run.exit, descriptor))

    async def _orphan_ended(self, exit: asyncio.Future[int], descriptor: int) -> None:
        await self._watcher.ended(descriptor)
        exit.set_result(UNKNOWN_EXIT)

    def _start(self, start: _Start) -> tuple[subprocess.Popen[bytes], float]:
        """Start the run's process (blocking: off the loop); its start time."""
        key, effect, argv, env, run_as = start
        try:
            sandbox_dirs.make(effect.sandbox_dir)
            self.isolator.prepare(key, self._starting[key])
            with open(os.path.join(effect.sandbox_dir, "stdout"), "ab") as out, \
                    open(os.path.join(effect.sandbox_dir, "stderr"), "ab") as err:
                if run_as is not None:  # the whole sandbox, logs and run keys too
                    users.hand_over(run_as, effect.sandbox_dir)
                process = spawn.start(self.isolator.wrap(key, argv),
                                      effect.sandbox_dir, env, out.fileno(), err.fileno())
        except (OSError, ValueError, IsolationError) as exc:
            self.isolator.cleanup(key)
            raise LaunchError(f"{argv[0]}: {exc}") from exc
        try:
            return process, holder.start_time(process.pid)
        except OSError:
            return process, 0.0  # already gone; the reaper reports how it ended

    async def connect_holder(self) -> None:
        """Hear from the holder (started if none is there) which of its runs live
        and which ended: before runs are adopted after a restart, and at the
        agent's start, so that no task waits for a holder to start."""
        if self._holder is not None:
            try:
                await self._holder.connect()
            except HolderGone as exc:
                log.error("no holder: direct runs that lived on are watched without it (%s)",
                          exc)

    def adopt(self, key: RunKey, pid: int, started: float, held: bool = False) -> bool:
        """Watch a run left by an earlier agent; False if that process is gone. A
        direct run its holder still holds is the holder's to report; one whose
        holder died is watched by pidfd, its status unknown."""
        if held and self._holder is not None and self._holder.live.get(key, (0,))[0] == pid:
            run = self._runs[key] = _Run(pid, started, None, held=True,
                                         exit=asyncio.get_running_loop().create_future())
            if key in self._holder.ended:  # it ended as we connected
                self._held_exited(key, self._holder.ended[key])
            run.waiter = asyncio.ensure_future(self._reap(key, run))
            log.info("adopted direct run %s from the holder (pid %d)", key[1], pid)
            return True
        descriptor = self._pidfd(pid, started)
        if descriptor < 0:
            return False
        run = self._runs[key] = _Run(pid, started, None, held=held)
        run.waiter = asyncio.ensure_future(self._reap(key, run, descriptor))
        log.info("adopted executor %s (pid %d)", key[1], pid)
        return True

    def ended(self, key: RunKey) -> tuple[int, str] | None:
        """A direct run that ended while the agent was away: its status (as its
        holder reaped it) and how that reads, or None if no holder told it."""
        status = self._holder.ended.get(key) if self._holder is not None else None
        return None if status is None else (status, describe_command_exit(status))

    def checkpointed(self, saved: Iterable[SavedExecutor]) -> None:
        """A checkpoint holding the runs `saved` is on disk: the holder may forget
        every ended run not among them (the core has taken in its end)."""
        if self._holder is not None and self._holder.ended:
            keys = {(e.framework_id, e.info.executor_id, e.run_id) for e in saved}
            self._holder.forget([key for key in self._holder.ended if key not in keys])

    @staticmethod
    def _pidfd(pid: int, started: float) -> int:
        """A pidfd of `pid` if it is still the process that started at `started`,
        else -1."""
        try:
            process = psutil.Process(pid)
            alive = (abs(holder.start_time(pid) - started) < START_TIME_SLACK
                     and process.status() != psutil.STATUS_ZOMBIE)
            return os.pidfd_open(pid) if alive else -1
        except (psutil.Error, OSError):
            return -1

    def update(self, key: RunKey, limits: Limits) -> None:
        if key in self._starting:
            self._starting[key] = limits
        elif key in self._runs:
            self.isolator.update(key, limits)

    def kill(self, key: RunKey, sig: str) -> None:
        run = self._runs.get(key)
        if run is None:
            if key in self._starting and sig == "KILL":
                self._doomed.add(key)
            return
        if sig == "TERM":
            self._signal_group(key, run, signal.SIGTERM)
            return
        self._kill_everything(key, run, run.pid)

    def _signal_group(self, key: RunKey, run: _Run, sig: signal.Signals) -> None:
        """The run's process group. A held run's live leader is signalled through
        its holder, which knows whether it has reaped it (and its pid may be reused)."""
        if run.exit is not None and not run.exit.done() and self._holder is not None \
                and self._holder.connected:
            self._holder.kill(key, sig)
        else:
            signal_group(run.pid, sig)

    def kill_all(self) -> None:
        """Last resort when the agent stops: SIGKILL every run."""
        for key, run in list(self._runs.items()):
            self._kill_everything(key, run, run.pid)

    async def wait_all(self) -> None:
        waiters = [run.waiter for run in self._runs.values() if run.waiter is not None]
        if waiters:
            await asyncio.gather(*waiters, return_exceptions=True)

    def close(self) -> None:
        """The agent stops (its runs are gone, or left to the holder for the next)."""
        self.run_log.flush()
        if self._holder is not None:
            self._holder.close()

    async def sample_all(self) -> list[RunSample]:
        """Measure every run (in a worker thread: /proc and cgroup reads block)."""
        runs = [(key, run) for key, run in self._runs.items()]
        return await asyncio.to_thread(self._sample, runs)

    def _sample(self, runs: list[tuple[RunKey, _Run]]) -> list[RunSample]:
        samples = []
        for key, run in runs:
            run.seen = processes(self.isolator.pids(key, run.pid))
            sample = self.isolator.sample(key, run.pid)
            if sample is not None:
                samples.append(sample)
        return samples

    def _kill_everything(self, key: RunKey, run: _Run, root: int | None) -> None:
        """SIGKILL the run's group and every process known to be the run's. `root`
        None: the leader is reaped, so its pid may be reused: its group is
        signalled unless that pid now leads a group (someone else's, as ours has
        no leader), and otherwise only the cgroup and the processes seen at the
        last sample count."""
        members = processes(self.isolator.pids(key, root)) + run.seen
        if root is not None or not leads_a_group(run.pid):
            self._signal_group(key, run, signal.SIGKILL)
        for process in members:
            try:
                if process.is_running():  # checks the start time: no pid reuse
                    process.kill()
            except psutil.Error:
                pass

    async def _reap(self, key: RunKey, run: _Run, descriptor: int = -1) -> None:
        if run.exit is not None:
            status = await run.exit
        elif run.process is not None:
            status = await self._watcher.wait(run.process)
        else:
            status = UNKNOWN_EXIT
            await self._watcher.ended(descriptor)
        final = await (run.final or self._ends.run((key, run, status)))
        del self._runs[key]
        description = describe_command_exit(status) if run.held else describe_exit(status)
        self.run_log.ended(key, run.pid, status)
        self._on_exit(key, status, final, description)

    def _final(self, ending: tuple[RunKey, _Run, int]) -> RunSample | None:
        """The run's last sample; then what is left of it is killed and its cgroup
        goes (blocking: off the loop). A run that exited with 0 was not killed for
        memory (cgroups v2 kills the whole group; under v1 and posix the agent does
        the killing), so it needs no last sample."""
        key, run, status = ending
        final = None if status == 0 else self.isolator.sample(key, None)
        self._kill_everything(key, run, None)  # leftovers of a finished run
        self.isolator.cleanup(key)
        return final

