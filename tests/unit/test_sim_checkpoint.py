"""Checkpoints: a master's /state saved, then replayed as a cell and its live tasks."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dyad.cli import main as dyad_main
from sim.checkpoint import FORMAT, load_start
from sim.policy import Policy
from sim.run import Simulation
from tests.unit.test_sim_runs import cell, simulate, tasks


def snapshot_of_a_run(tmp_path: Path) -> dict[str, Any]:
    simulation, _ = simulate(
        tmp_path, cell({"name": "n", "count": 3, "resources": "cpus:4;cpus(prod):2;mem:4096",
                        "attributes": {"rack": ["r1", "r2"]}},
                       roles={"prod": {"weight": 3, "quota": {"guarantee": {"cpus": 2}}}}),
        [tasks("A", "a", 5, 1, 512, duration=1e6, usage={"cpus": 0.25}),
         tasks("P", "prod", 2, 1, 256, duration=1e6), {"kind": "end", "at": 120}],
        Policy(usage_report_interval=10))
    return {"format": FORMAT, "master": "http://sim", "state": simulation.master.state.snapshot()}


def test_replay_keeps_agents_roles_and_live_tasks_where_they_were(tmp_path: Path) -> None:
    document = snapshot_of_a_run(tmp_path)
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(document))
    replay_cell, workload = load_start(path, None)
    assert [g.name for g in replay_cell.groups] == ["n-1", "n-2", "n-3"]
    assert str(replay_cell.groups[0].resources) == "cpus:4;cpus(prod):2;mem:4096"
    assert replay_cell.groups[1].attributes == {"rack": "r2"}
    assert replay_cell.weights == {"prod": 3.0}
    assert replay_cell.quota["prod"].guarantee == {"cpus": 2000}
    assert len(workload.arrivals) == 7
    where = {}
    for framework in document["state"]["frameworks"]:
        hosts = {a["id"]: a["hostname"] for a in document["state"]["agents"]}
        for task in framework["tasks"]:
            where.setdefault(framework["name"], []).append(hosts[task["agent_id"]])
    simulation = Simulation(replay_cell, workload, Policy(until=60), seed=0)
    report = simulation.run()
    assert report["tasks"]["running_at_end"] == 7
    replayed: dict[str, list[str]] = {}
    state = simulation.master.state.snapshot()
    hosts = {a["id"]: a["hostname"] for a in state["agents"]}
    for framework in state["frameworks"]:
        for task in framework["tasks"]:
            replayed.setdefault(framework["name"].removeprefix("checkpoint:"), []).append(
                hosts[task["agent_id"]])
    assert {k: sorted(v) for k, v in replayed.items()} == {k: sorted(v) for k, v in where.items()}
    # The usage the agents last reported comes along.
    assert report["utilization"]["cpus"]["used"] < report["utilization"]["cpus"]["allocated"]


class _State(BaseHTTPRequestHandler):
    document: dict[str, Any] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps(self.document["state"]).encode()
        self.send_response(200 if self.path == "/state" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_checkpoint_command_saves_and_run_replays(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _State.document = snapshot_of_a_run(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _State)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = tmp_path / "saved.json"
        assert dyad_main(["checkpoint", "save", "--master",
                          f"127.0.0.1:{server.server_port}", str(out)]) == 0
        # The older spelling is kept as an alias.
        alias = tmp_path / "alias.json"
        assert dyad_main(["sim", "checkpoint", "--master", f"127.0.0.1:{server.server_port}",
                          "--out", str(alias)]) == 0
        assert json.loads(alias.read_text()) == json.loads(out.read_text())
    finally:
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().out.count("3 agents, 2 frameworks, 7 live tasks") == 2
    assert json.loads(out.read_text())["format"] == FORMAT
    assert dyad_main(["sim", "run", "--cell", str(out), "--out", str(tmp_path / "run"),
                      "--quiet", "--no-plots"]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["tasks"]["running_at_end"] == 7
    assert dyad_main(["checkpoint", "save", "--master", "127.0.0.1:1", str(out)]) == 2
    assert "dyad checkpoint: " in capsys.readouterr().err
