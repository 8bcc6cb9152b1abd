"""Keeping each executor run within its resources, and measuring what it uses.

Three isolators behind one interface, chosen once at start (`detect`):

- **cgroups v2** (a unified hierarchy with the `memory` and `cpu` controllers):
  one cgroup per run under ``<mount>/<root>/``; ``memory.max`` and ``cpu.max``
  enforce the limits, ``memory.oom.group`` makes the kernel kill the whole run when
  it runs out of memory, and ``memory.events`` tells the agent it did.
- **cgroups v1** (separate ``memory`` and ``cpu`` hierarchies):
  ``memory.limit_in_bytes`` and ``cpu.cfs_quota_us``/``cpu.shares``. The kernel's
  OOM killer is switched off for the run (``memory.oom_control``), so a run at its
  limit stalls instead of losing one random process; the agent sees
  ``under_oom 1`` at its next sample and kills the whole run with the memory
  reason. That keeps the verdict with the agent, as under v2.
- **posix**: no kernel help. The agent samples the process tree (psutil) and kills
  the run when its RSS passes the limit. CPU is measured, not enforced.

Revocable tasks add no CPU weight (`Limits.weight_share`): under cgroups a run's
``cpu.shares`` (v1) or ``cpu.weight`` (v2) is scaled by the non-revocable share of
its cpus, updated as its tasks change; under posix a run launched mostly for
revocable work starts niced (`POSIX_MAX_NICE` times its revocable share), fixed
at launch.

A run joins its cgroup before it execs (a tiny ``/bin/sh`` that writes its own pid
into ``cgroup.procs`` and ``exec``s the executor), so its pid, its parent and its
whole process tree are the executor's own from the first instruction on.

The sampling functions read ``/proc`` and cgroup files: cheap, but blocking, so
the shell calls them from a worker thread. Nothing here decides anything: limits
come from `AgentState`, verdicts go back to it as `RunSample`s.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from typing import Iterable, Protocol

import attrs
import psutil

from agent.model import Limits, RunKey, RunSample

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
POSIX_MAX_NICE = 19
# Joins every cgroup named before "--", then execs the rest: the executor keeps
# this shell's pid, so the agent's child is the executor itself.
JOIN_SCRIPT = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; '
               'shift; exec "$@"')


class IsolationError(Exception):
    """The requested isolation cannot be used, or a run's cgroup cannot be made."""


class Isolator(Protocol):
    """What the containerizer asks of an isolator; `key` names a run."""

    name: str  # what the agent logs and shows: "posix", "cgroups v1", "cgroups v2"
    kind: str  # the `AgentConfig.isolation` it stands for: "posix" or "cgroups"

    def prepare(self, key: RunKey, limits: Limits) -> None: ...

    def wrap(self, key: RunKey, argv: list[str]) -> list[str]: ...

    def join_files(self, key: RunKey) -> list[str] | None:
        """Where the holder writes its pid to join the run's cgroups before it
        starts the run's process (`agent.holder`); None: there is nothing to
        join, `wrap` it instead."""
        ...

    def home_files(self) -> list[str]:
        """Where the holder goes back to after a start: cgroups of its own (a leaf,
        as cgroups v2 wants), made on first use; [] when nothing is joined."""
        ...

    def update(self, key: RunKey, limits: Limits) -> None: ...

    def pids(self, key: RunKey, root: int | None) -> list[int]: ...

    def sample(self, key: RunKey, root: int | None) -> RunSample | None: ...

    def cleanup(self, key: RunKey) -> None: ...


# ----------------------------------------------------------------------- sampling


def processes(pids: Iterable[int]) -> list[psutil.Process]:
    """psutil handles for the pids still alive (each remembers its start time)."""
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def tree(root: int) -> list[int]:
    """`root` and every live descendant (empty if `root` is gone)."""
    try:
        process = psutil.Process(root)
        return [root] + [child.pid for child in process.children(recursive=True)]
    except psutil.Error:
        return []


