"""`dyad-agent`: run one agent until SIGTERM/SIGINT, then stop its executors and
exit 0 (1 if its ports cannot be bound).

On start it prints exactly one line, flushed, that scripts (and `dyad local`) wait
for:  ``dyad-agent listening on http://IP:PORT executors=tcp://IP:EPORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

import zmq

from agent.detect import resolve_resources
from agent.server import AgentServer
from agent.state import AgentConfig
from dyad.detector import parse_http_address
from dyad.resources import Resources, ResourcesError
from dyad.units import parse_attributes, parse_duration


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dyad-agent", description="Run a Dyad agent.")
    p.add_argument("--master", required=True, help="the master's HTTP address, host:5050")
    p.add_argument("--ip", default="127.0.0.1", help="address to bind and advertise")
    p.add_argument("--hostname", default=socket.gethostname(), help="name to advertise")
    p.add_argument("--port", type=_port, default=5051, help="HTTP port (0: any free port)")
    p.add_argument("--executor-port", type=_port, default=5052,
                   help="port of the executors' ZMQ socket (0: any free port)")
    p.add_argument("--work-dir", default="./work-dir/agent", help="where sandboxes live")
    p.add_argument("--resources", default=None,
                   help='e.g. "cpus:4;mem:8192;disk:20000;ports:[31000-32000]"; '
                        "kinds left out are detected")
    p.add_argument("--attributes", type=_attributes, default={}, help='e.g. "rack:r1;zone:a"')
    p.add_argument("--executor-registration-timeout", type=_duration, default=60.0,
                   help="kill executors that do not register within this (e.g. 60s)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    return p


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0-65535")
    return value


def _attributes(text: str) -> dict[str, str]:
    try:
        return parse_attributes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> AgentConfig:
    try:
        parse_http_address(args.master)
    except ValueError as exc:
        parser.error(f"argument --master: {exc}")
    work_dir = os.path.abspath(args.work_dir)
    try:
        resources: Resources = resolve_resources(args.resources, work_dir)
    except ResourcesError as exc:
        parser.error(f"argument --resources: {exc}")
    return AgentConfig(hostname=args.hostname, ip=args.ip, port=args.port,
                       executor_port=args.executor_port, work_dir=work_dir,
                       resources=resources, python=sys.executable,
                       attributes=args.attributes,
                       executor_registration_timeout=args.executor_registration_timeout)


async def _serve(config: AgentConfig, master: str) -> int:
    server = AgentServer(config, master)
    try:
        await server.start()
    except (OSError, zmq.ZMQError) as exc:
        print(f"dyad-agent: error: cannot listen on {config.ip}: {exc}", file=sys.stderr)
        return 1
    print(f"dyad-agent listening on {server.http_url} executors={server.executor_endpoint}",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger(__name__).info("stopping: shutting down executors")
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    config = _config(parser, args)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_serve(config, args.master))


if __name__ == "__main__":
    sys.exit(main())
