"""The web UI's usage view (`GET /usage/view`, master/usage_view.py): canned
queries over a real DuckDB store with injected time, answering used against limit
per bucket, per-group rows and what explains a limit moving; bad parameters are a
counted 400, never a 5xx; any parameters parse or are refused, and any group is
only ever a string literal in the SQL (hypothesis)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from master import usage_view
from master.usage import Dimensions, DuckDBEngine, StoreConfig, UsageSample, event_items
from master.usage_api import UsageService, routes

MIB = 1 << 20
T0 = 1_700_000_400.0  # on a 10-minute boundary, so buckets start at T0
WEB1 = Dimensions(task_id="web.1", framework_id="svc", role="prod", app="/web",
                  agent_id="a1", hostname="h1")
WEB2 = Dimensions(task_id="web.2", framework_id="svc", role="prod", app="/web",
                  agent_id="a2", hostname="h2")
ODD = Dimensions(task_id="odd.1", framework_id="svc", role="prod", app="/it's",
                 agent_id="a1", hostname="h1")
JOB = Dimensions(task_id="job.1", framework_id="batch", role="batch", app="wc",
                 agent_id="a2", hostname="h2")


class Clock:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t


def sample(at: float, who: Dimensions, cpus: float, limit: float, mem: int,
           mem_limit: int) -> UsageSample:
    return UsageSample(at=at, who=who, executor_id=who.task_id, cpus_used=cpus,
                       cpus_limit=limit, mem_rss_bytes=mem, mem_limit_bytes=mem_limit)


def launch(at: float, who: Dimensions, cpus: float, mem_mib: int) -> list:
    return event_items(at, who, "TASK_STAGING", cpus=cpus, mem_bytes=mem_mib * MIB)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[TestClient, UsageService, Clock]]:
    clock = Clock(T0 + 300)
    service = UsageService(StoreConfig(), "256MB", clock.now)
    store = service.store
    await store.record(
        [s for t in (T0, T0 + 5, T0 + 60) for s in (
            sample(t, WEB1, 0.2, 1.0, 30 * MIB, 512 * MIB),
            sample(t, WEB2, 0.4, 1.0, 50 * MIB, 512 * MIB))]
        + [sample(T0 + 60, JOB, 1.5, 2.0, 100 * MIB, 200 * MIB),
           sample(T0 + 60, ODD, 0.1, 0.5, 10 * MIB, 64 * MIB)],
        [*launch(T0 - 10, WEB1, 1.0, 512), *launch(T0 - 5, WEB2, 1.0, 512),
         *launch(T0 + 120, Dimensions(task_id="web.3", framework_id="svc", role="prod",
                                      app="/web"), 0.5, 128),
         *event_items(T0 + 100, JOB, "TASK_FAILED", reason=usage_view.OOM_REASON,
                      message="memory limit")])
    app = web.Application()
    app.add_routes(routes(lambda request: service))
    async with TestClient(TestServer(app)) as client:
        yield client, service, clock
    await service.close()


async def get(client: TestClient, query: str) -> tuple[int, Any]:
    response = await client.get(f"/usage/view?{query}")
    return response.status, await response.json()


async def test_the_series_sums_each_buckets_executors(cluster: Any) -> None:
    client, _, _ = cluster
    status, view = await get(client, "by=app&window=600&bucket=60")
    assert status == 200, view
    assert view["since"] == T0 - 300 and view["bucket"] == 60
    points = {p[0]: p[1:] for p in view["series"]["points"]}
    assert len(points) == 11 and points[T0 - 300] == [0, 0, 0, 0]  # empty buckets: zero
    # T0's bucket: two reports of each /web executor, averaged, then summed.
    assert points[T0] == pytest.approx([0.6, 2.0, 80 * MIB, 1024 * MIB])
    assert points[T0 + 60] == pytest.approx([2.2, 4.5, 190 * MIB, 1288 * MIB])


async def test_groups_rows_hold_slack_and_oom_kills(cluster: Any) -> None:
    client, _, _ = cluster
    status, view = await get(client, "by=app&window=600")
    assert status == 200, view
    rows = {g["group"]: g for g in view["groups"]}
    assert [g["group"] for g in view["groups"]] == ["/web", "wc", "/it's"]  # most cores first
    assert rows["/web"]["tasks"] == 2 and rows["/web"]["framework_id"] == "svc"
    assert rows["/web"]["cpus_used"] == pytest.approx(0.6)
    assert rows["/web"]["mem_limit"] == pytest.approx(1024 * MIB)
    assert rows["wc"]["ooms"] == 1 and rows["/web"]["ooms"] == 0
    status, view = await get(client, "by=agent&window=600")
    assert {g["group"]: g["hostname"] for g in view["groups"]} == {"a1": "h1", "a2": "h2"}


async def test_one_group_and_the_events_that_explain_a_limit(cluster: Any) -> None:
    client, _, _ = cluster
    status, view = await get(client, "by=app&window=600&group=%2Fweb")
    assert status == 200, view
    assert view["group"] == "/web"
    points = {p[0]: p[1:] for p in view["series"]["points"]}
    assert points[T0 + 60] == pytest.approx([0.6, 2.0, 80 * MIB, 1024 * MIB])
    (moved,) = view["events"]
    assert moved["kind"] == "limit_changed" and moved["task_id"] == "web.3"
    assert (moved["cpus_before"], moved["cpus"]) == (1.0, 0.5)
    assert (moved["mem_before"], moved["mem_bytes"]) == (512 * MIB, 128 * MIB)
    status, view = await get(client, "by=role&window=600")
    assert [e["kind"] for e in view["events"]] == ["oom_kill"]
    assert view["events"][0]["group"] == "batch"


async def test_a_group_with_a_quote_is_a_literal_not_sql(cluster: Any) -> None:
    client, _, _ = cluster
    status, view = await get(client, "by=app&window=600&group=%2Fit%27s")
    assert status == 200, view
    assert [g["group"] for g in view["groups"]] == ["/it's"]
    status, view = await get(client, "by=app&window=600&group=x%27%20OR%20%271%27%3D%271")
    assert status == 200 and view["groups"] == []


@pytest.mark.parametrize("query, words", [
    ("by=user", "by must be one of"),
    ("window=10", "between 60"),
    ("window=ten", "whole number"),
    ("window=86400&bucket=10", "at most 1000 buckets"),
    ("bucket=0", "bucket must be between"),
    ("sql=SELECT%201", "unknown parameter"),
    ("group=" + "x" * 1001, "at most 1000 characters"),
])
async def test_bad_parameters_are_a_counted_400(cluster: Any, query: str, words: str) -> None:
    client, service, _ = cluster
    status, body = await get(client, query)
    assert status == 400 and words in body["error"], body
    assert service.bad_requests == 1


async def test_with_the_store_off_the_view_is_404() -> None:
    app = web.Application()
    app.add_routes(routes(lambda request: None))
    async with TestClient(TestServer(app)) as client:
        status, body = await get(client, "by=role")
    assert status == 404 and "--usage-store" in body["error"]


def test_the_bucket_follows_the_window() -> None:
    assert usage_view.parse({}).bucket == 60
    assert usage_view.parse({"window": "300"}).bucket == 10
    assert usage_view.parse({"window": "21600"}).bucket == 600
    assert usage_view.parse({"window": str(7 * 86400)}).bucket == 10800


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from((*usage_view.PARAMETERS, "sql")), st.text(max_size=12)))
def test_any_parameters_are_a_view_or_a_view_error(query: dict[str, str]) -> None:
    try:
        view = usage_view.parse(query)
    except usage_view.ViewError:
        return
    assert view.by in usage_view.DIMENSIONS and view.window / view.bucket <= usage_view.MAX_BUCKETS


@pytest.fixture(scope="module")
def engine() -> Iterator[DuckDBEngine]:
    e = DuckDBEngine(memory_limit="256MB", threads=1)
    yield e
    e.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(group=st.text(max_size=40), by=st.sampled_from(sorted(usage_view.DIMENSIONS)))
def test_any_group_is_only_ever_a_literal(engine: DuckDBEngine, group: str, by: str) -> None:
    view = usage_view.View(by=by, window=600, bucket=60, group=group)
    for sql in (usage_view.series_sql, usage_view.groups_sql, usage_view.events_sql):
        assert engine.query(sql(view, T0), 100, 5.0).rows == ()
