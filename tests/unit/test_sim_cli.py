"""`dyad sim run` and `dyad sim compare` end to end, and byte-identical reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dyad.cli import main as dyad_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "sim"


def run_cli(out: Path, hash_seed: str, seed: int = 3) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run(
        [sys.executable, "-m", "dyad.cli", "sim", "run", "--cell", str(EXAMPLES / "cell.json"),
         "--workload", str(EXAMPLES / "workload.jsonl"), "--policy", str(EXAMPLES / "policy.json"),
         "--seed", str(seed), "--out", str(out), "--no-plots"],
        env=env, capture_output=True, text=True, timeout=300, check=False)


def test_two_runs_give_identical_report_bytes(tmp_path: Path) -> None:
    """Different processes and hash seeds: the report depends only on the inputs."""
    first = run_cli(tmp_path / "a", "1")
    second = run_cli(tmp_path / "b", "2")
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    report = (tmp_path / "a" / "report.json").read_bytes()
    assert report == (tmp_path / "b" / "report.json").read_bytes()
    timing = json.loads((tmp_path / "a" / "timing.json").read_text())
    assert timing["simulated_seconds"] == 7200 and timing["speed"] > 0
    assert "simulated 2.00 h" in first.stdout
    parsed = json.loads(report)
    assert parsed["jobs"]["succeeded"] >= 2
    assert parsed["simulator"].get("agents/rejected", 0) == 0


def test_run_writes_plots_and_compare_prints_both(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for name, seed in (("a", "1"), ("b", "2")):
        code = dyad_main(["sim", "run", "--cell", str(EXAMPLES / "cell.json"),
                          "--workload", str(EXAMPLES / "workload.jsonl"), "--seed", seed,
                          "--out", str(tmp_path / name), "--quiet"])
        assert code == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "pending.png", "report.json", "shares.png", "summary.txt", "timing.json",
        "utilization.png"]
    assert dyad_main(["sim", "compare", str(tmp_path / "a"), str(tmp_path / "b" / "report.json")]) == 0
    out = capsys.readouterr().out
    assert "cpus allocated (mean fraction)" in out and "jobs succeeded" in out


def test_bad_input_exits_2_with_file_and_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cell = tmp_path / "cell.json"
    cell.write_text('{"agent_groups": [{"name": "a", "resources": "cpus:1"}]}')
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"kind": "end", "at": 10}\n{"kind": "job", "at": 1}\n')
    args = ["sim", "run", "--cell", str(cell), "--workload", str(workload),
            "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]
    assert dyad_main([*args, "--strict"]) == 2
    assert f"{workload}:2: 'name' is required" in capsys.readouterr().err
    assert dyad_main(args) == 0  # lenient: skipped and said so
    assert f"skipped {workload}:2" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "report.json").read_text())["inputs"][
        "workload_records_skipped"] == 1
    assert dyad_main(["sim", "compare", str(cell), str(cell)]) == 2
