"""Command tasks the agent runs itself (`agent.host_runs`), event by event with a
fake clock and `validate()` after every step (the holder that runs them, with real
processes: `tests/unit/test_holder.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.checkpoint import Recover, decode, encode
from agent.containerizer import describe_command_exit
from agent.health import HealthCheckResult, RunHealthCheck
from agent.host_runs import LOST_STATUS
from agent.model import (
    MIB, UNKNOWN_EXIT, Checkpoint, ExecutorProcessExited, ExecutorStarted, KillDue,
    KillExecutor, LaunchExecutor, RegistrationTimeout, UpdateLimits,
)
from dyad.effects import ArmTimer
from dyad.messages import (
    CommandInfo, ExecutorExited, HealthCheck, HealthCheckType, KillTask, Reason,
    RegisterExecutor, ShutdownExecutor, Source, TaskInfo, TaskState, TaskStatus,
)
from dyad.resources import Resources
from tests.unit.test_agent_state import Agent, of_type, to_master, to_peer

KEY = ("F1", "t1", "id0")
SANDBOX = "/work/F1/t1/id0"  # run_directory: what the core names, no disk touched


def task(task_id: str = "t1", **kw: Any) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1",
                    resources=Resources.parse("cpus:0.5;mem:64"),
                    command=CommandInfo(shell="./serve", environment={"COLOR": "blue"}), **kw)


def direct_agent() -> Agent:
    agent = Agent(command_tasks="direct")
    agent.register()
    return agent


def told(agent: Agent, task_id: str = "t1") -> list[TaskStatus]:
    """Every update of the task so far, acknowledging each as it goes (the
    manager sends the next only once the last is acknowledged)."""
    seen: list[TaskStatus] = []
    while queued := agent.state.updates.queued("F1", task_id):
        seen.append(queued[0].status)
        agent.ack(queued[0])
    return seen


def started(agent: Agent, info: TaskInfo | None = None) -> list[Any]:
    """Run it and let its holder start it; the updates so far are acknowledged."""
    info = info or task()
    agent.run(info)
    effects = agent(ExecutorStarted(*KEY, 4242, 1000.5))
    # Told as the task's executor's: the agent plays it.
    assert [(s.state, s.source) for s in told(agent, info.task_id)] == [
        (TaskState.TASK_STARTING, Source.EXECUTOR), (TaskState.TASK_RUNNING, Source.EXECUTOR)]
    return effects


def run_dir(agent: Agent) -> str:
    (executor,) = agent.state.records.executors()
    return executor.directory


def test_a_command_task_is_held_with_no_executor_and_no_timer() -> None:
    agent = direct_agent()
    effects = agent.run(task())
    # Nothing will register: the only timer is the TASK_STARTING update's retry.
    assert not any(isinstance(t.key, RegistrationTimeout) for t in of_type(effects, ArmTimer))
    (launch,) = of_type(effects, LaunchExecutor)
    assert launch.held and launch.sandbox_dir == run_dir(agent)
    assert launch.command == task().command  # its own, under nothing
    assert launch.env["COLOR"] == "blue" and launch.env["MESOS_TASK_ID"] == "t1"
    assert launch.limits.mem_bytes == 64 * MIB and launch.limits.cpus == 0.5  # no executor's
    (executor,) = agent.state.records.executors()
    assert executor.info.name == "Command (Task: t1)" and executor.host_direct
    # Nothing may claim to be its executor.
    assert to_peer(agent.executor(RegisterExecutor(framework_id="F1", executor_id="t1")),
                   kind=ShutdownExecutor)
    # The executor mode keeps the Python command executor, with its allowance.
    other = Agent()
    other.register()
    (python,) = of_type(other.run(task()), LaunchExecutor)
    assert python.command.argv[1:] == ["-m", "frameworks.executors.command"]
    assert not python.held and python.limits.mem_bytes == 128 * MIB


def test_the_pid_and_start_time_are_checkpointed_before_task_running() -> None:
    agent = direct_agent()
    agent.run(task(health_check=HealthCheck(type=HealthCheckType.COMMAND, delay=1.0,
                                            command=CommandInfo(shell="test -e ok"))))
    effects = agent(ExecutorStarted(*KEY, 4242, 1000.5))
    assert effects[0] == Checkpoint()
    (saved,) = agent.state.saved().executors
    assert (saved.pid, saved.started, saved.host_direct) == (4242, 1000.5, True)
    (executor,) = agent.state.records.executors()
    assert executor.phase == "RUNNING" and not executor.queued
    (probe,) = of_type(agent.advance(1.0), RunHealthCheck)
    assert probe.sandbox_dir == run_dir(agent) and probe.env["MESOS_TASK_ID"] == "t1"


@pytest.mark.parametrize("status,description,state,reason", [
    (0, "Command exited with status 0", TaskState.TASK_FINISHED, ""),
    (3, "Command exited with status 3", TaskState.TASK_FAILED, ""),
    (139, "Command exited with status 139 (signal SIGSEGV, or an exit with that status)",
     TaskState.TASK_FAILED, ""),
    (-9, "Command terminated by signal SIGKILL", TaskState.TASK_FAILED, ""),
    (UNKNOWN_EXIT, describe_command_exit(UNKNOWN_EXIT), TaskState.TASK_FAILED,
     Reason.EXECUTOR_TERMINATED)])
def test_the_commands_exit_is_the_tasks_end(status: int, description: str, state: TaskState,
                                            reason: str) -> None:
    assert describe_command_exit(status) == description
    agent = direct_agent()
    started(agent)
    effects = agent(ExecutorProcessExited(*KEY, status, description))
    (end,) = told(agent)
    assert (end.state, end.reason, end.message) == (state, reason, description)
    # What the agent could not learn from the command is its own word.
    assert end.source == (Source.AGENT if status == UNKNOWN_EXIT else Source.EXECUTOR)
    assert to_master(effects, ExecutorExited) == []  # the agent's own: not the master's
    assert not agent.state.frameworks


def test_a_kill_is_sigterm_then_sigkill_after_the_tasks_grace_and_ends_killed() -> None:
    agent = direct_agent()
    started(agent, task(kill_grace_period=2.5))
    effects = agent.master(KillTask(framework_id="F1", task_id="t1"))
    (killing,) = told(agent)
    assert killing.state == TaskState.TASK_KILLING and "SIGKILL after 2.5s" in killing.message
    assert of_type(effects, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    assert not of_type(agent.advance(2.4), KillExecutor)
    assert of_type(agent.advance(0.1), KillExecutor) == [KillExecutor(*KEY, "KILL")]
    agent(ExecutorProcessExited(*KEY, -9, "Command terminated by signal SIGKILL"))
    (end,) = told(agent)
    assert (end.state, end.message) == (TaskState.TASK_KILLED,
                                        "Command terminated by signal SIGKILL")


def test_a_command_ending_at_sigterm_is_killed_whatever_its_status() -> None:
    agent = direct_agent()
    started(agent)
    agent.master(KillTask(framework_id="F1", task_id="t1", kill_grace_period=1.0))
    told(agent)
    agent(ExecutorProcessExited(*KEY, 0, "Command exited with status 0"))  # it cleaned up
    (end,) = told(agent)
    assert end.state == TaskState.TASK_KILLED
    assert not any(isinstance(k, KillDue) for k in agent.timers)  # no SIGKILL left to send


def test_a_failing_health_check_kills_the_task_and_it_ends_unhealthy() -> None:
    check = HealthCheck(type=HealthCheckType.TCP, port=31001, delay=0, interval=1,
                        grace_period=0, consecutive_failures=1)
    agent = direct_agent()
    started(agent, task(health_check=check))
    (probe,) = of_type(agent.advance(0.0), RunHealthCheck)
    effects = agent(HealthCheckResult(probe.key, False, "connection refused"))
    assert of_type(effects, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    agent(ExecutorProcessExited(*KEY, 143, describe_command_exit(143)))
    states = [(s.state, s.reason, s.source) for s in told(agent)]
    assert states[-1] == (TaskState.TASK_FAILED, Reason.TASK_UNHEALTHY, Source.AGENT)


def test_a_kill_before_the_command_started_abandons_the_launch() -> None:
    agent = direct_agent()
    agent.run(task())
    told(agent)  # TASK_STARTING
    effects = agent.master(KillTask(framework_id="F1", task_id="t1"))
    assert [(s.state, s.reason) for s in told(agent)] == [
        (TaskState.TASK_KILLED, Reason.TASK_KILLED_DURING_LAUNCH)]
    assert of_type(effects, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    agent(ExecutorStarted(*KEY, 4242, 1000.5))  # it got going anyway: no TASK_RUNNING
    assert not told(agent)
    agent(ExecutorProcessExited(*KEY, -15, "Command terminated by signal SIGTERM"))
    assert not agent.state.frameworks


# ------------------------------------------------------------------- recovery


def checkpointed(kill: bool = False) -> Any:
    agent = direct_agent()
    started(agent, task(health_check=HealthCheck(type=HealthCheckType.TCP, port=31001,
                                                 delay=0.5)))
    if kill:
        agent.master(KillTask(framework_id="F1", task_id="t1"))
        told(agent)
    return decode(encode(agent.state.saved()))


def recovered(saved: Any, alive: bool, exits: dict[Any, Any] | None = None) -> Agent:
    back = Agent(command_tasks="direct")
    back.effects = back(Recover(saved, frozenset({KEY}) if alive else frozenset(), {},
                                exits or {}))
    back.register()
    return back


def test_a_live_run_is_running_again_with_its_health_checks_and_limits() -> None:
    back = recovered(checkpointed(), alive=True)
    assert not told(back)  # running as before: nothing to say
    (executor,) = back.state.records.executors()
    assert executor.phase == "RUNNING" and executor.pid == 4242
    assert of_type(back.effects, UpdateLimits)
    assert of_type(back.advance(0.5), RunHealthCheck)
    # Its end later comes from its holder, which the restarted agent reconnected to.
    back(ExecutorProcessExited(*KEY, 7, "Command exited with status 7"))
    (end,) = told(back)
    assert (end.state, end.message) == (TaskState.TASK_FAILED, "Command exited with status 7")


def test_a_run_that_ended_while_the_agent_was_away_ends_by_what_its_holder_said() -> None:
    back = recovered(checkpointed(), alive=False,
                     exits={KEY: ExecutorProcessExited(*KEY, 0, "Command exited with status 0")})
    (end,) = told(back)
    assert (end.state, end.message) == (TaskState.TASK_FINISHED, "Command exited with status 0")
    assert not back.state.frameworks


def test_a_run_gone_without_a_status_is_failed_or_killed_if_a_kill_had_begun() -> None:
    (lost,) = told(recovered(checkpointed(), alive=False))
    assert (lost.state, lost.reason, lost.message) == (
        TaskState.TASK_FAILED, Reason.EXECUTOR_TERMINATED, LOST_STATUS)
    (killed,) = told(recovered(checkpointed(kill=True), alive=False))
    assert killed.state == TaskState.TASK_KILLED


def test_a_live_run_being_killed_is_killed_again() -> None:
    back = recovered(checkpointed(kill=True), alive=True)
    assert of_type(back.effects, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    assert any(isinstance(t.key, KillDue) for t in of_type(back.effects, ArmTimer))
    assert not any(isinstance(k, RegistrationTimeout) for k in back.timers)
