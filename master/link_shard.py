"""`dyad-link-shard`: many agents' connections carried to the master over one.

    dyad-link-shard --listen HOST:PORT --master tcp://MASTER:SHARD_PORT
                    [--http HOST:PORT --master-http MASTER:5050]

The master is one process and every directly connected agent is one of its
file descriptors, so the descriptor limit bounds the cluster (20,000 here:
issue 19). A link shard, as Borg's link shards do, holds agents' connections
itself -- up to ~15,000 each, below the same limit -- and forwards their frames
to the master's shard port (`dyad-master --shard-port`) over one connection,
and the master's frames back to each agent. Agents connect to it as they would
to the master (it is a ROUTER with the master's own options: backlog, hand-over,
mandatory sends); the master sees each as if it had come directly. A real
`dyad-agent` finds its master over HTTP (`GET /master/info`), so with `--http`
the shard answers that too: the master's own MasterInfo, fetched from
`--master-http` on each request, with the shard's endpoint in place of the
master's (`dyad-agent --master SHARD:HTTP_PORT`). `/metrics/snapshot` gives the
shard's counters.

It moves bytes: no agent frame is decoded here. Each loop turn packs what
arrived into shard frames (master/shard_wire.py). Bad input costs only itself:
an agent's frame in several parts, or larger than a frame may be, is counted and
dropped (the master would have refused it too); a frame from the master that
does not parse is counted and dropped; the loops read on.

With `--credentials` and `--curve-key` it is a CURVE server to agents (its own
ZAP handler admits them, as the master's would) and a CURVE client of the
master (`--master-key`), and it passes on the principal each agent was admitted
as; the master reads the shard port only from the principals it names
(`--shard-principal`): docs/security.md.

It keeps no state, so a shard that dies loses the frames in flight and its
agents are unreachable until it is back (their own retries and re-registration
then bring them back, as after a network cut): docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import zmq
import zmq.asyncio

from dyad import gc_pauses, logs, security
from dyad.argtypes import host_port
from dyad.auth import load_keys
from dyad.codec import CodecError, to_json
from dyad.detector import parse_http_address
from dyad.messages import MAX_FRAME_BYTES
from dyad.supervision import LogLimiter, Supervisor
from dyad.transport import Dealer, Router
from master.shard_wire import FRAME_RECORDS, Record, ShardFrameError, pack, unpack

log = logging.getLogger("dyad.link_shard")

AGENT_SEND_QUEUE = 10_000
"""Frames queued for one agent before a send to it fails (counted)."""
MASTER_SEND_QUEUE = 64
"""Shard frames queued for the master before the shard stops reading agents:
at most 64 x 1,024 agent frames held here, so a slow master pushes back on the
agents' own sockets instead of growing this process (ZeroMQ's default, 1,000
frames of up to 1 MiB, would be a gigabyte)."""


class LinkShard:
    """One shard: a ROUTER for agents on `listen`, a DEALER to the master."""

    def __init__(self, master: str, host: str = "127.0.0.1", port: int = 0,
                 context: zmq.asyncio.Context | None = None,
                 identity: str | None = None, http: tuple[str, int] | None = None,
                 master_http: str | None = None,
                 secure: security.ServerSecurity | None = None,
                 master_key: bytes | None = None) -> None:
        if (http is None) != (master_http is None):
            raise ValueError("--http and --master-http go together")
        self._http, self._master_http = http, master_http
        self._runner: Any = None  # aiohttp's, only with `http`
        self._secure = secure or security.ServerSecurity()
        if self._secure.curve is not None and master_key is None:
            raise ValueError("with CURVE, the master's public key is needed (--master-key)")
        self._master_key = master_key
        self._zap: security.Zap | None = None
        self.http_port: int | None = None
        self._ctx = context or zmq.asyncio.Context.instance()
        self._master_endpoint = master
        self._host, self._port = host, port
        self._identity = identity
        self._agents: Router | None = None
        self._master: Dealer | None = None
        self._supervisor = Supervisor(self._fatal, self._count_error, logger=log)
        self._log = LogLimiter(log)
        self.failed: asyncio.Future[str] | None = None
        self.counts = {
            "agent_frames": 0, "agent_frames_bad": 0, "agent_frames_oversize": 0,
            "master_frames": 0, "master_frames_bad": 0, "frames_to_agents": 0,
            "internal_errors": 0}

    async def start(self) -> int:
        """Bind, connect, forward; the bound port."""
        self.failed = asyncio.get_running_loop().create_future()
        curve = self._secure.curve
        if curve is not None:
            assert self._secure.credentials is not None  # `security.load` makes sure
            self._zap = security.Zap(self._secure.credentials,
                                     security.Refusals("shard", log))
        context = self._zap.context if self._zap is not None else self._ctx
        self._agents = Router(context, curve=curve, send_queue=AGENT_SEND_QUEUE)
        if self._zap is not None:
            self._zap.watch(self._agents.socket)
        self.port = self._agents.bind(self._host, self._port)
        self._master = Dealer(self._identity, context, curve=curve, server_key=self._master_key)
        self._master.socket.setsockopt(zmq.SNDHWM, MASTER_SEND_QUEUE)
        self._master.connect(self._master_endpoint)
        self._supervisor.loop("shard-up", self._up)
        self._supervisor.loop("shard-down", self._down)
        if self._http is not None:
            await self._serve_http(*self._http)
        return self.port

    async def _serve_http(self, host: str, port: int) -> None:
        """`/master/info` for agents that detect their master over HTTP, and
        `/metrics/snapshot`. aiohttp is imported only here."""
        import aiohttp
        from aiohttp import web

        from dyad.detector import fetch_master_info

        assert self._master_http is not None
        base = parse_http_address(self._master_http)
        session = aiohttp.ClientSession()

        async def info(request: web.Request) -> web.Response:
            try:
                found = await fetch_master_info(session, base)
            except (aiohttp.ClientError, asyncio.TimeoutError, CodecError, ValueError) as exc:
                # The master is away: say so; the agent's detector retries.
                return web.json_response({"error": f"master at {base}: {exc}"}, status=503)
            curve = self._secure.curve
            return web.json_response(to_json(attrs.evolve(
                found, ip=self._host, zmq_port=self.port,
                curve_key=curve.public.decode() if curve is not None else "")))

        async def metrics(request: web.Request) -> web.Response:
            return web.json_response(self.metrics())

        async def close_session(app: web.Application) -> None:
            await session.close()

        app = web.Application()
        app.router.add_get("/master/info", info)
        app.router.add_get("/metrics/snapshot", metrics)
        app.on_cleanup.append(close_session)
        listening = socket.create_server((host, port))
        self.http_port = listening.getsockname()[1]
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, listening).start()

    async def _up(self) -> None:
        """Agents' frames to the master, packed per loop turn; while the master's
        queue is full, agents wait in ZeroMQ (their queues push back)."""
        agents, master = self._agents, self._master
        assert agents is not None and master is not None
        counts = self.counts
        while True:
            records: list[Record] = []
            for raw in await agents.recv_undecoded(FRAME_RECORDS):
                if len(raw.frames) != 1:
                    counts["agent_frames_bad"] += 1
                elif len(raw.frames[0]) > MAX_FRAME_BYTES:
                    counts["agent_frames_oversize"] += 1
                else:  # the principal this shard's ZAP admitted the agent as
                    records.append((raw.identity, (raw.principal or "").encode(),
                                    raw.frames[0]))
            counts["agent_frames"] += len(records)
            for frame, _ in pack(records):
                await master.send_frame_waiting(frame)
            await asyncio.sleep(0)  # the other direction gets its turn

    async def _down(self) -> None:
        """The master's frames to their agents; a send to an agent gone or full
        is counted by the agents' Router (`sends_unroutable`, `sends_full`)."""
        agents, master = self._agents, self._master
        assert agents is not None and master is not None
        counts = self.counts
        while True:
            for parts in await master.recv_undecoded(64):
                counts["master_frames"] += 1
                try:
                    if len(parts) != 1:
                        raise ShardFrameError(f"expected 1 frame, got {len(parts)}")
                    records = unpack(parts[0])
                except ShardFrameError as exc:
                    counts["master_frames_bad"] += 1
                    self._log.log("master", logging.WARNING,
                                  "dropped a frame from the master: %s", exc)
                    continue
                for identity, _, payload in records:
                    if agents.send_frame(identity, payload):
                        counts["frames_to_agents"] += 1
            await asyncio.sleep(0)

    def metrics(self) -> dict[str, int]:
        result = dict(self.counts)
        if self._agents is not None:
            result["sends_unroutable"] = self._agents.sends_unroutable
            result["sends_full"] = self._agents.sends_full
        return result

    def _count_error(self) -> None:
        self.counts["internal_errors"] += 1

    def _fatal(self, reason: str) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_result(reason)

    async def stop(self) -> None:
        await self._supervisor.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._agents is not None:
            self._agents.close()
        if self._master is not None:
            self._master.close()
        if self._zap is not None:
            await self._zap.stop()


