"""Limits, usage and drain in the agent core: what each run may use, what it is
measured to use, the memory verdict under each isolator, the reports to the
master, and draining -- all with a fake clock and made-up samples."""

from __future__ import annotations

from typing import Any

import attrs

from agent.model import (
    MIB, Drain, ExecutorProcessExited, KillExecutor, LaunchExecutor, Limits, RunSample,
    UpdateLimits, UsageSampled,
)
from dyad.messages import (
    DrainAgent, Reason, RegisterExecutor, RunTask, ShutdownExecutor,
    ShutdownFramework, TaskState, UsageReport,
)
from dyad.resources import Resources

from tests.unit.test_agent_state import (
    FRAMEWORK, Agent, command_task, custom_executor, executor_task, of_type, running_executor,
    status, to_master, to_peer, updates,
)


def sample(executor_id: str = "t1", run_id: str = "id0", at: float = 0.0, cpu: float = 0.0,
           rss_mib: float = 10, **kw: Any) -> RunSample:
    return RunSample("F1", executor_id, run_id, timestamp=at, cpus_user_time=cpu,
                     cpus_system_time=0.0, mem_rss_bytes=int(rss_mib * MIB), processes=2, **kw)


def verdicts(effects: list[Any]) -> list[Any]:
    return of_type(effects, KillExecutor) + updates(effects)


def test_limits_are_the_tasks_plus_room_for_the_command_executor() -> None:
    agent = Agent()
    agent.register()
    (launch,) = of_type(agent.run(command_task("t1", Resources.parse("cpus:1;mem:100"))),
                        LaunchExecutor)
    assert launch.limits == Limits(cpus=1.1, mem_bytes=164 * MIB)
    (launch,) = of_type(agent.run(command_task("t2", Resources.parse("cpus:1"))),
                        LaunchExecutor)
    assert launch.limits == Limits(cpus=1.1, mem_bytes=0)  # no mem asked: not limited


def test_limits_follow_the_tasks_of_a_custom_executor() -> None:
    agent = Agent()
    agent.register()
    info = custom_executor(resources=Resources.parse("cpus:0.5;mem:32"))
    (launch,) = of_type(agent.run(executor_task("t1", info)), LaunchExecutor)
    assert launch.limits == Limits(cpus=1.5, mem_bytes=160 * MIB)
    assert of_type(agent.run(executor_task("t2", info)), UpdateLimits) == [
        UpdateLimits("F1", "E1", "id0", Limits(cpus=2.5, mem_bytes=288 * MIB))]
    agent.executor(RegisterExecutor(framework_id="F1", executor_id="E1"))
    effects = agent.executor(status("t1", TaskState.TASK_FINISHED, "u1"))
    assert of_type(effects, UpdateLimits) == [
        UpdateLimits("F1", "E1", "id0", Limits(cpus=1.5, mem_bytes=160 * MIB))]


def test_posix_kills_a_run_whose_rss_passes_its_limit() -> None:
    agent = Agent(isolation="posix")
    agent.register()
    running_executor(agent, command_task("t1", Resources.parse("cpus:1;mem:64")))
    assert not verdicts(agent(UsageSampled((sample(rss_mib=127),))))
    effects = agent(UsageSampled((sample(at=1, rss_mib=300),)))
    assert of_type(effects, KillExecutor) == [KillExecutor("F1", "t1", "id0", "KILL")]
    (failed,) = updates(effects)
    assert failed.state == TaskState.TASK_FAILED
    assert failed.reason == Reason.CONTAINER_LIMITATION_MEMORY
    assert failed.message == (
        "Memory limit exceeded: executor t1 used 300.0 MiB (2 processes), its limit is "
        "128.0 MiB (64.0 MiB for the task + 64 MiB for the command executor)")
    assert not verdicts(agent(UsageSampled((sample(at=2, rss_mib=400),))))  # already dying
    assert agent.state.metrics()["agent/executors_memory_limited"] == 1


def test_under_cgroups_the_kernel_decides_and_the_agent_reports_it() -> None:
    agent = Agent(isolation="cgroups")
    agent.register()
    running_executor(agent, command_task("t1", Resources.parse("cpus:1;mem:64")))
    assert not verdicts(agent(UsageSampled((sample(rss_mib=500),))))  # shared pages count
    effects = agent(UsageSampled((sample(at=1, rss_mib=120, mem_peak_bytes=128 * MIB,
                                         oom=True),)))
    (failed,) = updates(effects)
    assert failed.reason == Reason.CONTAINER_LIMITATION_MEMORY
    assert "used 128.0 MiB" in failed.message


