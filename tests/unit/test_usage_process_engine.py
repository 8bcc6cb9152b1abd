"""The usage store in its own process: the same answers and refusals as the
in-process engine, and a child that is gone fails calls instead of hanging them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from master.usage import (
    QueryError, QueryRefused, QueryTimeout, StoreConfig, UsageStore)
from master.usage.duckdb_engine import DuckDBEngine
from master.usage.process_engine import _ROWS, NICENESS, Deferred, EngineFailed, ProcessEngine
from tests.unit.test_usage_store import JOB, T0, WEB, event, later, sample


@pytest.fixture(scope="module")
def engine() -> Iterator[ProcessEngine]:
    e = ProcessEngine(memory_limit="256MB", threads=1)
    yield e
    e.close()


def test_rows_written_there_are_answered_here(engine: ProcessEngine) -> None:
    engine.insert([sample(T0 + i, WEB) for i in range(10)] + [sample(T0, JOB, cpus=2.0)],
                  [*event(T0, WEB, "TASK_RUNNING"), *event(T0 + 1, JOB, "TASK_FINISHED")])
    result = engine.query("SELECT role, count(*), agent_attributes['rack'] FROM task_usage "
                          "GROUP BY ALL ORDER BY role", 10, 5)
    assert result.rows == (("batch", 1, "r2"), ("prod", 10, "r1"))
    assert engine.counts() == {"task_usage": 11, "task_events": 2}
    # A later event without its task's facts is joined to them there.
    engine.insert([], later(T0 + 2, WEB, "TASK_FAILED"))
    failed = engine.query("SELECT app, hostname, cpus FROM task_events "
                          "WHERE state = 'TASK_FAILED'", 10, 5)
    assert failed.rows == (("/web", "h1", 1.0),)
    gone = engine.expire(older_than=T0 + 5, max_rows=None)
    assert (gone.samples, gone.events) == (6, 3)


def test_every_column_crosses_the_pipe_as_it_is_written_here() -> None:
    """The rows go as msgpack (lists back, not tuples): what the child stores is
    what the in-process engine stores, maps, None and booleans included, and the
    facts of a task without labels or attributes as the master sends them (None)."""
    samples = [sample(T0 + i, WEB) for i in range(3)] + [sample(T0, JOB, cpus=2.5)]
    events = [*event(T0, WEB, "TASK_RUNNING"), *event(T0 + 1, JOB, "TASK_FINISHED"),
              *later(T0 + 2, WEB, "TASK_FAILED", "r", "m", "agent", True),
              T0 + 3, ("svc", "bare", "prod", "", "h9", None, None, 0, False, 0.5, 1 << 20),
              ("svc", "bare", "TASK_RUNNING", "a9", "master", "", "", None)]
    here, there = DuckDBEngine(memory_limit="256MB", threads=1), ProcessEngine("256MB", 1)
    try:
        for e in (here, there):
            e.insert(samples, events)
        for table in ("task_usage", "task_events"):
            sql = f"SELECT * FROM {table} ORDER BY ALL"
            assert there.query(sql, 100, 5).rows == here.query(sql, 100, 5).rows
        bare = here.query("SELECT source, labels, agent_attributes, hostname FROM task_events "
                          "WHERE task_id = 'bare' OR state = 'TASK_FAILED' ORDER BY ts", 10, 5)
        assert bare.rows == (("SOURCE_AGENT", {"team": "shop"}, {"rack": "r1"}, "h1"),
                             ("SOURCE_MASTER", {}, {}, "h9"))
    finally:
        here.close()
        there.close()


def test_refusals_come_back_as_themselves(engine: ProcessEngine) -> None:
    with pytest.raises(QueryRefused, match="only SELECT"):
        engine.query("DELETE FROM task_usage", 10, 5)
    with pytest.raises(QueryError, match="task_nothing"):
        engine.query("SELECT * FROM task_nothing", 10, 5)
    with pytest.raises(QueryTimeout):
        engine.query("SELECT count(*) FROM range(10000000000) a, range(100) b", 10, 0.2)


def test_a_failed_write_is_an_error_the_store_counts() -> None:
    engine = ProcessEngine(memory_limit="256MB", threads=1)
    try:
        engine._call(engine._writes, "insert", _ROWS.encode(([("not", "a row")], [])))
        engine.insert([sample(T0)], [])  # waits there, behind the bad rows
        assert engine.counts()["task_usage"] == 1  # in before the count; the bad rows failed
        with pytest.raises(EngineFailed):  # and the write pipe's next answer says so
            engine.insert([sample(T0 + 1)], [])
        assert engine.counts()["task_usage"] == 2  # the child still serves
    finally:
        engine.close()


def test_a_child_that_is_gone_fails_calls_and_close_still_returns() -> None:
    engine = ProcessEngine(memory_limit="256MB", threads=1)
    engine.counts()
    engine._process.kill()
    engine._process.join()
    with pytest.raises(EngineFailed, match="gone"):
        engine.insert([sample(T0)], [])
    with pytest.raises(QueryError, match="shut down"):
        engine.query("SELECT 1", 1, 5)
    engine.close()  # closing what is gone is done at once
    engine.close()  # and a second close is a no-op


async def test_the_store_counts_a_write_the_child_could_not_make() -> None:
    engine = ProcessEngine(memory_limit="256MB", threads=1)
    store = UsageStore(engine, StoreConfig(batch_interval=0))
    assert await store.record([sample(T0)], event(T0, WEB, "TASK_RUNNING"))
    engine._process.kill()
    engine._process.join()
    assert await store.record([sample(T0 + 1)])
    assert store.stats["samples"] == 1 and store.stats["write_errors"] == 1
    await store.close()


def test_a_stuck_child_is_killed_and_no_call_waits_for_ever() -> None:
    engine = ProcessEngine(memory_limit="256MB", threads=1)
    engine.counts()
    engine.answer_wait = 0.5
    assert engine._process.pid is not None
    os.kill(engine._process.pid, signal.SIGSTOP)  # alive, answering nothing
    with pytest.raises(EngineFailed, match="no answer to counts in time"):
        engine._call(engine._writes, "counts")
    engine._process.join(5)
    assert not engine._process.is_alive()
    with pytest.raises(QueryError):
        engine.query("SELECT 1", 1, 1)
    engine.close()


def test_the_child_yields_the_cpu_to_the_master(engine: ProcessEngine) -> None:
    engine.counts()  # answered: the child is up and has set its priority
    child = os.getpriority(os.PRIO_PROCESS, engine._process.pid)
    assert child == min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICENESS)


class _Engine:
    """What `Deferred` drives: records the inserts and the calls after them."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def insert_values(self, samples: list, events: list) -> None:
        if samples == ["bad"]:
            raise ValueError("not a row")
        self.calls.append(("insert", samples))

    def query(self, sql: str, max_rows: int, timeout: float) -> str:
        self.calls.append(("query", sql))
        return "answer"

    def expire(self, older_than: float, max_rows: int | None) -> str:
        self.calls.append(("expire", older_than))
        return "expired"

    def counts(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def test_rows_wait_for_a_burst_to_end_and_never_longer_than_the_most_lag() -> None:
    now = [0.0]
    engine = _Engine()
    rows = Deferred(engine, clock=lambda: now[0])
    assert rows.due() is None  # nothing waits
    for i in range(30):  # a burst: a batch every 0.2 s for 6 s
        now[0] = i * 0.2
        rows.methods["insert"](_ROWS.encode(([i], [])))
        rows.due()
    # The batches until MOST_LAG went in then, at once; the rest still wait.
    inserted = [samples[0] for kind, samples in engine.calls]
    assert inserted == list(range(26))
    now[0] = 29 * 0.2 + Deferred.QUIET - 0.01
    assert rows.due() == pytest.approx(0.01) and len(engine.calls) == 26
    now[0] += 0.01
    assert rows.due() is None and [s[0] for _, s in engine.calls] == list(range(30))


def test_every_answer_covers_every_row_received_and_failures_come_back_once() -> None:
    engine = _Engine()
    rows = Deferred(engine, clock=lambda: 0.0)
    rows.methods["insert"](_ROWS.encode((["bad"], [])))
    rows.methods["insert"](_ROWS.encode(([1], [])))
    assert rows.methods["query"]("SELECT 1", 1, 1.0) == "answer"
    assert engine.calls == [("insert", [1]), ("query", "SELECT 1")]  # rows first
    with pytest.raises(ValueError, match="not a row"):  # on the write pipe's next answer
        rows.methods["expire"](5.0, None)
    assert rows.methods["expire"](5.0, None) == "expired"  # once


def test_rows_that_reach_the_most_bytes_go_in_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _Engine()
    rows = Deferred(engine, clock=lambda: 0.0)
    monkeypatch.setattr(Deferred, "MOST_BYTES", 2 * len(_ROWS.encode(([1], []))))
    rows.methods["insert"](_ROWS.encode(([1], [])))
    assert engine.calls == []
    rows.methods["insert"](_ROWS.encode(([2], [])))
    assert engine.calls == [("insert", [1]), ("insert", [2])]
