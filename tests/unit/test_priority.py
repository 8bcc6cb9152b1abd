"""Priorities and their Borg bands (dyad/priority.py), and where frameworks set
them: the service framework's app definitions, the batch framework's --priority,
the task views of the master's /state."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyad import priority
from dyad.messages import (
    FrameworkInfo,
    MessageError,
    RunTask,
    TaskInfo,
    TaskState,
    decode,
    encode,
)
from dyad.resources import Resources
from frameworks.batch.cli import build_parser
from frameworks.service.appdef import AppInvalid, app_to_json, parse_app
from master.model import MasterTask
from master.views import _task_json


@pytest.mark.parametrize(("value", "band"), [
    (-5, priority.BEST_EFFORT), (0, priority.BEST_EFFORT), (99, priority.BEST_EFFORT),
    (100, priority.BATCH), (199, priority.BATCH), (200, priority.PRODUCTION),
    (359, priority.PRODUCTION), (360, priority.MONITORING), (10_000, priority.MONITORING)])
def test_bands_are_borgs(value: int, band: str) -> None:
    assert priority.band(value) == band


@given(st.integers(priority.MIN_PRIORITY, priority.MAX_PRIORITY),
       st.integers(priority.MIN_PRIORITY, priority.MAX_PRIORITY))
def test_bands_are_ordered_like_priorities(a: int, b: int) -> None:
    if a <= b:
        assert priority.BANDS.index(priority.band(a)) <= priority.BANDS.index(priority.band(b))


def test_check_priority_takes_integers_and_band_names() -> None:
    assert priority.check_priority(250) == 250
    assert priority.check_priority("250") == 250
    assert priority.check_priority("production") == 200
    assert priority.check_priority("batch") == 100
    assert priority.check_priority("best-effort") == 0
    assert priority.check_priority("monitoring") == 360
    for bad in ("high", 1.5, True, None, 10**7):
        with pytest.raises(priority.PriorityError):
            priority.check_priority(bad)


def test_task_priority_defaults_to_batch_floor_and_crosses_the_wire() -> None:
    task = TaskInfo(task_id="t", name="t", agent_id="S1", resources=Resources.of(cpus=1))
    assert task.priority == 100 and not task.revocable
    sent = RunTask(framework=FrameworkInfo(name="f", id="F1"),
                   task=TaskInfo(task_id="t", name="t", agent_id="S1",
                                 resources=Resources.of(cpus=1), priority=360, revocable=True))
    assert decode(encode(sent)) == sent
    with pytest.raises(MessageError, match="outside"):
        decode(encode(sent).replace(b'"priority":360', b'"priority":7000000'))
    with pytest.raises(ValueError):
        TaskInfo(task_id="t", name="t", agent_id="S1", resources=Resources.of(cpus=1),
                 priority="batch")  # type: ignore[arg-type]


def test_service_apps_default_to_production_and_take_priority() -> None:
    app = parse_app({"id": "/web", "cmd": "sleep 1"})
    assert app.priority == priority.DEFAULT_PRODUCTION
    assert priority.band(app.priority) == priority.PRODUCTION
    mon = parse_app({"id": "/mon", "cmd": "sleep 1", "priority": "monitoring"})
    assert mon.priority == 360
    assert parse_app(app_to_json(mon)) == mon
    with pytest.raises(AppInvalid) as info:
        parse_app({"id": "/web", "cmd": "sleep 1", "priority": "urgent"})
    assert "/priority" in dict(info.value.details)


def test_batch_jobs_default_to_the_batch_band() -> None:
    parser = build_parser()
    base = ["submit", "wc.py", "--input", "a", "--output", "out"]
    assert parser.parse_args(base).priority == priority.DEFAULT_BATCH
    assert parser.parse_args([*base, "--priority", "best-effort"]).priority == 0
    assert parser.parse_args([*base, "--priority", "150"]).priority == 150
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--priority", "urgent"])


def test_master_task_views_show_priority_band_and_revocable() -> None:
    task = MasterTask(task_id="t", framework_id="F", agent_id="S", executor_id="t",
                      name="t", resources=Resources.of(cpus=1), state=TaskState.TASK_RUNNING,
                      labels={}, kill_grace_period=None, statuses=collections.deque(),
                      story=collections.deque(), priority=250, revocable=True)
    view = _task_json(task)
    assert (view["priority"], view["band"], view["revocable"]) == (250, "production", True)
