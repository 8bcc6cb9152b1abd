"""`dyad.prometheus` and the `/metrics` routes: the same figures as
`/metrics/snapshot`, in text that prometheus_client's own parser reads back."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agent.http import make_app as agent_app
from agent.metrics import COUNTERS as AGENT_COUNTERS, GAUGES as AGENT_GAUGES
from agent.model import AgentConfig
from agent.server import AgentServer
from dyad.messages import TaskState
from dyad.resources import Resources
from dyad import prometheus
from master.http import make_app as master_app
from master.metrics import COUNTERS, GAUGES, HISTOGRAMS, Histogram
from master.model import AllocationTimed
from tests.unit.test_events import HttpView
from tests.unit.test_master_state import Harness


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_names_and_role_labels() -> None:
    text = prometheus.render({"master/tasks_running": 3, "agent/fetcher-cache.bytes": 1.5,
                              "allocator/roles/eng/ml/shares/dominant": 0.25,
                              "allocator/roles/*/shares/dominant": 0.5}).decode()
    assert parse(text) == {
        ("dyad_master_tasks_running", ()): 3.0,
        ("dyad_agent_fetcher_cache_bytes", ()): 1.5,
        ("dyad_allocator_role_dominant_share", (("role", "eng/ml"),)): 0.25,
        ("dyad_allocator_role_dominant_share", (("role", "*"),)): 0.5,
    }
    assert "# TYPE dyad_master_tasks_running gauge" in text


def test_keys_that_collide_are_an_error_not_a_silent_loss() -> None:
    with pytest.raises(ValueError, match="both map to dyad_a_b"):
        prometheus.render({"a/b": 1, "a.b": 2})


@given(st.dictionaries(st.from_regex(r"[a-z]{1,8}(/[a-z_]{1,8}){0,2}", fullmatch=True),
                       st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10**9, 10**9)))
def test_every_figure_survives_the_round_trip(figures: dict[str, float]) -> None:
    parsed = parse(prometheus.render(figures).decode())
    assert parsed == {(prometheus.metric_name(k), ()): float(v) for k, v in figures.items()}


async def test_master_metrics_route_matches_the_snapshot() -> None:
    harness = Harness()
    harness.register("a1")
    harness.subscribe("d1")
    harness.allocate()
    async with TestClient(TestServer(master_app(HttpView(harness)))) as client:
        snapshot = await (await client.get("/metrics/snapshot")).json()
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        parsed = parse(await response.text())
    plain = {k: v for k, v in snapshot.items() if not k.startswith("allocator/roles/")}
    assert {(prometheus.metric_name(k) + ("_total" if k in COUNTERS else ""), ()): float(v)
            for k, v in plain.items()}.items() <= parsed.items()
    assert parsed[("dyad_allocator_role_dominant_share", (("role", "*"),))] == \
        snapshot["allocator/roles/*/shares/dominant"]
    assert parsed[("dyad_master_agents_active", ())] == 1


def test_master_metrics_are_typed_and_described() -> None:
    """Counters are counters (`_total`), gauges gauges, latencies histograms; every
    HELP says what the figure measures, not its name."""
    harness = Harness()
    harness.register("a1")
    harness.subscribe("d1")
    harness.allocate()
    for seconds in (0.0002, 0.003, 0.003, 7.0):
        harness.handle(AllocationTimed(seconds))
    figures = harness.state.metrics()
    assert set(figures) - {k for k in figures if k.startswith("allocator/roles/")} \
        <= set(COUNTERS) | set(GAUGES), "every master figure needs a catalogue entry"
    text = prometheus.render(figures, {
        **{k: prometheus.MetricInfo(prometheus.COUNTER, h) for k, h in COUNTERS.items()},
        **{k: prometheus.MetricInfo(prometheus.GAUGE, h) for k, h in GAUGES.items()}},
        {"allocator/allocation_run_seconds": figures_of(harness.state.allocation_seconds)}
    ).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for key, help_text in COUNTERS.items():
        family = families[prometheus.metric_name(key)]
        assert (family.type, family.documentation) == ("counter", help_text), key
        assert [s.name for s in family.samples] == [prometheus.metric_name(key) + "_total"]
    for key in set(GAUGES) & set(figures):
        assert families[prometheus.metric_name(key)].type == "gauge", key
        assert families[prometheus.metric_name(key)].documentation == GAUGES[key]
    assert families["dyad_allocator_role_dominant_share"].type == "gauge"
    latency = families["dyad_allocator_allocation_run_seconds"]
    assert latency.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in latency.samples}
    assert samples[("dyad_allocator_allocation_run_seconds_bucket", "0.0005")] == 1
    assert samples[("dyad_allocator_allocation_run_seconds_bucket", "0.005")] == 3
    assert samples[("dyad_allocator_allocation_run_seconds_bucket", "+Inf")] == 4
    assert samples[("dyad_allocator_allocation_run_seconds_count", None)] == 4
    assert samples[("dyad_allocator_allocation_run_seconds_sum", None)] == pytest.approx(7.0062)
    for family in families.values():
        assert family.documentation and family.documentation != family.name


def figures_of(histogram: Histogram) -> prometheus.HistogramFigures:
    return prometheus.HistogramFigures(help=HISTOGRAMS["allocator/allocation_run_seconds"],
                                       buckets=histogram.cumulative(), total=histogram.total,
                                       count=histogram.count)


def test_histogram_buckets_are_cumulative_and_bounds_checked() -> None:
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 3.0):
        histogram.add(value)
    assert histogram.cumulative() == [(1.0, 2), (2.0, 3)]
    assert (histogram.count, histogram.total) == (4, 6.0)
    with pytest.raises(ValueError):
        Histogram((2.0, 1.0))
    with pytest.raises(ValueError):
        prometheus.MetricInfo("summary", "x")


class _AgentSource:
    """Only what `/metrics` reads from the agent's StateSource."""

    def metrics(self) -> dict[str, Any]:
        return {"agent/tasks_running": 2, "agent/registered": 1}


