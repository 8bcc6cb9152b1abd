"""Isolators: choosing one, the cgroup file protocol (against a directory tree laid
out like cgroupfs, so v1 and v2 are both exercised on any machine), joining a cgroup
before exec, and measuring a real process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agent.isolation import (
    CgroupsV1, CgroupsV2, IsolationError, PosixIsolator, _mounts, detect, measure, tree,
)
from agent.model import Limits

KEY = ("F1", "E1", "run-1")
MiB = 1024 * 1024


def fake_v1(root: Path) -> str:
    for controller in ("memory", "cpu"):
        (root / controller).mkdir(parents=True)
    return (f"cgroup {root}/memory cgroup rw,relatime,memory 0 0\n"
            f"cgroup {root}/cpu cgroup rw,relatime,cpu 0 0\n"
            f"cgroup2 {root}/unified cgroup2 rw 0 0\n")


def fake_v2(root: Path) -> str:
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n"


def test_mounts_are_read_per_controller() -> None:
    unified, v1 = _mounts("cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
                          "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\nnonsense\n")
    assert unified == "/sys/fs/cgroup/unified"
    assert v1["cpu"] == v1["cpuacct"] == "/sys/fs/cgroup/cpu,cpuacct"


def test_posix_when_asked_or_when_no_cgroup_can_be_written(tmp_path: Path) -> None:
    assert isinstance(detect("posix"), PosixIsolator)
    mounts = f"cgroup2 {tmp_path}/none cgroup2 rw 0 0\n"
    assert isinstance(detect(None, mounts=mounts), PosixIsolator)
    with pytest.raises(IsolationError) as error:
        detect("cgroups", mounts=mounts)
    assert "lacks" in str(error.value) and "no cgroup v1 memory and cpu" in str(error.value)


def test_v1_limits_oom_control_sampling_and_joining(tmp_path: Path) -> None:
    isolator = detect(None, "dyad", mounts=fake_v1(tmp_path))
    assert isinstance(isolator, CgroupsV1) and isolator.kind == "cgroups"
    isolator.prepare(KEY, Limits(cpus=1.5, mem_bytes=128 * MiB))
    memory = tmp_path / "memory" / "dyad" / "run-1"
    cpu = tmp_path / "cpu" / "dyad" / "run-1"
    assert (memory / "memory.limit_in_bytes").read_text() == str(128 * MiB)
    assert (memory / "memory.oom_control").read_text() == "1"  # the agent decides
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    assert (cpu / "cpu.shares").read_text() == "1536"
    isolator.update(KEY, Limits(cpus=0, mem_bytes=0))
    assert (memory / "memory.limit_in_bytes").read_text() == "-1"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "-1"

    argv = isolator.wrap(KEY, [sys.executable, "-c", "import os; print(os.getpid())"])
    ran = subprocess.run(argv, capture_output=True, text=True, check=True)
    pid = ran.stdout.strip()
    assert (memory / "cgroup.procs").read_text().strip() == pid  # joined, then exec'd
    assert (cpu / "cgroup.procs").read_text().strip() == pid

    (memory / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 1\nunder_oom 1\noom_kill 0\n")
    (memory / "memory.max_usage_in_bytes").write_text(str(128 * MiB))
    (cpu / "cpu.stat").write_text("nr_periods 10\nnr_throttled 4\nthrottled_time 2500000000\n")
    sample = isolator.sample(KEY, None)
    assert sample is not None and sample.oom and sample.processes == 1
    assert sample.mem_rss_bytes > 0 and sample.mem_peak_bytes == 128 * MiB
    assert (sample.cpus_nr_throttled, sample.cpus_throttled_time) == (4, 2.5)
    assert isolator.pids(KEY, None) == [os.getpid()]


def test_v2_delegates_and_lets_the_kernel_kill_the_whole_run(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    isolator = detect(None, "dyad", mounts=fake_v2(root))
    assert isinstance(isolator, CgroupsV2)
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert (root / "dyad" / "cgroup.subtree_control").read_text() == "+memory +cpu"
    isolator.prepare(KEY, Limits(cpus=0.25, mem_bytes=64 * MiB))
    run = root / "dyad" / "run-1"
    assert (run / "memory.max").read_text() == str(64 * MiB)
    assert (run / "memory.oom.group").read_text() == "1"
    assert (run / "cpu.max").read_text() == "25000 100000"
    isolator.update(KEY, Limits())
    assert (run / "memory.max").read_text() == "max" and (run / "cpu.max").read_text() == \
        "max 100000"
    (run / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (run / "cpu.stat").write_text("usage_usec 10\nnr_throttled 2\nthrottled_usec 500000\n")
    sample = isolator.sample(KEY, None)
    assert sample is not None and sample.oom and sample.processes == 0
    assert (sample.cpus_nr_throttled, sample.cpus_throttled_time) == (2, 0.5)
    assert isolator.sample(("F1", "E1", "other"), None) is None


def test_an_unwritable_cgroup_is_a_launch_error(tmp_path: Path) -> None:
    isolator = CgroupsV1(str(tmp_path / "memory"), str(tmp_path / "cpu"), "dyad")
    (tmp_path / "memory").write_text("not a directory")
    with pytest.raises(IsolationError, match="cannot set up cgroup for run run-1"):
        isolator.prepare(KEY, Limits(mem_bytes=MiB))


def test_posix_measures_the_whole_process_tree() -> None:
    parent = subprocess.Popen(["/bin/sh", "-c", "sleep 5 & sleep 5 & wait"])
    try:
        pids: list[int] = []
        deadline = time.monotonic() + 5
        while len(pids) < 3 and time.monotonic() < deadline:
            pids = tree(parent.pid)
            time.sleep(0.01)
        assert len(pids) == 3 and pids[0] == parent.pid
        sample = PosixIsolator().sample(KEY, parent.pid)
        assert sample is not None and sample.processes == 3 and sample.mem_rss_bytes > 0
        assert not sample.oom and sample.mem_peak_bytes == 0
    finally:
        for child in psutil.Process(parent.pid).children():
            child.kill()
        parent.kill()
        parent.wait()
    assert PosixIsolator().sample(KEY, parent.pid) is None
    assert measure(KEY, []).processes == 0


def test_revocable_cpus_add_no_cpu_weight(tmp_path: Path) -> None:
    """cpu.shares (v1) and cpu.weight (v2) scale with the non-revocable share of a
    run's cpus; under posix a run launched for revocable work starts niced."""
    mixed = Limits(cpus=2.0, mem_bytes=MiB, revocable_cpus=1.5)
    lent = Limits(cpus=1.1, mem_bytes=MiB, revocable_cpus=1.0)  # only its executor's own
    v1 = detect(None, "dyad", mounts=fake_v1(tmp_path / "v1"))
    v1.prepare(KEY, Limits(cpus=2.0, mem_bytes=MiB))
    shares = tmp_path / "v1" / "cpu" / "dyad" / "run-1" / "cpu.shares"
    assert shares.read_text() == "2048"
    v1.update(KEY, mixed)
    assert shares.read_text() == "512"
    v1.update(KEY, Limits(cpus=1.0, revocable_cpus=1.0))
    assert shares.read_text() == "2"  # the kernel's least
    v2 = detect(None, "dyad", mounts=fake_v2(tmp_path / "v2"))
    v2.prepare(KEY, Limits(cpus=0.5))
    weight = tmp_path / "v2" / "dyad" / "run-1" / "cpu.weight"
    assert weight.read_text() == "100"  # the kernel's default
    v2.update(KEY, lent)
    assert weight.read_text() == "9"
    posix = PosixIsolator()
    posix.prepare(KEY, lent)
    argv = posix.wrap(KEY, [sys.executable, "-c", "import os; print(os.nice(0))"])
    assert argv[:3] == ["nice", "-n", "17"]
    ran = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert int(ran.stdout) >= 17  # (more if this test itself runs niced)
    posix.prepare(KEY, Limits(cpus=1.0))
    assert posix.wrap(KEY, ["true"]) == ["true"]
