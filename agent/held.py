"""The agent's end of its holder (`agent.holder`): connect (starting a holder if
none answers), ask for starts, kills and forgets, and hear of exits.

One connection, JSON lines both ways. What the holder says of its runs is kept
here (`live`, `ended`) for the containerizer: a restarted agent adopts a live run
and ends an ended one by what it said. Nothing here waits for ever: the holder
must answer a connect in `CONNECT_TIMEOUT` and a start in `START_TIMEOUT`, and a
connection that ends fails every start still waiting with `HolderGone`. A
holder that answers no start for `START_TIMEOUT` is taken for stuck: its
connection is closed, as if it had died (one timer for all the starts waiting:
`asyncio.wait_for` on each cost the loop about 25 us a start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import Any, Callable

from agent import holder
from agent.model import RunKey

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 20.0  # a fresh holder is a Python start: well under a second
START_TIMEOUT = 30.0
LINE_LIMIT = 1 << 26  # a hello lists every run the holder knows
# Where this agent's code lives: the holder must run the same code as its agent,
# from a source tree as much as from an install (it starts in "/").
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(holder.__file__)))


class HolderGone(Exception):
    """The holder could not be reached, did not answer, or its connection ended."""


def run_key(key: RunKey) -> str:
    return "/".join(key)  # ids never hold "/" (agent.sandbox.check_id)


def _key(text: str) -> RunKey:
    framework_id, executor_id, run_id = text.split("/")
    return framework_id, executor_id, run_id


class HolderLink:
    """`on_exited(key, status)`: a run of ours ended; `on_gone(live)`: the
    connection ended, with the runs that were live (key -> pid, start time)."""

    def __init__(self, work_dir: str, base_env: dict[str, str],
                 on_exited: Callable[[RunKey, int], None],
                 on_gone: Callable[[dict[RunKey, tuple[int, float]]], None]) -> None:
        self.work_dir = work_dir
        self._base_env = base_env
        self._on_exited = on_exited
        self._on_gone = on_gone
        self.live: dict[RunKey, tuple[int, float]] = {}
        self.ended: dict[RunKey, int] = {}
        self.pid = 0
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._starts: dict[str, asyncio.Future[tuple[int, float]]] = {}
        self._outbox: list[bytes] = []  # for the holder, written by `_flush`
        self._flushing: asyncio.Handle | None = None
        self._closed = False
        self._answered = 0  # answers to starts so far: progress, for `_check`
        self._check_timer: asyncio.TimerHandle | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def connect(self) -> None:
        """Be connected (one connect at a time, however many ask). Raises
        `HolderGone` when no holder answers in time."""
        if self._writer is not None:
            return
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT
        started = False
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(
                    holder.address(self.work_dir), limit=LINE_LIMIT)
            except (ConnectionRefusedError, FileNotFoundError):
                pass
            else:
                owner = holder.peer_uid(writer.get_extra_info("socket"))
                if owner != os.getuid():  # someone else took the name: never ours to use
                    writer.close()
                    raise HolderGone(f"the holder's address is held by a process of user "
                                     f"{owner}, not ours")
                try:
                    line = await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT)
                except (asyncio.TimeoutError, OSError, ValueError):
                    line = b""
                if line:
                    self._hello(holder.decode(line), writer)
                    self._send({"op": "base", "env": self._base_env})
                    asyncio.ensure_future(self._read(reader, writer))
                    return
                writer.close()  # a holder on its way out: ask the next one
            if not started:
                status = await asyncio.to_thread(self._start_holder)
                log.info("started a holder for %s (its starter exited with %d)",
                         self.work_dir, status)
                started = True
            if loop.time() > deadline:
                raise HolderGone(f"no holder answered in {CONNECT_TIMEOUT:g}s")
            await asyncio.sleep(0.01)

    def _start_holder(self) -> int:
        """A holder of its own session (signals to the agent's group pass it by),
        its errors in the work dir; blocking (on a thread): it leaves us once it
        listens (`agent.holder`). Its starter's exit status."""
        path = os.pathsep.join(filter(None, [CODE_ROOT, os.environ.get("PYTHONPATH")]))
        with open(os.path.join(self.work_dir, "holder.out"), "ab") as out:
            return subprocess.call(
                [sys.executable, "-m", "agent.holder", self.work_dir], stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True, cwd="/",
                env={**os.environ, "PYTHONPATH": path})

    def _hello(self, hello: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        self.pid = hello["pid"]
        self.live = {_key(key): (pid, started) for key, pid, started in hello["live"]}
        self.ended.update((_key(key), status) for key, status in hello["ended"])
        self._writer = writer
        log.info("holder pid %d: %d live runs, %d ended", self.pid, len(self.live),
                 len(hello["ended"]))

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                self._dispatch(holder.decode(line))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # DecodeError: ValueError
            log.error("the holder's connection broke: %r", exc)
        finally:
            writer.close()
            self._writer = None
            if self._flushing is not None:  # what was queued was for this connection
                self._flushing.cancel()
                self._flushing = None
            self._outbox = []
            gone = HolderGone(f"the holder (pid {self.pid}) is gone")
            for waiting in self._starts.values():
                if not waiting.done():
                    waiting.set_exception(gone)
            self._starts.clear()
            live, self.live = self.live, {}
            if not self._closed:
                self._on_gone(live)

    def _dispatch(self, message: dict[str, Any]) -> None:
        op, key = message["op"], message["key"]
        if op == "exited":
            run = _key(key)
            self.live.pop(run, None)
            self.ended[run] = message["status"]
            self._on_exited(run, message["status"])
            return
        waiting = self._starts.pop(key, None)
        self._answered += 1
        if op == "started":
            self.live[_key(key)] = (message["pid"], message["started"])
        if waiting is None or waiting.done():
            return
        if op == "started":
            waiting.set_result((message["pid"], message["started"]))
        else:
            waiting.set_exception(OSError(message["error"]))

    def _send(self, message: dict[str, Any]) -> None:
        """Queued, and written with the others sent in this turn of the loop: the
        starts of a trip's runs go in one write (and reach the holder in one read),
        not a system call each."""
        if self._writer is None:
            raise HolderGone("not connected to the holder")
        self._outbox.append(holder.encode(message))
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = None
        outbox, self._outbox = self._outbox, []
        if outbox and self._writer is not None:
            self._writer.write(b"\n".join(outbox) + b"\n")

    async def start(self, key: RunKey, argv: list[str], cwd: str, env: dict[str, str],
                    join: list[str], home: list[str]) -> tuple[int, float]:
        """Start a run (its stdout and stderr in `cwd`, `env` over the base
        environment): its pid and start time. Raises `OSError` (it could not be
        started) or `HolderGone`."""
        await self.connect()
        name = run_key(key)
        waiting: asyncio.Future[tuple[int, float]] = asyncio.get_running_loop().create_future()
        self._starts[name] = waiting
        self._send({"op": "start", "key": name, "argv": argv, "cwd": cwd, "env": env,
                    "stdout": f"{cwd}/stdout", "stderr": f"{cwd}/stderr", "join": join,
                    "home": home})
        if self._check_timer is None:
            self._check_timer = asyncio.get_running_loop().call_later(
                START_TIMEOUT, self._check, self._answered)
        try:
            return await waiting
        finally:
            self._starts.pop(name, None)

    def _check(self, answered: int) -> None:
        """Starts have waited: a holder that answered none of them since the last
        check is stuck (stopped, or blocked in the kernel), and is dropped."""
        self._check_timer = None
        if not self._starts or self._writer is None:
            return
        if self._answered == answered:
            log.error("the holder (pid %d) answered no start in %gs: dropped", self.pid,
                      START_TIMEOUT)
            self._writer.close()  # its reader ends: every start waiting fails
            return
        self._check_timer = asyncio.get_running_loop().call_later(
            START_TIMEOUT, self._check, self._answered)

    def kill(self, key: RunKey, signal: int) -> None:
        """Signal the run's process group, if the holder has not reaped it."""
        if self._writer is not None:
            self._send({"op": "kill", "key": run_key(key), "signal": signal})

    def close(self) -> None:
        """The agent stops: the holder exits once no run of its lives (or goes on
        holding those that do, for the next agent)."""
        self._closed = True
        if self._check_timer is not None:
            self._check_timer.cancel()
        if self._flushing is not None:  # the last forgets go before the end
            self._flushing.cancel()
            self._flush()
        if self._writer is not None:
            self._writer.close()

    def forget(self, keys: list[RunKey]) -> None:
        """The holder may drop these ended runs: the checkpoint needs them no more."""
        for key in keys:
            self.ended.pop(key, None)
        if keys and self._writer is not None:
            self._send({"op": "forget", "keys": [run_key(key) for key in keys]})
