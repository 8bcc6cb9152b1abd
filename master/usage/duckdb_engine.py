"""The usage store on DuckDB: an in-memory analytical database in this process.

Safety of user queries rests on DuckDB's own guards first, and on ours second:

- the database is opened with `enable_external_access = false` (no files, no
  network, no extensions: COPY, ATTACH, read_csv and friends fail) and a memory
  limit, then `lock_configuration = true`, so no statement can undo either;
- DuckDB's parser must find exactly one statement, of type SELECT (this covers
  WITH, FROM-first, DESCRIBE, SHOW and SUMMARIZE; it refuses INSERT, COPY, ATTACH,
  PRAGMA, CALL, SET, EXPLAIN ...);
- it runs on its own cursor inside a transaction that is always rolled back, so
  even a SELECT with a side effect could not change the store;
- `fetchmany(limit + 1)` bounds the rows (DuckDB streams, so an enormous result
  is never built), and a timer interrupts the cursor at the deadline.

Ingestion hands DuckDB whole columns as NumPy arrays (one `INSERT ... SELECT`
from them per batch) rather than a statement per row: per-row inserts are two
orders of magnitude slower, and typed Python lists bound as parameters twice
as slow as the arrays.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np

from master.usage.schema import (
    EVENT_COLUMNS, TABLES, USAGE_COLUMNS, EventItem, KnownTasks, UsageSample, usage_values)
from master.usage.store import (
    Expired, QueryError, QueryRefused, QueryResult, QueryTimeout)

MAX_SQL_CHARS = 20_000
_MAP = "MAP(VARCHAR, VARCHAR)"

MACROS = (
    # Time-bucket helpers: bucket(ts, 60) is the start of ts's minute; ago(INTERVAL
    # 1 HOUR) is an hour before now, in the same UTC as the `ts` columns.
    "CREATE MACRO bucket(ts, seconds) AS time_bucket(to_seconds(seconds::BIGINT), ts)",
    "CREATE MACRO ago(span) AS (now()::TIMESTAMP - span)",
    "CREATE MACRO epoch_ts(seconds) AS make_timestamp((seconds::DOUBLE * 1000000)::BIGINT)",
)


_ROWS_VIEW = "_rows"
"""The name a batch's columns are registered under on the writer's connection
(the query cursor, a connection of its own, never sees it)."""
_NUMPY = {"VARCHAR": object, "BOOLEAN": object, "DOUBLE": np.float64, "TIMESTAMP": np.float64,
          "BIGINT": np.int64, "INTEGER": np.int32, _MAP: np.int32}
"""How each column type travels: strings and nullable booleans as object arrays
(DuckDB reads None as NULL), numbers as typed arrays, a map as an index into
the batch's distinct maps."""


def _insert_sql(table: str, columns: tuple[tuple[str, str], ...]) -> str:
    """``INSERT INTO table SELECT ... FROM _rows``, `_rows` the batch's columns.

    Maps are sent once per distinct value (agents share attributes, tasks share
    labels) as two lists of keys and values, and each row carries an index."""
    outer = []
    for name, kind in columns:
        if kind == _MAP:
            outer.append(f"map((?::VARCHAR[][])[{name}], (?::VARCHAR[][])[{name}])")
        elif name == "ts":
            outer.append("make_timestamp((ts * 1000000)::BIGINT)")
        else:
            outer.append(name)
    return f"INSERT INTO {table} SELECT {', '.join(outer)} FROM {_ROWS_VIEW}"


def _columns(columns: tuple[tuple[str, str], ...], rows: Sequence[Sequence[Any]]
             ) -> tuple[dict[str, np.ndarray], list[Any]]:
    """The rows as one NumPy array a column, which DuckDB scans in C++ (binding
    the same values as Python lists cost twice as much: docs/usage-store.md),
    and the maps' keys and values in the order `_insert_sql` binds them."""
    arrays: dict[str, np.ndarray] = {}
    maps: list[Any] = []
    for (name, kind), values in zip(columns, zip(*rows)):
        if kind == _MAP:
            distinct: dict[tuple, int] = {}
            seen: dict[int, int] = {}  # by id: a task's rows share one map object
            index = []
            for m in values:
                at = seen.get(id(m))
                if at is None:
                    at = seen[id(m)] = distinct.setdefault(tuple(sorted(m.items())),
                                                           len(distinct) + 1)
                index.append(at)
            maps += [[[k for k, _ in m] for m in distinct], [[v for _, v in m] for m in distinct]]
            values = index
        arrays[name] = np.array(values, dtype=_NUMPY[kind])
    return arrays, maps