def test_usage_is_kept_per_executor_and_reported_to_the_master_now_and_then() -> None:
    agent = Agent(usage_report_interval=5.0)
    agent.register()
    running_executor(agent, command_task("t1", Resources.parse("cpus:2;mem:64")))
    effects = agent(UsageSampled((sample(at=10, cpu=1.0),), ("http://x/pkg.tgz",)))
    (report,) = to_master(effects, UsageReport)
    assert report.cached_uris == ["http://x/pkg.tgz"] and report.agent_id == "A1"
    assert report.executors[0].cpus_used == 0  # one sample: no rate yet
    agent.clock.advance(2)
    assert to_master(agent(UsageSampled((sample(at=12, cpu=2.5),))), UsageReport) == []
    agent.clock.advance(3)
    (report,) = to_master(agent(UsageSampled((sample(at=15, cpu=4.0),))), UsageReport)
    (usage,) = report.executors
    assert (usage.executor_id, usage.task_ids, usage.cpus_used) == ("t1", ["t1"], 0.5)
    assert usage.cpus_limit == 2.1 and usage.mem_limit_bytes == 128 * MIB
    (entry,) = agent.state.statistics()
    assert entry["executor_id"] == "t1" and entry["statistics"]["cpus_user_time_secs"] == 4.0
    # Samples of runs that ended meanwhile are ignored.
    agent(UsageSampled((sample("zz"), sample(run_id="old", rss_mib=999))))
    assert agent.state.statistics() == [entry]


def test_drain_kills_every_task_with_the_drain_reason_and_refuses_new_ones() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, attrs.evolve(command_task("t1"), kill_grace_period=5.0))
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1", "t1"))
    agent.run(executor_task("t2"))  # its executor has not registered: killed at once
    effects = agent(Drain())
    assert to_master(effects, DrainAgent) == [DrainAgent(agent_id="A1")]
    (shutdown,) = to_peer(effects, kind=ShutdownExecutor)
    assert shutdown.grace_period == 8.0  # the task's 5 s kill grace + the agent's 3 s
    assert KillExecutor("F1", "E1", "id1", "TERM") in effects
    assert agent.state.drain_state == "DRAINING"
    queued = [u.status for u in agent.state.updates.all_queued() if u.status.task_id == "t2"]
    assert [(s.state, s.reason) for s in queued] == [(TaskState.TASK_KILLED,
                                                      Reason.AGENT_DRAINING)]
    agent.executor(status("t1", TaskState.TASK_KILLED, "u2", "t1"))
    (killed,) = [u.status for u in agent.state.updates.all_queued() if u.status.uuid == "u2"]
    assert killed.reason == Reason.AGENT_DRAINING and killed.state == TaskState.TASK_KILLED
    assert agent.state.drain_state == "DRAINED"
    assert agent(Drain()) == []
    (dropped,) = updates(agent.master(RunTask(framework=FRAMEWORK, task=command_task("t9"))))
    assert (dropped.state, dropped.reason) == (TaskState.TASK_DROPPED, Reason.AGENT_DRAINING)
    # A new master hears it again when the agent registers there.
    agent.lose_master()
    assert to_master(agent.register(), DrainAgent) == [DrainAgent(agent_id="A1")]
    assert agent.state.snapshot()["drain_state"] == "DRAINED"


def test_an_executor_dying_during_a_drain_still_reports_the_drain() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"))
    agent(Drain())
    agent(ExecutorProcessExited("F1", "E1", "id0", -9))
    (killed,) = [u.status for u in agent.state.updates.all_queued()
                 if u.status.state.is_terminal]
    assert (killed.state, killed.reason) == (TaskState.TASK_KILLED, Reason.AGENT_DRAINING)


def test_shutdown_grace_covers_the_tasks_kill_grace_periods() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, attrs.evolve(executor_task("t1"), kill_grace_period=10.0))
    effects = agent.master(ShutdownFramework(framework_id="F1"))
    (shutdown,) = to_peer(effects, kind=ShutdownExecutor)
    assert shutdown.grace_period == 13.0
    assert of_type(agent.advance(12.9), KillExecutor) == []
    assert of_type(agent.advance(0.2), KillExecutor) == [KillExecutor("F1", "E1", "id0", "TERM")]
