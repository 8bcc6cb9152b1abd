"""`dyad state|agents|...` (dyad.operator_cli) over /state documents from a real
MasterState, and the JSON log format (dyad.logs). The commands against a live
cluster are in tests/integration/test_operator.py."""

from __future__ import annotations

import argparse
import io
import json
import logging
from typing import Any

import pytest

from dyad import logs, operator_cli
from dyad.cli import build_parser
from dyad.messages import StatusUpdate, TaskState
from master.operator import SetWeights
from tests.unit.test_master_state import Harness, launch, status, task


def cluster_state() -> tuple[Harness, dict[str, Any]]:
    """One agent, framework `web` with a running t1 and a finished t0, and an
    outstanding offer."""
    h = Harness()
    agent = h.register("a1", attributes={"rack": "r1"})
    fid = h.subscribe("d1", name="web", roles=["eng"])
    assert h.call(SetWeights({"eng": 2.0})).ok
    offers = h.offers_to(h.allocate(), "d1")
    h.recv("d1", launch(fid, offers, task("t0", agent), task("t1", agent), refuse=0))
    for task_id, state, uuid in (("t0", TaskState.TASK_FINISHED, "u0"),
                                 ("t1", TaskState.TASK_RUNNING, "u1")):
        h.recv("a1", StatusUpdate(framework_id=fid, status=status(task_id, state, uuid=uuid,
                                                                  agent_id=agent)))
    h.allocate()
    return h, {**h.state.snapshot(), "elected": True}


def test_tables_show_what_the_master_knows() -> None:
    h, state = cluster_state()
    summary = operator_cli.format_state(state)
    assert "agents      1 active, 0 unreachable" in summary
    assert "tasks       1 running" in summary
    assert "cpus 1/4 used" in summary
    agents = operator_cli.format_agents(state).splitlines()
    assert agents[0].split() == ["ID", "HOST", "CPUS", "MEM", "DISK", "ATTRIBUTES", "STATUS", "URL"]
    assert "1/4" in agents[1] and "rack=r1" in agents[1] and "active" in agents[1]
    frameworks = operator_cli.format_frameworks(state).splitlines()
    assert frameworks[1].split()[:5] == [state["frameworks"][0]["id"], "web", "eng", "yes", "1"]
    offers = operator_cli.format_offers(state).splitlines()
    assert len(offers) == 2 and "3" in offers[1].split()  # the 3 cpus left are offered
    roles = operator_cli.format_roles(state["roles"])
    assert any(line.split()[:2] == ["eng", "2"] for line in roles.splitlines())


def test_tasks_filter_by_framework_and_state() -> None:
    _, state = cluster_state()
    fid = state["frameworks"][0]["id"]

    def ids(**kw: Any) -> list[str]:
        return [t["id"] for t in operator_cli.select_tasks(state, **kw)]

    assert ids(framework=None, task_state=None, completed=False) == ["t1"]
    assert ids(framework=None, task_state=None, completed=True) == ["t1", "t0"]
    assert ids(framework="web", task_state="running", completed=False) == ["t1"]
    assert ids(framework=fid, task_state="TASK_FINISHED", completed=False) == ["t0"]
    assert ids(framework="other", task_state=None, completed=True) == []
    table = operator_cli.format_tasks(operator_cli.select_tasks(state, None, None, True))
    assert table.splitlines()[1].split()[:3] == ["t1", "web", "RUNNING"]


def test_table_aligns_columns() -> None:
    text = operator_cli.table(["A", "LONGER"], [["xyz", 1.0], ["q", None]])
    assert text == "A    LONGER\nxyz  1\nq    -\n"


def test_amounts_parse_and_reject() -> None:
    assert operator_cli._amounts("cpus:4;mem:8192") == {"cpus": 4.0, "mem": 8192.0}
    assert operator_cli._amounts("") == {}
    for bad in ("cpus", "cpus:x", ":4"):
        with pytest.raises(argparse.ArgumentTypeError):
            operator_cli._amounts(bad)
    args = build_parser().parse_args(["quota", "set", "eng", "cpus:2", "--limit", "cpus:8",
                                      "--master", "h:1"])
    assert (args.role, args.guarantee, args.limit, args.master) == \
        ("eng", {"cpus": 2.0}, {"cpus": 8.0}, "h:1")


def test_find_sandbox_follows_master_then_agent_state() -> None:
    _, state = cluster_state()
    agent_url = state["agents"][0]["url"]
    fid = state["frameworks"][0]["id"]
    agent_state = {"frameworks": [{"id": fid, "executors": [], "completed_executors": [
        {"id": "t0", "directory": "/sandboxes/t0/run1", "tasks": [],
         "completed_tasks": [{"id": "t0"}]}]}]}
    asked: list[str] = []

    def fetch(url: str) -> dict[str, Any]:
        asked.append(url)
        return agent_state

    assert operator_cli.find_sandbox(state, fetch, "t0")[:2] == (agent_url, "/sandboxes/t0/run1")
    assert asked == [agent_url]
    with pytest.raises(operator_cli.UsageError, match="has no sandbox for task t1"):
        operator_cli.find_sandbox(state, fetch, "t1")
    with pytest.raises(operator_cli.UsageError, match="knows no task nope"):
        operator_cli.find_sandbox(state, fetch, "nope")


def test_bad_master_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["agents", "--master", "nohostport"])
    assert operator_cli.run(args) == 2
    assert "needs a port" in capsys.readouterr().err


def test_json_log_lines_are_one_object_each() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    log = logging.getLogger("dyad.test.json")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("agent %s said %r", "a1", "multi\nline")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "warning" and first["logger"] == "dyad.test.json"
    assert first["message"] == "agent a1 said 'multi\\nline'"
    assert first["time"].endswith("+00:00")
    assert "RuntimeError: boom" in second["exception"]
    with pytest.raises(ValueError):
        logs.configure("info", "xml")
