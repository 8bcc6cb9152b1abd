"""`python -m benchmarks.master` runs end to end on a small cluster, with the
simulated agents batching and not: nothing lost, nothing launched twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("extra", [[], ["--single-frames"]])
def test_a_small_flood_loses_nothing(extra: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.master", "--agents", "20", "--quick",
         "--workers", "1", "--timeout", "120", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lost: 0 (must be 0)" in done.stdout
    assert "duplicate launches: 0" in done.stdout
    assert "admission: offers held" in done.stdout
