"""Health checks: the timing core alone (`HealthChecker`), then through `AgentState`
(health updates, the kill, the TASK_FAILED it ends in), with a fake clock."""

from __future__ import annotations

from typing import Any

from agent.checkpoint import Recover
from agent.health import (
    HealthChanged, HealthChecker, HealthCheckResult, RunHealthCheck, describe,
)
from dyad.effects import ArmTimer, CancelTimer
from dyad.messages import (
    CommandInfo, HealthCheck, HealthCheckType, KillTask, Reason, ReregisterExecutor, TaskInfo,
    TaskState,
)
from dyad.resources import Resources

from tests.unit.test_agent_state import (
    Agent, of_type, running_executor, status, to_peer, updates,
)

HTTP = HealthCheck(type=HealthCheckType.HTTP, port=8080, path="/ready", delay=5,
                   interval=2, timeout=1, grace_period=10, consecutive_failures=3)


class Checks:
    """A HealthChecker with the timer table a shell would keep."""

    def __init__(self) -> None:
        self.checker = HealthChecker()
        self.timers: dict[Any, float] = {}
        self.outcomes: list[Any] = []

    def apply(self, effects: list[Any]) -> list[RunHealthCheck]:
        for effect in effects:
            if isinstance(effect, ArmTimer):
                self.timers[effect.key] = effect.at
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)
        self.checker.validate()
        return [e for e in effects if isinstance(e, RunHealthCheck)]

    def fire(self) -> tuple[RunHealthCheck, float]:
        key, at = min(self.timers.items(), key=lambda item: item[1])
        del self.timers[key]
        (run,) = self.apply(self.checker.timer_fired(key, at))
        return run, at

    def answer(self, run: RunHealthCheck, healthy: bool, now: float) -> list[Any]:
        effects, outcomes = self.checker.result(HealthCheckResult(run.key, healthy, "boom"),
                                                now)
        self.apply(effects)
        self.outcomes += outcomes
        return outcomes


def test_defaults_are_mesos_and_checks_are_named() -> None:
    check = HealthCheck(type=HealthCheckType.TCP, port=9)
    assert (check.delay, check.interval, check.timeout, check.grace_period,
            check.consecutive_failures) == (15.0, 10.0, 20.0, 10.0, 3)
    assert describe(HTTP) == "HTTP GET http://127.0.0.1:8080/ready"
    assert describe(check) == "TCP connect to 127.0.0.1:9"
    command = HealthCheck(type=HealthCheckType.COMMAND, command=CommandInfo(shell="true"))
    assert describe(command) == "COMMAND true"


def test_first_check_after_delay_then_each_interval_after_the_answer() -> None:
    checks = Checks()
    checks.apply(checks.checker.start("F1", "t1", HTTP, "/sandbox", {"A": "1"}, 100.0))
    run, at = checks.fire()
    assert at == 105.0 and run.check == HTTP and run.sandbox_dir == "/sandbox"
    assert checks.timers == {}  # one check in flight, nothing piles up behind it
    assert checks.answer(run, True, 106.5) == [HealthChanged("F1", "t1", True,
                                                             "health check passed")]
    run, at = checks.fire()
    assert at == 108.5
    assert checks.answer(run, True, 109.0) == []  # no change, no news


def test_failures_in_grace_do_not_count_until_the_task_was_healthy_once() -> None:
    checks = Checks()
    checks.apply(checks.checker.start("F1", "t1", HTTP, "/s", {}, 0.0))
    for _ in range(2):  # at 5 and 7: inside the 10 s grace period
        run, at = checks.fire()
        assert checks.answer(run, False, at) == []
    run, at = checks.fire()
    assert checks.answer(run, True, at) == [HealthChanged("F1", "t1", True,
                                                          "health check passed")]
    run, at = checks.fire()  # still inside the grace period, but healthy once: counts
    (changed,) = checks.answer(run, False, at)
    assert isinstance(changed, HealthChanged) and not changed.healthy
    assert "HTTP GET http://127.0.0.1:8080/ready failed: boom" == changed.message


def test_consecutive_failures_kill_and_a_success_resets_the_count() -> None:
    checks = Checks()
    checks.apply(checks.checker.start("F1", "t1", HTTP, "/s", {}, 0.0))
    answers = [False, False, True, False, False, False]
    for healthy in answers:
        run, at = checks.fire()
        checks.answer(run, healthy, at + 20)  # outside the grace period
    kinds = [(type(o).__name__, getattr(o, "healthy", None)) for o in checks.outcomes]
    assert kinds == [("HealthChanged", False), ("HealthChanged", True),
                     ("HealthChanged", False), ("Unhealthy", None)]
    unhealthy = checks.outcomes[-1]
    assert "3 consecutive times" in unhealthy.message
    assert not checks.checker.watching("F1", "t1") and checks.timers == {}


def test_zero_consecutive_failures_reports_but_never_kills() -> None:
    checks = Checks()
    check = HealthCheck(type=HealthCheckType.TCP, port=9, delay=0, grace_period=0,
                        consecutive_failures=0)
    checks.apply(checks.checker.start("F1", "t1", check, "/s", {}, 0.0))
    for _ in range(10):
        run, at = checks.fire()
        checks.answer(run, False, at)
    assert [type(o) for o in checks.outcomes] == [HealthChanged]


