"""Cell, workload and policy files: what they mean, and bad input named by file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cell import load_cell
from sim.inputs import InputError
from sim.policy import Policy, load_policy
from sim.workload import AppArrival, JobArrival, TasksArrival, load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_examples_load() -> None:
    cell = load_cell(EXAMPLES / "cell.json")
    assert cell.agent_count == 8
    assert [a.attributes["rack"] for a in cell.agents()[:4]] == ["r1", "r2", "r3", "r1"]
    assert cell.capacity().get("cpus") == 6 * 8 + 2 * 32
    assert cell.weights == {"prod": 2.0, "batch": 1.0}
    assert cell.quota["prod"].guarantee == {"cpus": 16000, "mem": 32768000}
    workload, skipped = load_workload(EXAMPLES / "workload.jsonl")
    assert skipped == []
    assert [type(a) for a in workload.arrivals[:3]] == [AppArrival, AppArrival, JobArrival]
    assert workload.end == 7200
    assert any(isinstance(a, TasksArrival) for a in workload.arrivals)
    policy = load_policy(EXAMPLES / "policy.json")
    assert policy.codec and policy.usage_report_interval == 30


def test_cell_errors_name_the_line(tmp_path: Path) -> None:
    text = ('{\n  "agent_groups": [\n    {"name": "a", "resources": "cpus:1"},\n'
            '    {"name": "b", "count": 0, "resources": "cpus:1"}\n  ]\n}\n')
    with pytest.raises(InputError) as caught:
        load_cell(write(tmp_path, "cell.json", text))
    assert str(caught.value).startswith(f"{tmp_path / 'cell.json'}:4: agent_groups[1].count")
    with pytest.raises(InputError, match=r"cell.json:3: agent_groups\[0\]: unknown field 'cpu'"):
        load_cell(write(tmp_path, "cell.json",
                        '{"agent_groups": [\n\n {"name": "a", "cpu": 1, "resources": "cpus:1"}]}'))
    with pytest.raises(InputError, match=r"cell.json:2: not JSON"):
        load_cell(write(tmp_path, "cell.json", '{"name": "x",\n "agent_groups": [}'))
    with pytest.raises(InputError, match=r"resources"):
        load_cell(write(tmp_path, "cell.json",
                        '{"agent_groups": [{"name": "a", "resources": "cpus:lots"}]}'))
    with pytest.raises(InputError, match=r"cell.json:3: roles.prod.*quota covers only"):
        load_cell(write(tmp_path, "cell.json",
                        '{"agent_groups": [{"name": "a", "resources": "cpus:1"}],\n"roles": {\n'
                        '"prod": {"quota": {"guarantee": {"ports": 1}}}}}'))


def test_workload_errors_skip_or_stop(tmp_path: Path) -> None:
    lines = [
        {"kind": "tasks", "at": 0, "framework": "g", "count": 1,
         "task": {"cpus": 1, "mem": 1, "duration": 1}},
        {"kind": "job", "at": 0, "name": "j", "maps": 2,
         "map": {"cpus": 1, "mem": 1, "duration": [1, 2, 3]},
         "reduce": {"cpus": 1, "mem": 1, "duration": 1}},
        {"kind": "meteor", "at": 0},
        {"kind": "tasks", "at": -1, "framework": "g", "count": 1,
         "task": {"cpus": 1, "mem": 1, "duration": 1}},
        {"kind": "tasks", "at": 0, "framework": "g", "role": "other", "count": 1,
         "task": {"cpus": 1, "mem": 1, "duration": 1}},
        {"kind": "app", "at": 0, "app": {"id": "/x", "instances": -1}},
        {"kind": "app_delete", "at": 0, "id": "/x", "framework": "nobody"},
    ]
    text = "# a comment\n\n" + "\n".join(json.dumps(line) for line in lines) + "\nnot json\n"
    path = write(tmp_path, "w.jsonl", text)
    with pytest.raises(InputError, match=r"w.jsonl:4: map.duration: a list of durations"):
        load_workload(path, strict=True)
    workload, skipped = load_workload(path, strict=False)
    assert len(workload.arrivals) == 1
    messages = [str(e).split("w.jsonl:")[1] for e in skipped]
    assert [m.split(":")[0] for m in messages] == ["4", "5", "6", "7", "8", "9", "10"]
    assert "unknown kind 'meteor'" in messages[1]
    assert "at: must be >= 0" in messages[2]
    assert "first given as a tasks framework in role '*'" in messages[3]
    assert "/instances" in messages[4]
    assert "not JSON" in messages[6]


def test_policy_knobs_and_switches(tmp_path: Path) -> None:
    assert load_policy(None) == Policy()
    policy = load_policy(write(tmp_path, "p.json", json.dumps(
        {"allocator": {"interval": 2, "offer_timeout": 10},
         "master": {"agent_ping_timeout": 60}, "run": {"until": 100, "settle": 0},
         "frameworks": {"service": {"refuse_seconds": 3}},
         "preemption": {"enabled": False}})))
    assert (policy.allocation_interval, policy.offer_timeout, policy.until) == (2, 10, 100)
    assert policy.master_config().agent_ping_timeout == 60
    assert policy.service_refuse_seconds == 3
    assert not policy.master_config().preemption.enabled
    assert not policy.master_config().oversubscription
    assert policy.report_interval_of_agents == 0
    policy = load_policy(write(tmp_path, "p.json", json.dumps(
        {"oversubscription": {"enabled": True, "window": 60, "margin": 0.1,
                              "margin_floor": {"mem": 16}, "qos_mem_watermark": 0.8,
                              "borrowers": ["b"]},
         "preemption": {"enabled": True, "hold": 5, "max_per_minute": 10},
         "recommender": {"enabled": True, "mode": "recommend", "apps": ["/web"], "step": 60,
                         "warmup": 600, "min_samples": 5, "min_interval": 0}})))
    assert policy.oversubscription and policy.master_config().oversubscription
    assert (policy.reclaim.window, policy.reclaim.margin, policy.reclaim.margin_floor.mem,
            policy.qos.mem_watermark, policy.borrowers) == (60, 0.1, 16, 0.8, ("b",))
    preemption = policy.master_config().preemption
    assert (preemption.enabled, preemption.hold, preemption.max_per_minute) == (True, 5, 10)
    assert (policy.recommender, policy.recommender_mode, policy.recommender_apps) == (
        True, "recommend", ("/web",))
    assert (policy.autopilot.step, policy.autopilot.warmup, policy.autopilot.min_samples) == (
        60, 600, 5)
    assert policy.master_config().record_usage
    assert policy.report_interval_of_agents == 5.0  # usage is needed: reports come
    json.dumps(policy.to_json())  # plain JSON for the report
    with pytest.raises(InputError, match=r"p.json:3: oversubscription: reclaim window must "
                                         r"be positive|oversubscription.window: must be > 0"):
        load_policy(write(tmp_path, "p.json",
                          '{\n "report": {"interval": 5},\n "oversubscription": {"window": 0}}'))
    with pytest.raises(InputError, match=r"usage_report_interval: oversubscription and the "
                                         r"recommender need usage reports"):
        load_policy(write(tmp_path, "p.json", json.dumps(
            {"agents": {"usage_report_interval": 0}, "oversubscription": {"enabled": True}})))
    with pytest.raises(InputError, match=r"recommender.mode: must be one of"):
        load_policy(write(tmp_path, "p.json", '{"recommender": {"mode": "off"}}'))
    with pytest.raises(InputError, match=r"p.json:1: allocator: unknown field 'intervall'"):
        load_policy(write(tmp_path, "p.json", '{"allocator": {"intervall": 1}}'))
