"""`dyad-agent`: run one agent until SIGTERM/SIGINT, then stop its executors and
exit 0 -- or 1 if its ports cannot be bound, the asked-for isolation is not
available, or the checkpoint under ``--work-dir`` cannot be taken over (the reason
is printed). Killed (SIGKILL) and started again with the same work dir, it takes
its running executors back.

On start it prints exactly one line, flushed, that scripts (and `dyad local`) wait
for:  ``dyad-agent listening on http://IP:PORT executors=tcp://IP:EPORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import signal
import socket
import sys

import attrs
import zmq

from agent.checkpoint import CheckpointError
from agent.container_spec import DockerConfig
from agent.detect import DETECTED_KINDS, resolve_resources
from agent.docker import DEFAULT_PULL_TIMEOUT, DEFAULT_SOCKET, EngineUnavailable
from agent.isolation import IsolationError, Isolator, detect
from agent.model import COMMAND_TASKS, CONTAINERIZERS, AgentConfig
from agent.qos import QosConfig
from agent.reclaim import ReclaimConfig
from agent.server import AgentOptions, AgentServer
from dyad import gc_pauses, logs, security
from dyad.auth import ClientCredentials, CredentialsError
from dyad.detector import parse_http_address
from dyad.resources import Resources, ResourcesError
from dyad import argtypes
from dyad.units import parse_attributes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dyad-agent", description="Run a Dyad agent.")
    p.add_argument("--master", required=True, help="the master: its HTTP address host:5050, or zk://HOSTS/dyad")
    p.add_argument("--ip", default="127.0.0.1", help="address to bind and advertise")
    p.add_argument("--hostname", default=socket.gethostname(), help="name to advertise")
    p.add_argument("--port", type=argtypes.port, default=5051, help="HTTP port (0: any free port)")
    p.add_argument("--executor-port", type=argtypes.port, default=0,
                   help="port of the executors' ZMQ socket (default 0: a free port chosen "
                        "at the first start and kept in the checkpoint, so a restarted "
                        "agent binds it again and its executors find it)")
    p.add_argument("--work-dir", default="./work-dir/agent",
                   help="sandboxes, the fetcher cache and the checkpoint a restart recovers")
    p.add_argument("--resources", default=None,
                   help='e.g. "cpus:4;mem:8192;disk:20000;ports:[31000-32000]"; '
                        "kinds left out are detected")
    p.add_argument("--attributes", type=_attributes, default={}, help='e.g. "rack:r1;zone:a"')
    p.add_argument("--executor-registration-timeout", type=argtypes.duration, default=60.0,
                   help="kill executors that do not register within this (e.g. 60s)")
    p.add_argument("--executor-reregistration-timeout", type=argtypes.duration, default=10.0,
                   help="after a restart, kill executors that do not re-register within this")
    p.add_argument("--executor-shutdown-grace-period", type=argtypes.duration, default=3.0,
                   help="time an executor gets to stop (plus its tasks' kill grace periods)")
    p.add_argument("--recovery-timeout", type=argtypes.duration, default=15 * 60.0,
                   help="executors shut themselves down when the agent stays away this long")
    p.add_argument("--command-tasks", choices=COMMAND_TASKS, default="direct",
                   help="how a plain command task runs: direct (default: by the agent itself "
                   "through its holder process, no process of its own) or executor (under a "
                   "Python command executor of its own, ~50 MiB each); docs/agent.md")
    p.add_argument("--isolation", choices=["cgroups", "posix"], default=None,
                   help="resource isolation (default: cgroups if writable, else posix)")
    p.add_argument("--cgroups-root", default="dyad", help="cgroup under which runs live")
    p.add_argument("--switch-user", action=argparse.BooleanOptionalAction, default=None,
                   help="run each task as the user it names (its command's, else its "
                        "framework's); default: on when the agent runs as root")
    p.add_argument("--status-update-retry", type=argtypes.duration, default=10.0,
                   help="first resend of an unacknowledged status update; later ones "
                        "back off (doubling, with jitter) up to --status-update-retry-max")
    p.add_argument("--status-update-retry-max", type=argtypes.duration, default=600.0,
                   help="the longest wait between resends of a status update")
    p.add_argument("--usage-interval", type=argtypes.duration, default=1.0,
                   help="how often executors are measured (and, under posix, limited)")
    p.add_argument("--usage-report-interval", type=argtypes.duration, default=5.0,
                   help="how often usage and cached URIs are reported to the master")
    p.add_argument("--oversubscription", choices=["on", "off"], default="on",
                   help="lend what tasks reserve but do not use as revocable resources "
                        "(docs/oversubscription.md; only frameworks that ask see them)")
    p.add_argument("--reclaim-window", type=argtypes.positive_duration, default=300.0,
                   help="how long a reservation takes to decay from a task's allocation "
                        "to its usage plus margin")
    p.add_argument("--reclaim-margin", type=_fraction, default=0.2,
                   help="kept above measured usage, as a fraction of it")
    p.add_argument("--qos-mem-watermark", type=argtypes.fraction, default=0.9,
                   help="evict revocable tasks when measured memory use passes this "
                        "fraction of the agent's memory")
    p.add_argument("--gc-delay", type=argtypes.duration, default=7 * 86400.0,
                   help="keep finished sandboxes this long (shorter when disk is short)")
    p.add_argument("--gc-disk-headroom", type=_fraction, default=0.1,
                   help="disk fraction to keep free; sandboxes go sooner as it shrinks")
    p.add_argument("--disk-watch-interval", type=argtypes.duration, default=60.0,
                   help="how often finished sandboxes are considered for removal")
    p.add_argument("--log-max-size", type=_size, default=10 * 1024 * 1024,
                   help="rotate a task's stdout/stderr past this size (e.g. 10MB)")
    p.add_argument("--log-keep", type=_count, default=3, help="rotated log files kept per log")
    p.add_argument("--fetcher-cache-dir", default="",
                   help="where fetched URIs are cached (default WORK_DIR/cache)")
    p.add_argument("--fetcher-cache-size", type=_size, default=2 * 1024 ** 3,
                   help="bound of the fetcher cache (e.g. 2GB)")
    p.add_argument("--fetcher-allowed-paths", type=_directories, default=(),
                   metavar="DIR[:DIR...]",
                   help="host directories file:// URIs and absolute paths may be copied "
                        "from (default: none; other local URIs fail the task)")
    p.add_argument("--containerizers", type=_containerizers, default=None,
                   help="process,docker or process (default: docker too when a Docker "
                        "Engine answers on --docker-socket)")
    p.add_argument("--docker-socket", default=DEFAULT_SOCKET,
                   help="the Docker Engine's unix socket")
    p.add_argument("--docker-volume-root", action="append", default=[],
                   help="a host directory under which container volumes may lie "
                        "(repeatable; default none: only sandbox-relative volumes)")
    p.add_argument("--docker-pull-timeout", type=argtypes.duration, default=DEFAULT_PULL_TIMEOUT,
                   help="give up an image pull after this long (its own timeout: a pull "
                        "is not an executor registration)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--log-format", default="text", choices=logs.FORMATS,
                   help="json: one JSON object per log line (default text)")
    security.add_flags(p, zookeeper=False)
    return p



def _containerizers(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = set(names) - set(CONTAINERIZERS)
    if unknown or "process" not in names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: containerizers are process,docker or process")
    return names


def _attributes(text: str) -> dict[str, str]:
    try:
        return parse_attributes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None



_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.IGNORECASE)



def _size(text: str) -> int:
    """'10MB', '512KB', '2GB' (binary units, as Mesos reads them) or bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (try 10MB, 512KB, 2GB)")
    power = "_KMGT".index(match.group(2).upper()) if match.group(2) else 0
    return int(float(match.group(1)) * 1024 ** power)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2, ...)")
    return int(text)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1)")
    return value