class DuckDBEngine:
    """An in-memory DuckDB usage store (one database, a writer and a query cursor)."""

    def __init__(self, memory_limit: str = "1GB", threads: int = 2) -> None:
        self._db = duckdb.connect(":memory:", config={
            "enable_external_access": False, "memory_limit": memory_limit,
            "threads": threads, "autoinstall_known_extensions": False,
            "autoload_known_extensions": False})
        for table, columns in TABLES.items():
            body = ", ".join(f"{name} {kind}" for name, kind in columns)
            self._db.execute(f"CREATE TABLE {table} ({body})")
        for macro in MACROS:
            self._db.execute(macro)
        self._db.execute("SET lock_configuration = true")
        self._usage_sql = _insert_sql("task_usage", USAGE_COLUMNS)
        self._event_sql = _insert_sql("task_events", EVENT_COLUMNS)
        self.tasks = KnownTasks()
        self._reader = self._db.cursor()
        self._querying = threading.Lock()
        self._closed = False

    # -- writer thread ----------------------------------------------------------------

    def insert(self, samples: Sequence[UsageSample], events: Sequence[EventItem]) -> None:
        self.insert_values([usage_values(s) for s in samples], events)

    def insert_values(self, samples: list[tuple], events: Sequence[EventItem]) -> None:
        """`insert` of samples already turned into values (`usage_values`): what
        the store's own process is sent. The events stream's rows are joined to
        their tasks' facts here (`KnownTasks`), in the order they came."""
        if samples:
            self._insert(self._usage_sql, USAGE_COLUMNS, samples)
        rows = self.tasks.values(events)
        if rows:
            self._insert(self._event_sql, EVENT_COLUMNS, rows)

    def _insert(self, sql: str, columns: tuple[tuple[str, str], ...],
                rows: Sequence[Sequence[Any]]) -> None:
        arrays, maps = _columns(columns, rows)
        self._db.register(_ROWS_VIEW, arrays)
        try:
            self._db.execute(sql, maps)
        finally:
            self._db.unregister(_ROWS_VIEW)

    def expire(self, older_than: float, max_rows: int | None) -> Expired:
        gone = []
        for table in ("task_usage", "task_events"):
            n = self._delete(f"DELETE FROM {table} WHERE ts < epoch_ts(?)", [older_than])
            if max_rows is not None:
                excess = self._count(table) - max_rows
                if excess > 0:
                    # The oldest `excess` rows by time; rows tied with the last of
                    # them go too (a few more than needed, never fewer).
                    n += self._delete(
                        f"DELETE FROM {table} WHERE ts <= (SELECT ts FROM {table} "
                        "ORDER BY ts LIMIT 1 OFFSET ?)", [excess - 1])
            gone.append(n)
        return Expired(samples=gone[0], events=gone[1])

    def _delete(self, sql: str, parameters: list[Any]) -> int:
        row = self._db.execute(sql, parameters).fetchone()
        return int(row[0]) if row else 0

    def _count(self, table: str) -> int:
        row = self._db.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(row[0]) if row else 0

    def counts(self) -> dict[str, int]:
        cursor = self._db.cursor()
        try:
            return {table: int(cursor.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
                    for table in TABLES}
        finally:
            cursor.close()

    # -- query thread -----------------------------------------------------------------

    def query(self, sql: str, max_rows: int, timeout: float) -> QueryResult:
        statement = read_only_statement(sql)
        with self._querying:
            if self._closed:
                raise QueryError("the usage store is shut down")
            return self._run(statement, max_rows, timeout)

    def _run(self, sql: str, max_rows: int, timeout: float) -> QueryResult:
        cursor = self._reader
        deadline = threading.Timer(timeout, cursor.interrupt)
        deadline.daemon = True
        started = time.monotonic()
        cursor.execute("BEGIN TRANSACTION")
        try:
            deadline.start()
            try:
                result = cursor.execute(sql)
                rows = result.fetchmany(max_rows + 1)
                description = result.description or []
            finally:
                deadline.cancel()
        except duckdb.InterruptException:
            raise QueryTimeout(f"query ran past its time limit of {timeout:g}s") from None
        except duckdb.PermissionException as error:
            raise QueryRefused(_message(error)) from None
        except duckdb.Error as error:
            raise QueryError(_message(error)) from None
        finally:
            cursor.execute("ROLLBACK")
        return QueryResult(
            columns=tuple(d[0] for d in description),
            types=tuple(str(d[1]) for d in description),
            rows=tuple(tuple(r) for r in rows[:max_rows]),
            truncated=len(rows) > max_rows, elapsed=time.monotonic() - started)

    def close(self) -> None:
        self._reader.interrupt()
        with self._querying:
            self._closed = True
            self._reader.close()
            self._db.close()


def read_only_statement(sql: str) -> str:
    """The one SELECT in `sql`, or a `QueryError` saying why not."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("the query is empty")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"the query is longer than {MAX_SQL_CHARS} characters")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as error:
        raise QueryError(_message(error)) from None
    if len(statements) != 1:
        raise QueryRefused(f"send exactly one statement, not {len(statements)}")
    [statement] = statements
    if statement.type != duckdb.StatementType.SELECT:
        kind = statement.type.name
        raise QueryRefused(f"only SELECT (or WITH ... SELECT) queries are allowed, not {kind}")
    return statement.query


def _message(error: Exception) -> str:
    return str(error).strip() or type(error).__name__
