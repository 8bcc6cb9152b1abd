"""`dyad query`: ask the master's usage store a question in SQL.

    dyad query "SELECT app, count(*) FROM task_events
                WHERE reason = 'REASON_CONTAINER_LIMITATION_MEMORY' GROUP BY app"
    dyad query "SELECT bucket(ts, 60) AS minute, role, quantile_cont(cpus_used, 0.95)
                FROM task_usage GROUP BY ALL ORDER BY ALL" --csv
    dyad query --tables                 # the tables and their columns

Prints a table (drawn by rich: numbers right-aligned, NULL as an empty cell, cells
never folded when the output is not a terminal; ``--json``: the master's answer;
``--csv``: CSV with a header row). Tables and columns: docs/usage-store.md. ``--master`` as for the
other operator commands. Exit status: 0 answered, 1 the master refused the query
(bad SQL, not read-only, over its time limit: the reason is printed), 2 bad usage
or no master reachable.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dyad.apps_cli import UsageError
from dyad.operator_cli import DEFAULT_MASTER, call, master_url

# DuckDB's numeric type names (DECIMAL(p, s) starts with DECIMAL).
_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
            "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL")


def add_parser(commands: Any) -> None:
    """Register ``query`` on the `dyad` command's subparsers."""
    query = commands.add_parser("query", help="ask the usage store (SQL)",
                                description=__doc__.split("\n\n")[0])
    query.add_argument("sql", nargs="?", help="one SELECT over task_usage and task_events")
    query.add_argument("--master", default=os.environ.get("DYAD_MASTER", DEFAULT_MASTER),
                       help="host:port of a master or zk://host:2181/root (default "
                            f"$DYAD_MASTER or {DEFAULT_MASTER})")
    shape = query.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print the master's JSON")
    shape.add_argument("--csv", action="store_true", help="print CSV")
    query.add_argument("--max-rows", type=int, help="at most this many rows (the master "
                       "caps it too)")
    query.add_argument("--timeout", type=float, help="seconds the query may run")
    query.add_argument("--tables", action="store_true", help="list the tables and columns")


def execute(args: argparse.Namespace, out: Any) -> None:
    if args.tables == bool(args.sql):
        raise UsageError("give one SQL query, or --tables")
    base = master_url(args.master)
    if args.tables:
        answer = call(base, "GET", "/usage/tables")
        if args.json:
            out.write(json.dumps(answer, indent=2) + "\n")
            return
        console = _console(out)
        for name, table_ in answer["tables"].items():
            console.print(_table(["column", "type"], ["VARCHAR", "VARCHAR"],
                                 [(c["name"], c["type"]) for c in table_["columns"]],
                                 f"{name} ({table_['rows']} rows)"))
        console.print(Text("helpers: " + ", ".join(answer["helpers"])))
        return
    body: dict[str, Any] = {"sql": args.sql}
    if args.max_rows is not None:
        body["max_rows"] = args.max_rows
    if args.timeout is not None:
        body["timeout"] = args.timeout
    answer = call(base, "POST", "/usage/query", body)
    if args.json:
        out.write(json.dumps(answer, indent=2) + "\n")
        return
    rows = [[_text(v) for v in row] for row in answer["rows"]]
    if args.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(answer["columns"])
        writer.writerows(rows)
        return
    console = _console(out)
    console.print(_table(answer["columns"], answer.get("types") or [], rows))
    more = " (truncated: more rows exist; narrow the query or raise --max-rows)" \
        if answer["truncated"] else ""
    console.print(Text(f"{len(rows)} rows in {answer['elapsed_ms']:.0f} ms{more}"))


def _console(out: Any) -> Console:
    """A terminal gets its own width; a pipe or file a width no row reaches, so no
    cell is folded or cut for a reader that is a program or a file."""
    terminal = hasattr(out, "isatty") and out.isatty()
    width = shutil.get_terminal_size().columns if terminal else 100_000
    return Console(file=out, width=width, highlight=False, soft_wrap=False)


def _table(columns: Sequence[str], types: Sequence[str], rows: Sequence[Sequence[Any]],
           title: str | None = None) -> Table:
    # Every text goes in as Text: a value like "[red]" is data, not rich markup.
    table = Table(title=None if title is None else Text(title), title_justify="left")
    for i, name in enumerate(columns):
        numeric = i < len(types) and str(types[i]).upper().startswith(_NUMERIC)
        table.add_column(Text(name), justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text("" if v is None else str(v)) for v in row))
    return table


def _text(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value
