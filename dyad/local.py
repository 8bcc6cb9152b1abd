"""Start a master and agents as real processes on loopback, and stop them cleanly.

Used by `dyad local`, by the multi-process integration tests and by the benchmarks,
so all three exercise the same start-up and shutdown path a user does.

Each child runs in its own session, so a Ctrl-C in the terminal reaches only
`dyad local`, which then stops agents first (they shut down their executors) and the
master last. On Linux, children also get SIGTERM if this process dies abruptly
(`PR_SET_PDEATHSIG`), so nothing is left behind even after a SIGKILL of the parent.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import attrs

from dyad.resources import Resources

_MASTER_LINE = re.compile(r"dyad-master listening on (https?://\S+) zmq=(tcp://\S+)")
_AGENT_LINE = re.compile(r"dyad-agent listening on (https?://\S+) executors=(tcp://\S+)")
DEFAULT_AGENT_RESOURCES = "cpus:2;mem:2048;disk:10000"
PORTS_PER_AGENT = 1000
LOWEST_TASK_PORT = 10000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default
MAX_LOCAL_AGENTS = 253  # 127.0.0.2 .. 127.0.0.254
PROJECT_ROOT = Path(__file__).resolve().parents[1]
_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A process did not start, or the cluster did not become ready in time."""


def _die_with_parent() -> None:
    """preexec hook: ask the kernel to SIGTERM this child when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: shutdown relies on stop()
        pass


@attrs.define
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    zmq: str = ""


def _wait_for_line(child: Child, pattern: re.Pattern[str], deadline: float) -> re.Match[str]:
    while time.monotonic() < deadline:
        text = child.log_path.read_text(errors="replace") if child.log_path.exists() else ""
        match = pattern.search(text)
        if match:
            return match
        if child.process.poll() is not None:
            raise ClusterError(f"{child.name} exited with {child.process.returncode}; "
                               f"log {child.log_path}:\n{text[-2000:]}")
        time.sleep(0.05)
    raise ClusterError(f"{child.name} did not start in time; see {child.log_path}")


def http_get_json(url: str, timeout: float = 5.0, env: dict[str, str] | None = None) -> Any:
    """GET JSON; `env` holds client credentials (`LocalCluster.client_env`)."""
    if env:
        from dyad.auth import ClientCredentials
        opened = ClientCredentials.from_env(env).urlopen(url, timeout)
    else:
        opened = urllib.request.urlopen(url, timeout=timeout)
    with opened as resp:
        return json.loads(resp.read())


def agent_address(index: int) -> str:
    """Local agent `index` lives on its own loopback address, 127.0.0.2 onwards
    (the master keeps 127.0.0.1): it is the agent's ip and hostname, so a task's
    host resolves, answers, and tells agents apart (`UNIQUE hostname`). Linux
    routes all of 127.0.0.0/8 to the loopback interface."""
    if not 0 <= index < MAX_LOCAL_AGENTS:
        raise ClusterError(f"dyad local runs at most {MAX_LOCAL_AGENTS} agents "
                           f"(one per loopback address); agent {index} has none")
    return f"127.0.0.{index + 2}"


def ephemeral_port_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel hands to outgoing sockets; task ports must avoid them,
    or a task can find "its" port taken by some client's connection."""
    try:
        with open(path) as handle:
            low, high = map(int, handle.read().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def port_ranges(count: int, ephemeral: tuple[int, int]) -> list[tuple[int, int]]:
    """`count` disjoint blocks of PORTS_PER_AGENT ports, none inside `ephemeral`:
    blocks aligned on thousands from 31000 (Mesos' default) down to 10000, then
    those above the ephemeral range."""
    low, high = ephemeral
    starts = [*range(31000, LOWEST_TASK_PORT - 1, -PORTS_PER_AGENT),
              *range(32000, 65536 - PORTS_PER_AGENT + 1, PORTS_PER_AGENT)]
    blocks = [(start, start + PORTS_PER_AGENT - 1) for start in starts]
    usable = [(a, b) for a, b in blocks if b < low or a > high]
    if len(usable) < count:
        raise ClusterError(
            f"only {len(usable)} blocks of {PORTS_PER_AGENT} ports lie outside the "
            f"ephemeral range {low}-{high}; give the agents ports in --resources")
    return usable[:count]


def agent_resources(base: str, index: int, ephemeral: tuple[int, int] | None = None) -> str:
    """Each local agent gets its own slice of ports so two never hand out the same
    (tasks that bind every address would collide), outside the ephemeral range."""
    resources = Resources.parse(base)
    if not resources.ranges("ports"):
        low, high = port_ranges(index + 1, ephemeral or ephemeral_port_range())[index]
        resources = resources + Resources.parse(f"ports:[{low}-{high}]")
    return str(resources)


@attrs.define
class LocalCluster:
    """One master on 127.0.0.1 and `agents` agents, each on its own loopback
    address (`agent_address`), logs under `work_dir`. `port` and `zmq_port` are the
    master's (0: any free port).

    With `zk` (a `zk://host:port/root` URL of a running ZooKeeper), `masters`
    masters contend through it and agents follow whichever leads; `master` is
    then the first one started, `leader()` the one leading now."""

    work_dir: Path
    agents: int = 3
    port: int = 0
    zmq_port: int = 0
    resources: str = DEFAULT_AGENT_RESOURCES
    master_args: list[str] = attrs.field(factory=list)
    agent_args: list[str] = attrs.field(factory=list)
    attributes: Callable[[int], str] = lambda i: f"rack:r{i % 2 + 1}"
    master: Child | None = None
    agent_children: list[Child] = attrs.field(factory=list)
    zk: str = ""
    masters: int = 1
    master_children: list[Child] = attrs.field(factory=list)
    # `secure`: generate credentials under WORK_DIR/keys (`dyad keys generate`,
    # with `principals` besides the default ones) and run everything with them.
    secure: bool = False
    principals: tuple[str, ...] = ()

    @property
    def keys_dir(self) -> Path:
        return self.work_dir / "keys"

    def client_env(self, principal: str = "operator", curve: bool = True) -> dict[str, str]:
        """What a client process of `principal` needs in its environment (its
        CURVE key, the master's public key, the CA, its token); {} when not secure."""
        if not self.secure:
            return {}
        keys = self.keys_dir
        env = {"DYAD_CA": str(keys / "tls" / "ca.pem"),
               "DYAD_TOKEN_FILE": str(keys / "tokens" / f"{principal}.token")}
        if curve:
            env["DYAD_CURVE_KEY"] = str(keys / "curve" / f"{principal}.key_secret")
            env["DYAD_MASTER_KEY"] = str(keys / "curve" / "master.key")
        return env

    def _server_args(self, principal: str) -> list[str]:
        if not self.secure:
            return []
        keys = self.keys_dir
        curve = ["--curve-key", str(keys / "curve" / "master.key_secret")] \
            if principal == "master" else []
        return ["--credentials", str(keys / "credentials.json"),
                "--acls", str(keys / "acls.json"), *curve,
                "--tls-cert", str(keys / "tls" / "server.pem"),
                "--tls-key", str(keys / "tls" / "server-key.pem")]

    def _generate_keys(self) -> None:
        from dyad import keys_cli

        if (self.keys_dir / "credentials.json").exists():
            return
        hosts = ["localhost", "127.0.0.1",
                 *(agent_address(i) for i in range(min(self.agents + 4, MAX_LOCAL_AGENTS)))]
        keys_cli.generate(self.keys_dir, [*keys_cli.DEFAULT_PRINCIPALS, *self.principals],
                          hosts)

    def get(self, url: str, principal: str = "operator", timeout: float = 5.0) -> Any:
        """GET JSON from one of the cluster's servers, as `principal` when secure."""
        return http_get_json(url, timeout, self.client_env(principal, curve=False))

    @property
    def master_address(self) -> str:
        """What users and drivers are given: host:port of the master's HTTP API,
        or the ZooKeeper URL when masters contend through ZooKeeper."""
        if self.master is None:
            raise ClusterError("cluster not started")
        return self.zk or self.master.url.split("://", 1)[1]

    def leader(self) -> Child:
        """The master leading now (asks each running master's /health)."""
        for child in self.master_children:
            if child.process.poll() is not None:
                continue
            try:
                if self.get(f"{child.url}/health", timeout=2).get("leader"):
                    return child
            except (urllib.error.URLError, OSError, ValueError):
                continue
        raise ClusterError("no master is leading")

    def _spawn(self, name: str, argv: list[str], principal: str = "") -> Child:
        log_path = self.work_dir / f"{name}.log"
        if log_path.exists():  # a restart: keep the previous run's log beside it
            runs = 1
            while log_path.with_name(f"{name}.log.{runs}").exists():
                runs += 1
            log_path.rename(log_path.with_name(f"{name}.log.{runs}"))
        log = open(log_path, "wb")
        try:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent,
                env={**os.environ, **self.client_env(principal)} if principal else None)
        finally:
            log.close()
        return Child(name, process, log_path)

    def start_master(self, timeout: float = 30.0, index: int = 0) -> Child:
        """Start (or restart) master `index`; masters after the first need `zk`."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        name = "master" if index == 0 else f"master{index}"
        zk_args = ["--zk", self.zk] if self.zk else []
        # Masters after the first share the host: they take any free ports.
        ports = (self.port, self.zmq_port) if index == 0 else (0, 0)
        child = self._spawn(name, [
            sys.executable, "-m", "master.main", "--ip", "127.0.0.1",
            "--hostname", "127.0.0.1", "--port", str(ports[0]),
            "--zmq-port", str(ports[1]), "--work-dir", str(self.work_dir / name),
            *zk_args, *self._server_args("master"), *self.master_args],
            principal="master" if self.secure else "")
        match = _wait_for_line(child, _MASTER_LINE, time.monotonic() + timeout)
        child.url, child.zmq = match.group(1), match.group(2)
        if index < len(self.master_children):
            self.master_children[index] = child
        else:
            self.master_children.append(child)
        if index == 0:
            self.master = child
        return child

    def start_agent(self, index: int, timeout: float = 30.0) -> Child:
        child = self._spawn(f"agent{index}", [
            sys.executable, "-m", "agent.main", "--master", self.master_address,
            "--ip", agent_address(index), "--hostname", agent_address(index), "--port", "0",
            "--executor-port", "0", "--work-dir", str(self.work_dir / f"agent{index}"),
            "--resources", agent_resources(self.resources, index),
            "--attributes", self.attributes(index), *self._server_args("agent"),
            # Tasks run as you unless --secure (frameworks often name `nobody`).
            *([] if self.secure else ["--no-switch-user"]),
            *self.agent_args], principal="agent" if self.secure else "")
        match = _wait_for_line(child, _AGENT_LINE, time.monotonic() + timeout)
        child.url, child.zmq = match.group(1), match.group(2)
        if index < len(self.agent_children):
            self.agent_children[index] = child
        else:
            self.agent_children.append(child)
        return child

    def start(self, timeout: float = 30.0) -> None:
        if self.masters > 1 and not self.zk:
            raise ClusterError("several masters need ZooKeeper (zk=...)")
        if self.secure:
            self._generate_keys()
        try:
            for index in range(self.masters):
                self.start_master(timeout, index)
            for index in range(self.agents):
                self.start_agent(index, timeout)
            self.wait_for_agents(self.agents, timeout)
        except BaseException:
            self.stop()
            raise

    def state(self) -> Any:
        """The leading master's /state."""
        if self.master is None:
            raise ClusterError("cluster not started")
        leader = self.leader() if self.zk else self.master
        return self.get(f"{leader.url}/state")

    def wait_for_agents(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                active = [a for a in self.state()["agents"] if a.get("active", True)]
                if len(active) >= count:
                    return
            except (urllib.error.URLError, OSError, ValueError, KeyError, ClusterError):
                pass
            time.sleep(0.1)
        raise ClusterError(f"{count} agents did not register within {timeout:.0f}s")

    @staticmethod
    def stop_child(child: Child, sig: int = signal.SIGTERM, grace: float = 15.0) -> int:
        """Signal a child, wait up to `grace`, then SIGKILL its whole session."""
        if child.process.poll() is None:
            child.process.send_signal(sig)
            try:
                child.process.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.process.wait()
        return child.process.returncode

    def stop(self) -> None:
        """Agents first (each shuts down its executors), then the master."""
        for child in self.agent_children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        for child in self.agent_children:
            self.stop_child(child)
        for child in self.master_children:
            self.stop_child(child)

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
