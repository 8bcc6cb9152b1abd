"""Autopilot end to end: real agents measure an app that declares far more memory
than it uses, the master's usage store keeps the samples, `dyad-service` reads them
back, recommends, and (in `auto`) right-sizes the app by a rolling upgrade that
never drops below the app's healthy-capacity bound. Windows are shortened through
the real flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dyad.local import PROJECT_ROOT

from .conftest import wait_for
from .test_service import Service, services  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

FAT = {"id": "/fat", "cmd": "sleep 600", "instances": 2, "cpus": 0.2, "mem": 512,
       "upgradeStrategy": {"minimumHealthCapacity": 0.5, "maximumOverCapacity": 0.5},
       "taskKillGracePeriodSeconds": 1, "autopilot": {"mode": "auto", "min": {"mem": 64}}}
FAST_PILOT = ["--autopilot-step", "1s", "--autopilot-warmup", "4s",
              "--autopilot-min-samples", "10"]


def burner(tmp_path: Path, share: float) -> str:
    """The command of a task using about `share` of a core: busy that share of
    every 100 ms."""
    script = tmp_path / f"burn-{share:g}.py"
    script.write_text(f"""import time
while True:
    t = time.monotonic()
    while time.monotonic() - t < {0.1 * share!r}:
        pass
    time.sleep({0.1 * (1 - share)!r})
""")
    return f"{sys.executable} {script}"


async def app_on_cluster(make_cluster: Any, services: Any, tmp_path: Path, agents: int,
                         pilot_flags: list[str], app: dict[str, Any]) -> tuple[Any, Service]:
    """A cluster whose agents report usage twice a second, a `dyad-service` with
    these autopilot flags, and `app` created on it."""
    cluster = make_cluster(agents=agents, resources="cpus:2;mem:2048;disk:1000",
                           agent_args=["--usage-report-interval", "0.5s"])
    service: Service = await services("pilot", "--master", cluster.master_address,
                                      "--work-dir", str(tmp_path / "state"),
                                      *pilot_flags).started()
    status, created = service.call("POST", "/v2/apps", app)
    assert status == 201, created
    return cluster, service


async def test_an_over_declared_app_is_recommended_less_and_right_sized(
        make_cluster: Any, services: Any, tmp_path: Path) -> None:  # noqa: F811
    _, service = await app_on_cluster(make_cluster, services, tmp_path, 2, FAST_PILOT, FAT)

    def recommended() -> Any:
        rec = service.get("/v2/apps/fat/recommendation")["recommendation"]
        return rec if rec is not None and rec["ready"] else None

    rec = await wait_for(recommended, 60, "a recommendation from measured usage")
    assert rec["mem"] <= 128 and rec["samples"] >= 10 and rec["reasons"]

    # The upgrade rolls within the strategy: never fewer than 1 of 2 running.
    fewest = 2

    def right_sized() -> bool:
        nonlocal fewest
        app = service.app("/fat")
        if app["mem"] < 512:
            fewest = min(fewest, app["tasksRunning"])
        return app["mem"] <= 128 and not app["deployments"] and app["tasksRunning"] == 2 \
            and all(t["version"] == app["versionInfo"]["lastConfigChangeAt"]
                    for t in app["tasks"])

    await wait_for(right_sized, 90, "the right-sized tasks")
    assert fewest >= 1
    metrics = service.get("/metrics")["counters"]
    assert metrics["autopilot_upgrades"] == 1 and metrics["autopilot_samples"] >= 10

    # The master's store saw the same tasks; the CLI prints current vs recommended.
    shown = subprocess.run(
        [sys.executable, "-m", "dyad.cli", "apps", "--service", service.url, "recommend",
         "/fat"], capture_output=True, text=True, timeout=20,
        env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
    assert shown.returncode == 0, shown.stderr
    assert "recommended" in shown.stdout and "mem (MiB)" in shown.stdout


async def test_a_new_leader_reads_the_evidence_back_from_the_store(
        make_cluster: Any, services: Any, tmp_path: Path) -> None:  # noqa: F811
    """The autopilot's evidence lives in memory; a restarted `dyad-service` reads the
    last `--autopilot-history` of samples back from the master's store, so an app
    with a day of evidence is not sent back through its warmup by a failover."""
    flags = ["--autopilot-step", "1s", "--autopilot-warmup", "20s",
             "--autopilot-min-samples", "10"]
    thin = {"id": "/thin", "cmd": "sleep 600", "instances": 1, "cpus": 0.2, "mem": 256,
            "taskKillGracePeriodSeconds": 1, "autopilot": {"mode": "recommend"}}
    cluster, first = await app_on_cluster(make_cluster, services, tmp_path, 1, flags, thin)

    def ready(service: Service) -> Any:
        rec = service.get("/v2/apps/thin/recommendation")["recommendation"]
        return rec if rec is not None and rec["ready"] else None

    before = await wait_for(lambda: ready(first), 60, "evidence over the 20 s warmup")
    first.stop(signal.SIGKILL)
    restarted_at = time.monotonic()
    argv = ["--master", cluster.master_address, "--work-dir", str(tmp_path / "state"), *flags]
    second = await services("second", *argv).started()
    after = await wait_for(lambda: ready(second), 15,
                           "a recommendation sooner than a fresh warmup allows")
    # Fresh evidence could not be ready within the 20 s warmup of the restart.
    assert time.monotonic() - restarted_at < 20
    assert after["samples"] >= before["samples"]
    assert second.get("/metrics")["counters"]["autopilot_samples"] >= before["samples"]