def test_stop_cancels_and_late_results_are_ignored() -> None:
    checks = Checks()
    checks.apply(checks.checker.start("F1", "t1", HTTP, "/s", {}, 0.0))
    assert checks.apply(checks.checker.start("F1", "t1", HTTP, "/s", {}, 1.0)) == []
    run, at = checks.fire()
    assert checks.checker.stop("F1", "t1") == []  # in flight: nothing to cancel
    assert checks.answer(run, False, 100.0) == []
    checks.apply(checks.checker.start("F1", "t2", HTTP, "/s", {}, 0.0))
    (cancel,) = checks.checker.stop("F1", "t2")
    assert isinstance(cancel, CancelTimer)
    assert checks.checker.timer_fired(cancel.key, 50.0) == []


# --------------------------------------------------------------- in the agent


def checked_task(check: HealthCheck = HTTP, grace: float | None = 2.0) -> TaskInfo:
    return TaskInfo(task_id="t1", name="t1", agent_id="A1",
                    resources=Resources.parse("cpus:1;mem:64"),
                    command=CommandInfo(shell="serve", environment={"PORT": "8080"}),
                    health_check=check, kill_grace_period=grace)


def ack_everything(agent: Agent) -> None:
    """Play the master: acknowledge until no update is waiting."""
    while agent.state.updates.pending():
        for update in agent.state.updates.pending():
            agent.ack(update)


def running_checked(agent: Agent) -> list[Any]:
    agent.register()
    running_executor(agent, checked_task())
    effects = agent.executor(status("t1", TaskState.TASK_RUNNING, "u1", "t1"))
    ack_everything(agent)
    return effects


def run_check(agent: Agent, healthy: bool, wait: float = 30.0) -> list[Any]:
    (check,) = of_type(agent.advance(wait), RunHealthCheck)
    return agent(HealthCheckResult(check.key, healthy, "HTTP 500"))


def test_running_starts_checks_in_the_sandbox_with_the_tasks_environment() -> None:
    agent = Agent()
    assert of_type(running_checked(agent), ArmTimer)
    (check,) = of_type(agent.advance(5), RunHealthCheck)
    assert check.sandbox_dir == "/work/frameworks/F1/executors/t1/runs/id0"
    assert check.env["PORT"] == "8080" and check.env["DYAD_TASK_ID"] == "t1"
    assert check.env["MESOS_SANDBOX"] == check.sandbox_dir


def test_health_changes_are_running_updates_and_unhealthy_tasks_fail() -> None:
    agent = Agent()
    running_checked(agent)
    (healthy,) = updates(run_check(agent, True, 5))
    assert (healthy.state, healthy.healthy) == (TaskState.TASK_RUNNING, True)
    assert healthy.reason == Reason.TASK_HEALTH_CHECK_STATUS_UPDATED
    assert healthy.source == "SOURCE_AGENT"
    assert updates(run_check(agent, True, 2)) == []
    ack_everything(agent)
    effects = run_check(agent, False, 2)
    (sick,) = updates(effects)
    assert (sick.healthy, sick.message) == (False, "HTTP GET http://127.0.0.1:8080/ready "
                                                   "failed: HTTP 500")
    ack_everything(agent)
    run_check(agent, False, 2)
    effects = run_check(agent, False, 2)
    (kill,) = to_peer(effects, kind=KillTask)
    assert kill == KillTask(framework_id="F1", task_id="t1", kill_grace_period=2.0)
    assert agent.state.metrics()["agent/tasks_killed_unhealthy"] == 1
    # Whatever the executor calls the end, the framework hears why it happened.
    agent.executor(status("t1", TaskState.TASK_KILLING, "u2", "t1"))
    agent.executor(status("t1", TaskState.TASK_KILLED, "u3", "t1"))
    (failed,) = [u.status for u in agent.state.updates.all_queued()
                 if u.status.state.is_terminal]
    assert failed.state == TaskState.TASK_FAILED and failed.reason == Reason.TASK_UNHEALTHY
    assert "3 consecutive times" in failed.message
    assert of_type(agent.advance(100), RunHealthCheck) == []


def test_killing_or_ending_a_task_stops_its_checks() -> None:
    agent = Agent()
    running_checked(agent)
    agent.master(KillTask(framework_id="F1", task_id="t1"))
    assert of_type(agent.advance(100), RunHealthCheck) == []
    assert agent.state.snapshot()["frameworks"][0]["executors"][0]["tasks"][0]["healthy"] is None


def test_checks_of_a_recovered_task_start_afresh_when_its_executor_reregisters() -> None:
    agent = Agent()
    running_checked(agent)
    fresh = Agent()
    fresh(Recover(agent.state.saved(), frozenset({("F1", "t1", "id0")})))
    fresh.register()
    assert of_type(fresh.advance(5), RunHealthCheck) == []  # not before it is back
    fresh.executor(ReregisterExecutor(framework_id="F1", executor_id="t1",
                                      tasks=[checked_task()]))
    (check,) = of_type(fresh.advance(5), RunHealthCheck)
    assert check.check == HTTP
