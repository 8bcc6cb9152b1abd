"""Horizontal sizing end to end: real agents measure an app whose tasks each use
about 0.3 cores against a 0.2-core limit (posix agents measure it; cgroups agents
hold it at 0.2 and report the throttled time, which counts as demand),
the master's usage store keeps the samples, `dyad-service` reads them back and
scales the app up to its horizontal `max` at once. Vertical sizing is kept out of
the way by a long warmup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import wait_for
from .test_autopilot_service import app_on_cluster, burner
from .test_service import services  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration



async def test_a_busy_app_is_scaled_up_to_its_max(make_cluster: Any, services: Any,
                                                   tmp_path: Path) -> None:  # noqa: F811
    app = {"id": "/busy", "cmd": burner(tmp_path, 0.3), "instances": 2, "cpus": 0.2,
           "mem": 64, "taskKillGracePeriodSeconds": 1,
           "autopilot": {"mode": "auto", "horizontal": {"target": 0.5, "min": 1, "max": 3}}}
    _, service = await app_on_cluster(
        make_cluster, services, tmp_path, 2,
        ["--autopilot-step", "1s", "--autopilot-warmup", "1h"], app)

    def scaled() -> bool:
        found = service.app("/busy")
        return found["instances"] == 3 and found["tasksRunning"] == 3

    await wait_for(scaled, 90, "the scale-up to the max")
    rec = service.get("/v2/apps/busy/recommendation")["recommendation"]
    assert rec["instances"]["recommended"] == 3 and rec["instances"]["ready"]
    assert service.app("/busy")["cpus"] == 0.2  # the limits were not touched
    metrics = service.get("/metrics")["counters"]
    assert metrics["autopilot_scales"] == 1
