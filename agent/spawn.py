"""Starting a run's process and learning of its end, without asyncio's
subprocess machinery.

`asyncio.create_subprocess_exec` gives every child a transport, pipes' protocols
and (Python 3.11's default child watcher) a thread of its own blocked in
`waitpid`: about 0.4 ms of the agent's CPU per start, where a plain
`subprocess.Popen` (vfork + exec) costs under 0.1 ms (`benchmarks.launch`
measures the difference as agent CPU per task). A run needs none of it -- its
stdio goes to files in its sandbox -- so here a child is started with `Popen`
and its end watched through a pidfd (`os.pidfd_open`, Linux 5.3): readable once
the process has ended, then reaped with one `waitpid`. The pidfds of all runs are
in one epoll set, one reader on the event loop (`Watcher`).

The `Popen` is kept until its process is reaped: a `Popen` collected earlier
would put itself on `subprocess`'s list of children to reap behind our back.
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
from collections.abc import Mapping, Sequence

_devnull = -1  # one /dev/null for every run's stdin, opened on first use


def _stdin() -> int:
    global _devnull
    if _devnull < 0:
        _devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _devnull


def start(argv: Sequence[str], cwd: str, env: Mapping[str, str], stdout: int,
          stderr: int) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (it leads its own process group), stdin from
    /dev/null, stdout and stderr to the given descriptors. Raises `OSError` (or
    `ValueError`) as `Popen` does when it cannot be started."""
    return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=_stdin(),
                            stdout=stdout, stderr=stderr, start_new_session=True)


class Watcher:
    """Learns of the end of many processes through one epoll set of their pidfds,
    which is one reader on the event loop: a reader per pidfd cost the loop 9.5 us
    a run to add and remove (asyncio's handles, selector keys and transport
    checks), the epoll set 1.7 us. The reader is on the loop only while some
    process is waited for."""

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._waiting: dict[int, asyncio.Future[None]] = {}

    async def wait(self, process: subprocess.Popen[bytes]) -> int:
        """Wait for `process` (started by `start`) to end and reap it: its exit
        status, negative for death by signal, as `Popen.returncode`."""
        try:
            descriptor = os.pidfd_open(process.pid)
        except ProcessLookupError:  # already reaped by us: nothing to wait for
            return process.wait()
        await self.ended(descriptor)
        return process.wait()  # it has ended: this only reaps it

    async def ended(self, descriptor: int) -> None:
        """Wait until a pidfd says its process ended, then close it."""
        loop = asyncio.get_running_loop()
        if self._epoll is None:
            self._epoll = select.epoll()
            loop.add_reader(self._epoll.fileno(), self._ready)
        ended: asyncio.Future[None] = loop.create_future()
        self._epoll.register(descriptor, select.EPOLLIN | select.EPOLLONESHOT)
        self._waiting[descriptor] = ended
        try:
            await ended
        finally:
            del self._waiting[descriptor]
            self._epoll.unregister(descriptor)
            os.close(descriptor)
            if not self._waiting:
                loop.remove_reader(self._epoll.fileno())
                self._epoll.close()
                self._epoll = None

    def _ready(self) -> None:
        assert self._epoll is not None
        for descriptor, _ in self._epoll.poll(0):
            ended = self._waiting.get(descriptor)
            if ended is not None and not ended.done():
                ended.set_result(None)
