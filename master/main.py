"""`dyad-master`: run one master until SIGTERM or SIGINT.

Standalone by default; with `--zk zk://HOSTS/ROOT` it is one of several masters
contending through ZooKeeper, a standby until elected. On start it prints exactly
one line to stdout, ``dyad-master listening on http://IP:PORT zmq=tcp://IP:ZMQPORT``
(the real ports when 0 was asked for; a standby prints it too), which `dyad local`
and tests parse.

Exit codes: 0 after SIGTERM/SIGINT; 1 when it cannot start (port in use, work dir
held by another master); `EXIT_NOT_LEADER` (75, "try again") when it stopped
leading or lost its place in the election: a supervisor restarts it and it
contends anew, as Mesos masters do.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import re
import signal
import socket
import sys
from collections.abc import Sequence

import zmq

from dyad import gc_pauses, logs, security
from dyad import argtypes
from dyad.auth import is_loopback
from dyad.units import parse_duration
from dyad.zk import ZkAddress, parse_zk_url
from master.registry import RegistryError
from master.usage import StoreConfig
from master.server import DEFAULT_ZK_SESSION_TIMEOUT, MasterServer
from master.allocator.preemption import PreemptionConfig
from master.admission import DEFAULT_LIMIT as DEFAULT_ADMISSION
from master.model import MasterConfig

log = logging.getLogger("dyad.master")

EXIT_NOT_LEADER = 75  # EX_TEMPFAIL



def _positive_int(text: str, least: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} must be at least {least}")
    return value


def _non_negative_int(text: str) -> int:
    return _positive_int(text, least=0)


def _rate(text: str) -> tuple[int, float] | None:
    """'1/10s' -> (1, 10.0): at most 1 per 10 seconds; 'none' -> no limit."""
    if text.strip().lower() == "none":
        return None
    permits, slash, per = text.partition("/")
    try:
        if not slash:
            raise ValueError
        count, seconds = int(permits), parse_duration(per)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid rate {text!r} (try 1/10s, 5/1mins or none)") from None
    if count < 1 or seconds <= 0:
        raise argparse.ArgumentTypeError(f"rate {text!r} must be positive")
    return count, seconds


def _max_rows(text: str) -> int | None:
    return None if text.strip().lower() == "none" else _positive_int(text)



_MEMORY = re.compile(r"\s*\d+(\.\d+)?\s*([KMGT]i?)?B\s*", re.IGNORECASE)


def _memory_limit(text: str) -> str:
    """DuckDB's own syntax ('1GB', '512MiB'); checked here so a typo fails at start."""
    if not _MEMORY.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid memory limit {text!r} (try 512MB or 2GB)")
    return text.strip()


def _zk_url(text: str) -> ZkAddress:
    try:
        return parse_zk_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dyad-master", description="Run a Dyad master.")
    parser.add_argument("--ip", default="127.0.0.1", help="address to bind and advertise")
    parser.add_argument("--hostname", default=socket.gethostname(),
                        help="hostname to advertise (default: this machine's)")
    parser.add_argument("--port", type=argtypes.port, default=5050, help="HTTP port (0: any free)")
    parser.add_argument("--zmq-port", type=argtypes.port, default=5055, help="ZMQ port (0: any free)")
    parser.add_argument("--work-dir", type=pathlib.Path, default=pathlib.Path("./work-dir/master"),
                        help="directory for the master's files")
    parser.add_argument("--offer-timeout", type=argtypes.positive_duration, default="30s")
    parser.add_argument("--allocation-interval", type=argtypes.positive_duration, default="1s")
    parser.add_argument("--agent-ping-timeout", type=argtypes.positive_duration, default="15s",
                        help="ping interval, and how long a ping may go unanswered")
    parser.add_argument("--max-agent-ping-timeouts", type=_positive_int, default=5)
    parser.add_argument("--admission-limit", type=_non_negative_int, default=DEFAULT_ADMISSION,
                        help="tasks in flight beyond which offers wait (0: off; "
                             "master/admission.py)")
    parser.add_argument("--heartbeat-interval", type=argtypes.positive_duration, default="5s",
                        help="framework heartbeat interval (both directions)")
    parser.add_argument("--oversubscription", choices=["on", "off"], default="on",
                        help="offer what agents lend (revocable resources) to frameworks "
                             "with REVOCABLE_RESOURCES (docs/oversubscription.md)")
    parser.add_argument("--preemption", action="store_true",
                        help="preempt lower-priority tasks for unmet quota guarantees and "
                             "for frameworks that ask (off by default)")
    parser.add_argument("--max-preemptions-per-minute", type=_positive_int, default=60)
    parser.add_argument("--preemption-hold", type=argtypes.positive_duration, default="10s",
                        help="how long agents freed by preemption are kept for the preemptor")
    parser.add_argument("--preemption-guarantees", choices=["on", "off"], default="on",
                        help="with --preemption: also preempt, unasked, for unmet guarantees")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="json: one JSON object per log line (default text)")
    parser.add_argument("--zk", metavar="URL", type=_zk_url,
                        help="contend for leadership through ZooKeeper, e.g. "
                             "zk://zk1:2181,zk2:2181/dyad (default: standalone)")
    parser.add_argument("--zk-session-timeout", type=argtypes.positive_duration,
                        default=f"{DEFAULT_ZK_SESSION_TIMEOUT:g}s",
                        help="how long ZooKeeper waits before a silent master's "
                             "leadership ends: the floor of failover time")
    parser.add_argument("--agent-reregister-timeout", type=argtypes.positive_duration, default="10mins",
                        help="after a failover, how long agents from the registry "
                             "have to re-register before they are unreachable")
    parser.add_argument("--agent-removal-rate-limit", type=_rate, default="1/10s",
                        help="at most N agents marked unreachable per duration "
                             "(N/DURATION, or none)")
    usage = parser.add_argument_group("usage store (docs/usage-store.md)")
    usage.add_argument("--usage-store", choices=["on", "off"], default="on",
                       help="keep tasks' usage samples and events, answerable with SQL")
    usage.add_argument("--usage-retention", type=argtypes.positive_duration, default="24h",
                       help="how long rows are kept")
    usage.add_argument("--usage-max-rows", type=_max_rows, default="10000000",
                       help="rows kept per table at most (oldest go first; none: no limit)")
    usage.add_argument("--usage-sample-rate", type=argtypes.fraction, default=1.0,
                       help="fraction of usage samples kept (aggregates weigh by "
                            "sample_weight); events are always kept")
    usage.add_argument("--usage-query-timeout", type=argtypes.positive_duration, default="10s",
                       help="longest a query may run")
    usage.add_argument("--usage-query-rows", type=_positive_int, default=10_000,
                       help="most rows a query answers")
    usage.add_argument("--usage-memory-limit", type=_memory_limit, default="1GB",
                       help="memory the store's engine may use (DuckDB syntax)")
    shards = parser.add_argument_group("link shards (docs/operations.md)")
    shards.add_argument("--shard-port", type=argtypes.port, default=None,
                        help="also listen here for link shards (dyad-link-shard), which "
                             "carry many agents' connections each (0: any free; "
                             "default: off)")
    shards.add_argument("--shard-ip", default="127.0.0.1",
                        help="address of the shard port: only trusted shards may reach "
                             "it (docs/security.md)")
    shards.add_argument("--shard-principal", action="append", default=[], metavar="NAME",
                        help="with CURVE: a principal link shards connect as (repeat); "
                             "no one else is read on the shard port")
    security.add_flags(parser)
    return parser


