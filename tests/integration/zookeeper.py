"""A real ZooKeeper server for tests, started from Debian's package without systemd.

`ZooKeeperServer` runs `org.apache.zookeeper.server.ZooKeeperServerMain` from
/usr/share/java/zookeeper.jar (the `zookeeper` package) on a free loopback port,
with its data and log in a temporary directory, and can pause (SIGSTOP) and
resume it to play a ZooKeeper outage. The `zookeeper` fixture gives each test its
own server, so a test that pauses or stops it cannot disturb another.

Import the fixture into a test module (``from .zookeeper import zookeeper``). Tests are skipped, saying why, where ZooKeeper or
Java is not installed (`.ci/run` installs both).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyad.local import _die_with_parent

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# ZooKeeper logs through SLF4J; the simple binding writes to stderr (our log file).
SLF4J_BINDING = Path("/usr/share/java/slf4j-simple.jar")
TICK_MS = 250
"""A short tick makes short session timeouts possible (ZooKeeper grants 2 to 20
ticks) and session expiry precise (it expires sessions on tick boundaries)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1:`port`, files under `directory`."""

    def __init__(self, directory: Path, tick_ms: int = TICK_MS) -> None:
        self.directory = directory
        self.tick_ms = tick_ms
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "zookeeper.log"

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, root: str = "/dyad") -> str:
        return f"zk://{self.hosts}{root}"

    def start(self, timeout: float = 60.0) -> None:
        java = shutil.which("java")
        if java is None or not ZOOKEEPER_JAR.exists():
            raise FileNotFoundError("ZooKeeper needs `apt-get install zookeeper` (and Java)")
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text("\n".join([
            f"tickTime={self.tick_ms}",
            f"dataDir={self.directory / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "maxClientCnxns=0",          # every test client is on 127.0.0.1
            "admin.enableServer=false",  # no Jetty on port 8080
            "4lw.commands.whitelist=ruok",
            f"minSessionTimeout={2 * self.tick_ms}",
            "",
        ]))
        classpath = os.pathsep.join(str(p) for p in (ZOOKEEPER_JAR, SLF4J_BINDING) if p.exists())
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath,
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while not self.ok():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ZooKeeper did not start; log {self.log_path}:\n"
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    def ok(self) -> bool:
        """ZooKeeper's own liveness probe: `ruok` answered with `imok`."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(4) == b"imok"
        except OSError:
            return False

    def pause(self) -> None:
        """Freeze the server: clients see no answers, as in a ZooKeeper outage."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()  # a stopped process would not act on SIGTERM
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A fresh ZooKeeper server for one test, stopped afterwards."""
    server = ZooKeeperServer(tmp_path / "zookeeper")
    try:
        server.start()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()
