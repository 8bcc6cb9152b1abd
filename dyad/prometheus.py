"""Prometheus text exposition of a flat metrics dict (`GET /metrics`).

Masters and agents keep their figures as one flat ``{"master/tasks_running": 3}``
dict (the `/metrics/snapshot` document); this module renders the same figures in
Prometheus' text format with `prometheus_client`, so both endpoints always agree.

Naming: ``dyad_`` plus the key with every character Prometheus does not allow
turned into ``_`` (``master/tasks_running`` -> ``dyad_master_tasks_running``).
Per-role keys (``allocator/roles/<role>/shares/dominant``) become one family with
a ``role`` label, because role names (``eng/ml``) would not survive as names.

Limits: every figure is exposed as a gauge. The snapshot does not say which keys
are monotonic counters, and `rate()` works on a gauge that only grows, so nothing
is lost for dashboards; only the `# TYPE` line differs from a hand-typed exporter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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

    def __init__(self, figures: Mapping[str, float]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        labelled: dict[str, GaugeMetricFamily] = {}
        plain: dict[str, GaugeMetricFamily] = {}
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
                plain[name] = GaugeMetricFamily(name, key, value=value)
        yield from plain.values()
        yield from labelled.values()


def render(figures: Mapping[str, float]) -> bytes:
    """`figures` (a `/metrics/snapshot` dict) as Prometheus text, version 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(figures))
    return generate_latest(registry)
