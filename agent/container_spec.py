"""From a run's container description to a Docker Engine create request -- pure.

`create_request` turns what a framework asked for (`ContainerInfo`, a command, an
environment, the run's limits) and what this agent allows (`DockerConfig`) into
the body of `POST /containers/create`, or raises `ContainerSpecError` whose
`problems` become the run's `TASK_ERROR` message. Nothing here touches the engine,
so every rule is tested without one.

Every container the agent makes carries `dyad.*` labels naming the agent,
framework, executor, run and task. They are how a restarted agent finds its
containers again (`ContainerLabels.parse` over the engine's list), and how it
tells its own containers from anyone else's on a shared engine.
"""

from __future__ import annotations

import posixpath
import re

import attrs

from dyad.containers import (
    SANDBOX_MOUNT, ContainerInfo, DockerInfo, Network, VolumeMode, problems,
)
from agent.persistent import VolumeMount
from dyad.messages import CommandInfo
from dyad.resources import Resources

LABEL_PREFIX = "dyad."
AGENT_LABEL = LABEL_PREFIX + "agent_id"
FRAMEWORK_LABEL = LABEL_PREFIX + "framework_id"
EXECUTOR_LABEL = LABEL_PREFIX + "executor_id"
RUN_LABEL = LABEL_PREFIX + "run_id"
TASK_LABEL = LABEL_PREFIX + "task_id"

NETWORK_MODES = {Network.HOST: "host", Network.BRIDGE: "bridge", Network.NONE: "none"}
CPU_SHARES_PER_CPU = 1024
MIN_CPU_SHARES = 2  # the kernel's floor
# The engine keeps its own copy of the log (the agent follows it into the
# sandbox); bounded, because the sandbox holds the whole log already.
ENGINE_LOG = {"Type": "json-file", "Config": {"max-size": "16m", "max-file": "2"}}
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


