"""When to run a task's health check, and what its results mean -- pure.

The agent, not the executor, checks health, so checks work the same under the
command executor and any custom one. Per task, from the moment the agent first
sees it `TASK_RUNNING`:

- the first check runs `delay` seconds later, the next one `interval` seconds
  after the previous one answered (one check in flight per task, never a pile-up);
- a check that does not answer within `timeout` is a failure (the shell enforces
  the timeout and reports it as a result);
- failures during `grace_period` (counted from the start) do not count, unless
  the task was healthy once: a task that came up and then broke is not warming up;
- a change of health (first result included) is an `HealthChanged` outcome, which
  the agent sends as a `TASK_RUNNING` update with `healthy` set;
- `consecutive_failures` counted failures in a row give an `Unhealthy` outcome:
  the agent kills the task (kill policy applies) and reports it `TASK_FAILED`.
  0 means "report, never kill".

Timer and probe share one key per round, `HealthRound(framework, task, n)`, so a
late result of an abandoned round (the task was killed, a check restarted) is
recognised and ignored.
"""

from __future__ import annotations

import itertools

import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerKey
from dyad.messages import HealthCheck, HealthCheckType

TaskKey = tuple[str, str]  # (framework_id, task_id)


@attrs.frozen
class HealthRound(TimerKey):
    """One round of one task's check: the timer that starts it and the probe it
    runs share this key; `seq` makes every round's key new."""

    framework_id: str
    task_id: str
    seq: int

    @property
    def task(self) -> TaskKey:
        return (self.framework_id, self.task_id)


@attrs.frozen
class RunHealthCheck:
    """Effect: probe once (at most `check.timeout` seconds) and answer
    `HealthCheckResult(key, healthy, message)`. COMMAND checks run in `sandbox_dir`
    with `env` on top of the agent's environment, as `user` (the task's run's,
    `agent.users`; "": the agent's own)."""

    key: HealthRound
    check: HealthCheck
    sandbox_dir: str
    env: dict[str, str]
    user: str = ""


@attrs.frozen
class HealthCheckResult:
    """Event: how a `RunHealthCheck` went; `message` says why when unhealthy."""

    key: HealthRound
    healthy: bool
    message: str = ""


@attrs.frozen
class HealthChanged:
    """HealthOutcome: the task's health flipped (or was learnt for the first time)."""

    framework_id: str
    task_id: str
    healthy: bool
    message: str


@attrs.frozen
class Unhealthy:
    """HealthOutcome: too many failures in a row; the task must be killed."""

    framework_id: str
    task_id: str
    message: str


HealthOutcome = HealthChanged | Unhealthy
Effect = RunHealthCheck | ArmTimer | CancelTimer


def describe(check: HealthCheck) -> str:
    """How an operator would name the check: 'HTTP GET http://127.0.0.1:80/health'."""
    if check.type == HealthCheckType.HTTP:
        return f"HTTP GET {check.scheme}://127.0.0.1:{check.port}{check.path}"
    if check.type == HealthCheckType.TCP:
        return f"TCP connect to 127.0.0.1:{check.port}"
    command = check.command
    assert command is not None
    return "COMMAND " + (command.shell if command.shell is not None
                         else " ".join(command.argv or []))


@attrs.define
class _Watch:
    check: HealthCheck
    sandbox_dir: str
    env: dict[str, str]
    started: float
    user: str = ""
    key: HealthRound | None = None  # the current round: armed timer or check in flight
    in_flight: bool = False
    healthy: bool | None = None
    ever_healthy: bool = False
    failures: int = 0


class HealthChecker:
    """Every task's health check; see the module docstring."""

    def __init__(self) -> None:
        self._watches: dict[TaskKey, _Watch] = {}
        self._seq = itertools.count()
        self.checks_run = 0
        self.checks_failed = 0

    def watching(self, framework_id: str, task_id: str) -> bool:
        return (framework_id, task_id) in self._watches

    def health(self, framework_id: str, task_id: str) -> bool | None:
        watch = self._watches.get((framework_id, task_id))
        return watch.healthy if watch else None

    def start(self, framework_id: str, task_id: str, check: HealthCheck, sandbox_dir: str,
              env: dict[str, str], now: float, user: str = "") -> list[Effect]:
        """Begin checking a task that just became TASK_RUNNING (idempotent)."""
        if (framework_id, task_id) in self._watches:
            return []
        watch = self._watches[(framework_id, task_id)] = _Watch(check, sandbox_dir, env, now,
                                                                user)
        return self._arm(framework_id, task_id, watch, now + check.delay)

    def stop(self, framework_id: str, task_id: str) -> list[Effect]:
        """Stop checking (the task ends or is being killed). A result still in
        flight will be ignored."""
        watch = self._watches.pop((framework_id, task_id), None)
        if watch is None or watch.key is None or watch.in_flight:
            return []
        return [CancelTimer(watch.key)]

    def timer_fired(self, key: HealthRound, now: float) -> list[Effect]:
        watch = self._current(key)
        if watch is None or watch.in_flight:
            return []
        watch.in_flight = True
        self.checks_run += 1
        return [RunHealthCheck(key, watch.check, watch.sandbox_dir, dict(watch.env), watch.user)]

    def result(self, event: HealthCheckResult, now: float) -> tuple[list[Effect], list[HealthOutcome]]:
        watch = self._current(event.key)
        if watch is None or not watch.in_flight:
            return [], []
        framework_id, task_id = event.key.task
        watch.in_flight = False
        outcomes: list[HealthOutcome] = []
        if event.healthy:
            watch.failures = 0
            watch.ever_healthy = True
            if watch.healthy is not True:
                outcomes.append(HealthChanged(framework_id, task_id, True, "health check passed"))
            watch.healthy = True
            return self._arm(framework_id, task_id, watch, now + watch.check.interval), outcomes
        self.checks_failed += 1
        in_grace = not watch.ever_healthy and now < watch.started + watch.check.grace_period
        if in_grace:
            return self._arm(framework_id, task_id, watch, now + watch.check.interval), []
        watch.failures += 1
        what = f"{describe(watch.check)} failed"
        if watch.healthy is not False:
            outcomes.append(HealthChanged(framework_id, task_id, False,
                                          f"{what}: {event.message}"))
        watch.healthy = False
        limit = watch.check.consecutive_failures
        if limit and watch.failures >= limit:
            del self._watches[(framework_id, task_id)]
            outcomes.append(Unhealthy(framework_id, task_id, (
                f"task failed its health check: {what} {watch.failures} consecutive "
                f"times; last: {event.message}")))
            return [], outcomes
        return self._arm(framework_id, task_id, watch, now + watch.check.interval), outcomes

    def validate(self) -> None:
        for (framework_id, task_id), watch in self._watches.items():
            assert watch.key is not None, (framework_id, task_id)
            assert watch.key.task == (framework_id, task_id)
            assert watch.failures == 0 or watch.healthy is False

    def _current(self, key: HealthRound) -> _Watch | None:
        watch = self._watches.get(key.task)
        return watch if watch is not None and watch.key == key else None

    def _arm(self, framework_id: str, task_id: str, watch: _Watch, at: float) -> list[Effect]:
        watch.key = HealthRound(framework_id, task_id, next(self._seq))
        return [ArmTimer(watch.key, at)]
