"""The usage store: ingestion, retention with injected time, queries and their
guards (read-only, no file access, bounded rows, a time limit)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from master.usage import (
    Dimensions, DuckDBEngine, QueryBusy, QueryError, QueryRefused, QueryTimeout,
    StoreConfig, UsageSample, UsageStore, event_items, read_only_statement)

T0 = 1_700_000_000.0
WEB = Dimensions(task_id="web.1", framework_id="svc", role="prod", app="/web",
                 agent_id="a1", hostname="h1", agent_attributes={"rack": "r1"},
                 labels={"team": "shop"}, priority=200)
JOB = Dimensions(task_id="job.1", framework_id="batch", role="batch", app="wordcount",
                 agent_id="a2", hostname="h2", agent_attributes={"rack": "r2", "zone": "b"},
                 priority=100, revocable=True)


def sample(at: float, who: Dimensions = WEB, cpus: float = 0.5, mem: int = 30 << 20,
           weight: float = 1.0) -> UsageSample:
    return UsageSample(at=at, who=who, executor_id=who.task_id, cpus_used=cpus, cpus_limit=1.0,
                       mem_rss_bytes=mem, mem_limit_bytes=512 << 20, sample_weight=weight)


def event(at: float, who: Dimensions, state: str, reason: str = "") -> list:
    """A state change with its task's facts, as the events stream carries it."""
    return event_items(at, who, state, reason=reason, cpus=1.0, mem_bytes=512 << 20)


def later(at: float, who: Dimensions, state: str, reason: str = "", message: str = "",
          source: str = "", healthy: bool | None = None) -> list:
    """A state change of a task the store was told of: its time and row only."""
    return [float(at), (who.framework_id, who.task_id, state, who.agent_id, source, reason,
                        message, healthy)]


@pytest.fixture
def engine():
    e = DuckDBEngine(memory_limit="256MB", threads=1)
    yield e
    e.close()


def test_samples_and_events_answer_group_bys(engine) -> None:
    engine.insert([sample(T0 + i, WEB, cpus=0.1 * (i % 10)) for i in range(100)]
                  + [sample(T0 + i, JOB, cpus=2.0) for i in range(50)],
                  [*event(T0, WEB, "TASK_RUNNING"),
                   *event(T0 + 5, WEB, "TASK_FAILED", "REASON_CONTAINER_LIMITATION_MEMORY"),
                   *event(T0 + 9, JOB, "TASK_FINISHED")])
    result = engine.query(
        "SELECT role, count(*) n, round(quantile_cont(cpus_used, 0.95), 3) p95, "
        "agent_attributes['rack'] rack FROM task_usage GROUP BY ALL ORDER BY role", 100, 5)
    assert result.columns == ("role", "n", "p95", "rack")
    assert result.rows == (("batch", 50, 2.0, "r2"), ("prod", 100, 0.9, "r1"))
    ooms = engine.query("SELECT app, count(*) FROM task_events WHERE reason = "
                        "'REASON_CONTAINER_LIMITATION_MEMORY' GROUP BY app", 10, 5)
    assert ooms.rows == (("/web", 1),)
    per_minute = engine.query(
        "WITH m AS (SELECT bucket(ts, 60) AS at_minute, role FROM task_usage) "
        "SELECT at_minute, role, count(*) FROM m GROUP BY ALL ORDER BY ALL", 10, 5)
    # T0 is 40 s before a minute ends: (batch, prod) then (batch, prod)
    assert [r[2] for r in per_minute.rows] == [40, 40, 10, 60]
    assert per_minute.as_json()["rows"][0][0] == "2023-11-14T22:13:00"


def test_sample_weights_compensate_for_sampling(engine) -> None:
    engine.insert([sample(T0 + i, weight=4.0) for i in range(25)], [])
    assert engine.query("SELECT sum(sample_weight) FROM task_usage", 1, 5).rows == ((100.0,),)