class ContainerSpecError(ValueError):
    """The container cannot be made as asked; `problems` say why, one per fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@attrs.frozen
class DockerConfig:
    """What this agent lets containers use.

    `volume_roots`: absolute host directories under which a volume's `host_path`
    may lie (none by default: only sandbox-relative volumes). `networks`: the
    modes this agent offers (an agent whose engine has no bridge leaves BRIDGE
    out). `cpu_hard_limit`: cap CPU at the task's `cpus` (CFS quota), not only
    weight it.
    """

    volume_roots: tuple[str, ...] = ()
    networks: tuple[str, ...] = (Network.HOST, Network.BRIDGE, Network.NONE)
    cpu_hard_limit: bool = True


@attrs.frozen(kw_only=True)
class ContainerRun:
    """One run the agent wants in a container. `command` None runs the image's own
    entrypoint, with `args` as its arguments if given (Marathon's `args`) or else
    the image's command; `task_id` is empty for a custom executor's container."""

    agent_id: str
    framework_id: str
    executor_id: str
    run_id: str
    container: ContainerInfo
    sandbox_dir: str
    resources: Resources
    cpus: float = 0.0  # 0: no limit (the run's limits, as the agent computes them)
    mem_bytes: int = 0
    command: CommandInfo | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict)
    task_id: str = ""
    # Persistent volumes (agent.persistent), bound under the sandbox mount.
    persistent: tuple[VolumeMount, ...] = ()


@attrs.frozen
class ContainerLabels:
    """Which run a container belongs to, read back from its labels."""

    agent_id: str
    framework_id: str
    executor_id: str
    run_id: str
    task_id: str = ""

    @classmethod
    def of(cls, run: ContainerRun) -> ContainerLabels:
        return cls(run.agent_id, run.framework_id, run.executor_id, run.run_id, run.task_id)

    def to_labels(self) -> dict[str, str]:
        return {AGENT_LABEL: self.agent_id, FRAMEWORK_LABEL: self.framework_id,
                EXECUTOR_LABEL: self.executor_id, RUN_LABEL: self.run_id,
                TASK_LABEL: self.task_id}

    @classmethod
    def parse(cls, labels: dict[str, str] | None) -> ContainerLabels | None:
        """The run named by `labels`, or None if they are not a whole Dyad set
        (someone else's container, or one made by hand)."""
        labels = labels or {}
        try:
            found = cls(labels[AGENT_LABEL], labels[FRAMEWORK_LABEL], labels[EXECUTOR_LABEL],
                        labels[RUN_LABEL], labels.get(TASK_LABEL, ""))
        except KeyError:
            return None
        return found if found.agent_id and found.framework_id and found.executor_id \
            and found.run_id else None


def container_name(agent_id: str, run_id: str) -> str:
    """A name the engine accepts and no other run shares (run ids are fresh)."""
    return _NAME_UNSAFE.sub("_", f"dyad-{agent_id}-{run_id}")[:200]


def check(run: ContainerRun, config: DockerConfig) -> list[str]:
    """Every reason `run` cannot be created on this agent (empty: it can)."""
    return check_container(run.container, run.resources, config)


def check_container(container: ContainerInfo, resources: Resources,
                    config: DockerConfig) -> list[str]:
    """Every reason `container` cannot run here for a run given `resources`."""
    found = problems(container, resources)
    docker = container.docker
    if docker is None:
        return found
    if docker.network not in config.networks:
        found.append(f"container.docker.network {docker.network} is not available on this "
                     f"agent (available: {', '.join(config.networks) or 'none'})")
    if "hostname" in docker.parameters and docker.network == Network.HOST:
        found.append("container.docker.parameters: hostname cannot be set under network HOST")
    for i, volume in enumerate(container.volumes):
        if volume.host_path.startswith("/") and not _under_any(volume.host_path,
                                                               config.volume_roots):
            allowed = ", ".join(config.volume_roots) or "none: only sandbox-relative paths"
            found.append(f"container.volumes[{i}].host_path {volume.host_path!r} is outside "
                         f"what this agent allows ({allowed})")
    return found


def create_request(run: ContainerRun, config: DockerConfig) -> dict[str, object]:
    """The body of `POST /containers/create` for `run`; raises `ContainerSpecError`."""
    found = check(run, config)
    if found:
        raise ContainerSpecError(found)
    docker = run.container.docker
    assert docker is not None  # check() refused a container without one
    body: dict[str, object] = {
        "Image": docker.image,
        "Env": [f"{k}={v}" for k, v in sorted(environment(run).items())],
        "Labels": ContainerLabels.of(run).to_labels(),
        "WorkingDir": docker.parameters.get("workdir", SANDBOX_MOUNT),
        "AttachStdin": False, "AttachStdout": False, "AttachStderr": False,
        "Tty": False, "OpenStdin": False,
        "HostConfig": _host_config(run, docker, config),
    }
    body.update(_command(run.command, run.args))
    user = docker.parameters.get("user") or (run.command.user if run.command else "")
    if user:
        body["User"] = user
    if "hostname" in docker.parameters:
        body["Hostname"] = docker.parameters["hostname"]
    if docker.port_mappings:
        body["ExposedPorts"] = {f"{m.container_port}/{m.protocol}": {}
                                for m in docker.port_mappings}
    return body


def environment(run: ContainerRun) -> dict[str, str]:
    """The container's environment: the run's own (the framework's `PORTn` are the
    host ports, as for process tasks and in Marathon; a framework that wants a
    BRIDGE task to bind `$PORT0` maps container port = host port), and where the
    sandbox is. Nothing of the agent's own environment leaks in."""
    return {**run.env, "MESOS_SANDBOX": SANDBOX_MOUNT}


def _command(command: CommandInfo | None, args: tuple[str, ...]) -> dict[str, object]:
    """A shell command replaces the image's entrypoint with `/bin/sh -c` (the
    image needs a shell); argv is exec'd as given; None keeps the image's own
    entrypoint, given `args` if any."""
    if command is None:
        return {"Cmd": list(args)} if args else {}
    if command.shell is not None:
        return {"Entrypoint": ["/bin/sh", "-c"], "Cmd": [command.shell]}
    argv = command.argv or []
    return {"Entrypoint": argv[:1], "Cmd": argv[1:]}


def _host_config(run: ContainerRun, docker: DockerInfo,
                 config: DockerConfig) -> dict[str, object]:
    host: dict[str, object] = {
        "Binds": [f"{run.sandbox_dir}:{SANDBOX_MOUNT}:rw", *_binds(run)],
        "NetworkMode": NETWORK_MODES[docker.network],
        "RestartPolicy": {"Name": "no"},  # the agent and its framework decide
        "LogConfig": ENGINE_LOG,
    }
    if docker.port_mappings:
        ports: dict[str, list[dict[str, str]]] = {}
        for m in docker.port_mappings:
            ports.setdefault(f"{m.container_port}/{m.protocol}", []).append(
                {"HostIp": "", "HostPort": str(m.host_port)})
        host["PortBindings"] = ports
    if run.mem_bytes:
        # Swap as large as memory means none: over the limit is an OOM kill, as
        # for process tasks, not a slow death by swapping.
        host["Memory"] = run.mem_bytes
        host["MemorySwap"] = run.mem_bytes
    if run.cpus:
        host["CpuShares"] = max(MIN_CPU_SHARES, int(run.cpus * CPU_SHARES_PER_CPU))
        if config.cpu_hard_limit:
            host["NanoCpus"] = int(round(run.cpus * 1e9))
    if docker.parameters.get("init", "").lower() in ("1", "true", "yes"):
        host["Init"] = True
    return host


def _binds(run: ContainerRun) -> list[str]:
    binds = []
    for volume in run.container.volumes:
        source = volume.host_path if volume.host_path.startswith("/") else \
            posixpath.join(run.sandbox_dir, volume.host_path)
        mode = "ro" if volume.mode == VolumeMode.RO else "rw"
        binds.append(f"{posixpath.normpath(source)}:{volume.container_path}:{mode}")
    for mount in run.persistent:
        mode = "ro" if mount.mode == VolumeMode.RO else "rw"
        binds.append(f"{mount.host_path}:{SANDBOX_MOUNT}/{mount.container_path}:{mode}")
    return binds


def _under_any(path: str, roots: tuple[str, ...]) -> bool:
    path = posixpath.normpath(path)
    return any(path == posixpath.normpath(root) or
               path.startswith(posixpath.normpath(root).rstrip("/") + "/") for root in roots)
