"""The simulator on small cells: exact outcomes through the real cores."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

from dyad.messages import TaskState
from sim.cell import load_cell
from sim.engine import Engine
from sim.policy import Policy
from sim.run import Simulation
from sim.workload import load_workload


def simulate(tmp_path: Path, cell: dict[str, Any], records: list[dict[str, Any]],
             policy: Policy | None = None, seed: int = 0) -> tuple[Simulation, dict[str, Any]]:
    (tmp_path / "cell.json").write_text(json.dumps(cell))
    (tmp_path / "w.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    workload, skipped = load_workload(tmp_path / "w.jsonl")
    assert not skipped
    simulation = Simulation(load_cell(tmp_path / "cell.json"), workload, policy or Policy(),
                            seed=seed)
    report = simulation.run()
    simulation.master.state.validate()
    assert report["simulator"].get("agents/rejected", 0) == 0
    assert report["simulator"]["frameworks/driver_errors"] == 0
    return simulation, report


def cell(*groups: dict[str, Any], roles: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "test", "agent_groups": list(groups), "roles": roles or {}}


def tasks(framework: str, role: str, count: int, cpus: float, mem: float,
          duration: float = 1000.0, at: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"kind": "tasks", "at": at, "framework": framework, "role": role, "count": count,
            "task": {"cpus": cpus, "mem": mem, "duration": duration, **extra}}


def role_allocation(simulation: Simulation) -> dict[str, dict[str, float]]:
    return {r["name"]: r["allocated"] for r in simulation.master.state.roles_json()}


def live_tasks(simulation: Simulation) -> list[dict[str, Any]]:
    return [t for f in simulation.master.state.snapshot()["frameworks"] for t in f["tasks"]]


def test_drf_example_from_the_paper(tmp_path: Path) -> None:
    """Ghodsi et al. (NSDI 2011): 9 CPUs and 18 GB; A runs <1 CPU, 4 GB> tasks,
    B <3 CPUs, 1 GB>. DRF gives A three tasks and B two: both at share 2/3."""
    simulation, report = simulate(
        tmp_path, cell({"name": "a", "resources": "cpus:9;mem:18432"}),
        [tasks("A", "a", 10, 1, 4096), tasks("B", "b", 10, 3, 1024), {"kind": "end", "at": 300}])
    assert role_allocation(simulation) == {"a": {"cpus": 3.0, "mem": 12288.0},
                                           "b": {"cpus": 6.0, "mem": 2048.0}}
    shares = report["series"]["dominant_shares"]
    assert shares["a"][-1] == shares["b"][-1] == 0.666667
    assert report["tasks"]["running_at_end"] == 5


def test_weights_scale_shares(tmp_path: Path) -> None:
    """Weight 2 for b: b's weighted share is half its raw share, so b gets twice
    the cpus of a on identical tasks."""
    simulation, _ = simulate(
        tmp_path, cell({"name": "a", "count": 6, "resources": "cpus:1;mem:1024"},
                       roles={"b": {"weight": 2}}),
        [tasks("A", "a", 6, 1, 512), tasks("B", "b", 6, 1, 512), {"kind": "end", "at": 300}])
    assert role_allocation(simulation)["a"]["cpus"] == 2.0
    assert role_allocation(simulation)["b"]["cpus"] == 4.0


def test_quota_guarantee_is_held_for_a_late_role_and_a_limit_caps(tmp_path: Path) -> None:
    """prod is guaranteed 6 of 10 cpus: batch, arriving first and wanting all,
    gets only the 4 nobody is guaranteed; prod arrives later and gets its 6.
    research is limited to 1 cpu however much is free."""
    simulation, report = simulate(
        tmp_path, cell({"name": "n", "count": 12, "resources": "cpus:1;mem:1024"},
                       roles={"prod": {"quota": {"guarantee": {"cpus": 6}}},
                              "research": {"quota": {"limit": {"cpus": 1}}}}),
        [tasks("batch", "batch", 10, 1, 256), tasks("research", "research", 5, 1, 256),
         tasks("prod", "prod", 6, 1, 256, at=100), {"kind": "end", "at": 400}])
    allocated = role_allocation(simulation)
    assert allocated["prod"]["cpus"] == 6.0
    assert allocated["research"]["cpus"] == 1.0
    assert allocated["batch"]["cpus"] == 5.0  # 12 - 6 guaranteed - 1 research
    assert report["pending_seconds"]["batch"]["count"] == 6 + 5 + 1


def test_service_constraint_unique_hostname(tmp_path: Path) -> None:
    """The real service core: UNIQUE hostname puts at most one task per agent."""
    simulation, report = simulate(
        tmp_path, cell({"name": "n", "count": 3, "resources": "cpus:8;mem:8192"}),
        [{"kind": "app", "at": 0, "role": "prod",
          "app": {"id": "/db", "instances": 5, "cpus": 1, "mem": 1024,
                  "constraints": [["hostname", "UNIQUE"]]}},
         {"kind": "end", "at": 300}])
    hosts = sorted(t["agent_id"] for t in live_tasks(simulation))
    assert len(hosts) == 3 and len(set(hosts)) == 3
    assert report["tasks"]["running_at_end"] == 3
    assert report["pending_seconds"]["production"]["count"] == 3


def test_batch_job_runs_to_completion(tmp_path: Path) -> None:
    """The real batch core: every map, then the reduce, then teardown."""
    _, report = simulate(
        tmp_path, cell({"name": "n", "count": 2, "resources": "cpus:4;mem:8192"}),
        [{"kind": "job", "at": 0, "name": "wc", "role": "batch", "maps": 6, "reduces": 1,
          "map": {"cpus": 1, "mem": 1024, "duration": 60},
          "reduce": {"cpus": 1, "mem": 1024, "duration": 30}}])
    assert report["jobs"] == {"succeeded": 1, "failed": 0, "unfinished": 0, "failures": {}}
    assert report["tasks"]["by_final_state"] == {"TASK_FINISHED": 7}
    assert report["span"]["stopped"] == "workload done"
    pending = report["pending_seconds"]["batch"]
    assert pending["count"] == 7
    # Maps 0-5 fit at once (2 agents x 4 cpus less two executors): they wait only for
    # the first offer; the reduce waits for no slot once the last map ended.
    assert pending["max"] < 2.0


def test_memory_over_the_limit_is_an_oom(tmp_path: Path) -> None:
    _, report = simulate(
        tmp_path, cell({"name": "n", "resources": "cpus:4;mem:4096"}),
        [tasks("g", "r", 2, 1, 1024, duration=100,
               usage={"mem": {"steps": [[0, 500], [30, 2000]]}})])
    assert report["tasks"]["by_final_state"] == {TaskState.TASK_FAILED.name: 2}
    assert report["tasks"]["ooms"] == 2


def test_usage_below_allocation_is_slack(tmp_path: Path) -> None:
    _, report = simulate(
        tmp_path, cell({"name": "n", "resources": "cpus:10;mem:10240"}),
        [tasks("g", "r", 5, 2, 2048, duration=1e6, usage={"cpus": {"fraction": 0.25}}),
         {"kind": "end", "at": 3600}])
    cpus = report["utilization"]["cpus"]
    assert cpus["peak_allocated"] == 1.0
    assert cpus["peak_used"] == 0.25
    final = report["series"]["fractions"]["cpus"]
    assert final["slack"][-1] == 0.75


def test_same_seed_same_report_different_seed_different_draws(tmp_path: Path) -> None:
    records = [tasks("g", "r", 20, 1, 512, duration={"exp": 100}, fail=0.3)]
    spec = cell({"name": "n", "count": 2, "resources": "cpus:4;mem:4096"})
    _, first = simulate(tmp_path, spec, records, seed=7)
    _, second = simulate(tmp_path, spec, records, seed=7)
    _, other = simulate(tmp_path, spec, records, seed=8)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["span"] != other["span"] or first["tasks"] != other["tasks"]


def test_example_keeps_the_masters_books_straight_after_every_event() -> None:
    """The example cell and workload (every kind of record) with the master's
    invariants checked after each of its events, through the codec."""
    from sim.policy import load_policy
    examples = Path(__file__).resolve().parents[2] / "examples" / "sim"
    workload, _ = load_workload(examples / "workload.jsonl")
    policy = load_policy(examples / "policy.json")
    simulation = Simulation(load_cell(examples / "cell.json"), workload,
                            attrs.evolve(policy, until=3600), seed=5, validate=True)
    report = simulation.run()
    assert report["simulator"]["wire_bytes"] > 0
    assert report["simulator"].get("agents/rejected", 0) == 0
    assert report["master"]["master/messages_rejected"] == 0
    assert report["jobs"]["succeeded"] >= 1


def test_acknowledgements_of_one_instant_travel_together(tmp_path: Path, monkeypatch: Any
                                                         ) -> None:
    """Four tasks launched on one agent at once start at one instant: their
    TASK_STARTING updates are acknowledged in one `Acknowledgements`, forwarded
    as one `StatusUpdateAcks`, and every stream still moves on (no retry, no
    stale ack), as one by one."""
    sent: Counter[str] = Counter()
    send = Engine.send

    def counting(engine: Engine, sender: str, to: str, message: Any) -> None:
        sent[type(message).__name__] += 1
        send(engine, sender, to, message)

    monkeypatch.setattr(Engine, "send", counting)
    _, report = simulate(tmp_path, cell({"name": "a", "resources": "cpus:4;mem:4096"}),
                         [{**tasks("A", "a", 4, 1, 512, duration=10), "per_offer": 4},
                          {"kind": "end", "at": 300}])
    assert sent["Acknowledgements"] >= 1 and sent["StatusUpdateAcks"] >= 1
    assert sent["StatusUpdate"] == 12  # starting, running, finished: each sent once
    assert report["simulator"].get("agents/status_update_retries", 0) == 0
    assert report["simulator"].get("agents/stale_acks", 0) == 0
    assert report["tasks"]["running_at_end"] == 0