def test_retention_by_age_and_by_rows(engine) -> None:
    engine.insert([sample(T0 + i) for i in range(100)],
                  [item for i in range(10) for item in event(T0 + i, WEB, "TASK_RUNNING")])
    gone = engine.expire(older_than=T0 + 30, max_rows=None)
    assert (gone.samples, gone.events) == (30, 10)
    assert engine.counts() == {"task_usage": 70, "task_events": 0}
    gone = engine.expire(older_than=T0, max_rows=50)
    assert gone.samples == 20
    oldest = engine.query("SELECT min(epoch(ts)) FROM task_usage", 1, 5).rows[0][0]
    assert oldest == T0 + 50  # the newest 50 stay


async def test_store_expires_with_injected_time_and_counts() -> None:
    store = UsageStore(DuckDBEngine(threads=1), StoreConfig(retention=3600, max_rows=None))
    try:
        assert await store.record([sample(T0 + 60 * i) for i in range(120)])
        gone = await store.expire(now=T0 + 7200)  # keeps the last hour
        assert gone.samples == 60
        assert (await store.counts())["task_usage"] == 60
        assert store.stats["samples"] == 120 and store.stats["expired"] == 60
    finally:
        await store.close()


async def test_submit_never_waits_and_drops_when_full() -> None:
    store = UsageStore(DuckDBEngine(threads=1), StoreConfig(max_buffered=10))
    try:
        assert store.submit([sample(T0 + i) for i in range(8)])
        assert not store.submit([sample(T0 + i) for i in range(5)])  # 13 > 10: dropped
        await store.flush()
        assert store.submit([sample(T0 + i) for i in range(5)])
        await store.flush()
        assert (await store.counts())["task_usage"] == 13
        assert store.stats["dropped"] == 5
    finally:
        await store.close()


async def test_a_full_buffer_keeps_the_tasks_facts_and_the_times() -> None:
    """Dropping a task's facts would leave its later rows without their
    dimensions: when full, the store keeps the facts (one a task) and the times
    and drops the state rows, counted."""
    store = UsageStore(DuckDBEngine(threads=1), StoreConfig(max_buffered=2))
    try:
        assert store.submit([sample(T0), sample(T0 + 1)])
        # Full: both state rows go, the facts stay.
        assert not store.submit([], event(T0, WEB, "TASK_STAGING")
                                + later(T0 + 1, WEB, "TASK_RUNNING"), rows=2)
        await store.flush()
        assert store.stats["dropped"] == 2 and store.stats["events"] == 0
        assert store.submit([], later(T0 + 3, WEB, "TASK_RUNNING"))
        await store.flush()
        assert store.stats["events"] == 1
        rows = await store.query("SELECT state, app, labels['team'] FROM task_events")
        assert rows.rows == (("TASK_RUNNING", "/web", "shop"),)
        assert store.engine.tasks.unknown == 0
    finally:
        await store.close()


async def test_a_flood_of_rows_becomes_a_few_large_inserts() -> None:
    class Counting(DuckDBEngine):
        def __init__(self) -> None:
            super().__init__(threads=1)
            self.inserts = 0

        def insert(self, samples, events) -> None:  # type: ignore[no-untyped-def]
            self.inserts += 1
            super().insert(samples, events)

    engine = Counting()
    store = UsageStore(engine, StoreConfig(batch_interval=0.2))
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(50):  # a state change every 10 ms for half a second
            store.submit(events=event(T0 + i, WEB, "TASK_RUNNING"))
            await asyncio.sleep(0.01)
        await store.flush()
        elapsed = loop.time() - started
        assert (await store.counts())["task_events"] == 50
        # The first row goes at once, then at most one insert per interval.
        assert engine.inserts <= 2 + elapsed / 0.2
    finally:
        await store.close()


