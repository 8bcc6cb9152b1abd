"""Prometheus text exposition of a flat metrics dict (`GET /metrics`).

Masters and agents keep their figures as one flat ``{"master/tasks_running": 3}``
dict (the `/metrics/snapshot` document); this module renders the same figures in
Prometheus' text format with `prometheus_client`, so both endpoints always agree.

Naming: ``dyad_`` plus the key with every character Prometheus does not allow
turned into ``_`` (``master/tasks_running`` -> ``dyad_master_tasks_running``).
Per-role keys (``allocator/roles/<role>/shares/dominant``) become one family with
a ``role`` label, because role names (``eng/ml``) would not survive as names.

Types: the snapshot does not say which keys are monotonic counters, so a caller
passes a catalogue (`MetricInfo` by key: counter or gauge, and a HELP line that
says what it measures). A counter is exposed as Prometheus' ``<name>_total``; a
key missing from the catalogue is a gauge whose HELP is the key. Latencies come
as `HistogramFigures` (cumulative buckets, sum, count) beside the flat figures.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COUNTER = "counter"
GAUGE = "gauge"


@attrs.frozen
class MetricInfo:
    """What one snapshot key is: `kind` (COUNTER or GAUGE) and its HELP text."""

    kind: str
    help: str

    def __attrs_post_init__(self) -> None:
        if self.kind not in (COUNTER, GAUGE):
            raise ValueError(f"a metric is a {COUNTER} or a {GAUGE}, not {self.kind!r}")


def catalogue(counters: Mapping[str, str], gauges: Mapping[str, str]) -> dict[str, MetricInfo]:
    """A catalogue from HELP texts by key, one mapping per kind."""
    return {**{key: MetricInfo(COUNTER, text) for key, text in counters.items()},
            **{key: MetricInfo(GAUGE, text) for key, text in gauges.items()}}


@attrs.frozen
class HistogramFigures:
    """A histogram's exposition: `buckets` as (upper bound, cumulative count) in
    increasing order (the +Inf bucket is `count`), `total` the sum of samples."""

    help: str
    buckets: Sequence[tuple[float, int]]
    total: float
    count: int

_INVALID = re.compile(r"[^a-zA-Z0-9_]")
# Keys carrying a label value in the middle: (pattern, family name, label, help).
_LABELLED = ((re.compile(r"^allocator/roles/(?P<value>.+)/shares/dominant$"),
              "dyad_allocator_role_dominant_share", "role",
              "allocator/roles/<role>/shares/dominant: the role subtree's dominant share"),)


def metric_name(key: str) -> str:
    """The Prometheus name for a snapshot key without a label."""
    return "dyad_" + _INVALID.sub("_", key)


class _SnapshotCollector:
    """A one-shot collector over a fixed dict (prometheus_client's Collector API)."""

    def __init__(self, figures: Mapping[str, float], catalogue: Mapping[str, MetricInfo],
                 histograms: Mapping[str, HistogramFigures]) -> None:
        self._figures = figures
        self._catalogue = catalogue
        self._histograms = histograms

    def collect(self) -> Iterator[Metric]:
        labelled: dict[str, GaugeMetricFamily] = {}
        plain: dict[str, Metric] = {}
        for key in sorted(self._figures):
            value = float(self._figures[key])
            for pattern, family, label, help_text in _LABELLED:
                match = pattern.match(key)
                if match:
                    if family not in labelled:
                        labelled[family] = GaugeMetricFamily(family, help_text, labels=[label])
                    labelled[family].add_metric([match["value"]], value)
                    break
            else:
                name = metric_name(key)
                if name in plain:  # two keys differing only in forbidden characters
                    raise ValueError(f"metrics {key!r} and another key both map to {name}")
                info = self._catalogue.get(key)
                if info is not None and info.kind == COUNTER:
                    plain[name] = CounterMetricFamily(name, info.help, value=value)
                else:
                    plain[name] = GaugeMetricFamily(name, info.help if info else key, value=value)
        for key in sorted(self._histograms):
            figures = self._histograms[key]
            name = metric_name(key)
            if name in plain:
                raise ValueError(f"histogram {key!r} and another key both map to {name}")
            buckets = [(_bound(le), count) for le, count in figures.buckets]
            plain[name] = HistogramMetricFamily(
                name, figures.help, buckets=[*buckets, ("+Inf", figures.count)],
                sum_value=figures.total)
        yield from plain.values()
        yield from labelled.values()


def _bound(le: float) -> str:
    return repr(float(le))


def render(figures: Mapping[str, float], catalogue: Mapping[str, MetricInfo] | None = None,
           histograms: Mapping[str, HistogramFigures] | None = None) -> bytes:
    """`figures` (a `/metrics/snapshot` dict), typed and described by `catalogue`,
    and `histograms`, as Prometheus text, version 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(figures, catalogue or {}, histograms or {}))
    return generate_latest(registry)