def usage_config_from(args: argparse.Namespace) -> StoreConfig | None:
    if args.usage_store == "off":
        return None
    return StoreConfig(retention=args.usage_retention, max_rows=args.usage_max_rows,
                       sample_rate=args.usage_sample_rate, query_rows=args.usage_query_rows,
                       query_timeout=args.usage_query_timeout)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def config_from(args: argparse.Namespace,
                secure: security.ServerSecurity | None = None) -> MasterConfig:
    return MasterConfig(
        acls=(secure or security.ServerSecurity()).acls,
        offer_timeout=args.offer_timeout, allocation_interval=args.allocation_interval,
        agent_ping_timeout=args.agent_ping_timeout,
        max_agent_ping_timeouts=args.max_agent_ping_timeouts,
        admission_limit=args.admission_limit,
        heartbeat_interval=args.heartbeat_interval,
        agent_reregister_timeout=args.agent_reregister_timeout,
        agent_removal_rate=args.agent_removal_rate_limit,
        oversubscription=args.oversubscription == "on",
        preemption=PreemptionConfig(enabled=args.preemption,
                                    max_per_minute=args.max_preemptions_per_minute,
                                    hold=args.preemption_hold,
                                    guarantees=args.preemption_guarantees == "on"))


async def _serve(args: argparse.Namespace, secure: security.ServerSecurity) -> int:
    gc_pauses.install()  # full collections of a large heap stall the loop (dyad/gc_pauses.py)
    server = MasterServer(ip=args.ip, hostname=args.hostname, port=args.port,
                          zmq_port=args.zmq_port, config=config_from(args, secure),
                          work_dir=args.work_dir, zk=args.zk,
                          zk_session_timeout=args.zk_session_timeout,
                          usage=usage_config_from(args),
                          usage_memory_limit=args.usage_memory_limit, secure=secure,
                          shard_port=args.shard_port, shard_ip=args.shard_ip,
                          shard_principals=frozenset(args.shard_principal))
    await server.start()
    info = server.info
    url = f"{secure.scheme}://{info.ip}:{info.port}"
    print(f"dyad-master listening on {url} zmq={info.zmq_endpoint}", flush=True)
    if server.shard_port is not None:
        log.info("link shards: listening on tcp://%s:%d", args.shard_ip, server.shard_port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    server.lost.add_done_callback(lambda _: stopping.set())
    try:
        await stopping.wait()
    finally:
        log.info("stopping")
        await server.stop()
    if server.lost.done():
        log.error("exiting with %d so a supervisor restarts this master: %s",
                  EXIT_NOT_LEADER, server.lost.result())
        return EXIT_NOT_LEADER
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        secure = security.for_server(args, args.ip)
    except security.SecurityError as exc:
        log.error("cannot start the master: %s", exc)
        return 1
    if (args.shard_port is not None and not is_loopback(args.shard_ip)
            and secure.curve is None and not args.insecure):
        # Whoever reaches the shard port may speak for any agent (docs/security.md).
        log.error("cannot start the master: the shard port would take anyone on %s as a "
                  "link shard: give --curve-key and --shard-principal, bind it to loopback, "
                  "or pass --insecure to accept the risk", args.shard_ip)
        return 1
    if args.shard_port is not None and secure.curve is not None and not args.shard_principal:
        log.error("cannot start the master: with CURVE, --shard-port needs --shard-principal "
                  "(docs/security.md)")
        return 1
    try:
        # The registry will live here; creating it now surfaces permission problems
        # at start rather than at the first failover.
        args.work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.error("cannot create work dir %s: %s", args.work_dir, exc)
        return 1
    try:
        return asyncio.run(_serve(args, secure))
    except (OSError, zmq.ZMQError, RegistryError) as exc:  # port or work dir in use
        log.error("cannot start the master: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
