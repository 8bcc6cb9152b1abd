"""The horizontal-sizing benchmark's world and scoring (benchmarks/horizontal.py)."""

from __future__ import annotations

import math
import random

from benchmarks import horizontal as bench


def test_a_short_run_is_deterministic_and_damping_cuts_reversals() -> None:
    models = bench.apps(2, 0.1, seed=3, warm_in=3600.0)
    scores = {name: bench.replay(models, 0.1, config, seed=3, warm_in=3600.0)
              for name, config in bench.APPROACHES.items()}
    assert scores["default"] == bench.replay(models, 0.1, bench.APPROACHES["default"], seed=3,
                                             warm_in=3600.0)
    assert scores["fixed"].changes == 0
    assert scores["undamped"].reversals > scores["default"].reversals
    assert scores["undamped"].changes > scores["default"].changes
    for score in scores.values():  # the same week for every approach
        assert score.demand == scores["fixed"].demand
        assert score.ideal_seconds == scores["fixed"].ideal_seconds
        assert 0 <= score.throttled <= score.demand
        assert 0 < score.served <= score.capacity


def test_the_ideal_count_is_the_load_at_the_target_within_the_bounds() -> None:
    (app,) = bench.apps(1, 1, seed=1)
    per_task = bench.TARGET * app.cpus
    assert app.ideal(2.5 * per_task) == 3
    assert app.ideal(0.0) == app.spec.min
    assert app.ideal(1e9) == app.spec.max
    assert app.spec.max == math.ceil(3 * app.base * (1 + app.amp) / per_task)
    load = app.load(bench.DAY / 4, random.Random(1))
    assert load > 0
