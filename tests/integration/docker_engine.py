"""A private Docker Engine for tests, and a test image built without a registry.

`DockerEngine` starts Debian's `dockerd` (package `docker.io`) as ci/compose-smoke.sh
does -- its own `--data-root`, `--exec-root`, pidfile and unix socket under a
temporary directory -- and keeps its hands off the host's network: it brings its
own bridge (a fresh name and a free 10.213.N.0/24), and runs with
`--iptables=false --ip-forward=false --ip-masq=false`, so published ports go
through the engine's userland proxy and no firewall rule or sysctl is touched.
On stop it removes its containers, stops the engine and whatever it left (its
containerd shims), unmounts every mount under its directory and deletes the
bridge.

`test_image` is `dyad-test/busybox:latest`, imported (`POST /images/create?fromSrc`,
what `docker import` does) from Debian's static busybox (`busybox-static`) with
every applet linked in /bin.

The `docker_engine` fixture gives a test module one engine with the image. Where
no engine can be started (not root, no `dockerd`) the tests are skipped saying
why -- unless `DYAD_DOCKER_REQUIRED=1` (CI sets it), when they fail instead.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.docker import DockerClient, DockerError
from dyad.local import _die_with_parent

TEST_IMAGE = "dyad-test/busybox:latest"
BUSYBOX = Path("/bin/busybox")
REQUIRED = os.environ.get("DYAD_DOCKER_REQUIRED") == "1"


class EngineStartError(RuntimeError):
    """No engine could be started here; the message says what is missing."""


class DockerEngine:
    """One private dockerd with its files under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket_path = str(directory / "docker.sock")
        self.log_path = directory / "dockerd.log"
        self.bridge = f"dyb{os.getpid() % 10000:04d}{random.randrange(16 ** 3):03x}"
        self.gateway = ""
        self.bridge_made = False
        self.process: subprocess.Popen[bytes] | None = None

    def client(self) -> DockerClient:
        return DockerClient(self.socket_path)

    def start(self, timeout: float = 60.0) -> None:
        if os.geteuid() != 0:
            raise EngineStartError("a private dockerd needs root")
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise EngineStartError("no dockerd: apt-get install docker.io")
        self._make_bridge()
        config = self.directory / "daemon.json"
        config.write_text("{}")  # not the host's /etc/docker/daemon.json
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [dockerd, "--config-file", str(config),
                 "--data-root", str(self.directory / "data"),
                 "--exec-root", str(self.directory / "exec"),
                 "--pidfile", str(self.directory / "docker.pid"),
                 "--host", f"unix://{self.socket_path}", "--bridge", self.bridge,
                 "--iptables=false", "--ip-forward=false", "--ip-masq=false"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise EngineStartError(f"dockerd did not start; its log ends:\n{tail}")
            time.sleep(0.1)

    def answers(self) -> bool:
        """The engine's own liveness probe (`GET /_ping`) over its socket."""
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(2)
                sock.connect(self.socket_path)
                sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return sock.recv(64).startswith(b"HTTP/1.0 200")
        except OSError:
            return False

    def build_test_image(self) -> None:
        if not BUSYBOX.exists():
            raise EngineStartError("no static busybox: apt-get install busybox-static")
        asyncio.run(self._import(busybox_rootfs()))

    async def _import(self, tarball: bytes) -> None:
        async with self.client() as client:
            await client.import_image(tarball, *TEST_IMAGE.split(":"))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            if self.answers():
                asyncio.run(self._remove_containers())
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._kill_leftovers()
        self._unmount_all()
        if self.bridge_made:
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
            self.bridge_made = False

    async def _remove_containers(self) -> None:
        async with self.client() as client:
            for container in await client.list():
                try:
                    await client.remove(container.id, force=True)
                except DockerError:
                    pass  # going anyway: the engine stops next

    def _make_bridge(self) -> None:
        if shutil.which("ip") is None:
            raise EngineStartError("no ip command for the test bridge: apt-get install iproute2")
        used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        free = [n for n in range(1, 255) if f"10.213.{n}." not in used]
        if not free:
            raise EngineStartError("no free 10.213.N.0/24 for a test bridge")
        subnet = random.choice(free)
        self.gateway = f"10.213.{subnet}.1"
        for command in (["ip", "link", "add", "name", self.bridge, "type", "bridge"],
                        ["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge],
                        ["ip", "link", "set", self.bridge, "up"]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise EngineStartError(f"{' '.join(command)}: {done.stderr.strip()}")
            self.bridge_made = True

    def _kill_leftovers(self) -> None:
        """SIGKILL processes the engine started that outlived it (containerd and
        its shims keep running on purpose): those whose command line names our
        directory, so nothing of anyone else's is touched."""
        marker = str(self.directory).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass

    def _unmount_all(self) -> None:
        """Unmount everything under our directory, deepest first (overlays,
        network namespaces, the shims' rootfs mounts)."""
        for _ in range(3):  # a mount may be busy for a moment after its process died
            ours = mounts_under(self.directory)
            if not ours:
                return
            for mount in ours:
                subprocess.run(["umount", mount], capture_output=True)
            time.sleep(0.2)
        for mount in ours:  # still busy: detach, the kernel frees it when it can
            subprocess.run(["umount", "--lazy", mount], capture_output=True)


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or under `directory`, deepest first."""
    prefix = str(directory)
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return sorted((m for m in points if m == prefix or m.startswith(prefix + "/")),
                  key=len, reverse=True)


def busybox_rootfs() -> bytes:
    """A root filesystem tarball: static busybox, every applet linked in /bin,
    the directories a container runtime expects, and a page for httpd."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "www", "mnt"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        for name, text in (("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"
                                          "nobody:x:65534:65534:nobody:/:/bin/false\n"),
                           ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
                           ("www/index.html", "hello from a dyad container\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def engine_or_skip(directory: Path) -> DockerEngine:
    """A started engine with the test image, or a skip (a failure if required)."""
    engine = DockerEngine(directory)
    try:
        engine.start()
        engine.build_test_image()
    except (EngineStartError, DockerError, OSError) as exc:
        engine.stop()
        reason = f"no Docker Engine for tests: {exc}"
        if REQUIRED:
            pytest.fail(f"{reason} (DYAD_DOCKER_REQUIRED=1)")
        pytest.skip(reason)
    except BaseException:
        engine.stop()  # a bug here must not leave a dockerd behind
        raise
    return engine


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[DockerEngine]:
    """One private engine for a test module, with `TEST_IMAGE` in it."""
    # Short: unix socket paths are limited to 108 bytes, and containerd's live
    # under the exec root.
    directory = Path(tempfile.mkdtemp(prefix="dyad-docker-", dir="/tmp"))
    try:
        engine = engine_or_skip(directory)
        try:
            yield engine
        finally:
            engine.stop()
    finally:
        if not mounts_under(directory):  # never delete through a live mount
            shutil.rmtree(directory, ignore_errors=True)

