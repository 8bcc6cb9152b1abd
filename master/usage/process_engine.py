"""The DuckDB usage store in a process of its own, behind the same `Engine` face.

Why: in the master's process the store cost a quarter of the master's CPU under a
launch flood (DuckDB converting the Python lists it is handed runs under the GIL,
and its inserts on the master's cores), and the master's one event loop is what
bounds its throughput (docs/operations.md). Here the master's writer thread only
turns samples into plain tuples and sends them and the events (tuples already)
down a pipe as msgpack; the child joins events to their tasks' facts, builds the
columns and runs DuckDB.

Two pipes, one per caller thread (`UsageStore` writes from one thread and queries
from another, and an engine must let the two overlap); the child serves each pipe
on a thread of its own against one `DuckDBEngine`, so a slow query never holds up
ingestion there either. Errors travel back as values: a `QueryError` is re-raised
as itself (its message is for the user), any other failure as `EngineFailed`.
The child exits when the master closes the store or its end of a pipe goes away
(the master died), so it never outlives the master.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from master.usage.schema import TaskEvent, UsageSample, usage_values
from master.usage.store import Expired, QueryError, QueryResult

CLOSE_WAIT = 5.0  # seconds the child gets to close its database before it is killed
NICENESS = 10
"""Added to the child's nice value: the store is an observer, so where CPU is short
(a launch flood on the master's host) its inserts wait for the master, the agents
and the frameworks rather than the other way round. Measured, 10,000 simulated
agents and 10 frameworks on 2 cores: 2-5% more tasks/s (docs/usage-store.md);
the store catches up when the flood ends, and what does not fit in the master's
buffer meanwhile is dropped and counted (`usage/dropped`), as before. Queries run
in this process too, so on a host short of CPU they also wait (their time limit
still holds)."""
ANSWER_WAIT = 60.0
"""Seconds a write or a count may take before the child is called stuck: killed,
so that no call waits on it for ever (a late answer would also answer the wrong
call). A query waits its own time limit (the child interrupts it then) and this."""


_ROWS = msgspec.msgpack.Encoder()
"""Rows go down the pipe as msgpack, not pickle: a `TaskEvent` pickles through a
Python-level `__getnewargs__` (2.0 µs an event, measured with
`multiprocessing.reduction.ForkingPickler`; msgspec 0.1 µs), and the writer
thread shares the master's GIL. The child reads tuples back as lists, which
`DuckDBEngine.insert_values` takes alike."""


class EngineFailed(Exception):
    """The store's process failed a call, or is gone (the message says which)."""


class ProcessEngine:
    """A `DuckDBEngine` run in a child process (spawned, so it inherits none of
    the master's sockets or threads)."""

    def __init__(self, memory_limit: str = "1GB", threads: int = 2) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._writes, child_writes = ctx.Pipe()
        self._queries, child_queries = ctx.Pipe()
        self._process = ctx.Process(target=serve, name="dyad-usage-store", daemon=True,
                                    args=(child_writes, child_queries, memory_limit, threads))
        self._process.start()
        child_writes.close()
        child_queries.close()
        self._closed = False
        self.answer_wait = ANSWER_WAIT

    def insert(self, samples: Sequence[UsageSample], events: Sequence[TaskEvent]) -> None:
        # Events go as they are: the child joins them to their tasks' facts.
        self._call(self._writes, "insert", _ROWS.encode(
            ([usage_values(s) for s in samples], events)))

    def expire(self, older_than: float, max_rows: int | None) -> Expired:
        return self._call(self._writes, "expire", older_than, max_rows)  # type: ignore[no-any-return]

    def query(self, sql: str, max_rows: int, timeout: float) -> QueryResult:
        return self._call(self._queries, "query", sql, max_rows, timeout,  # type: ignore[no-any-return]
                          wait=timeout + self.answer_wait)

    def counts(self) -> dict[str, int]:
        return self._call(self._queries, "counts")  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._writes, "close", wait=CLOSE_WAIT)
        except (EngineFailed, QueryError):
            pass  # gone already, or failed to close: it is killed below either way
        finally:
            self._writes.close()
            self._queries.close()
            self._process.join(CLOSE_WAIT)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()

    def _call(self, conn: Connection, method: str, *args: Any, wait: float | None = None) -> Any:
        try:
            conn.send((method, args))
            if not conn.poll(self.answer_wait if wait is None else wait):
                self._process.kill()  # stuck: its pipes close, every call fails from now on
                raise EOFError(f"no answer to {method} in time; killed")
            ok, value = conn.recv()
        except (EOFError, OSError) as error:
            if method == "query":
                raise QueryError("the usage store is shut down") from None
            raise EngineFailed(f"the usage store's process is gone ({error})") from None
        if not ok:
            raise value
        return value


# ------------------------------------------------------------------- the child


def serve(writes: Connection, queries: Connection, memory_limit: str, threads: int) -> None:
    """The child: one `DuckDBEngine`, the query pipe on a thread, the write pipe
    here; returns (the process ends) on "close" or when the master is gone."""
    from master.usage.duckdb_engine import DuckDBEngine  # DuckDB only in the child
    os.nice(NICENESS)
    engine = DuckDBEngine(memory_limit=memory_limit, threads=threads)
    rows = msgspec.msgpack.Decoder()
    methods = {"insert": lambda packed: engine.insert_values(*rows.decode(packed)),
               "expire": engine.expire, "query": engine.query, "counts": engine.counts, "close": engine.close}
    threading.Thread(target=_answer, args=(queries, methods), daemon=True,
                     name="usage-query").start()
    _answer(writes, methods)


def _answer(conn: Connection, methods: dict[str, Any]) -> None:
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return  # the master is gone: nothing more will come
        try:
            reply: tuple[bool, Any] = (True, methods[method](*args))
        except QueryError as error:
            reply = (False, error)
        except Exception as error:  # sent back as a value: the master counts it
            reply = (False, EngineFailed(f"{type(error).__name__}: {error}"))
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        if method == "close":
            return
