"""The `dyad-batch` command.

    dyad-batch submit --master 127.0.0.1:5050 wordcount.py --input 'data/*.txt' \\
        --output out/ --reducers 4 [--map-cpus 0.5 --map-mem 256]
    dyad-batch submit --master ... --map-command 'tr -s " " "\\n"' \\
        --reduce-command 'uniq -c' --input ... --output ...
    dyad-batch status JOB
    dyad-batch list

`submit` runs the job and shows its progress (a bar on a terminal, plain lines
otherwise) on stderr, then a summary on stdout. Exit status: 0 when the job
succeeded, 1 when it failed, 2 when it could not start (bad arguments, missing
input, existing output, a job module that does not import), 130 when Ctrl-C or
SIGTERM stopped it (the framework torn down, the output removed).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from pathlib import Path

from dyad import priority as priorities
from dyad.units import parse_duration
from frameworks.batch.job import DEFAULT_SPLIT_SIZE, Job, JobError
from frameworks.batch.scheduler import run_job
from frameworks.batch.status import ProgressPrinter, default_jobs_dir, describe, find_job, \
    list_jobs, progress_dict, table
from frameworks.batch.work import OUTPUT_FORMATS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def parse_size(text: str) -> int:
    """'32MiB', '512k', '1g' or a number of bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (try 32MiB, 512k)")
    unit = (match.group(2) or "").lower()[:1]
    return max(1, int(float(match.group(1)) * _SIZE_UNITS[unit]))


def _priority(text: str) -> int:
    try:
        return priorities.check_priority(text)
    except priorities.PriorityError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dyad-batch", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    jobs_dir = argparse.ArgumentParser(add_help=False)
    jobs_dir.add_argument("--jobs-dir", type=Path, default=None,
                          help="where job records live (default $DYAD_BATCH_JOBS or "
                               "~/.local/state/dyad-batch/jobs)")

    submit = commands.add_parser("submit", parents=[jobs_dir], help="run a job")
    submit.add_argument("module", nargs="?", help="job module defining map and reduce")
    submit.add_argument("--master", default=os.environ.get("DYAD_MASTER"),
                        help="the master's host:port (default $DYAD_MASTER)")
    submit.add_argument("--input", action="extend", nargs="+", required=True,
                        metavar="INPUT", help="files, directories, globs, http(s) URIs; "
                        "HOST[,HOST]:PATH names the hosts holding the data (repeatable)")
    submit.add_argument("--output", required=True, help="output directory (must not exist)")
    submit.add_argument("--reducers", type=int, default=1)
    submit.add_argument("--map-command", help="shell command for maps (streaming mode)")
    submit.add_argument("--reduce-command", help="shell command for reduces (streaming mode)")
    submit.add_argument("--name", default="", help="job name (default: the module's)")
    for kind in ("map", "reduce"):
        submit.add_argument(f"--{kind}-cpus", type=float, default=0.5)
        submit.add_argument(f"--{kind}-mem", type=float, default=256.0, help="MB")
    submit.add_argument("--executor-cpus", type=float, default=0.1)
    submit.add_argument("--executor-mem", type=float, default=64.0, help="MB")
    submit.add_argument("--executor-image", default=None,
                        help="run the executor in this Docker image (Python 3.11+ with "
                        "Dyad installed); inputs and output are mounted at their paths")
    submit.add_argument("--executor-python", default="python3",
                        help="the interpreter inside --executor-image (default python3)")
    submit.add_argument("--executor-volume", action="append", default=[],
                        metavar="HOST:CONTAINER[:ro]",
                        help="another bind mount for the executor's container (repeatable)")
    submit.add_argument("--executor-env", action="append", default=[], type=_assignment,
                        metavar="NAME=VALUE", help="environment for the executor (repeatable)")
    submit.add_argument("--max-attempts", type=int, default=4)
    submit.add_argument("--priority", type=_priority, default=priorities.DEFAULT_BATCH,
                        help="task priority, an integer or a band name (default 100, "
                             "the batch band; see docs/oversubscription.md)")
    submit.add_argument("--revocable", action="store_true",
                        help="also run tasks on revocable resources (idle reservations "
                             "the agents lend; evicted tasks are retried, not charged)")
    submit.add_argument("--locality-wait", type=_duration, default=1.0,
                        help="how long maps wait for a data-local offer (default 1s; 0: off)")
    submit.add_argument("--speculative", action="store_true",
                        help="run extra attempts of the slowest tasks near the end")
    submit.add_argument("--split-size", type=parse_size, default=DEFAULT_SPLIT_SIZE,
                        help="bytes per map split (default 32MiB)")
    submit.add_argument("--format", choices=OUTPUT_FORMATS, default="text",
                        help="output format (default text: key<TAB>value)")
    submit.add_argument("--timeout", type=_duration, default=None,
                        help="fail the job if it runs longer than this")
    submit.add_argument("--quiet", action="store_true", help="no progress display")
    submit.add_argument("-v", "--verbose", action="store_true", help="log scheduling")

    status = commands.add_parser("status", parents=[jobs_dir], help="show one job")
    status.add_argument("job", help="job id (or a unique prefix)")
    commands.add_parser("list", parents=[jobs_dir], help="list jobs")
    return parser


def _assignment(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def _job(args: argparse.Namespace) -> Job:
    return Job(module=args.module, inputs=args.input, output=args.output,
               map_command=args.map_command, reduce_command=args.reduce_command,
               reducers=args.reducers, name=args.name, map_cpus=args.map_cpus,
               map_mem=args.map_mem, reduce_cpus=args.reduce_cpus, reduce_mem=args.reduce_mem,
               executor_cpus=args.executor_cpus, executor_mem=args.executor_mem,
               max_attempts=args.max_attempts, locality_wait=args.locality_wait,
               speculative=args.speculative, split_size=args.split_size,
               output_format=args.format, priority=args.priority,
               revocable=args.revocable,
               executor_image=args.executor_image, executor_python=args.executor_python,
               executor_volumes=args.executor_volume, executor_env=dict(args.executor_env))


def submit(args: argparse.Namespace) -> int:
    if not args.master:
        print("error: give --master host:port or set DYAD_MASTER", file=sys.stderr)
        return 2
    printer = None if args.quiet else ProgressPrinter(sys.stderr)
    try:
        result = run_job(_job(args), args.master, timeout=args.timeout,
                         jobs_dir=args.jobs_dir or default_jobs_dir(),
                         on_progress=None if printer is None
                         else lambda p: printer.update(progress_dict(p)))
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if printer is not None:
            printer.close()
    print(result.summary())
    return 0 if result.succeeded else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    jobs_dir = args.jobs_dir or default_jobs_dir()
    if args.command == "submit":
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
        # SIGTERM stops the job like Ctrl-C: framework torn down, output removed.
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            return submit(args)
        except KeyboardInterrupt:
            print("interrupted; the job was stopped and its output removed", file=sys.stderr)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
    if args.command == "status":
        try:
            print(describe(find_job(jobs_dir, args.job)))
        except LookupError as exc:
            print(f"error: {exc.args[0]}", file=sys.stderr)
            return 1
        return 0
    print(table(list_jobs(jobs_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