def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> AgentConfig:
    try:
        parse_http_address(args.master)
    except ValueError as exc:
        parser.error(f"argument --master: {exc}")
    if not 0 < args.status_update_retry <= args.status_update_retry_max:
        parser.error("need 0 < --status-update-retry <= --status-update-retry-max")
    work_dir = os.path.abspath(args.work_dir)
    try:
        resources: Resources = resolve_resources(args.resources, work_dir)
    except ResourcesError as exc:
        parser.error(f"argument --resources: {exc}")
    return AgentConfig(hostname=args.hostname, ip=args.ip, port=args.port,
                       executor_port=args.executor_port, work_dir=work_dir,
                       resources=resources, python=sys.executable,
                       command_tasks=args.command_tasks,
                       attributes=args.attributes,
                       executor_registration_timeout=args.executor_registration_timeout,
                       executor_reregistration_timeout=args.executor_reregistration_timeout,
                       executor_shutdown_grace_period=args.executor_shutdown_grace_period,
                       recovery_timeout=args.recovery_timeout,
                       status_update_backoff=args.status_update_retry,
                       status_update_backoff_max=args.status_update_retry_max,
                       usage_report_interval=args.usage_report_interval,
                       docker=DockerConfig(volume_roots=tuple(
                           os.path.abspath(r) for r in args.docker_volume_root)),
                       reclaim=ReclaimConfig(enabled=args.oversubscription == "on",
                                             window=args.reclaim_window,
                                             margin=args.reclaim_margin),
                       qos=QosConfig(mem_watermark=args.qos_mem_watermark))