async def test_sample_rate_keeps_a_weighted_share() -> None:
    store = UsageStore(DuckDBEngine(threads=1), StoreConfig(sample_rate=0.25, seed=7))
    try:
        await store.record([sample(T0 + i) for i in range(4000)])
        result = await store.query("SELECT count(*), sum(sample_weight) FROM task_usage")
        kept, estimate = result.rows[0]
        assert 800 < kept < 1200 and kept + store.stats["sampled_out"] == 4000
        assert 3200 < estimate < 4800 and estimate == kept * 4
    finally:
        await store.close()


@pytest.mark.parametrize("sql", [
    "INSERT INTO task_usage (ts) VALUES (now())",
    "DELETE FROM task_usage",
    "UPDATE task_events SET state = 'x'",
    "DROP TABLE task_usage",
    "CREATE TABLE x AS SELECT 1",
    "COPY task_usage TO '/tmp/dyad-usage-leak.csv'",
    "EXPORT DATABASE '/tmp/dyad-usage-leak'",
    "ATTACH '/tmp/dyad-usage-leak.db' AS leak",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "SET memory_limit = '64GB'",
    "EXPLAIN ANALYZE DELETE FROM task_usage",
    "BEGIN TRANSACTION",
    "SELECT 1; DELETE FROM task_usage",
])
def test_writes_and_side_doors_are_refused(engine, sql) -> None:
    engine.insert([sample(T0)], [])
    with pytest.raises(QueryRefused):
        engine.query(sql, 10, 5)
    assert engine.counts() == {"task_usage": 1, "task_events": 0}


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM 'https://example.com/x.parquet'",
    "SELECT * FROM glob('/etc/*')",
])
def test_file_and_network_access_is_refused(engine, sql) -> None:
    with pytest.raises(QueryError) as caught:
        engine.query(sql, 10, 5)
    assert "disabled" in str(caught.value) or isinstance(caught.value, QueryRefused)


def test_bad_sql_names_the_problem(engine) -> None:
    for sql, words in [("SELEC 1", "syntax error"), ("SELECT * FROM nowhere", "nowhere"),
                       ("", "empty"), ("SELECT 'x' || ", "syntax")]:
        with pytest.raises(QueryError, match=words):
            engine.query(sql, 10, 5)
    with pytest.raises(QueryError, match="longer than"):
        read_only_statement("SELECT 1 -- " + "x" * 30_000)
    # The engine is fine afterwards.
    assert engine.query("SELECT 42", 1, 5).rows == ((42,),)


def test_results_are_bounded(engine) -> None:
    huge = "SELECT a.range * b.range FROM range(1000000) a, range(1000000) b"
    result = engine.query(huge, 7, 5)  # streamed: never builds 10^12 rows
    assert len(result.rows) == 7 and result.truncated
    exact = engine.query("SELECT * FROM range(7)", 7, 5)
    assert len(exact.rows) == 7 and not exact.truncated


def test_a_slow_query_is_interrupted_and_the_engine_recovers(engine) -> None:
    slow = "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b"
    with pytest.raises(QueryTimeout, match="time limit of 0.2s"):
        engine.query(slow, 10, 0.2)
    assert engine.query("SELECT 1", 1, 5).rows == ((1,),)


async def test_store_limits_queries_and_keeps_ingesting_during_one() -> None:
    store = UsageStore(DuckDBEngine(threads=1), StoreConfig(
        query_timeout=1.0, max_waiting_queries=0, query_rows=3))
    try:
        slow = "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b"
        running = asyncio.ensure_future(store.query(slow, timeout=60))  # capped at 1 s
        await asyncio.sleep(0)  # let it start waiting on the query thread
        with pytest.raises(QueryBusy):
            await store.query("SELECT 1")
        assert await store.record([sample(T0)])  # writes do not wait for queries
        with pytest.raises(QueryTimeout):
            await running
        result = await store.query("SELECT * FROM range(10)", max_rows=100)
        assert len(result.rows) == 3 and result.truncated  # the store's cap wins
        assert store.stats["query_timeouts"] == 1 and store.stats["query_busy"] == 1
    finally:
        await store.close()