async def test_agent_metrics_are_typed_and_described(tmp_path: Any) -> None:
    """The agent's `/metrics`, from a real (unstarted) AgentServer: every figure is
    catalogued, counters are `_total`, HELP says what is measured."""
    server = AgentServer(AgentConfig(hostname="localhost", ip="127.0.0.1", port=0,
                                     executor_port=0, work_dir=str(tmp_path),
                                     resources=Resources.parse("cpus:1;mem:64"),
                                     python=sys.executable, isolation="posix"),
                         master="127.0.0.1:1")
    for state in TaskState:  # every per-state counter the core can make
        if state.is_terminal:
            server.state.counters[f"tasks_{state.name.removeprefix('TASK_').lower()}"] += 1
    figures = server.metrics()
    assert set(figures) <= set(AGENT_COUNTERS) | set(AGENT_GAUGES), \
        "every agent figure needs a catalogue entry in agent/metrics.py"
    async with TestClient(TestServer(agent_app(server, str(tmp_path)))) as client:
        text = await (await client.get("/metrics")).text()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) == {prometheus.metric_name(key) for key in figures}
    for key in figures:
        family = families[prometheus.metric_name(key)]
        if key in AGENT_COUNTERS:
            assert (family.type, family.documentation) == ("counter", AGENT_COUNTERS[key])
            assert [s.name for s in family.samples] == [prometheus.metric_name(key) + "_total"]
        else:
            assert (family.type, family.documentation) == ("gauge", AGENT_GAUGES[key])
        assert family.samples[0].value == figures[key]


async def test_agent_metrics_route(tmp_path: Any) -> None:
    async with TestClient(TestServer(agent_app(_AgentSource(), str(tmp_path)))) as client:  # type: ignore[arg-type]
        parsed = parse(await (await client.get("/metrics")).text())
    assert parsed == {("dyad_agent_tasks_running", ()): 2.0, ("dyad_agent_registered", ()): 1.0}