def _http_address(text: str) -> str:
    try:
        return parse_http_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dyad-link-shard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=host_port, default=("127.0.0.1", 5056),
                        help="HOST:PORT agents connect to (port 0: any free)")
    parser.add_argument("--master", required=True, metavar="tcp://HOST:PORT",
                        help="the master's shard port (dyad-master --shard-port)")
    parser.add_argument("--http", type=host_port, metavar="HOST:PORT",
                        help="serve /master/info here, for agents that find their "
                             "master over HTTP (needs --master-http)")
    parser.add_argument("--master-http", type=_http_address, metavar="HOST:PORT",
                        help="the master's HTTP address, where /master/info is fetched")
    parser.add_argument("--identity", help="this shard's identity at the master "
                                           "(default: a fresh one each start)")
    parser.add_argument("--master-key", metavar="FILE",
                        help="with CURVE: the master's public key (curve/master.key)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS)
    security.add_flags(parser, zookeeper=False)
    return parser


async def _serve(args: argparse.Namespace, secure: security.ServerSecurity) -> int:
    gc_pauses.install()
    shard = LinkShard(args.master, *args.listen, identity=args.identity, http=args.http,
                      master_http=args.master_http, secure=secure,
                      master_key=load_keys(args.master_key).public if args.master_key else None)
    port = await shard.start()
    http = f" http=http://{args.http[0]}:{shard.http_port}" if args.http else ""
    print(f"dyad-link-shard listening on tcp://{args.listen[0]}:{port}{http} "
          f"master={args.master}", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    assert shard.failed is not None
    shard.failed.add_done_callback(lambda _: stopping.set())
    try:
        await stopping.wait()
    finally:
        log.info("stopping: %s", shard.metrics())
        await shard.stop()
    if shard.failed.done():
        log.error("a loop could not go on: %s", shard.failed.result())
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.http is None) != (args.master_http is None):
        parser.error("--http and --master-http go together")
    logs.configure(args.log_level, args.log_format)
    try:
        secure = security.for_server(args, args.listen[0])
        if secure.tls is not None:
            raise security.SecurityError("a link shard serves no HTTPS (--tls-cert)")
        if secure.curve is not None and args.master_key is None:
            raise security.SecurityError("with --curve-key, name the master's --master-key")
    except security.SecurityError as exc:
        log.error("cannot start the link shard: %s", exc)
        return 1
    # One descriptor per agent: take all the hard limit allows.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        return asyncio.run(_serve(args, secure))
    except (OSError, zmq.ZMQError) as exc:
        log.error("cannot start the link shard: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
