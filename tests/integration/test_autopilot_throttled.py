"""Throttled time as an input, on real agents: a task wanting about half a core
under a 0.1-core CFS quota (cgroups) is throttled, its samples show at most 0.1
cores, and the autopilot still recommends more than its limit, from the
throttled time the agent reports (docs/autopilot.md, "Throttled time as an
input")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.isolation import IsolationError, detect

from .conftest import wait_for
from .test_autopilot_oom import query
from .test_autopilot_service import FAST_PILOT, app_on_cluster, burner
from .test_service import services  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration



def _throttling_agents() -> bool:
    """The test cluster's agents take cgroups when they can write them (their
    default), and only cgroups enforce a CPU limit."""
    try:
        detect("cgroups", "dyad-probe")
    except IsolationError:
        return False
    return True


@pytest.mark.skipif(not _throttling_agents(), reason="no writable cgroups: nothing throttles")
async def test_a_throttled_app_is_recommended_more_than_its_limit(
        make_cluster: Any, services: Any, tmp_path: Path) -> None:  # noqa: F811
    app = {"id": "/starved", "cmd": burner(tmp_path, 0.5), "instances": 1,
           "cpus": 0.1, "mem": 64, "taskKillGracePeriodSeconds": 1,
           "autopilot": {"mode": "recommend"}}
    cluster, service = await app_on_cluster(make_cluster, services, tmp_path, 1,
                                            FAST_PILOT, app)

    def raised() -> Any:
        rec = service.get("/v2/apps/starved/recommendation")["recommendation"]
        # Capped samples alone give at most the limit plus a margin (about 0.11),
        # however many: only the throttled time can lift it past 0.15.
        return rec if rec is not None and rec["ready"] and rec["cpus"] > 0.15 else None

    await wait_for(raised, 60, "a CPU recommendation above the 0.1-core limit")
    throttled = query(cluster, "SELECT sum(cpus_throttled_secs) FROM task_usage "
                               "WHERE app = '/starved'")
    assert throttled["rows"][0][0] > 0
