"""The usage store's interface, and the asyncio face the master shell uses.

An `Engine` is a blocking store (DuckDB today; see docs/usage-store.md for pointing
the same SQL at a bigger one). `UsageStore` runs it off the event loop: writes on
one dedicated thread, queries on another, so a slow query never delays ingestion
and neither ever blocks the master's loop.

Ingestion never waits: `submit` only appends to a bounded buffer (the loop's cost is
a list append) and a background task hands the buffer to the writer thread in
batches. When the buffer is full, rows are dropped and counted, never queued
without bound: the store is an observer, and must not become the master's problem.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import attrs

from master.usage.schema import EventItem, UsageSample, is_state_row

log = logging.getLogger(__name__)


class QueryError(Exception):
    """A query that cannot be answered; the message is for the user (HTTP 4xx)."""

    status = 400


class QueryRefused(QueryError):
    """Not a single read-only SELECT, or it reaches outside the store."""

    status = 403


class QueryTimeout(QueryError):
    status = 408


class QueryBusy(QueryError):
    """Too many queries are already waiting."""

    status = 429


@attrs.frozen
class QueryResult:
    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool  # more rows existed than the row limit
    elapsed: float  # seconds

    def as_json(self) -> dict[str, Any]:
        """JSON-ready: timestamps as ISO strings, other odd values as strings."""
        return {"columns": list(self.columns), "types": list(self.types),
                "rows": [[_jsonable(v) for v in row] for row in self.rows],
                "truncated": self.truncated, "elapsed_ms": round(self.elapsed * 1000, 3)}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


@attrs.frozen
class Expired:
    samples: int
    events: int


@attrs.frozen
class StoreConfig:
    retention: float = attrs.field(default=24 * 3600.0, validator=attrs.validators.gt(0))
    max_rows: int | None = 10_000_000  # per table; None: bounded by age only
    sample_rate: float = attrs.field(default=1.0, validator=[
        attrs.validators.gt(0.0), attrs.validators.le(1.0)])
    max_buffered: int = attrs.field(default=200_000, validator=attrs.validators.ge(1))
    query_rows: int = attrs.field(default=10_000, validator=attrs.validators.ge(1))
    query_timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    max_waiting_queries: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    # Batches go to the engine at most this often (the store's process puts its
    # inserts off further: process_engine.Deferred). Short, so that a flood's rows
    # wait little in the buffer, where each young collection walks them again.
    batch_interval: float = attrs.field(default=0.05, validator=attrs.validators.ge(0))
    seed: int = 0  # sampling is seeded, so a replay samples the same rows


class Engine(Protocol):
    """A blocking store. `insert` and `expire` are called from one writer thread,
    `query` from one query thread; an engine must allow the two to overlap."""

    def insert(self, samples: Sequence[UsageSample], events: Sequence[EventItem]) -> None: ...

    def expire(self, older_than: float, max_rows: int | None) -> Expired: ...

    def query(self, sql: str, max_rows: int, timeout: float) -> QueryResult: ...

    def counts(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class UsageStore:
    """The store as the master shell sees it. Create it inside the running loop."""

    def __init__(self, engine: Engine, config: StoreConfig = StoreConfig()) -> None:
        self.engine = engine
        self.config = config
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "usage-writer")
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "usage-query")
        self._samples: list[UsageSample] = []
        self._events: list[EventItem] = []
        self._rows = 0  # state rows in `_events`
        self._drain: asyncio.Task[None] | None = None
        self._waiting = 0
        self._last_insert = -math.inf  # loop time the latest insert started
        self._rng = random.Random(config.seed)
        self.stats = {"samples": 0, "events": 0, "sampled_out": 0, "dropped": 0,
                      "write_errors": 0, "queries": 0, "query_errors": 0,
                      "query_timeouts": 0, "query_busy": 0, "expired": 0}

    # -- ingestion (from the event loop, never waits) ---------------------------------

    def submit(self, samples: Iterable[UsageSample] = (),
               events: Iterable[EventItem] = (), rows: int | None = None) -> bool:
        """Buffer rows for the writer; False if the buffer was full and they were
        dropped (all but the events stream's times and tasks' facts). `rows`:
        how many of `events` are state rows (None: count them). Called once a
        master step with task events, so it copies nothing it need not."""
        kept = self._sample(samples) if samples else []
        if not isinstance(events, list):
            events = list(events)
        if rows is None:
            rows = sum(map(is_state_row, events))
        accepted = True
        if len(self._samples) + len(self._events) + len(kept) + len(events) \
                > self.config.max_buffered:
            # Full: drop the state rows, but keep the tasks' facts (one a task)
            # and the times, so the tasks' later rows still join.
            telling = [e for e in events if not is_state_row(e)]
            self.stats["dropped"] += len(kept) + rows
            kept, events, rows, accepted = [], telling, 0, False
        if kept:
            self._samples += kept
        self._events += events
        self._rows += rows
        drain = self._drain
        if drain is None or drain.done():
            self._drain = asyncio.get_running_loop().create_task(self._write())
        return accepted

    def _sample(self, samples: Iterable[UsageSample]) -> list[UsageSample]:
        rate = self.config.sample_rate
        if rate >= 1.0:
            return list(samples)
        kept = []
        for s in samples:
            if self._rng.random() < rate:
                kept.append(attrs.evolve(s, sample_weight=s.sample_weight / rate))
            else:
                self.stats["sampled_out"] += 1
        return kept

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        while self._samples or self._events:
            wait = self._last_insert + self.config.batch_interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_insert = loop.time()
            samples, self._samples = self._samples, []
            events, self._events = self._events, []
            rows, self._rows = self._rows, 0
            try:
                await loop.run_in_executor(self._writer, self.engine.insert, samples, events)
            except Exception:  # the engine's failure must not stop ingestion
                self.stats["write_errors"] += 1
                log.exception("usage store: writing %d samples and %d events failed",
                              len(samples), len(events))
                continue
            self.stats["samples"] += len(samples)
            self.stats["events"] += rows

    async def flush(self) -> None:
        """Wait until every row submitted so far is written (or failed)."""
        while self._drain is not None and not self._drain.done():
            await asyncio.shield(self._drain)

    async def record(self, samples: Iterable[UsageSample] = (),
                     events: Iterable[EventItem] = ()) -> bool:
        """`submit`, then wait for the write: for tests and tools, not the hot path."""
        accepted = self.submit(samples, events)
        await self.flush()
        return accepted

    # -- retention --------------------------------------------------------------------

    async def expire(self, now: float) -> Expired:
        """Drop rows older than the retention, then the oldest beyond `max_rows`."""
        loop = asyncio.get_running_loop()
        gone = await loop.run_in_executor(self._writer, self.engine.expire,
                                          now - self.config.retention, self.config.max_rows)
        self.stats["expired"] += gone.samples + gone.events
        return gone

    # -- questions --------------------------------------------------------------------

    async def query(self, sql: str, max_rows: int | None = None,
                    timeout: float | None = None) -> QueryResult:
        """Run one read-only SELECT. Raises a `QueryError` the caller shows the user."""
        if self._waiting > self.config.max_waiting_queries:
            self.stats["query_busy"] += 1
            raise QueryBusy(f"{self._waiting} queries are already running or waiting; "
                            "try again shortly")
        rows = min(max_rows or self.config.query_rows, self.config.query_rows)
        limit = min(timeout or self.config.query_timeout, self.config.query_timeout)
        self._waiting += 1
        started = time.monotonic()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self._reader, self.engine.query, sql, rows, limit)
        except QueryTimeout:
            self.stats["query_timeouts"] += 1
            raise
        except QueryError:
            self.stats["query_errors"] += 1
            raise
        finally:
            self._waiting -= 1
        self.stats["queries"] += 1
        log.debug("usage query took %.3fs", time.monotonic() - started)
        return result

    async def counts(self) -> dict[str, int]:
        return await asyncio.get_running_loop().run_in_executor(self._reader, self.engine.counts)

    async def close(self) -> None:
        await self.flush()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self.engine.close)
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
