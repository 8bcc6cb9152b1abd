"""Runs started by `agent.spawn` and reaped through its `Watcher`, and the
containerizer's batched ends of runs it started and of runs its holder held, with
real processes (each lives milliseconds)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import psutil

from agent import holder, spawn
from agent.containerizer import Containerizer, _Run
from agent.isolation import PosixIsolator
from agent.model import LaunchExecutor, RunKey, RunSample
from dyad.messages import CommandInfo


def test_start_time_reads_what_psutil_reads() -> None:
    for pid in (1, os.getpid()):
        assert abs(holder.start_time(pid) - psutil.Process(pid).create_time()) < 0.01


async def test_one_watcher_reaps_many_runs_with_their_statuses(tmp_path: Path) -> None:
    watcher = spawn.Watcher()
    processes = [spawn.start(["/bin/sh", "-c", f"exit {n}"], str(tmp_path), {},
                             subprocess.DEVNULL, subprocess.DEVNULL) for n in range(20)]
    statuses = await asyncio.wait_for(
        asyncio.gather(*(watcher.wait(p) for p in processes)), 10)
    assert statuses == list(range(20))
    assert watcher._epoll is None  # off the loop while nothing is waited for


async def test_a_cancelled_wait_leaves_the_others_watched(tmp_path: Path) -> None:
    watcher = spawn.Watcher()
    slow = spawn.start(["sleep", "30"], str(tmp_path), {}, subprocess.DEVNULL,
                       subprocess.DEVNULL)
    quick = spawn.start(["/bin/sh", "-c", "exit 4"], str(tmp_path), {}, subprocess.DEVNULL,
                        subprocess.DEVNULL)
    waiting = asyncio.ensure_future(watcher.wait(slow))
    await asyncio.sleep(0)
    waiting.cancel()
    assert await asyncio.wait_for(watcher.wait(quick), 10) == 4
    slow.kill()
    slow.wait()


async def test_runs_ending_together_are_each_reported_once(tmp_path: Path) -> None:
    ended: dict[RunKey, tuple[int, str]] = {}
    all_ended = asyncio.Event()

    def on_exit(key: RunKey, status: int, final: RunSample | None, description: str) -> None:
        assert key not in ended
        ended[key] = (status, description)
        if len(ended) == 30:
            all_ended.set()

    containerizer = Containerizer(on_exit, {"PATH": os.environ["PATH"]}, PosixIsolator(),
                                  work_dir=str(tmp_path))
    launches = []
    for n in range(30):  # every third one held (a direct run), the others spawned here
        launches.append(LaunchExecutor(
            "f", f"e{n}", f"r{n}", CommandInfo(shell=f"exit {n % 3}"), {},
            str(tmp_path / f"run{n}"), held=n % 3 == 0))
    await containerizer.connect_holder()
    await asyncio.gather(*(containerizer.launch(launch) for launch in launches))
    await asyncio.wait_for(all_ended.wait(), 10)
    said = {True: "Command", False: "Executor"}
    assert ended == {("f", f"e{n}", f"r{n}"): (n % 3, f"{said[n % 3 == 0]} exited with status "
                                                      f"{n % 3}") for n in range(30)}
    assert containerizer.pids == []
    containerizer.close()


def test_a_reaped_leaders_group_is_killed_unless_its_pid_now_leads_another(
        tmp_path: Path) -> None:
    """After a run's leader is reaped its pid may be reused: the leftovers of its
    group are killed, but a new group led by that pid is left alone."""
    containerizer = Containerizer(lambda *_: None, {"PATH": os.environ["PATH"]},
                                  PosixIsolator(), work_dir=str(tmp_path))
    # A leader that leaves a child behind in its group, and is reaped.
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE,
                              start_new_session=True)
    left = psutil.Process(int(leader.stdout.readline()))  # type: ignore[union-attr]
    leader.wait()
    leader.stdout.close()  # type: ignore[union-attr]
    # Someone else's group, led by a pid we pretend was our run's.
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        containerizer._kill_everything(("f", "e", "r1"), _Run(leader.pid, 0.0, None), None)
        assert gone(left)
        containerizer._kill_everything(("f", "e", "r2"), _Run(other.pid, 0.0, None), None)
        assert other.poll() is None  # still running
    finally:
        other.kill()
        other.wait()
        containerizer.close()


def gone(process: psutil.Process, within: float = 5.0) -> bool:
    """Whether `process` ends (or is a zombie for its new parent to reap) in time."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False
