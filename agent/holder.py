"""The holder: one long-lived process per agent that starts, parents and reaps the
agent's direct command tasks (`agent.host_runs`), ``python -m agent.holder WORK_DIR``.

A task's command must outlive its agent and its exit status must reach the agent
that comes back. A shell per task (the shim this replaces) did that for about
0.8 ms of CPU a task; this process does it for all of an agent's tasks at once:

- the agent asks for a start over a Unix socket (`agent.held`); the holder joins
  the run's cgroups itself, starts the command with `posix_spawn` (vfork: the
  child is born in them, in a session of its own, its stdout and stderr opened by
  the child in the sandbox) and goes back to its own cgroups (it is one thread,
  so nothing else starts meanwhile);
- it is the parent: it reaps each run, appends its status to the exit log
  (`LOG`, in the work dir, so a status outlives the holder and a reboot) and
  tells the agent; signals for a run's group go through it, so a group is never
  signalled after its leader was reaped (the pid may be reused by then);
- a new connection replaces the old one (a restarted agent) and is told every run
  the holder has, live or ended; the agent forgets an ended one once its
  checkpoint no longer needs it. Only a peer of the holder's own user is served.
- It exits when no agent is connected and no run of its is live: what it knows
  of ended runs is in the log, which the next holder reads.

If it dies, its live runs go on as init's children: the agent sees the
connection end, reads the log, watches the runs still alive by pidfd, and
reports their ends with no exit status (`agent.containerizer`).

Messages are JSON lines (`encode`, `decode`): the agent sends `base` (the
environment every run starts from, once a connection), `start` (key, argv, what
it adds to the base environment, cwd, stdio, join and home cgroup files), `kill`
(key, signal) and `forget` (keys); the holder sends `hello` (its pid, `live`
runs with pid and start time, `ended` ones with status), `started`, `failed`
(key, error) and `exited` (key, status: negative for a signal). A foreign peer
that connects while the holder waits for its first agent makes it exit (the
agent then starts another). What either end sends in one turn of its loop goes
in one write: the exits reaped together are one append to the log, then one
write to the agent (measured, 500 starts at once: the agent's CPU for its end
of them fell from 0.13-0.21 to 0.02 ms a start).
"""

from __future__ import annotations

import errno
import gc
import os
import selectors
import shutil
import signal
import socket
import struct
import sys
from typing import Any

import msgspec

LOG = "holder-exits.log"
LOG_SLACK = 1024  # forgotten lines the log may hold before it is rewritten
# What a run gets back at its default: the holder ignores SIGTERM, Python SIGPIPE
# and SIGXFSZ, and an ignored signal stays ignored across exec (as `subprocess`'s
# restore_signals does).
DEFAULTS = (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ)
FIRST_AGENT_WAIT = 30.0  # seconds for the agent that started us to connect
_boot_time = 0.0  # /proc/stat's btime, read once
_TICKS = os.sysconf("SC_CLK_TCK")
_STARTTIME = 19  # field 22 of /proc/PID/stat, counted from the 3rd (after the name)
OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND
encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode


def peer_uid(connection: socket.socket) -> int:
    """The user of the process at the other end of a Unix socket."""
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                  struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def address(work_dir: str) -> str:
    """The holder's socket, in the abstract namespace: no path-length limit and no
    file to leave behind; named for the work dir (one holder per agent)."""
    return "\0dyad-holder:" + os.path.realpath(work_dir)


def read_log(work_dir: str) -> dict[str, int]:
    """The exit log: run key ("F/E/R") -> status, the last line of a key winning;
    a torn last line (the holder died as it wrote) is skipped."""
    ended: dict[str, int] = {}
    try:
        with open(os.path.join(work_dir, LOG), "rb") as handle:
            for line in handle:
                try:
                    key, status = decode(line)
                except (msgspec.DecodeError, ValueError, TypeError):
                    continue
                if status is None:
                    ended.pop(key, None)
                else:
                    ended[key] = status
    except FileNotFoundError:
        pass
    return ended


