"""`dyad sim fit`: the real service core answers how many more instances fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dyad.cli import main as dyad_main
from sim.cell import load_cell
from sim.fit import fit
from sim.inputs import Obj
from sim.workload import app_from_json

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def app(**body: object) -> object:
    obj = Obj({"id": "/probe", **body})
    obj.source, obj.line = "test", 1
    return app_from_json(obj)


def test_resources_alone_and_other_roles_guarantees() -> None:
    cell = load_cell(EXAMPLES / "cell.json")  # 6 x 8 cpus and 2 x 32 cpus
    result = fit(cell, app(cpus=4, mem=1024), role="prod")  # type: ignore[arg-type]
    assert result.fits == result.upper_bound == 6 * 2 + 2 * 8
    assert result.by_agent["big-1"] == 8
    # In another role, prod's unused guarantee (16 cpus) is held back from it.
    other = fit(cell, app(cpus=4, mem=1024), role="web")  # type: ignore[arg-type]
    assert other.fits == result.fits - 16 // 4


def test_constraints_are_honoured() -> None:
    cell = load_cell(EXAMPLES / "cell.json")  # racks r1-r3 on the small agents, r4 on the big
    result = fit(cell, app(cpus=1, mem=512, constraints=[["rack", "MAX_PER", "2"]]),  # type: ignore[arg-type]
                 role="prod")
    assert result.fits == 8
    assert result.unplaced.get("UnfulfilledConstraint", 0) > 0
    unique = fit(cell, app(cpus=1, mem=512, constraints=[["hostname", "UNIQUE"]]))  # type: ignore[arg-type]
    assert unique.fits == 8 and set(unique.by_agent.values()) == {1}


def test_fit_cli_after_a_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "app.json"
    path.write_text(json.dumps({"id": "/big", "cpus": 8, "mem": 8192}))
    assert dyad_main(["sim", "fit", "--cell", str(EXAMPLES / "cell.json"), "--app", str(path),
                      "--role", "prod", "--json"]) == 0
    empty = json.loads(capsys.readouterr().out)
    assert dyad_main(["sim", "fit", "--cell", str(EXAMPLES / "cell.json"), "--app", str(path),
                      "--workload", str(EXAMPLES / "workload.jsonl"), "--at", "3600", "--role", "prod", "--json"]) == 0
    busy = json.loads(capsys.readouterr().out)
    assert empty["fits"] == empty["upper_bound"] == 6 + 2 * 4
    assert busy["fits"] < empty["fits"]
    path.write_text('{"id": "/bad",\n "cpus": -1}')
    assert dyad_main(["sim", "fit", "--cell", str(EXAMPLES / "cell.json"), "--app", str(path)]) == 2
    assert "app.json:1: /cpus" in capsys.readouterr().err