def test_rows_validate_their_numbers() -> None:
    with pytest.raises(ValueError):
        sample(float("nan"))
    with pytest.raises(ValueError):
        sample(T0, cpus=-1)
    with pytest.raises(ValueError):
        sample(T0, weight=0.5)
    event(T0, WEB, "TASK_RUNNING")
    with pytest.raises(ValueError):
        event(float("nan"), WEB, "TASK_RUNNING")
    with pytest.raises(ValueError):
        event_items(T0, WEB, "TASK_RUNNING", cpus=-1.0)
    with pytest.raises(ValueError):
        event_items(T0, WEB, "TASK_RUNNING", mem_bytes=float("inf"))
    with pytest.raises(ValueError):
        event_items(T0, WEB, "")


@pytest.mark.parametrize("seconds", ["1700000000", "1700000000.5", "0"])
def test_epoch_ts_takes_whole_and_fractional_epoch_seconds(engine, seconds: str) -> None:
    result = engine.query(f"SELECT epoch(epoch_ts({seconds}))", 1, 5)
    assert result.rows == ((float(seconds),),)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_maps = st.dictionaries(_text, _text, max_size=3)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(
    st.floats(0, 2 ** 33), _text, st.sampled_from(["prod", ""]), _maps, _maps,
    st.integers(0, 2 ** 31 - 1), st.booleans(), st.floats(0, 1e6), st.integers(0, 2 ** 62),
    st.one_of(st.none(), st.booleans())), min_size=1, max_size=20))
def test_any_rows_come_back_as_they_went_in(rows: list[tuple]) -> None:
    """Each batch crosses to DuckDB as one NumPy array a column: every value the
    row types take (None, empty and non-ASCII strings, maps, large integers, both
    booleans) reads back as it was, in either table."""
    engine = DuckDBEngine(memory_limit="256MB", threads=1)
    try:
        samples, events = [], []
        for i, (at, text, role, attrs_, labels, priority, revocable, cpus, big, healthy) \
                in enumerate(rows):
            who = Dimensions(task_id=f"t{i}", framework_id=text, role=role, app=text,
                             agent_id="a", hostname=text, agent_attributes=attrs_,
                             labels=labels, priority=priority, revocable=revocable)
            samples.append(UsageSample(at=at, who=who, executor_id=text, cpus_used=cpus,
                                       mem_rss_bytes=big, mem_limit_bytes=big))
            events += event_items(at, who, "TASK_RUNNING", message=text, healthy=healthy,
                                  cpus=cpus, mem_bytes=big)
        engine.insert(samples, events)
        got = engine.query("SELECT task_id, framework_id, role, agent_attributes, labels, "
                           "priority, revocable, cpus_used, mem_rss_bytes, executor_id, "
                           "epoch(ts) FROM task_usage ORDER BY task_id", 100, 5).rows
        want = sorted((s.who.task_id, s.who.framework_id, s.who.role, s.who.agent_attributes,
                       s.who.labels, s.who.priority, s.who.revocable, s.cpus_used,
                       s.mem_rss_bytes, s.executor_id) for s in samples)
        assert [g[:10] for g in got] == want
        assert all(abs(g[10] - s.at) < 1e-5 for g, s in zip(got, sorted(
            samples, key=lambda s: s.who.task_id)))
        events_back = engine.query("SELECT task_id, message, healthy, labels, cpus, mem_bytes "
                                   "FROM task_events ORDER BY task_id", 100, 5).rows
        assert list(events_back) == sorted(
            (f"t{i}", text, healthy, labels, cpus, big)
            for i, (_, text, _, _, labels, _, _, cpus, big, healthy) in enumerate(rows))
    finally:
        engine.close()
