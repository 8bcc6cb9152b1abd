"""Runs' launches and ends: DEBUG lines one by one, an INFO count per interval."""

from __future__ import annotations

import logging
from typing import Callable

import pytest

from agent.run_log import RunLog

KEY = ("fw1", "task-7", "run-9")


class Timers:
    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.armed.append((delay, callback))

    def fire(self) -> None:
        armed, self.armed = self.armed, []
        for _, callback in armed:
            callback()


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_each_launch_and_clean_end_is_a_debug_line_and_the_interval_an_info_count(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="test.runs")
    timers = Timers()
    runs = RunLog(logging.getLogger("test.runs"), timers.call_later, interval=10.0)
    runs.launched(KEY, 4321, "/w/frameworks/fw1/executors/task-7/runs/run-9", "cgroups")
    runs.ended(KEY, 4321, 0)
    debug = _lines(caplog, logging.DEBUG)
    assert any("task-7" in line and "fw1" in line and "4321" in line and "runs/run-9" in line
               for line in debug)  # the launch: whose, which pid, where
    assert any("task-7" in line and "ended with status 0" in line for line in debug)
    assert _lines(caplog, logging.INFO) == []
    assert [delay for delay, _ in timers.armed] == [10.0]  # one summary, however many runs
    timers.fire()
    assert _lines(caplog, logging.INFO) == [
        "runs in the last 10s: 1 launched, 1 ended with status 0, 0 otherwise"]


def test_an_end_that_is_not_a_clean_exit_stays_an_info_line(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.runs")
    timers = Timers()
    runs = RunLog(logging.getLogger("test.runs"), timers.call_later)
    runs.ended(KEY, 4321, -9)
    assert _lines(caplog, logging.INFO) == [
        "executor task-7 of framework fw1 (pid 4321) ended with status -9"]
    runs.flush()  # the agent stops: what was counted is said
    assert _lines(caplog, logging.INFO)[-1].endswith("0 launched, 0 ended with status 0, "
                                                     "1 otherwise")


def test_a_quiet_interval_says_nothing_and_the_next_run_arms_again(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.runs")
    timers = Timers()
    runs = RunLog(logging.getLogger("test.runs"), timers.call_later)
    runs.flush()
    assert caplog.records == [] and timers.armed == []
    runs.launched(KEY, 1, "/s", "posix")
    timers.fire()
    runs.launched(KEY, 2, "/s", "posix")
    assert len(timers.armed) == 1
