"""Agent restart recovery: what is checkpointed, how a new AgentState takes it back,
how executors re-register, and the checkpoint file itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from agent import checkpoint, checkpoint_file
from agent.checkpoint import CheckpointError, Recover, SavedAgent
from agent.containerizer import describe_exit
from agent.model import UNKNOWN_EXIT, KillExecutor, UpdateLimits
from dyad.messages import (
    ExecutorExited, ExecutorRegistered, KillTask, LaunchTask, Reason, RegisterAgent,
    RegisterExecutor, ReregisterExecutor, ShutdownExecutor, ShutdownFramework,
    StatusUpdateAck, TaskState,
)
from dyad.resources import Resources

from tests.unit.test_agent_state import (
    CONFIG, PEER2, Agent, command_task, custom_executor, executor_task, of_type,
    running_executor, status, to_master, to_peer, updates,
)

KEY = ("F1", "E1", "id0")


def before_the_crash() -> tuple[Agent, SavedAgent]:
    """An agent with a registered custom executor running t1 (RUNNING, unacked) and
    t2 (launched, never confirmed), and a second executor E2 still launching t3."""
    agent = Agent(pid=4242)
    agent.register()
    running_executor(agent, executor_task("t1"))
    agent.run(executor_task("t2"))
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"))
    agent.run(executor_task("t3", custom_executor("E2")))
    return agent, agent.state.saved()


def recovered(saved: SavedAgent, alive: set[tuple[str, str, str]]) -> tuple[Agent, list[Any]]:
    agent = Agent(pid=5151)
    return agent, agent(Recover(saved, frozenset(alive)))


def test_the_checkpoint_holds_what_a_restart_needs_and_survives_the_codec() -> None:
    _, saved = before_the_crash()
    assert saved.agent_id == "A1" and saved.resources == CONFIG.resources
    executors = {e.info.executor_id: e for e in saved.executors}
    assert executors["E1"].phase == "RUNNING" and executors["E2"].phase == "LAUNCHING"
    assert [(t.info.task_id, t.state.name, t.queued) for t in executors["E1"].tasks] == [
        ("t1", "TASK_RUNNING", False), ("t2", "TASK_STAGING", False)]
    assert [u.status.uuid for u in saved.updates] == ["u1"]
    assert checkpoint.decode(checkpoint.encode(saved)) == saved


def test_a_surviving_executor_is_taken_back_when_it_reregisters() -> None:
    _, saved = before_the_crash()
    agent, effects = recovered(saved, {KEY})
    executor = agent.state.frameworks["F1"].executors["E1"]
    assert agent.state.agent_id == "A1" and executor.phase == "RECOVERING"
    assert UpdateLimits(*KEY, executor.limits) in effects
    assert to_master(effects) == []  # nothing reaches a master before one registers us
    agent.register()
    effects = agent.executor(ReregisterExecutor(
        framework_id="F1", executor_id="E1", tasks=[executor_task("t1")]), PEER2)
    (registered,) = to_peer(effects, PEER2, ExecutorRegistered)
    assert registered.agent_pid == 5151 and registered.agent.id == "A1"
    # t2 was launched before the crash, but the executor does not know it: lost.
    (t2_lost,) = [u for u in agent.state.updates.all_queued() if u.status.task_id == "t2"]
    assert t2_lost.status.state == TaskState.TASK_LOST
    assert t2_lost.status.reason == Reason.AGENT_RESTARTED
    assert executor.phase == "RUNNING" and executor.peer == PEER2


def test_registration_after_recovery_reports_tasks_and_the_exits_it_missed() -> None:
    _, saved = before_the_crash()
    agent, _ = recovered(saved, {KEY})
    effects = agent.register()
    (register,) = to_master(effects, RegisterAgent)
    assert register.agent.id == "A1"
    assert sorted(t.task_id for t in register.tasks) == ["t1", "t2"]
    assert [e.executor_id for e in register.executors] == ["E1"]
    (exited,) = to_master(effects, ExecutorExited)
    assert exited == ExecutorExited(agent_id="A1", framework_id="F1", executor_id="E2",
                                    status=UNKNOWN_EXIT)
    heads = {s.task_id: s for s in updates(effects)}
    assert heads["t1"].uuid == "u1"  # the unacknowledged update is sent again
    assert heads["t3"].state == TaskState.TASK_FAILED
    assert "ended while the agent was down" in heads["t3"].message
    assert "unknown" in describe_exit(UNKNOWN_EXIT)


def test_resent_updates_of_a_reregistering_executor_are_taken_once() -> None:
    _, saved = before_the_crash()
    agent, _ = recovered(saved, {KEY})
    agent.register()
    again = status("t1", TaskState.TASK_RUNNING, "u1")
    finished = status("t1", TaskState.TASK_FINISHED, "u9")
    effects = agent.executor(ReregisterExecutor(
        framework_id="F1", executor_id="E1", tasks=[executor_task("t2")],
        updates=[again, finished]))
    acks = to_peer(effects, kind=StatusUpdateAck)
    assert {a.uuid for a in acks} == {"u1", "u9"}
    queued = [u.status.uuid for u in agent.state.updates.all_queued()
              if u.status.task_id == "t1"]
    assert queued == ["u1", "u9"]  # u1 once, as before the crash


def test_an_executor_that_does_not_reregister_is_killed_and_its_tasks_fail() -> None:
    _, saved = before_the_crash()
    agent, _ = recovered(saved, {KEY})
    agent.register()
    assert of_type(agent.advance(9.9), KillExecutor) == []
    effects = agent.advance(0.2)
    assert of_type(effects, KillExecutor) == [KillExecutor("F1", "E1", "id0", "KILL")]
    failed = {u.status.task_id: u.status.reason for u in agent.state.updates.all_queued()
              if u.status.state == TaskState.TASK_FAILED}
    assert failed == {"t1": Reason.EXECUTOR_REREGISTRATION_TIMEOUT,
                      "t2": Reason.EXECUTOR_REREGISTRATION_TIMEOUT,
                      "t3": Reason.EXECUTOR_TERMINATED}


def test_kills_wait_for_the_executor_to_come_back() -> None:
    _, saved = before_the_crash()
    agent, _ = recovered(saved, {KEY})
    agent.register()
    assert to_peer(agent.master(KillTask(framework_id="F1", task_id="t1",
                                         kill_grace_period=4.0))) == []
    effects = agent.executor(ReregisterExecutor(
        framework_id="F1", executor_id="E1", tasks=[executor_task("t1"), executor_task("t2")]))
    assert to_peer(effects, kind=KillTask) == [KillTask(framework_id="F1", task_id="t1",
                                                        kill_grace_period=4.0)]


def test_a_launching_executor_that_survived_gets_its_queued_tasks() -> None:
    _, saved = before_the_crash()
    agent, _ = recovered(saved, {KEY, ("F1", "E2", "id1")})
    agent.register()
    effects = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E2"), PEER2)
    assert [m.task.task_id for m in to_peer(effects, PEER2, LaunchTask)] == ["t3"]


def test_an_executor_that_was_stopping_is_stopped() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, command_task("t1"))
    agent.master(ShutdownFramework(framework_id="F1"))
    assert agent.state.frameworks["F1"].executors["t1"].phase == "TERMINATING"
    fresh, effects = recovered(agent.state.saved(), {("F1", "t1", "id0")})
    assert KillExecutor("F1", "t1", "id0", "TERM") in effects
    assert KillExecutor("F1", "t1", "id0", "KILL") in of_type(fresh.advance(3), KillExecutor)


def test_unknown_executors_reregistering_are_told_to_stop() -> None:
    agent = Agent()
    agent.register()
    effects = agent.executor(ReregisterExecutor(framework_id="F1", executor_id="E1"))
    assert to_peer(effects, kind=ShutdownExecutor)


def test_the_checkpoint_file_is_written_atomically_and_damage_is_reported(
        tmp_path: Path) -> None:
    _, saved = before_the_crash()
    assert checkpoint_file.load(str(tmp_path)) is None
    checkpoint_file.write(str(tmp_path), saved)
    assert checkpoint_file.load(str(tmp_path)) == saved
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == ["agent.json"]
    (tmp_path / "meta" / "agent.json").write_text('{"format": 1, "agent": {"hostname": 3}}')
    with pytest.raises(CheckpointError, match="damaged"):
        checkpoint_file.load(str(tmp_path))
    (tmp_path / "meta" / "agent.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="not JSON"):
        checkpoint_file.load(str(tmp_path))
    checkpoint_file.remove(str(tmp_path))
    assert checkpoint_file.load(str(tmp_path)) is None


def test_a_changed_agent_refuses_its_checkpoint_and_says_why() -> None:
    _, saved = before_the_crash()
    assert checkpoint.incompatibility(saved, CONFIG) == ""
    changed = attrs.evolve(CONFIG, resources=Resources.parse("cpus:2;mem:1024"),
                           attributes={"rack": "r9"})
    problem = checkpoint.incompatibility(saved, changed)
    assert problem.startswith("agent A1 cannot recover: resources were")
    assert "attributes were {'rack': 'r1'}, are now {'rack': 'r9'}" in problem
    assert "/work/meta" in problem


def test_detected_resources_come_back_from_the_checkpoint() -> None:
    _, saved = before_the_crash()
    saved = attrs.evolve(saved, resources=Resources.parse(
        "cpus:4;mem:1024;disk:5000;ports:[31000-31009]"))
    now = attrs.evolve(CONFIG, resources=Resources.parse(
        "cpus:4;mem:1024;disk:4990;ports:[31000-31009]"))  # free disk moved a little
    assert checkpoint.incompatibility(saved, now) != ""
    again = checkpoint.with_detected(saved, now, {"disk"})
    assert again.resources == saved.resources
    assert checkpoint.incompatibility(saved, again) == ""
    told = attrs.evolve(now, resources=Resources.parse("cpus:8;mem:1024;disk:1"))
    assert "resources were" in checkpoint.incompatibility(
        saved, checkpoint.with_detected(saved, told, {"disk", "ports"}))
