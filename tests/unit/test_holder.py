"""The holder of direct runs (`agent.holder`) and the agent's end of it
(`agent.held`), with a real holder process and real runs (each lives
milliseconds, or until the test lets it go)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import AsyncIterator

import psutil
import pytest

from agent import held, holder
from agent.containerizer import Containerizer, describe_command_exit, stop_unrecorded
from agent.held import HolderGone, HolderLink, run_key
from agent.isolation import PosixIsolator
from agent.model import UNKNOWN_EXIT, LaunchExecutor, Limits, RunKey
from dyad.messages import CommandInfo
from tests.helpers import wait_for

BASE = {"PATH": os.environ["PATH"], "FROM": "the agent"}
ENV = {"FROM": "the run"}  # over BASE


class Heard:
    """What a link tells: exits, and the live runs of a holder that went."""

    def __init__(self) -> None:
        self.exits: dict[RunKey, int] = {}
        self.gone: list[dict[RunKey, tuple[int, float]]] = []
        self.links: list[HolderLink] = []

    def link(self, work_dir: Path) -> HolderLink:
        self.links.append(HolderLink(str(work_dir), BASE, self.exits.__setitem__,
                                     self.gone.append))
        return self.links[-1]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
async def heard(tmp_path: Path) -> AsyncIterator[Heard]:
    """A `Heard`; every holder started under `tmp_path` is killed at the end."""
    heard = Heard()
    yield heard
    for link in heard.links:
        link.close()
    await asyncio.sleep(0)  # the closes are done
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] and "agent.holder" in process.info["cmdline"] \
                and str(tmp_path) in process.info["cmdline"]:
            process.kill()


def sandbox(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.mkdir()
    return str(path)


async def test_runs_start_in_their_sandbox_and_session_and_their_statuses_are_told_and_logged(
        tmp_path: Path, heard: Heard) -> None:
    link = heard.link(tmp_path)
    commands = {"ok": ["true"], "three": ["sh", "-c", "exit 3"],
                "killed": ["sh", "-c", "kill -9 $$"],
                "where": ["sh", "-c", "pwd; echo $(ps -o sid= -p $$) $$; read x; echo $FROM >&2"]}
    pids = {}
    for name, argv in commands.items():
        pids[name], started = await link.start(("f", name, "r"), argv, sandbox(tmp_path, name),
                                               ENV, [], [])
        assert abs(started - time.time()) < 60  # read before the run could be reaped
    await wait_for(lambda: len(heard.exits) == 4, what="four exits")
    assert heard.exits == {("f", "ok", "r"): 0, ("f", "three", "r"): 3,
                           ("f", "killed", "r"): -signal.SIGKILL, ("f", "where", "r"): 0}
    where = tmp_path / "where"
    cwd, session = (where / "stdout").read_text().splitlines()
    assert cwd == str(where)
    assert session.split() == [str(pids["where"])] * 2  # the leader of its own session
    assert (where / "stderr").read_text() == "the run\n"  # stdin was /dev/null: read ended
    assert sorted(os.listdir(where)) == ["stderr", "stdout"]  # nothing else of ours
    assert holder.read_log(str(tmp_path)) == {run_key(k): s for k, s in heard.exits.items()}


async def test_a_flood_of_starts_is_answered_and_every_exit_is_logged_before_it_is_told(
        tmp_path: Path, heard: Heard) -> None:
    logged_when_told: list[bool] = []

    def told(key: RunKey, status: int) -> None:
        logged_when_told.append(holder.read_log(str(tmp_path)).get(run_key(key)) == status)

    link = HolderLink(str(tmp_path), BASE, told, lambda live: None)
    heard.links.append(link)  # its holder is killed at the end
    keys = [("f", f"e{n}", "r") for n in range(60)]  # queued and written together
    started = await asyncio.gather(*(link.start(key, ["sh", "-c", f"exit {n % 3}"],
                                                sandbox(tmp_path, f"s{n}"), ENV, [], [])
                                     for n, key in enumerate(keys)))
    assert len({pid for pid, _ in started}) == 60
    await wait_for(lambda: len(logged_when_told) == 60, what="sixty exits")
    assert all(logged_when_told)
    assert link.ended == {key: n % 3 for n, key in enumerate(keys)}
    # What is queued when the agent stops still reaches the holder.
    link.forget(keys)
    link.close()
    await wait_for(lambda: holder.read_log(str(tmp_path)) == {}, what="all forgotten")


async def test_starts_answered_together_each_carry_their_own_start_time(
        tmp_path: Path, heard: Heard) -> None:
    # Start times are read after the whole read's starts (`Holder._stamp`), so a
    # failed start among them must not shift the others' answers.
    link = heard.link(tmp_path)
    keys = [("f", f"e{n}", "r") for n in range(12)]
    argvs = [["sleep", "30"] if n != 5 else ["no-such-command-here"] for n in range(12)]
    answers = await asyncio.gather(*(link.start(key, argv, sandbox(tmp_path, f"s{n}"), ENV,
                                                [], [])
                                     for n, (key, argv) in enumerate(zip(keys, argvs))),
                                   return_exceptions=True)
    assert isinstance(answers[5], OSError)
    started = [answer for n, answer in enumerate(answers) if n != 5]
    assert len({pid for pid, _ in started}) == 11
    for pid, when in started:
        assert abs(when - psutil.Process(pid).create_time()) < 0.05
        assert link.live[[key for key in keys if link.live.get(key, (0,))[0] == pid][0]] \
            == (pid, when)
    for key in keys:
        link.kill(key, signal.SIGKILL)
    await wait_for(lambda: len(heard.exits) == 11, what="eleven exits")


async def test_a_run_that_cannot_start_fails_with_the_reason_and_the_holder_goes_on(
        tmp_path: Path, heard: Heard) -> None:
    link = heard.link(tmp_path)
    with pytest.raises(OSError, match="no-such-command"):
        await link.start(("f", "e", "r1"), ["no-such-command"], sandbox(tmp_path, "r1"), ENV,
                         [], [])
    with pytest.raises(OSError, match="No such file"):  # a cgroup it cannot join
        await link.start(("f", "e", "r2"), ["true"], sandbox(tmp_path, "r2"), ENV,
                         [str(tmp_path / "none" / "cgroup.procs")], [str(tmp_path / "home")])
    assert not (tmp_path / "home").exists()  # it joined nothing, so went nowhere
    await link.start(("f", "e", "r3"), ["true"], sandbox(tmp_path, "r3"), ENV, [], [])
    await wait_for(lambda: heard.exits, what="the exit")
    assert heard.exits == {("f", "e", "r3"): 0}


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/cpu", os.W_OK), reason="needs cgroups v1")
async def test_a_run_is_born_in_its_cgroup_and_the_holder_goes_home(
        tmp_path: Path, heard: Heard) -> None:
    base = Path(f"/sys/fs/cgroup/cpu/dyad-test-holder-{os.getpid()}")
    run, home = base / "run", base / "home"
    run.mkdir(parents=True)
    home.mkdir()
    try:
        link = heard.link(tmp_path)
        await link.start(("f", "e", "r"), ["sh", "-c", "cat /proc/self/cgroup"],
                         sandbox(tmp_path, "r"), ENV, [str(run / "cgroup.procs")],
                         [str(home / "cgroup.procs")])
        await wait_for(lambda: heard.exits, what="the exit")
        lines = (tmp_path / "r" / "stdout").read_text().splitlines()
        assert any(line.endswith(f":cpu:/{base.name}/run") for line in lines), lines
        assert (home / "cgroup.procs").read_text().split() == [str(link.pid)]
    finally:
        for pid in (home / "cgroup.procs").read_text().split():
            (base.parent / "cgroup.procs").write_text(pid)
        run.rmdir()
        home.rmdir()
        base.rmdir()


async def test_a_kill_reaches_the_whole_group_until_the_leader_is_reaped(
        tmp_path: Path, heard: Heard) -> None:
    link = heard.link(tmp_path)
    key = ("f", "e", "r")
    # The leader waits for a child in its group: SIGTERM to the group ends both.
    pid, _ = await link.start(key, ["sh", "-c", "sleep 30 & echo $! > child; wait"],
                              sandbox(tmp_path, "r"), ENV, [], [])
    child = await wait_for(lambda: (tmp_path / "r" / "child").exists()
                           and (tmp_path / "r" / "child").read_text().strip(), what="the child")
    link.kill(key, signal.SIGTERM)
    await wait_for(lambda: heard.exits, what="the exit")
    assert heard.exits == {key: -signal.SIGTERM}
    await wait_for(lambda: not alive(int(child)), what="the child to end")
    link.kill(key, signal.SIGKILL)  # reaped: nothing is signalled (the pid may be reused)
    assert holder.read_log(str(tmp_path)) == {run_key(key): -signal.SIGTERM}
    assert not alive(pid)


async def test_a_new_agent_hears_what_lives_and_what_ended_and_may_forget(
        tmp_path: Path, heard: Heard) -> None:
    first = heard.link(tmp_path)
    ended, live = ("f", "e", "ended"), ("f", "e", "live")
    await first.start(ended, ["sh", "-c", "exit 5"], sandbox(tmp_path, "ended"), ENV, [], [])
    pid, started = await first.start(live, ["sleep", "30"], sandbox(tmp_path, "live"), ENV,
                                     [], [])
    await wait_for(lambda: heard.exits, what="the first exit")
    # A restarted agent: its successor's connection replaces the first's.
    later = Heard()
    second = later.link(tmp_path)
    heard.links.append(second)
    await second.connect()
    assert second.pid == first.pid
    assert second.live == {live: (pid, started)} and second.ended == {ended: 5}
    await wait_for(lambda: heard.gone, what="the first link to hear it was replaced")
    second.forget([ended])
    second.kill(live, signal.SIGKILL)
    await wait_for(lambda: later.exits, what="the live run's exit")
    assert later.exits == {live: -signal.SIGKILL}
    assert holder.read_log(str(tmp_path)) == {run_key(live): -signal.SIGKILL}


async def test_the_log_is_rewritten_once_mostly_forgotten(tmp_path: Path, heard: Heard) -> None:
    many = 2 * holder.LOG_SLACK
    (tmp_path / holder.LOG).write_bytes(b"".join(
        holder.encode([f"f/e/r{n}", n % 7]) + b"\n" for n in range(many)) + b'["torn')
    link = heard.link(tmp_path)
    await link.connect()
    assert len(link.ended) == many  # the torn last line is skipped
    link.forget([("f", "e", f"r{n}") for n in range(many - 10)])
    await wait_for(lambda: len((tmp_path / holder.LOG).read_bytes().splitlines()) == 10,
                   what="the log rewritten")
    assert holder.read_log(str(tmp_path)) == {f"f/e/r{n}": n % 7 for n in range(many - 10, many)}


async def test_a_dead_holder_is_noticed_its_log_kept_and_a_new_one_started(
        tmp_path: Path, heard: Heard) -> None:
    link = heard.link(tmp_path)
    ended, live = ("f", "e", "ended"), ("f", "e", "live")
    await link.start(ended, ["true"], sandbox(tmp_path, "ended"), ENV, [], [])
    pid, started = await link.start(live, ["sleep", "30"], sandbox(tmp_path, "live"), ENV,
                                    [], [])
    await wait_for(lambda: heard.exits, what="the first exit")
    os.kill(link.pid, signal.SIGKILL)
    await wait_for(lambda: heard.gone, what="the holder's death")
    assert heard.gone == [{live: (pid, started)}] and not link.connected
    assert alive(pid)  # its run lives on, init's child now
    os.kill(pid, signal.SIGKILL)
    # The next start starts a holder, which knows what the dead one logged.
    await link.start(("f", "e", "next"), ["true"], sandbox(tmp_path, "next"), ENV, [], [])
    assert link.ended[ended] == 0


async def test_a_start_waiting_when_the_holder_dies_fails(tmp_path: Path, heard: Heard) -> None:
    link = heard.link(tmp_path)
    await link.connect()
    os.kill(link.pid, signal.SIGSTOP)  # it will never answer
    starting = asyncio.ensure_future(link.start(("f", "e", "r"), ["true"],
                                                sandbox(tmp_path, "r"), ENV, [], []))
    await wait_for(lambda: link._starts, 5, "the start sent and waiting")
    os.kill(link.pid, signal.SIGKILL)
    with pytest.raises(HolderGone):
        await asyncio.wait_for(starting, 10)


async def test_a_holder_that_answers_no_start_in_time_is_dropped(
        tmp_path: Path, heard: Heard, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held, "START_TIMEOUT", 0.3)
    link = heard.link(tmp_path)
    await link.connect()
    stuck = link.pid
    os.kill(stuck, signal.SIGSTOP)
    try:
        with pytest.raises(HolderGone):
            await asyncio.wait_for(link.start(("f", "e", "r"), ["true"], sandbox(tmp_path, "r"),
                                              ENV, [], []), 10)
        assert not link.connected and heard.gone == [{}]
    finally:
        os.kill(stuck, signal.SIGKILL)


async def test_the_holder_exits_with_no_agent_and_no_live_run(tmp_path: Path,
                                                              heard: Heard) -> None:
    link = heard.link(tmp_path)
    await link.connect()
    await link.start(("f", "e", "r"), ["true"], sandbox(tmp_path, "r"), ENV, [], [])
    await wait_for(lambda: heard.exits, what="the exit")
    the_holder = psutil.Process(link.pid)
    link.close()  # the agent went away
    await asyncio.to_thread(the_holder.wait, 10)
    assert holder.read_log(str(tmp_path)) == {"f/e/r": 0}  # for the next one


def test_only_the_holders_own_user_is_served(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another user")
    subprocess.run([sys.executable, "-m", "agent.holder", str(tmp_path)], check=True)
    with socket.socket(socket.AF_UNIX) as ours:  # the agent: it stays connected
        ours.connect(holder.address(str(tmp_path)))
        assert ours.recv(100).startswith(b'{"op":"hello"')
        probe = ("import socket; s = socket.socket(socket.AF_UNIX); "
                 f"s.connect({holder.address(str(tmp_path))!r}); print(s.recv(100))")
        theirs = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True,
                                text=True, user=65534, check=False, timeout=30)
        assert theirs.stdout.strip() == "b''", theirs  # closed on it: no hello


async def test_an_address_taken_by_another_user_is_refused(tmp_path: Path, heard: Heard) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to listen as another user")
    squat = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
             f"s.bind({holder.address(str(tmp_path))!r}); s.listen(); print('up', flush=True); "
             "time.sleep(30)")
    squatter = subprocess.Popen(["/usr/bin/python3", "-c", squat], user=65534,
                                stdout=subprocess.PIPE)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == b"up\n"
        with pytest.raises(HolderGone, match="user 65534"):
            await heard.link(tmp_path).connect()
    finally:
        squatter.kill()
        squatter.wait()
        if squatter.stdout is not None:
            squatter.stdout.close()


def test_a_run_whose_pid_was_never_checkpointed_is_found_in_its_sandbox_and_stopped(
        tmp_path: Path) -> None:
    process = subprocess.Popen(["/bin/sh", "-c", "echo up; exec sleep 30"], cwd=tmp_path,
                               start_new_session=True, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert stop_unrecorded([str(elsewhere), str(tmp_path / "none")]) == set()
    assert stop_unrecorded([]) == set()
    assert stop_unrecorded([str(elsewhere), str(tmp_path)]) == {str(tmp_path)}
    assert process.wait(10) == -signal.SIGKILL
    process.stdout.close()


async def test_the_containerizer_ends_the_runs_of_a_dead_holder_with_no_status(
        tmp_path: Path, heard: Heard) -> None:
    ended: dict[RunKey, tuple[int, str]] = {}
    containerizer = Containerizer(lambda key, status, _, said: ended.__setitem__(
        key, (status, said)), BASE, PosixIsolator(), work_dir=str(tmp_path))
    await containerizer.connect_holder()
    link = containerizer._holder
    assert link is not None
    pid, _ = await containerizer.launch(LaunchExecutor(
        "f", "e", "lost", CommandInfo(argv=["sleep", "30"]), {}, str(tmp_path / "lost"),
        held=True))
    os.kill(link.pid, signal.SIGKILL)
    await wait_for(lambda: not link.connected, what="the holder's death")
    assert not ended and alive(pid)  # it lives on, watched
    os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: ended, what="its end")
    assert ended == {("f", "e", "lost"): (UNKNOWN_EXIT, describe_command_exit(UNKNOWN_EXIT))}
    assert "holder died" in ended[("f", "e", "lost")][1]
    # The next run gets a new holder, and its status.
    await containerizer.launch(LaunchExecutor(
        "f", "e", "next", CommandInfo(shell="exit 4"), {}, str(tmp_path / "next"), held=True))
    await wait_for(lambda: len(ended) == 2, what="the next end")
    assert ended[("f", "e", "next")] == (4, "Command exited with status 4")
    containerizer.close()


async def test_a_run_that_ends_while_its_launch_is_held_back_is_ended_meanwhile(
        tmp_path: Path) -> None:
    """Starts answered together (`agent.trips.Together`): a run that ends while
    the others of its flood are still starting has its end (cgroups gone,
    leftovers killed) done meanwhile, and told only after its launch returned."""
    order: list[str] = []
    slow_preparing, quick_cleaned = threading.Event(), threading.Event()

    class Recorded(PosixIsolator):
        def prepare(self, key: RunKey, limits: Limits) -> None:
            if key[2] == "slow":
                slow_preparing.set()
                # The quick one starts and ends meanwhile (or, broken, does not
                # end before this lets go: the order below then fails).
                quick_cleaned.wait(10)
            super().prepare(key, limits)

        def cleanup(self, key: RunKey) -> None:
            order.append(f"cleanup {key[2]}")
            if key[2] == "quick":
                quick_cleaned.set()
            super().cleanup(key)

    containerizer = Containerizer(lambda key, status, _, said: order.append(
        f"ended {key[2]} {status}"), BASE, Recorded(), work_dir=str(tmp_path))
    await containerizer.connect_holder()

    async def launch(run: str, command: CommandInfo) -> None:
        await containerizer.launch(LaunchExecutor("f", "e", run, command, {},
                                                  str(tmp_path / run), held=True))
        order.append(f"launched {run}")

    async def quick() -> None:
        # Once the slow one's trip has left, this one has its own.
        await wait_for(slow_preparing.is_set, what="the slow one preparing")
        await launch("quick", CommandInfo(shell="exit 3"))

    await asyncio.gather(launch("slow", CommandInfo(argv=["true"])), quick())
    await wait_for(lambda: len(order) == 6, what="both ends")
    assert order.index("cleanup quick") < order.index("launched quick") \
        < order.index("ended quick 3")
    assert order.index("launched slow") < order.index("ended slow 0")
    containerizer.close()
