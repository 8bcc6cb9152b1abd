"""The `dyad` command: `dyad local` runs a whole cluster on this machine.

    dyad local --agents 3                      # until Ctrl-C / SIGTERM
    dyad local --agents 3 --run examples/hello.py [ARGS...]

The master listens on 127.0.0.1 (HTTP on `--port`, ZMQ on any free port unless
`--zmq-port` pins it); agent N on its own loopback address 127.0.0.(N+2), which is
also its hostname, so tasks' hosts resolve and answer.

With `--run`, the program gets the master's address in `DYAD_MASTER`, its output
goes to this terminal, and `dyad local` exits with the program's exit code after
stopping the cluster. Logs and sandboxes stay in the work directory.

`dyad apps ...` manages the service framework's apps (dyad.apps_cli); `dyad state`,
`agents`, `frameworks`, `tasks`, `offers`, `roles`, `logs`, `kill`, `quota` and
`weights` look at and act on a running cluster (dyad.operator_cli); `dyad query`
asks the master's usage store in SQL (dyad.query_cli).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from dyad import apps_cli, keys_cli, operator_cli, query_cli
from dyad.local import DEFAULT_AGENT_RESOURCES, PROJECT_ROOT, ClusterError, LocalCluster
from dyad.resources import Resources, ResourcesError


def _resources(text: str) -> str:
    try:
        Resources.parse(text)
    except ResourcesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dyad", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    local = commands.add_parser("local", help="run a master and agents on this machine")
    local.add_argument("--agents", type=int, default=3, help="number of agents (default 3)")
    local.add_argument("--port", type=int, default=5050,
                       help="master HTTP port (default 5050; 0 = any free port)")
    local.add_argument("--zmq-port", type=int, default=0,
                       help="master ZMQ port (default 0 = any free port; agents and "
                            "drivers learn it from the master's /master/info)")
    local.add_argument("--work-dir", type=Path, default=None,
                       help="where logs and sandboxes go (default: a new temp dir)")
    local.add_argument("--resources", type=_resources, default=DEFAULT_AGENT_RESOURCES,
                       help=f"per agent (default {DEFAULT_AGENT_RESOURCES!r}; unless you "
                            "give ports, each agent gets its own 1000 outside the "
                            "kernel's ephemeral port range)")
    local.add_argument("--master-arg", action="append", default=[], metavar="ARG",
                       help="extra argument for dyad-master (repeatable)")
    local.add_argument("--secure", action="store_true",
                       help="generate credentials under WORK_DIR/keys and run everything "
                            "authenticated and encrypted (CURVE, TLS, ACLs); PROGRAM runs "
                            "as principal 'operator' (DYAD_* variables, DYAD_KEYS_DIR)")
    local.add_argument("--run", nargs=argparse.REMAINDER, metavar="PROGRAM",
                       help="run PROGRAM [ARGS] against the cluster, then stop")
    apps_cli.add_parser(commands)
    keys_cli.add_parser(commands)
    operator_cli.add_parsers(commands)
    query_cli.add_parser(commands)
    commands.add_parser("sim", help="simulate a cell and a workload (dyad sim --help)")
    commands.add_parser("checkpoint", help="save a live cell for dyad sim (dyad checkpoint save)")
    return parser


def _program_argv(run: list[str]) -> list[str]:
    program, *args = run
    if program.endswith(".py"):
        return [sys.executable, program, *args]
    return [program, *args]


def run_local(args: argparse.Namespace) -> int:
    if args.agents < 1:
        print("dyad local: --agents must be at least 1", file=sys.stderr)
        return 2
    if args.run is not None and not args.run:
        print("dyad local: --run needs a program", file=sys.stderr)
        return 2
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="dyad-local-"))
    cluster = LocalCluster(work_dir=work_dir.resolve(), agents=args.agents, port=args.port,
                           zmq_port=args.zmq_port, resources=args.resources,
                           master_args=args.master_arg, secure=args.secure)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
    except ClusterError as exc:
        print(f"dyad local: {exc}", file=sys.stderr)
        return 1
    print(f"dyad local: master {cluster.master.url} with {args.agents} agents; "
          f"logs and sandboxes in {work_dir}", flush=True)
    code = 0
    try:
        if args.run is None:
            print("dyad local: press Ctrl-C to stop", flush=True)
            while not stop.wait(0.5):
                pass
        else:
            env = dict(os.environ, DYAD_MASTER=cluster.master_address,
                       **cluster.client_env("operator"))
            if args.secure:
                env["DYAD_KEYS_DIR"] = str(cluster.keys_dir)
            # So a framework program finds `frameworks` and `dyad` even when Dyad runs
            # from a checkout rather than an installed package.
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
            program = subprocess.Popen(_program_argv(args.run), env=env)
            while program.poll() is None:
                if stop.wait(0.2):
                    program.terminate()
                    program.wait()
                    break
            code = program.returncode
            print(f"dyad local: {args.run[0]} exited with {code}", flush=True)
    finally:
        print("dyad local: stopping agents and master", flush=True)
        cluster.stop()
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:  # the simulator lives in sim/, which may import every role
        from sim.cli import main as sim_main
        return sim_main(argv[1:])
    if argv[:1] == ["checkpoint"]:
        from sim.cli import checkpoint_main
        return checkpoint_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "local":
        return run_local(args)
    if args.command == "apps":
        return apps_cli.run(args)
    if args.command in operator_cli.COMMANDS:
        return operator_cli.run(args)
    if args.command == "query":
        return operator_cli.run(args, query_cli.execute)
    if args.command == "keys":
        return keys_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
