"""The DuckDB usage store in a process of its own, behind the same `Engine` face.

Why: in the master's process the store cost a quarter of the master's CPU under a
launch flood (DuckDB converting the Python lists it is handed runs under the GIL,
and its inserts on the master's cores), and the master's one event loop is what
bounds its throughput (docs/operations.md). Here the master's writer thread only
turns samples into plain tuples and sends them and the events stream (tuples
already) down a pipe as msgpack; the child joins state rows to their tasks'
facts, builds the columns and runs DuckDB, once a burst of rows is over
(`Deferred`).

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
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from master.usage.schema import EventItem, UsageSample, usage_values
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
"""Rows go down the pipe as msgpack, not pickle: the writer thread shares the
master's GIL, and msgspec packs a batch of plain tuples in C (0.1 µs an event;
the named tuples the rows once were pickled through a Python-level
`__getnewargs__`, 2.0 µs, measured with `multiprocessing.reduction.ForkingPickler`).
The child reads tuples back as lists, which `DuckDBEngine.insert_values` takes
alike."""


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

    def insert(self, samples: Sequence[UsageSample], events: Sequence[EventItem]) -> None:
        # The events stream goes as it is: the child joins rows to their tasks' facts.
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
    rows = Deferred(DuckDBEngine(memory_limit=memory_limit, threads=threads))
    threading.Thread(target=_answer, args=(queries, rows.methods), daemon=True,
                     name="usage-query").start()
    _answer(writes, rows.methods, rows.due)


class Deferred:
    """The child's inserts, put off until a burst of rows is over.

    Why: measured on 2 cores (docs/usage-store.md), the inserts cost a launch
    flood 5% of its tasks/s even niced, as the child's CPU comes out of the
    simulated cluster's or the master's core. So the packed rows wait here,
    undecoded, until none came for `QUIET` seconds, the oldest waited `MOST_LAG`,
    or they hold `MOST_BYTES`; and before any query, count, expiry or close, so
    every answer still covers every row received. An insert that fails is
    reported on the write pipe's next answer (the master counts it there); the
    rows after it still go in."""

    QUIET = 0.5
    MOST_LAG = 5.0
    MOST_BYTES = 64 * 1024 * 1024

    def __init__(self, engine: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self._clock = clock
        self._decode = msgspec.msgpack.Decoder().decode
        self._packed: list[bytes] = []
        self._bytes = 0
        self._first = self._last = 0.0
        self._lock = threading.RLock()  # the waiting rows and the engine's writer
        self._failure: Exception | None = None
        self.methods = {"insert": self.insert, "expire": self._after_flush(engine.expire, True),
                        "query": self._after_flush(engine.query),
                        "counts": self._after_flush(engine.counts),
                        "close": self._after_flush(engine.close)}

    def insert(self, packed: bytes) -> None:
        with self._lock:
            now = self._clock()
            if not self._packed:
                self._first = now
            self._last = now
            self._packed.append(packed)  # kept even when this answer reports a failure
            self._bytes += len(packed)
            if self._bytes >= self.MOST_BYTES:
                self.flush()
            self._raise_failure()

    def due(self) -> float | None:
        """Seconds until the rows waiting must be inserted (None: none wait);
        inserts them when that is now."""
        if not self._packed:
            return None
        wait = min(self._last + self.QUIET, self._first + self.MOST_LAG) - self._clock()
        if wait > 0:
            return wait
        self.flush()
        return None

    def flush(self) -> None:
        with self._lock:
            packed, self._packed, self._bytes = self._packed, [], 0
            for one in packed:
                try:
                    self.engine.insert_values(*self._decode(one))
                except Exception as error:  # kept for the next answer; the rest go in
                    self._failure = error

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _after_flush(self, method: Any, writes: bool = False) -> Any:
        """`method` once every row waiting is in (on the write pipe, `writes`,
        after reporting an insert that failed)."""
        def call(*args: Any) -> Any:
            self.flush()
            if writes:
                with self._lock:
                    self._raise_failure()
            return method(*args)
        return call


def _answer(conn: Connection, methods: dict[str, Any],
            due: Callable[[], float | None] = lambda: None) -> None:
    """Serve calls on `conn`; between calls, `due` runs when it asked to."""
    while True:
        try:
            wait = due()
            while wait is not None and not conn.poll(wait):
                wait = due()
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