def _directories(text: str) -> tuple[str, ...]:
    paths = tuple(path for path in text.split(os.pathsep) if path)
    relative = [path for path in paths if not os.path.isabs(path)]
    if relative:
        raise argparse.ArgumentTypeError(f"allowed paths must be absolute: {relative}")
    return paths


def _options(args: argparse.Namespace) -> AgentOptions:
    given = Resources.parse(args.resources).names() if args.resources else set()
    return AgentOptions(
        detected_resources=frozenset(DETECTED_KINDS) - given,
        cgroups_root=args.cgroups_root, usage_interval=args.usage_interval,
        disk_watch_interval=args.disk_watch_interval, gc_delay=args.gc_delay,
        gc_disk_headroom=args.gc_disk_headroom, log_max_size=args.log_max_size,
        log_keep=args.log_keep, fetcher_cache_dir=args.fetcher_cache_dir,
        fetcher_cache_size=args.fetcher_cache_size,
        fetcher_allowed_paths=args.fetcher_allowed_paths, containerizers=args.containerizers,
        docker_socket=args.docker_socket, docker_pull_timeout=args.docker_pull_timeout,
        switch_user=os.geteuid() == 0 if args.switch_user is None else args.switch_user)


async def _serve(config: AgentConfig, master: str, isolator: Isolator,
                 options: AgentOptions, secure: security.ServerSecurity,
                 client: ClientCredentials) -> int:
    server = AgentServer(config, master, isolator=isolator, options=options, secure=secure,
                         client=client)
    try:
        await server.start()
    except (CheckpointError, EngineUnavailable) as exc:
        print(f"dyad-agent: error: {exc}", file=sys.stderr)
        return 1
    except (OSError, zmq.ZMQError) as exc:
        print(f"dyad-agent: error: cannot listen on {config.ip}: {exc}", file=sys.stderr)
        return 1
    print(f"dyad-agent listening on {server.http_url} executors={server.executor_endpoint}",
          flush=True)
    # What start-up made (modules, the app) lives as long as the agent: out of the
    # collector's sight, a full collection walks only what tasks made since
    # (cyclic collection was 8% of the agent's CPU under a flood of tasks). Start-up's
    # garbage goes first, so none of it is kept for ever.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(server.wait_failed())
    await asyncio.wait([stopped, failed], return_when=asyncio.FIRST_COMPLETED)
    for waiter in (stopped, failed):
        waiter.cancel()
    if failed.done() and not failed.cancelled():
        # A loop kept dying: exit non-zero so a supervisor starts a fresh agent.
        # Executors keep running and re-attach to it (the checkpoint stays).
        logging.getLogger(__name__).critical("an agent loop cannot be kept alive; exiting")
        return 2
    logging.getLogger(__name__).info("stopping: shutting down executors")
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    config = _config(parser, args)
    logs.configure(args.log_level, args.log_format)
    options = _options(args)
    try:
        secure = security.for_server(args, args.ip)
        # How we reach the master: our CURVE keys, its keys, the CA, our token.
        client = ClientCredentials.from_env()
    except (security.SecurityError, CredentialsError) as exc:
        print(f"dyad-agent: error: {exc}", file=sys.stderr)
        return 1
    try:
        isolator = detect(args.isolation, options.cgroups_root)
    except IsolationError as exc:
        print(f"dyad-agent: error: {exc}", file=sys.stderr)
        return 1
    how = "as asked" if args.isolation else "the best available"
    logging.getLogger(__name__).info("isolation: %s (%s)", isolator.name, how)
    config = attrs.evolve(config, isolation=isolator.kind)
    gc_pauses.install()  # as the master: fewer, cheaper collections under a flood
    return asyncio.run(_serve(config, args.master, isolator, options, secure, client))


if __name__ == "__main__":
    sys.exit(main())
