"""The policy switches of the simulator, on small cells with exact outcomes:
oversubscription (the real estimator, QoS controller and revocable offers),
preemption (the real master preemption) and the Autopilot recommender (the real
autopilot core and the service framework's right-sizing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.policy import Policy, load_policy
from tests.unit.test_sim_runs import cell, live_tasks, role_allocation, simulate, tasks


def policy(tmp_path: Path, document: dict[str, Any]) -> Policy:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    return load_policy(path)


def owners(usage: dict[str, Any]) -> dict[str, Any]:
    """Two production tasks that declare half the agent each and use `usage`."""
    return {**tasks("svc", "prod", 2, 2, 4096, duration=None, usage=usage), "priority": 200}


ONE_AGENT = cell({"name": "n", "resources": "cpus:4;mem:8192"})
IDLE = {"cpus": {"fraction": 0.1}, "mem": {"fraction": 0.1}}


def test_oversubscription_runs_batch_in_idle_reserved_room(tmp_path: Path) -> None:
    """The services reserve the whole agent and use a tenth of it. Off, the batch
    tasks arriving later never run; on, once the reservations decayed (window 60
    s) the agent lends the idle room and all four batch tasks run there (3 at a
    time: 3.5 cpus are lent) and finish."""
    workload = [owners(IDLE), tasks("batch", "batch", 4, 1, 1024, duration=600, at=30),
                {"kind": "end", "at": 2000}]
    _, off = simulate(tmp_path, ONE_AGENT, workload,
                      policy(tmp_path, {"oversubscription": {"enabled": False}}))
    _, on = simulate(tmp_path, ONE_AGENT, workload,
                     policy(tmp_path, {"oversubscription": {"enabled": True, "window": 60}}))
    assert off["tasks"]["by_final_state"] == {}
    assert off["tasks"]["revocable_launched"] == 0
    assert off["utilization"]["mem"]["revocable"] == 0.0
    assert on["tasks"]["by_final_state"] == {"TASK_FINISHED": 4}
    assert on["tasks"]["revocable_launched"] == 4
    assert on["tasks"]["evictions"] == on["tasks"]["ooms"] == 0
    # Revocable resources are never allocation: the master's books are the same.
    assert on["utilization"]["mem"]["allocated"] == off["utilization"]["mem"]["allocated"]
    assert on["utilization"]["mem"]["revocable_used"] > 0
    assert on["utilization"]["mem"]["used"] > off["utilization"]["mem"]["used"]
    # At most 3.5 cpus were lent (2 x (2 - 0.25 reserved)): three tasks at a time.
    assert max(on["series"]["tasks_running"]) == 2 + 3


def test_qos_evicts_borrowers_when_the_owners_grow_back(tmp_path: Path) -> None:
    """At 900 s the services grow to 80% of what they declared: their
    reservations jump, the agent can lend only 328 MB, and the QoS controller
    evicts all three batch tasks (TASK_KILLED, REASON_CONTAINER_PREEMPTED) before
    any owner reaches its limit; the evicted tasks wait to run again."""
    grow = {"cpus": {"fraction": 0.1},
            "mem": {"steps": [[0, 0.1], [900, 0.8]], "fraction": True}}
    _, report = simulate(
        tmp_path, ONE_AGENT,
        [owners(grow), tasks("batch", "batch", 3, 1, 1024, duration=2000, at=30),
         {"kind": "end", "at": 1500}],
        policy(tmp_path, {"oversubscription": {"enabled": True, "window": 60}}))
    assert report["tasks"]["evictions"] == 3
    assert report["tasks"]["by_final_state"] == {"TASK_KILLED": 3}
    assert report["tasks"]["by_reason"] == {"REASON_CONTAINER_PREEMPTED": 3}
    assert report["tasks"]["ooms"] == 0
    assert report["tasks"]["running_at_end"] == 2  # the owners
    assert report["series"]["tasks_waiting"][-1] == 3


def test_borrowers_are_named_by_the_policy(tmp_path: Path) -> None:
    """`borrowers` lists who opts in: a batch framework not named never sees
    revocable resources."""
    _, report = simulate(
        tmp_path, ONE_AGENT,
        [owners(IDLE), tasks("batch", "batch", 2, 1, 1024, duration=600, at=30),
         {"kind": "end", "at": 1000}],
        policy(tmp_path, {"oversubscription": {"enabled": True, "window": 60,
                                               "borrowers": ["someone-else"]}}))
    assert report["tasks"]["revocable_launched"] == 0
    assert report["utilization"]["mem"]["revocable"] > 0  # lent, but nobody may take it


FOUR_AGENTS = cell({"name": "n", "count": 4, "resources": "cpus:1;mem:1024"})
FULL_OF_BATCH = tasks("batch", "batch", 4, 1, 1024, duration=None)


def asked_on_and_off(tmp_path: Path, workload: list[Any], asker: str) -> tuple[Any, Any]:
    """`workload` on `FOUR_AGENTS` with `asker` asking, preemption off then on: off,
    nothing is preempted and batch keeps the cell; the run with it on."""
    off_sim, off = simulate(tmp_path, FOUR_AGENTS, workload, policy(
        tmp_path, {"preemption": {"enabled": False, "askers": [asker]}}))
    assert off["tasks"]["preemptions"] == 0
    assert role_allocation(off_sim)["batch"] == {"cpus": 4.0, "mem": 4096.0}
    return simulate(tmp_path, FOUR_AGENTS, workload, policy(
        tmp_path, {"preemption": {"enabled": True, "askers": [asker]}}))


def test_production_preempts_batch_by_priority_band(tmp_path: Path) -> None:
    """Batch (priority 100) fills the cell; production work (200) arriving at
    100 s asks the master for room after 10 s. Off: it never runs. On: exactly
    two batch tasks are preempted (REASON_CONTAINER_PREEMPTED), production runs
    both its tasks, and the preempted batch tasks wait."""
    prod = {**tasks("prod", "prod", 2, 1, 1024, duration=None, at=100), "priority": 200}
    workload = [FULL_OF_BATCH, prod, {"kind": "end", "at": 400}]
    on_sim, on = asked_on_and_off(tmp_path, workload, "prod")
    assert on["tasks"]["preemptions"] == 2
    assert on["tasks"]["by_final_state"] == {"TASK_KILLED": 2}
    assert on["tasks"]["by_reason"] == {"REASON_CONTAINER_PREEMPTED": 2}
    assert role_allocation(on_sim) == {"batch": {"cpus": 2.0, "mem": 2048.0},
                                       "prod": {"cpus": 2.0, "mem": 2048.0}}
    assert on["series"]["dominant_shares"]["prod"][-1] == 0.5
    assert on["series"]["tasks_waiting"][-1] == 2


def test_equal_priority_never_preempts(tmp_path: Path) -> None:
    """Another batch framework at the same priority asks in vain: every request
    is refused and nothing is killed."""
    other = tasks("other", "other", 1, 1, 1024, duration=None, at=100)
    _, report = simulate(tmp_path, FOUR_AGENTS, [FULL_OF_BATCH, other, {"kind": "end", "at": 200}],
                         policy(tmp_path, {"preemption": {"enabled": True, "askers": ["other"]}}))
    assert report["tasks"]["preemptions"] == 0
    assert report["tasks"]["by_final_state"] == {}
    assert report["master"]["master/preemptions_refused"] == 9  # at 110, 120, ..., 190


def test_recommender_lowers_an_over_declared_apps_memory(tmp_path: Path) -> None:
    """/web declares 1 cpu and 1024 MB per task and uses 0.1 cpu and 100 MB. With
    the recommender on (auto), after the warmup its limits are cut to the
    meta-recommender's choice (105 MB, 0.109 cpus) by a rolling upgrade: the two
    old tasks are killed as the two new ones run. Off, nothing changes."""
    workload = [{"kind": "app", "at": 0, "role": "prod",
                 "app": {"id": "/web", "instances": 2, "cpus": 1, "mem": 1024},
                 "task": {"usage": {"cpus": 0.1, "mem": 100}}},
                {"kind": "end", "at": 3000}]
    knobs = {"warmup": 600, "min_samples": 10, "step": 60, "min_interval": 0}
    off_sim, off = simulate(tmp_path, cell({"name": "n", "count": 2,
                                            "resources": "cpus:4;mem:4096"}),
                            workload, policy(tmp_path, {"recommender": {"enabled": False}}))
    on_sim, on = simulate(tmp_path, cell({"name": "n", "count": 2,
                                          "resources": "cpus:4;mem:4096"}),
                          workload, policy(tmp_path, {"recommender": {"enabled": True, **knobs}}))
    assert off["recommender"] == {}
    assert [t["resources"]["mem"] for t in live_tasks(off_sim)] == [1024.0, 1024.0]
    web = on["recommender"]["service"]["apps"]["/web"]
    assert web["declared"] == {"cpus": 1.0, "mem": 1024.0}
    assert web["final"] == {"cpus": 0.109, "mem": 105.0}
    assert web["recommended"]["ready"] is True
    assert on["recommender"]["service"]["counters"]["autopilot_upgrades"] == 1
    assert [t["resources"]["mem"] for t in live_tasks(on_sim)] == [105.0, 105.0]
    assert on["tasks"]["by_final_state"] == {"TASK_KILLED": 2}
    assert on["tasks"]["ooms"] == 0
    assert on["utilization"]["mem"]["slack"] < off["utilization"]["mem"]["slack"] / 4


def test_recommend_mode_publishes_without_applying(tmp_path: Path) -> None:
    _, report = simulate(
        tmp_path, cell({"name": "n", "resources": "cpus:4;mem:4096"}),
        [{"kind": "app", "at": 0, "app": {"id": "/web", "instances": 1, "cpus": 1, "mem": 1024},
          "task": {"usage": {"cpus": 0.1, "mem": 100}}}, {"kind": "end", "at": 1500}],
        policy(tmp_path, {"recommender": {"enabled": True, "mode": "recommend", "warmup": 600,
                                          "min_samples": 10, "step": 60}}))
    web = report["recommender"]["service"]["apps"]["/web"]
    assert web["final"] == {"cpus": 1.0, "mem": 1024.0}
    assert web["recommended"]["mem"] < 200
    assert report["tasks"]["by_final_state"] == {}


def test_guarantee_preemption_stays_quiet_while_guarantees_hold(tmp_path: Path) -> None:
    """With preemption on, the quota example of test_sim_runs comes out the same:
    the allocator's hold-back meets prod's guarantee, so nothing is preempted."""
    simulation, report = simulate(
        tmp_path, cell({"name": "n", "count": 12, "resources": "cpus:1;mem:1024"},
                       roles={"prod": {"quota": {"guarantee": {"cpus": 6}}}}),
        [tasks("batch", "batch", 10, 1, 256), {**tasks("prod", "prod", 6, 1, 256, at=100),
                                                "priority": 200},
         {"kind": "end", "at": 400}],
        policy(tmp_path, {"preemption": {"enabled": True}}))
    assert report["tasks"]["preemptions"] == 0
    assert role_allocation(simulation)["prod"]["cpus"] == 6.0


def preempting_job(tmp_path: Path, refuse_seconds: float) -> dict[str, Any]:
    """A job's three maps fill two agents' cpus (with its executors); at 50 s a
    production task that asks for room arrives; it declines what it cannot use
    for `refuse_seconds`."""
    prod = {**tasks("prod", "prod", 1, 1, 512, duration=100, at=50), "priority": 200,
            "refuse_seconds": refuse_seconds}
    _, report = simulate(
        tmp_path, cell({"name": "n", "count": 2, "resources": "cpus:2;mem:2048"}),
        [{"kind": "job", "at": 0, "name": "wc", "role": "batch", "maps": 3, "reduces": 1,
          "map": {"cpus": 1, "mem": 512, "duration": 300},
          "reduce": {"cpus": 1, "mem": 512, "duration": 30}}, prod],
        policy(tmp_path, {"preemption": {"enabled": True, "askers": ["prod"]}}))
    return report


def test_a_preempted_map_is_retried_and_the_job_succeeds(tmp_path: Path) -> None:
    """The real batch core sees its map killed with REASON_CONTAINER_PREEMPTED,
    makes it pending again without charging an attempt, and the job succeeds.
    (The production framework refuses nothing, see the next test for why.)"""
    report = preempting_job(tmp_path, refuse_seconds=0)
    assert report["tasks"]["preemptions"] == 1
    assert report["tasks"]["by_reason"] == {"REASON_CONTAINER_PREEMPTED": 1}
    assert report["tasks"]["by_final_state"] == {"TASK_FINISHED": 5, "TASK_KILLED": 1}
    assert report["jobs"] == {"succeeded": 1, "failed": 0, "unfinished": 0, "failures": {}}


def test_the_preemption_hold_keeps_the_room_for_the_preemptor(tmp_path: Path) -> None:
    """The same with a preemptor that declines leftovers for 1 s (the `tasks`
    default): it is filtered from the victim's agent by its own decline, the hold
    filters everyone else, and the batch core's Revive on the preemption must not
    drop its hold filter. When it did, the job took the room back and every 10 s
    the production task asked again: 55 preemptions instead of 1."""
    report = preempting_job(tmp_path, refuse_seconds=1)
    assert report["tasks"]["preemptions"] == 1


def test_policy_runs_are_deterministic(tmp_path: Path) -> None:
    """All three policies on at once: the same inputs give the same report."""
    workload = [owners(IDLE), tasks("batch", "batch", 4, 1, 1024, duration=600, at=30),
                {"kind": "app", "at": 0, "role": "web",
                 "app": {"id": "/web", "instances": 1, "cpus": 0.5, "mem": 512},
                 "task": {"usage": {"cpus": 0.05, "mem": 60}}},
                {"kind": "end", "at": 2000}]
    both = {"oversubscription": {"enabled": True, "window": 60},
            "preemption": {"enabled": True, "askers": ["svc"]},
            "recommender": {"enabled": True, "warmup": 300, "min_samples": 5, "step": 60}}
    big = cell({"name": "n", "resources": "cpus:5;mem:9216"})
    _, first = simulate(tmp_path, big, workload, policy(tmp_path, both), seed=4)
    _, second = simulate(tmp_path, big, workload, policy(tmp_path, both), seed=4)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["tasks"]["revocable_launched"] > 0
    assert first["recommender"]["service"]["apps"]["/web"]["final"]["mem"] < 512


def test_compare_shows_a_policy_on_vs_off(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from dyad.cli import main as dyad_main

    (tmp_path / "cell.json").write_text(json.dumps(ONE_AGENT))
    (tmp_path / "w.jsonl").write_text("\n".join(json.dumps(r) for r in [
        owners(IDLE), tasks("batch", "batch", 4, 1, 1024, duration=600, at=30),
        {"kind": "end", "at": 2000}]) + "\n")
    for name, on in (("off", False), ("on", True)):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"oversubscription": {"enabled": on, "window": 60}}))
        assert dyad_main(["sim", "run", "--cell", str(tmp_path / "cell.json"), "--workload",
                          str(tmp_path / "w.jsonl"), "--policy", str(tmp_path / f"{name}.json"),
                          "--out", str(tmp_path / name), "--no-plots", "--quiet"]) == 0
    capsys.readouterr()
    assert dyad_main(["sim", "compare", str(tmp_path / "off"), str(tmp_path / "on")]) == 0
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:5]]
            for line in capsys.readouterr().out.splitlines() if line.count("│") >= 4}
    assert rows["tasks revocable_launched"] == ["0", "4", "+4"]
    assert rows["mem revocable (mean fraction)"][0] == "0"
    assert rows["tasks TASK_FINISHED"] == ["-", "4", ""]


def test_a_guarantee_set_on_a_full_cell_is_met_by_preemption(tmp_path: Path) -> None:
    """Batch fills the cell; at 100 s the operator guarantees prod 2 cpus (a
    `roles` record) and prod's two tasks arrive. Off: prod waits. On: the master
    preempts, unasked, exactly the two batch tasks the guarantee misses, and
    prod gets its guarantee."""
    workload = [FULL_OF_BATCH,
                {"kind": "roles", "at": 100, "roles": {"prod": {"quota": {
                    "guarantee": {"cpus": 2, "mem": 2048}}}}},
                {**tasks("prod", "prod", 2, 1, 1024, duration=None, at=100), "priority": 200},
                {"kind": "end", "at": 300}]
    off_sim, off = simulate(tmp_path, FOUR_AGENTS, workload, policy(tmp_path, {}))
    on_sim, on = simulate(tmp_path, FOUR_AGENTS, workload,
                          policy(tmp_path, {"preemption": {"enabled": True}}))
    assert off["tasks"]["preemptions"] == 0
    assert role_allocation(off_sim)["prod"] == {}
    assert on["tasks"]["preemptions"] == 2
    assert on["tasks"]["by_reason"] == {"REASON_CONTAINER_PREEMPTED": 2}
    assert role_allocation(on_sim) == {"batch": {"cpus": 2.0, "mem": 2048.0},
                                       "prod": {"cpus": 2.0, "mem": 2048.0}}


def test_a_bad_roles_record_is_named_with_its_line(tmp_path: Path) -> None:
    from sim.inputs import InputError
    from sim.workload import load_workload

    path = tmp_path / "w.jsonl"
    path.write_text('{"kind": "end", "at": 10}\n'
                    '{"kind": "roles", "at": 5, "roles": {"prod": {"weight": -1}}}\n')
    with pytest.raises(InputError, match=r"w.jsonl:2: roles.prod.weight: must be > 0"):
        load_workload(path, strict=True)


def test_a_batch_job_borrows_through_the_batch_cores_revocable_option(tmp_path: Path) -> None:
    """The services hold all but 1 cpu and 1 GB: room for the job's executor, not
    for a map. Off, the job starves (no offer big enough for a map within its
    starvation timeout); on, the real batch core runs its maps and reduce on what
    the agent lends and the job succeeds."""
    workload = [owners(IDLE),
                {"kind": "job", "at": 30, "name": "wc", "role": "batch", "maps": 4, "reduces": 1,
                 "starvation_timeout": 600,
                 "map": {"cpus": 1, "mem": 1024, "duration": 300},
                 "reduce": {"cpus": 1, "mem": 1024, "duration": 30}},
                {"kind": "end", "at": 3000}]
    roomy = cell({"name": "n", "resources": "cpus:5;mem:9216"})
    _, off = simulate(tmp_path, roomy, workload, policy(tmp_path, {}))
    _, on = simulate(tmp_path, roomy, workload,
                     policy(tmp_path, {"oversubscription": {"enabled": True, "window": 60}}))
    assert off["jobs"]["failed"] == 1 and off["tasks"]["revocable_launched"] == 0
    assert on["jobs"] == {"succeeded": 1, "failed": 0, "unfinished": 0, "failures": {}}
    assert on["tasks"]["revocable_launched"] == 5
    assert on["tasks"]["by_final_state"] == {"TASK_FINISHED": 5}


def test_a_service_that_asks_gets_room_from_batch(tmp_path: Path) -> None:
    """A service framework named an asker runs the service core's
    `preemption_ask_after` (as `dyad-service --preemption-ask-after`): its app,
    arriving at 100 s on a cell batch fills, waits 10 s, asks, and the master
    preempts two batch tasks for its two instances. Off: the app never runs."""
    app = {"kind": "app", "at": 100, "framework": "web", "role": "prod",
           "app": {"id": "/web", "instances": 2, "cpus": 1, "mem": 1024}}
    workload = [FULL_OF_BATCH, app, {"kind": "end", "at": 400}]
    on_sim, on = asked_on_and_off(tmp_path, workload, "web")
    assert on["tasks"]["preemptions"] == 2
    assert on["tasks"]["by_reason"] == {"REASON_CONTAINER_PREEMPTED": 2}
    assert role_allocation(on_sim) == {"batch": {"cpus": 2.0, "mem": 2048.0},
                                       "prod": {"cpus": 2.0, "mem": 2048.0}}