class Holder:
    """The holder's state and loop: one agent connection at a time."""

    def __init__(self, work_dir: str, listener: socket.socket) -> None:
        self.work_dir = work_dir
        self.listener = listener
        self.ended = read_log(work_dir)
        self.log = os.open(os.path.join(work_dir, LOG), OPEN_FLAGS | os.O_CLOEXEC, 0o600)
        self.log_lines = len(self.ended)
        self.live: dict[int, tuple[str, float]] = {}  # pid -> key, start time
        self.pids: dict[str, int] = {}  # key -> pid of a live run
        self._unstamped: list[int] = []  # started in this read, start time not yet read
        self.agent: socket.socket | None = None
        self.inbox = b""
        self.outbox: list[bytes] = []  # messages for the agent, sent by `_flush`
        self.selector = selectors.DefaultSelector()
        # SIGCHLD wakes the loop through this pair (its write end kept open here).
        self.children, self._wake = socket.socketpair()
        for end in (self.children, self._wake):
            end.setblocking(False)
        signal.set_wakeup_fd(self._wake.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(listener, selectors.EVENT_READ, self._accept)
        self.selector.register(self.children, selectors.EVENT_READ, self._reap)
        self._which: dict[tuple[str, str], str] = {}
        self.base: dict[str, str] = {}  # the agent's environment, under every run's
        self._homes: dict[str, int] = {}  # open cgroup.procs of where it goes back to

    def serve(self, wait: float) -> None:
        """Serve until no agent is connected and no run is live; `wait`: how long
        to wait for the first agent (the one that started us)."""
        events = self.selector.select(wait)
        while True:
            for key, _ in events:
                key.data()
            self._flush()
            if self.agent is None and not self.live:
                return
            events = self.selector.select()

    # ------------------------------------------------------------ the agent

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        if peer_uid(connection) != os.getuid():
            connection.close()  # only the agent's own user may start processes here
            return
        if self.agent is not None:  # its successor: the old agent is gone
            self._drop()
        self.agent = connection
        self.selector.register(connection, selectors.EVENT_READ, self._read)
        self._send({"op": "hello", "pid": os.getpid(),
                    "live": [[key, pid, started] for pid, (key, started) in self.live.items()],
                    "ended": [[key, status] for key, status in self.ended.items()]})

    def _drop(self) -> None:
        assert self.agent is not None
        self.selector.unregister(self.agent)
        self.agent.close()
        self.agent = None
        self.inbox = b""
        self.outbox = []  # for the agent that is gone: its successor hears a hello

    def _send(self, message: dict[str, Any]) -> None:
        """Queued, and sent with the others of this round of the loop (`_flush`):
        a flood's answers and exits go in a few writes, not one each."""
        if self.agent is not None:
            self.outbox.append(encode(message))

    def _flush(self) -> None:
        if not self.outbox:
            return
        data, self.outbox = b"\n".join(self.outbox) + b"\n", []
        if self.agent is None:
            return
        try:
            self.agent.sendall(data)
        except OSError:
            self._drop()

    def _read(self) -> None:
        assert self.agent is not None
        try:
            data = self.agent.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._drop()
            return
        *lines, self.inbox = (self.inbox + data).split(b"\n")
        for line in lines:
            try:
                message = decode(line)
                getattr(self, "_on_" + message["op"])(message)
            except (msgspec.DecodeError, KeyError, TypeError, AttributeError, ValueError,
                    OSError) as exc:  # said, and the holder goes on with the next
                print(f"holder: request {line[:200]!r} failed: {exc!r}", file=sys.stderr)
        self._stamp()

    def _on_base(self, message: dict[str, Any]) -> None:
        self.base = message["env"]

    def _on_start(self, message: dict[str, Any]) -> None:
        key = message["key"]
        try:
            pid = self._spawn(message)
        except (OSError, ValueError) as exc:
            self._send({"op": "failed", "key": key, "error": str(exc)})
            return
        self.live[pid] = (key, 0.0)
        self.pids[key] = pid
        self._unstamped.append(pid)

    def _stamp(self) -> None:
        """The start times of the runs started in this read, and their answers.
        Read after all of them, not after each: reading a child's /proc/PID/stat
        waits until its exec is through, which the holder would otherwise wait
        out start after start (measured: 0.35 ms of wall a start of 1.0). None of
        them can have been reaped meanwhile (reaping is a later turn's)."""
        for pid in self._unstamped:
            key, _ = self.live[pid]
            try:
                started = start_time(pid)
            except OSError:  # gone already (and not yet reaped: it cannot be)
                started = 0.0
            self.live[pid] = (key, started)
            self._send({"op": "started", "key": key, "pid": pid, "started": started})
        self._unstamped = []

    def _spawn(self, message: dict[str, Any]) -> int:
        argv, cwd = message["argv"], message["cwd"]
        env = {**self.base, **message["env"]}
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        for fd, path in ((1, message["stdout"]), (2, message["stderr"])):
            actions.append((os.POSIX_SPAWN_OPEN, fd, path, OPEN_FLAGS, 0o644))
        os.chdir(cwd)  # the child's working directory (posix_spawn has no chdir)
        joined = 0
        try:
            for path in message["join"]:
                _write_pid(path)
                joined += 1
            return os.posix_spawn(self._executable(argv[0], env), argv, env,
                                  file_actions=actions, setsid=True, setsigdef=DEFAULTS)
        finally:
            os.chdir("/")
            for path in message["home"][:joined]:
                self._go_home(path)

    def _go_home(self, path: str) -> None:
        """Back to one of its own cgroups, through a descriptor kept open (two
        fewer path walks a start)."""
        try:
            descriptor = self._homes.get(path)
            if descriptor is None:
                descriptor = self._homes[path] = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            os.write(descriptor, b"0")
        except OSError as exc:  # the run started all the same: it is ours
            if path in self._homes:
                os.close(self._homes.pop(path))
            print(f"holder: cannot go back to {path}: {exc}", file=sys.stderr)

    def _executable(self, name: str, env: dict[str, str]) -> str:
        """`name` looked up in the run's own PATH, as `subprocess` does."""
        if "/" in name:
            return name
        path = env.get("PATH", os.defpath)
        found = self._which.get((name, path))
        if found is None:
            found = shutil.which(name, path=path)
            if found is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)
            self._which[(name, path)] = found
        return found

    def _on_kill(self, message: dict[str, Any]) -> None:
        pid = self.pids.get(message["key"])
        if pid is not None:  # not reaped yet: the group is still the run's
            try:
                os.killpg(pid, message["signal"])
            except OSError:
                pass

    def _on_forget(self, message: dict[str, Any]) -> None:
        lines = []
        for key in message["keys"]:
            if self.ended.pop(key, None) is not None:
                lines.append(encode([key, None]) + b"\n")
        self._append(b"".join(lines), len(lines))
        if self.log_lines > 2 * len(self.ended) + LOG_SLACK:
            self._rewrite()

    # ------------------------------------------------------------ the runs

    def _reap(self) -> None:
        try:
            while self.children.recv(4096):
                pass
        except BlockingIOError:
            pass
        reaped: list[tuple[str, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            key, _ = self.live.pop(pid, ("", 0.0))
            if not key:
                continue
            del self.pids[key]
            code = os.waitstatus_to_exitcode(status)
            self.ended[key] = code
            reaped.append((key, code))
        # On disk before it is told: the runs reaped together in one write.
        self._append(b"".join(encode([key, code]) + b"\n" for key, code in reaped),
                     len(reaped))
        for key, code in reaped:
            self._send({"op": "exited", "key": key, "status": code})

    def _append(self, data: bytes, lines: int) -> None:
        if not data:
            return
        try:
            os.write(self.log, data)
        except OSError as exc:  # a full disk: the agent still hears it, the log misses it
            print(f"holder: cannot write its log: {exc}", file=sys.stderr)
            return
        self.log_lines += lines

    def _rewrite(self) -> None:
        """The log again with only what is not forgotten (atomically: a rename)."""
        path = os.path.join(self.work_dir, LOG)
        with open(path + ".new", "wb") as handle:
            handle.write(b"".join(encode([k, s]) + b"\n" for k, s in self.ended.items()))
        os.replace(path + ".new", path)
        os.close(self.log)
        self.log = os.open(path, OPEN_FLAGS | os.O_CLOEXEC, 0o600)
        self.log_lines = len(self.ended)


def start_time(pid: int) -> float:
    """When `pid` started, in seconds since the epoch: what psutil's
    `Process.create_time` says (clock ticks since boot, from /proc/PID/stat, plus
    the boot time), but with the boot time read once rather than on every call
    (/proc/stat is long: psutil's way took 36 us a start, this 11). A wall-clock
    step while the agent runs shifts the boot time as the kernel reports it;
    psutil is fooled the same way by a step between a run's start and its
    adoption. Raises `OSError` when `pid` is gone."""
    global _boot_time
    descriptor = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fields = os.read(descriptor, 4096).rpartition(b")")[2].split()
    finally:
        os.close(descriptor)
    if not _boot_time:
        with open("/proc/stat", "rb") as handle:
            _boot_time = float(next(line.split()[1] for line in handle
                                    if line.startswith(b"btime")))
    return int(fields[_STARTTIME]) / _TICKS + _boot_time


def _write_pid(path: str) -> None:
    """Move this process into a cgroup (its `cgroup.procs`): one write(2)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(descriptor, b"0")  # 0: the writer itself
    finally:
        os.close(descriptor)


def main(argv: list[str] | None = None) -> int:
    work_dir = (argv or sys.argv[1:])[0]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(address(work_dir))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 0  # a holder for this work dir is already there: the agent uses it
        raise
    listener.listen(8)
    # Listening, it leaves its parent (the agent, which reaps it now): init's child,
    # as it is to every agent after the one that started it.
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # not the agent's group's to stop
    holder = Holder(work_dir, listener)
    # What it made to start is never garbage; what a start makes rarely holds a cycle.
    gc.freeze()
    gc.set_threshold(10_000)
    holder.serve(FIRST_AGENT_WAIT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
