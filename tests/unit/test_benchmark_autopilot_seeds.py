"""benchmarks.autopilot_seeds: seeds parsed as ranges, each seed the same figures as
benchmarks.autopilot's own run, and the pooled row the seeds' sums."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from benchmarks import autopilot, autopilot_seeds


def test_seeds_are_ranges_and_single_seeds() -> None:
    assert autopilot_seeds.seeds("3-6,9, 11-12") == [3, 4, 5, 6, 9, 11, 12]
    with pytest.raises(ValueError):
        autopilot_seeds.seeds("x")
    with pytest.raises(argparse.ArgumentTypeError):
        autopilot_seeds.seeds("5-4")


def test_each_seed_scores_as_the_benchmark_does_and_the_pool_sums_them() -> None:
    results = {}
    for seed in (1, 2):
        _, user, meta = autopilot_seeds.one(20, 1.0, seed)
        alone = autopilot.run(20, 1.0, seed, autopilot.select("meta"))
        assert (user, meta) == (alone["user"], alone["meta"])
        results[seed] = (user, meta)
    user, meta = autopilot_seeds.pool(results)
    assert meta.apps == user.apps == 40
    assert meta.oom_apps == sum(m.oom_apps for _, m in results.values())
    assert meta.mem_idle == pytest.approx(sum(m.mem_idle for _, m in results.values()))
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(autopilot_seeds.table(results, 20, 1.0))
    assert f"{meta.mem_slack:.1%} / {meta.oom_apps}" in console.export_text().split("pooled")[1]
