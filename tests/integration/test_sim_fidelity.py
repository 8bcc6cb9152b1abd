"""Fidelity: one small workload run for real on a local cluster (real master,
agents and processes) and replayed in `dyad sim` agree on tasks by final state
and on per-role dominant shares.

The workload: framework alpha (role a) runs two tasks of cpus:1;mem:128 for 10 s
and one of cpus:0.5;mem:128 that fails after 8 s; framework beta (role b) runs
two of cpus:0.25;mem:256 for 10 s (long enough that all five overlap on the
real cluster, where process starts take a while). Everything fits the cell at
once (2 agents x cpus:2;mem:1024), so while all five run the shares are fixed
by the declared resources: a 2.5/4 cpus = 0.625, b 512/2048 mem = 0.25.

Tolerance (docs/simulator.md, "Fidelity"): final states exactly; shares within
0.02 absolute at the moment all five tasks run. Both masters charge exactly the
declared task resources (command tasks carry no executor resources in the
allocator's books), so the shares should agree to the digit; the 0.02 absorbs
a sample taken while an update is in flight on the real cluster (one task of b
is 0.0625 of cpus and 0.125 of mem, so a wrong task count would show far
outside it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dyad.resources import Resources
from frameworks import CommandInfo, Filters, FrameworkInfo, TaskInfo, TaskState
from sim.cell import load_cell
from sim.policy import load_policy
from sim.run import Simulation
from sim.workload import load_workload
from tests.helpers import wait_for

from .conftest import Recorder

pytestmark = pytest.mark.integration

TOLERANCE = 0.02
# (framework, role, task shape, count, seconds, fails)
WORKLOAD = [("alpha", "a", "cpus:1;mem:128", 2, 10.0, False),
            ("alpha", "a", "cpus:0.5;mem:128", 1, 8.0, True),
            ("beta", "b", "cpus:0.25;mem:256", 2, 10.0, False)]
EXPECTED_SHARES = {"a": 0.625, "b": 0.25}
RUNNING = sum(count for _, _, _, count, _, _ in WORKLOAD)


class Greedy(Recorder):
    """Launches its queue first fit into each offer, like the simulator's
    `tasks` framework; declines what it cannot use."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.queue = [(f"{name}-{i}-{n}", Resources.parse(shape), seconds, fails)
                      for i, (fw, _, shape, count, seconds, fails) in enumerate(WORKLOAD)
                      if fw == name for n in range(count)]
        self.on_offers = self._launch

    def _launch(self, driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            left, tasks = offer.resources, []
            for item in list(self.queue):
                task_id, need, seconds, fails = item
                if need <= left:
                    left = left - need
                    self.queue.remove(item)
                    shell = f"sleep {seconds:g}" + ("; exit 1" if fails else "")
                    tasks.append(TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                                          resources=need, command=CommandInfo(shell=shell)))
            if tasks:
                driver.launch_tasks([offer.id], tasks, Filters(refuse_seconds=1))
            else:
                driver.decline_offer(offer.id, Filters(refuse_seconds=1))

    def finals(self) -> dict[str, str]:
        return {s.task_id: s.state.name for s in self.statuses if s.state.is_terminal}


def simulated(tmp_path: Path) -> tuple[dict[str, int], dict[str, float]]:
    """The same workload and cell in `dyad sim`: final states, and the shares at
    the first sample where all tasks run."""
    (tmp_path / "cell.json").write_text(json.dumps({"name": "fidelity", "agent_groups": [
        {"name": "n", "count": 2, "resources": "cpus:2;mem:1024;disk:1000"}]}))
    lines = []
    for framework, role, shape, count, seconds, fails in WORKLOAD:
        need = Resources.parse(shape)
        lines.append(json.dumps({"kind": "tasks", "at": 0, "framework": framework, "role": role,
                                 "count": count, "per_offer": 10, "task": {
                                     "cpus": need.get("cpus"), "mem": need.get("mem"),
                                     "duration": seconds, "fail": 1 if fails else 0}}))
    (tmp_path / "w.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "p.json").write_text(json.dumps({"report": {"interval": 0.25}}))
    workload, _ = load_workload(tmp_path / "w.jsonl", strict=True)
    report = Simulation(load_cell(tmp_path / "cell.json"), workload,
                        load_policy(tmp_path / "p.json")).run()
    series = report["series"]
    index = series["tasks_running"].index(RUNNING)
    return (report["tasks"]["by_final_state"],
            {role: values[index] for role, values in series["dominant_shares"].items()})


async def test_local_cluster_and_simulation_agree(make_cluster: Any, drivers: Any,
                                                   tmp_path: Path) -> None:
    sim_finals, sim_shares = simulated(tmp_path)
    cluster = make_cluster(agents=2, resources="cpus:2;mem:1024;disk:1000")
    frameworks = {name: Greedy(name) for name in ("alpha", "beta")}
    for name, role in (("alpha", "a"), ("beta", "b")):
        await drivers(frameworks[name], FrameworkInfo(name=name, roles=[role]),
                      cluster.master_address).registered()

    def all_running() -> dict[str, float] | None:
        state = cluster.state()
        running = [t for f in state["frameworks"] for t in f["tasks"]
                   if t["state"] == TaskState.TASK_RUNNING.name]
        if len(running) < RUNNING:
            return None
        return {r["name"]: r["dominant_share"] for r in state["roles"] if r["name"] in "ab"}

    # Polled gently: the drivers share this event loop with the (blocking) reads.
    real_shares = await wait_for(all_running, 30, "all tasks running", interval=0.2)
    await wait_for(lambda: len(frameworks["alpha"].finals()) + len(frameworks["beta"].finals())
                   == RUNNING, 30, "every task to end")
    real_finals: dict[str, int] = {}
    for recorder in frameworks.values():
        for state in recorder.finals().values():
            real_finals[state] = real_finals.get(state, 0) + 1
    assert real_finals == sim_finals == {"TASK_FINISHED": 4, "TASK_FAILED": 1}
    for role, expected in EXPECTED_SHARES.items():
        assert abs(sim_shares[role] - expected) < 1e-6, (role, sim_shares)
        assert abs(real_shares[role] - sim_shares[role]) <= TOLERANCE, (role, real_shares)