def measure(key: RunKey, pids: list[int]) -> RunSample:
    """CPU times and RSS summed over `pids`. CPU of children they already reaped
    counts too, so short-lived helpers of a task are not invisible."""
    user = system = 0.0
    rss = 0
    count = 0
    for process in processes(pids):
        try:
            with process.oneshot():
                times = process.cpu_times()
                memory = process.memory_info()
        except psutil.Error:
            continue  # exited while we looked
        user += times.user + times.children_user
        system += times.system + times.children_system
        rss += memory.rss
        count += 1
    return RunSample(*key, timestamp=time.time(), cpus_user_time=round(user, 3),
                     cpus_system_time=round(system, 3), mem_rss_bytes=rss, processes=count)


# -------------------------------------------------------------------------- posix


class PosixIsolator:
    """Measures the process tree; the agent enforces memory by killing."""

    name = "posix"
    kind = "posix"

    def __init__(self) -> None:
        self._nice: dict[RunKey, int] = {}  # runs being launched -> their niceness

    def prepare(self, key: RunKey, limits: Limits) -> None:
        # Enforcement is the agent's sampling; only the CPU weight is set, by nice.
        self._nice[key] = round(POSIX_MAX_NICE * (1 - limits.weight_share))

    def wrap(self, key: RunKey, argv: list[str]) -> list[str]:
        nice = self._nice.pop(key, 0)
        return ["nice", "-n", str(nice), *argv] if nice else argv

    def join_files(self, key: RunKey) -> list[str] | None:
        return None

    def home_files(self) -> list[str]:
        return []

    def update(self, key: RunKey, limits: Limits) -> None:
        pass

    def pids(self, key: RunKey, root: int | None) -> list[int]:
        return tree(root) if root is not None else []

    def sample(self, key: RunKey, root: int | None) -> RunSample | None:
        pids = self.pids(key, root)
        return measure(key, pids) if pids else None

    def cleanup(self, key: RunKey) -> None:
        self._nice.pop(key, None)


# ------------------------------------------------------------------------ cgroups


def _write(path: str, value: str) -> None:
    # One write(2) and the flags open("w") uses, without a buffered file object
    # (a run's limits are four writes: Python's file objects were more than half their cost).
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(descriptor, value.encode())
    finally:
        os.close(descriptor)


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _fields(text: str) -> dict[str, int]:
    """'key value' lines (cpu.stat, memory.events, memory.oom_control) as a dict."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[name] = int(value)
    return out


def _cgroup_pids(directory: str) -> list[int]:
    return [int(line) for line in _read(os.path.join(directory, "cgroup.procs")).split()
            if line.isdigit()]


def _remove(directory: str) -> None:
    """rmdir a cgroup; its last processes may take a moment to leave after SIGKILL."""
    for _ in range(50):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("cannot remove cgroup %s: %s", directory, exc)
                return
            for pid in _cgroup_pids(directory):
                _kill(pid)
            time.sleep(0.02)
    log.warning("cgroup %s still busy; left behind", directory)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


HOLDER_CGROUP = "holder"  # run ids are generated uuids: never this


class _Cgroups:
    """What both cgroup versions share: a directory per run per hierarchy."""

    name = "cgroups"
    kind = "cgroups"

    def __init__(self, hierarchies: list[str], root: str) -> None:
        self._bases = [os.path.join(h, root) for h in hierarchies]

    def _dirs(self, key: RunKey) -> list[str]:
        return [os.path.join(base, key[2]) for base in self._bases]

    def prepare(self, key: RunKey, limits: Limits) -> None:
        try:
            for directory in self._dirs(key):
                os.makedirs(directory, exist_ok=True)
            self._limit(key, limits, first=True)
        except OSError as exc:
            raise IsolationError(f"cannot set up cgroup for run {key[2]}: {exc}") from exc

    def wrap(self, key: RunKey, argv: list[str]) -> list[str]:
        return ["/bin/sh", "-c", JOIN_SCRIPT, "dyad-join", *self.join_files(key), "--", *argv]

    def join_files(self, key: RunKey) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self._dirs(key)]

    def home_files(self) -> list[str]:
        homes = [os.path.join(base, HOLDER_CGROUP) for base in self._bases]
        try:
            for home in homes:
                os.makedirs(home, exist_ok=True)
        except OSError as exc:
            raise IsolationError(f"cannot make the holder's cgroup: {exc}") from exc
        return [os.path.join(home, "cgroup.procs") for home in homes]

    def update(self, key: RunKey, limits: Limits) -> None:
        try:
            self._limit(key, limits, first=False)
        except OSError as exc:  # e.g. a memory limit below what is in use now
            log.warning("cannot update limits of run %s to %s: %s", key[2], limits, exc)

    def pids(self, key: RunKey, root: int | None) -> list[int]:
        return _cgroup_pids(self._dirs(key)[0])

    def cleanup(self, key: RunKey) -> None:
        for directory in self._dirs(key):
            _remove(directory)

    def sample(self, key: RunKey, root: int | None) -> RunSample | None:
        """The run's processes as the cgroup lists them, plus what the kernel says:
        throttling, the memory high-water mark, whether it ran out of memory."""
        files = self._files(key)
        if not os.path.isdir(self._dirs(key)[0]):
            return None
        sample = measure(key, _cgroup_pids(self._dirs(key)[0]))
        throttle = _fields(_read(files.cpu_stat))
        oom = _fields(_read(files.oom))
        peak = _read(files.peak).strip()
        return attrs.evolve(
            sample, cpus_nr_throttled=throttle.get("nr_throttled", 0),
            cpus_throttled_time=round(throttle.get(files.throttled, 0) * files.scale, 6),
            mem_peak_bytes=int(peak) if peak.isdigit() else 0,
            oom=any(oom.get(name, 0) > 0 for name in files.oom_counters))

    def _files(self, key: RunKey) -> _Files:
        raise NotImplementedError

    def _limit(self, key: RunKey, limits: Limits, first: bool) -> None:
        raise NotImplementedError


@attrs.frozen
class _Files:
    """Where one cgroup version keeps what sampling reads."""

    cpu_stat: str
    throttled: str  # the cpu.stat field with the time spent throttled
    scale: float  # ... and its unit in seconds
    oom: str
    oom_counters: tuple[str, ...]  # fields of `oom` that say it ran out of memory
    peak: str


class CgroupsV1(_Cgroups):
    name = "cgroups v1"

    def __init__(self, memory: str, cpu: str, root: str) -> None:
        super().__init__([memory, cpu], root)

    def _limit(self, key: RunKey, limits: Limits, first: bool) -> None:
        memory, cpu = self._dirs(key)
        if first:
            _write(os.path.join(memory, "memory.oom_control"), "1")
        _write(os.path.join(memory, "memory.limit_in_bytes"),
               str(limits.mem_bytes) if limits.mem_bytes else "-1")
        # cpu.cfs_period_us is left at the kernel's default for a new cgroup,
        # CFS_PERIOD_US, which is what the quota is counted in.
        quota = max(1000, int(limits.cpus * CFS_PERIOD_US)) if limits.cpus else -1
        _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(quota))
        shares = (limits.cpus or 1) * 1024 * limits.weight_share
        _write(os.path.join(cpu, "cpu.shares"), str(max(2, int(shares))))

    def _files(self, key: RunKey) -> _Files:
        memory, cpu = self._dirs(key)
        return _Files(os.path.join(cpu, "cpu.stat"), "throttled_time", 1e-9,
                      os.path.join(memory, "memory.oom_control"), ("under_oom", "oom_kill"),
                      os.path.join(memory, "memory.max_usage_in_bytes"))


class CgroupsV2(_Cgroups):
    name = "cgroups v2"

    def __init__(self, mount: str, root: str) -> None:
        super().__init__([mount], root)
        self._mount = mount

    def enable(self) -> None:
        """Delegate memory and cpu to our root and to the runs under it."""
        _write(os.path.join(self._mount, "cgroup.subtree_control"), "+memory +cpu")
        os.makedirs(self._bases[0], exist_ok=True)
        _write(os.path.join(self._bases[0], "cgroup.subtree_control"), "+memory +cpu")

    def _limit(self, key: RunKey, limits: Limits, first: bool) -> None:
        (directory,) = self._dirs(key)
        if first:
            _write(os.path.join(directory, "memory.oom.group"), "1")
        _write(os.path.join(directory, "memory.max"),
               str(limits.mem_bytes) if limits.mem_bytes else "max")
        quota = max(1000, int(limits.cpus * CFS_PERIOD_US)) if limits.cpus else "max"
        _write(os.path.join(directory, "cpu.max"), f"{quota} {CFS_PERIOD_US}")
        # 100 is the kernel's default weight: revocable cpus scale it down.
        _write(os.path.join(directory, "cpu.weight"),
               str(max(1, round(100 * limits.weight_share))))

    def _files(self, key: RunKey) -> _Files:
        (directory,) = self._dirs(key)
        return _Files(os.path.join(directory, "cpu.stat"), "throttled_usec", 1e-6,
                      os.path.join(directory, "memory.events"), ("oom_kill", "oom_group_kill"),
                      os.path.join(directory, "memory.peak"))


# ---------------------------------------------------------------------- detection


def _mounts(text: str) -> tuple[str | None, dict[str, str]]:
    """The cgroup2 mount point and the v1 mount point of each controller."""
    unified = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2" and unified is None:
            unified = parts[1]
        elif parts[2] == "cgroup":
            for option in parts[3].split(","):
                v1.setdefault(option, parts[1])
    return unified, v1


def _probe(isolator: _Cgroups) -> None:
    """Make, limit and remove a throwaway run cgroup: writable or not, we learn now."""
    key = ("probe", "probe", f"probe-{os.getpid()}")
    try:
        isolator.prepare(key, Limits(cpus=0.5, mem_bytes=64 * 1024 * 1024))
    finally:
        isolator.cleanup(key)


def _try_v2(unified: str | None, root: str) -> tuple[Isolator | None, str]:
    if unified is None:
        return None, "no cgroup2 mount"
    controllers = _read(os.path.join(unified, "cgroup.controllers")).split()
    missing = {"memory", "cpu"} - set(controllers)
    if missing:
        return None, f"cgroup2 at {unified} lacks {', '.join(sorted(missing))}"
    v2 = CgroupsV2(unified, root)
    try:
        v2.enable()
        _probe(v2)
    except (OSError, IsolationError) as exc:
        return None, f"cgroup2 at {unified} is not writable: {exc}"
    return v2, ""


def _try_v1(v1: dict[str, str], root: str) -> tuple[Isolator | None, str]:
    if "memory" not in v1 or "cpu" not in v1:
        return None, "no cgroup v1 memory and cpu hierarchies"
    isolator = CgroupsV1(v1["memory"], v1["cpu"], root)
    try:
        _probe(isolator)
    except (OSError, IsolationError) as exc:
        return None, f"cgroup v1 hierarchies are not writable: {exc}"
    return isolator, ""


def detect(preferred: str | None, root: str = "dyad", mounts: str | None = None) -> Isolator:
    """The isolator to use. `preferred` "posix" or "cgroups" insists (an unusable
    cgroups raises `IsolationError` saying why); None takes the best that works:
    cgroups v2, then v1, then posix. `mounts` is /proc/mounts' text (for tests)."""
    if preferred == "posix":
        return PosixIsolator()
    if mounts is None:
        mounts = _read("/proc/mounts")
    unified, v1 = _mounts(mounts)
    v2, why_not_v2 = _try_v2(unified, root)
    if v2 is not None:
        return v2
    v1_isolator, why_not_v1 = _try_v1(v1, root)  # tried only when v2 is unusable
    if v1_isolator is not None:
        return v1_isolator
    reasons = f"{why_not_v2}; {why_not_v1}"
    if preferred == "cgroups":
        raise IsolationError(f"cgroups isolation is not available: {reasons}")
    log.info("cgroups unusable (%s); using the posix isolator", reasons)
    return PosixIsolator()
