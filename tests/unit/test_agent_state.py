"""AgentState driven event by event with a fake clock; `validate()` after every step."""

from __future__ import annotations

import itertools
from typing import Any, Hashable

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.checkpoint import Recover
from agent.containerizer import describe_exit
from agent.health import HealthCheckResult, HealthRound
from agent.model import (
    AgentConfig, Checkpoint, ConnectMaster, DetectMaster, Drain, ExecutorLaunchFailed,
    ExecutorMessage, ExecutorProcessExited, ExecutorStarted, Exit, InvalidFrame, KillExecutor,
    KillDue, LaunchExecutor, MasterDetected, MasterMessage, RunSample, Shutdown, UsageSampled,
)
from agent.master_link import MasterSilent, RegisterRetry
from agent.state import AgentState
from agent.status_updates import SendMaster
from dyad.clock import FakeClock
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    Address, AgentRegistered, CommandInfo, ExecutorExited, ExecutorInfo, ExecutorRegistered,
    ExecutorToFramework, FrameworkInfo, FrameworkToExecutor, Heartbeat, KillTask, LaunchTask,
    MasterInfo, MessageError, Ping, Pong, Reason, RegisterAgent, RegisterExecutor, Rejected,
    ReregisterExecutor, RunTask, ShutdownExecutor, ShutdownFramework, Source, StatusUpdate,
    StatusUpdateAck, Subscribe, TaskInfo, TaskState, TaskStatus,
)
from dyad.resources import Resources

MASTER = MasterInfo(id="m1", hostname="m", ip="10.0.0.1", port=5050, zmq_port=5055,
                    version="0.1.0", address=Address(hostname="m", ip="10.0.0.1", port=5050))
FRAMEWORK = FrameworkInfo(name="fw", id="F1")
TOTAL = Resources.parse("cpus:4;mem:1024;ports:[31000-31009]")
CONFIG = AgentConfig(hostname="agent-host", ip="127.0.0.1", port=5051, executor_port=5052,
                     command_tasks="executor",  # these tests drive the command executor
                     work_dir="/work", resources=TOTAL, python="/usr/bin/python3",
                     attributes={"rack": "r1"}, ping_interval=15.0)
PEER = "aa01"
PEER2 = "bb02"
SMALL = Resources.parse("cpus:1;mem:128")


def command_task(task_id: str, resources: Resources = SMALL, shell: str = "true") -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1", resources=resources,
                    command=CommandInfo(shell=shell))


def custom_executor(executor_id: str = "E1", resources: Resources = Resources()) -> ExecutorInfo:
    return ExecutorInfo(executor_id=executor_id, resources=resources,
                        command=CommandInfo(argv=["./my-executor", "--fast"],
                                            environment={"COLOR": "blue"}))


def executor_task(task_id: str, executor: ExecutorInfo | None = None,
                  resources: Resources = SMALL) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1", resources=resources,
                    executor=executor or custom_executor())


def status(task_id: str, state: TaskState, uuid: str, executor_id: str = "E1") -> StatusUpdate:
    return StatusUpdate(framework_id="F1", status=TaskStatus(
        task_id=task_id, state=state, uuid=uuid, source=Source.EXECUTOR,
        executor_id=executor_id, agent_id="A1"))


class Agent:
    """An AgentState with a fake clock and an emulated shell timer table."""

    def __init__(self, **config: Any) -> None:
        self.clock = FakeClock()
        ids = itertools.count()
        self.state = AgentState(attrs.evolve(CONFIG, **config),
                                new_id=lambda: f"id{next(ids)}")
        self.timers: dict[Hashable, float] = {}
        self.saved = self.state.saved()

    @property
    def now(self) -> float:
        return self.clock.now()

    def __call__(self, event: Any) -> list[Any]:
        effects = self.state.handle(event, self.clock.now())
        self.state.validate()
        # Whatever a restarted agent needs must be checkpointed before it is acted on.
        saved = self.state.saved()
        if saved != self.saved:
            assert effects and effects[0] == Checkpoint(), (event, effects)
            self.saved = saved
        for effect in effects:
            if isinstance(effect, ArmTimer):
                self.timers[effect.key] = effect.at
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)
        return effects

    def master(self, msg: Any) -> list[Any]:
        return self(MasterMessage(msg))

    def executor(self, msg: Any, peer: str = PEER) -> list[Any]:
        return self(ExecutorMessage(peer, msg))

    def advance(self, seconds: float) -> list[Any]:
        """Move time on, firing due timers in order; return all their effects."""
        end = self.clock.now() + seconds
        effects: list[Any] = []
        while True:
            due = sorted((at, str(k), k) for k, at in self.timers.items() if at <= end)
            if not due:
                break
            at, _, key = due[0]
            del self.timers[key]
            self.clock.advance(max(0.0, at - self.clock.now()))
            effects += self(TimerFired(key))
        self.clock.advance(end - self.clock.now())
        return effects

    def register(self, agent_id: str = "A1", ping_interval: float = 100.0) -> list[Any]:
        effects = self(MasterDetected(MASTER))
        return effects + self.master(AgentRegistered(agent_id=agent_id, master_info=MASTER,
                                                     ping_interval=ping_interval))

    def lose_master(self) -> None:
        assert of_type(self.advance(3 * self.state.ping_interval), DetectMaster)

    def run(self, task: TaskInfo, framework: FrameworkInfo = FRAMEWORK) -> list[Any]:
        return self.master(RunTask(framework=framework, task=task))

    def ack(self, update: StatusUpdate) -> list[Any]:
        return self.master(StatusUpdateAck(agent_id="A1", framework_id=update.framework_id,
                                           task_id=update.status.task_id,
                                           uuid=update.status.uuid))


def to_master(effects: list[Any], kind: type | None = None) -> list[Any]:
    return [e.message for e in effects
            if isinstance(e, SendMaster) and (kind is None or isinstance(e.message, kind))]


def to_peer(effects: list[Any], peer: str = PEER, kind: type | None = None) -> list[Any]:
    return [e.message for e in effects if isinstance(e, Send) and e.to == peer
            and (kind is None or isinstance(e.message, kind))]


def of_type(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def updates(effects: list[Any]) -> list[TaskStatus]:
    return [m.status for m in to_master(effects, StatusUpdate)]


def running_executor(agent: Agent, task: TaskInfo, peer: str = PEER) -> list[Any]:
    """Register, run `task`, and let its executor register; return the launch effects."""
    effects = agent.run(task)
    executor_id = task.executor.executor_id if task.executor else task.task_id
    return effects + agent.executor(RegisterExecutor(framework_id="F1",
                                                     executor_id=executor_id), peer)


# ------------------------------------------------------------------ registration


def test_detected_master_is_connected_and_registered_with() -> None:
    agent = Agent()
    effects = agent(MasterDetected(MASTER))
    assert of_type(effects, ConnectMaster) == [ConnectMaster("tcp://10.0.0.1:5055")]
    (register,) = to_master(effects, RegisterAgent)
    assert register.agent.id is None
    assert (register.agent.hostname, register.agent.port, register.agent.ip) == (
        "agent-host", 5051, "127.0.0.1")
    assert register.agent.resources == TOTAL and register.agent.attributes == {"rack": "r1"}
    assert agent.state.metrics()["agent/registered"] == 0
    agent.master(AgentRegistered(agent_id="A1", master_info=MASTER, ping_interval=5.0))
    assert agent.state.agent_id == "A1"
    assert agent.state.metrics()["agent/registered"] == 1
    assert to_master(agent.master(Ping(agent_id="A1")), Pong) == [Pong(agent_id="A1")]


def test_timers_of_an_unknown_kind_raise_and_stale_ones_are_ignored() -> None:
    @attrs.frozen
    class Stranger(TimerKey):
        n: int

    agent = Agent()
    agent.register()
    with pytest.raises(UnknownTimer):
        agent.state.handle(TimerFired(("register", 0)), agent.now)
    with pytest.raises(UnknownTimer):
        agent.state.handle(TimerFired(Stranger(1)), agent.now)
    # Known kinds whose subject is gone or was re-armed: nothing happens.
    for stale in (RegisterRetry(999), MasterSilent(999), KillDue("F1", "gone", 0)):
        assert agent(TimerFired(stale)) == []


def test_registration_is_retried_with_backoff_until_answered() -> None:
    agent = Agent(register_backoff_max=8.0)
    start = agent.now
    sent_at = [0.0] if to_master(agent(MasterDetected(MASTER)), RegisterAgent) else []
    for _ in range(40):
        if to_master(agent.advance(1), RegisterAgent):
            sent_at.append(agent.now - start)
    assert sent_at == [0, 1, 3, 7, 15, 23, 31, 39]  # gaps 1, 2, 4, 8, then capped at 8
    agent.master(AgentRegistered(agent_id="A1", master_info=MASTER))
    assert not [k for k in agent.timers if isinstance(k, RegisterRetry)]
    assert to_master(agent.advance(100), RegisterAgent) == []
    # A duplicate answer to a retried registration changes nothing.
    assert to_master(agent.master(AgentRegistered(agent_id="A1", master_info=MASTER))) == []


def test_registering_too_long_or_master_silence_redetects() -> None:
    agent = Agent()
    agent(MasterDetected(MASTER))
    effects = agent.advance(45)
    assert of_type(effects, DetectMaster) == [DetectMaster()]
    agent.register(ping_interval=2.0)
    assert of_type(agent.advance(5.9), DetectMaster) == []
    agent.master(Ping(agent_id="A1"))  # every ping pushes the deadline out
    assert of_type(agent.advance(5.9), DetectMaster) == []
    effects = agent.advance(0.2)
    assert of_type(effects, DetectMaster) == [DetectMaster()]
    assert agent.state.metrics()["agent/registered"] == 0
    # A late AgentRegistered from the abandoned master is ignored.
    agent.master(AgentRegistered(agent_id="A1", master_info=MASTER))
    assert agent.state.metrics()["agent/registered"] == 0


def test_a_successor_named_while_registered_is_followed_at_once() -> None:
    """ZooKeeper names the new leader: the agent moves without missing a ping, its
    pending updates wait for the new registration; naming the same master again
    (a watch and a detection crossing) changes nothing."""
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    assert agent(MasterDetected(MASTER)) == []  # the one we have
    successor = attrs.evolve(MASTER, id="m2", ip="10.0.0.2")
    effects = agent(MasterDetected(successor))
    assert of_type(effects, ConnectMaster) == [ConnectMaster(successor.zmq_endpoint)]
    (register,) = to_master(effects, RegisterAgent)
    assert register.agent.id == "A1" and [t.task_id for t in register.tasks] == ["t1"]
    assert agent.state.metrics()["agent/registered"] == 0
    effects = agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"))
    assert updates(effects) == []  # held until the successor registers us
    # A late answer from the master we left does not register us.
    assert agent.master(AgentRegistered(agent_id="A1", master_info=MASTER)) == []
    assert agent.state.metrics()["agent/registered"] == 0
    assert [k for k in agent.timers if isinstance(k, RegisterRetry)], "still retrying"
    effects = agent.master(AgentRegistered(agent_id="A1", master_info=successor))
    assert [s.uuid for s in updates(effects)] == ["u1"]
    assert agent(MasterDetected(successor)) == []


def test_reregistration_keeps_the_id_and_reports_tasks_executors_frameworks() -> None:
    agent = Agent()
    agent.register(ping_interval=5.0)
    running_executor(agent, executor_task("t1"))
    agent.run(command_task("t2"))
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"))
    agent.lose_master()
    effects = agent(MasterDetected(MASTER))
    (register,) = to_master(effects, RegisterAgent)
    assert register.agent.id == "A1"
    assert {(t.task_id, t.state, t.executor_id) for t in register.tasks} == {
        ("t1", TaskState.TASK_RUNNING, "E1"), ("t2", TaskState.TASK_STAGING, "t2")}
    assert all(t.agent_id == "A1" and t.framework_id == "F1" for t in register.tasks)
    # t2's executor is the agent's own (a command task): never reported, as in Mesos
    assert {e.executor_id for e in register.executors} == {"E1"}
    assert all(e.framework_id == "F1" for e in register.executors)
    assert register.frameworks == [FRAMEWORK]
    assert next(t for t in register.tasks if t.task_id == "t1").status_uuid == "u1"


def test_updates_wait_for_registration_and_are_replayed_after_reregistration() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    agent.lose_master()  # nothing may be sent now
    effects = agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"))
    assert updates(effects) == [] and to_peer(effects, kind=StatusUpdateAck)
    assert updates(agent.advance(10)) == []
    agent(MasterDetected(MASTER))
    effects = agent.master(AgentRegistered(agent_id="A1", master_info=MASTER))
    assert [s.uuid for s in updates(effects)] == ["u1"]


def test_a_new_agent_id_from_the_master_is_adopted() -> None:
    agent = Agent()
    agent.register("A1")
    agent.lose_master()
    agent(MasterDetected(MASTER))
    agent.master(AgentRegistered(agent_id="A2", master_info=MASTER))
    assert agent.state.agent_id == "A2"


# ----------------------------------------------------------------------- running


def launch_mesos_env(sandbox: str) -> dict[str, str]:
    """What a Mesos v1 executor reads (docs/mesos-compat.md)."""
    return {"MESOS_AGENT_ENDPOINT": f"127.0.0.1:{CONFIG.port}", "MESOS_AGENT_ID": "A1",
            "MESOS_SLAVE_ID": "A1", "MESOS_FRAMEWORK_ID": "F1", "MESOS_EXECUTOR_ID": "t1",
            "MESOS_DIRECTORY": sandbox, "MESOS_SANDBOX": sandbox, "MESOS_CHECKPOINT": "1",
            "MESOS_RECOVERY_TIMEOUT": "900secs",
            "MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD": "3secs", "MESOS_HTTP_COMMAND_EXECUTOR": "0"}


def test_command_task_runs_under_the_command_executor() -> None:
    agent = Agent()
    agent.register()
    task = command_task("t1")
    effects = agent.run(task)
    (launch,) = of_type(effects, LaunchExecutor)
    assert launch.command.argv == ["/usr/bin/python3", "-m", "frameworks.executors.command"]
    assert (launch.framework_id, launch.executor_id, launch.run_id) == ("F1", "t1", "id0")
    assert launch.sandbox_dir == "/work/frameworks/F1/executors/t1/runs/id0"
    assert launch.env == {
        "DYAD_AGENT_ENDPOINT": "tcp://127.0.0.1:5052", "DYAD_AGENT_ID": "A1",
        "DYAD_FRAMEWORK_ID": "F1", "DYAD_EXECUTOR_ID": "t1",
        "DYAD_SANDBOX_DIRECTORY": launch.sandbox_dir, "DYAD_RECOVERY_TIMEOUT": "900s",
        "HOST": "agent-host", "LIBPROCESS_IP": "127.0.0.1",
        **launch_mesos_env(launch.sandbox_dir)}
    assert to_peer(effects) == []  # queued until the executor registers
    effects = agent.executor(RegisterExecutor(framework_id="F1", executor_id="t1"))
    (registered,) = to_peer(effects, kind=ExecutorRegistered)
    assert registered.executor.executor_id == "t1"
    assert registered.framework == FRAMEWORK and registered.agent.id == "A1"
    assert to_peer(effects, kind=LaunchTask) == [LaunchTask(framework=FRAMEWORK, task=task)]
    assert agent.state.used == SMALL


def test_custom_executor_is_launched_once_and_gets_every_task() -> None:
    agent = Agent()
    agent.register()
    info = custom_executor(resources=Resources.parse("cpus:0.5;mem:32"))
    effects = agent.run(executor_task("t1", info)) + agent.run(executor_task("t2", info))
    (launch,) = of_type(effects, LaunchExecutor)
    assert launch.command.argv == ["./my-executor", "--fast"]
    assert launch.env["COLOR"] == "blue" and launch.env["DYAD_EXECUTOR_ID"] == "E1"
    assert agent.state.used == SMALL + SMALL + Resources.parse("cpus:0.5;mem:32")
    effects = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E1"))
    assert [m.task.task_id for m in to_peer(effects, kind=LaunchTask)] == ["t1", "t2"]
    effects = agent.run(executor_task("t3", info))
    assert of_type(effects, LaunchExecutor) == []
    assert [m.task.task_id for m in to_peer(effects, kind=LaunchTask)] == ["t3"]
    snapshot = agent.state.snapshot()
    (executor,) = snapshot["frameworks"][0]["executors"]
    assert [t["id"] for t in executor["tasks"]] == ["t1", "t2", "t3"]
    assert snapshot["used_resources"] == {"cpus": 3.5, "mem": 416.0}


def test_executor_that_never_registers_is_killed_and_its_tasks_fail() -> None:
    agent = Agent(executor_registration_timeout=60.0)
    agent.register()
    agent.run(executor_task("t1"))
    assert agent.advance(59) == []
    effects = agent.advance(1)
    assert of_type(effects, KillExecutor) == [KillExecutor("F1", "E1", "id0", "KILL")]
    (failed,) = updates(effects)
    assert failed.state == TaskState.TASK_FAILED
    assert failed.reason == Reason.EXECUTOR_REGISTRATION_TIMEOUT
    assert failed.source == Source.AGENT and failed.uuid and failed.agent_id == "A1"
    # It registers too late: told to shut down.
    late = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E1"))
    assert to_peer(late, kind=ShutdownExecutor)
    effects = agent(ExecutorProcessExited("F1", "E1", "id0", -9))
    assert to_master(effects, ExecutorExited) == [ExecutorExited(
        agent_id="A1", framework_id="F1", executor_id="E1", status=-9)]
    assert updates(effects) == []  # nothing unfinished was left
    assert agent.state.used == Resources()


def test_executor_updates_are_acked_at_once_and_delivered_in_order() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    first = status("t1", TaskState.TASK_RUNNING, "u1")
    effects = agent.executor(first)
    assert to_peer(effects, kind=StatusUpdateAck) == [StatusUpdateAck(
        agent_id="A1", framework_id="F1", task_id="t1", uuid="u1")]
    assert to_master(effects, StatusUpdate) == [first]
    second = status("t1", TaskState.TASK_FINISHED, "u2")
    effects = agent.executor(second)
    assert to_peer(effects, kind=StatusUpdateAck) and updates(effects) == []
    assert agent.state.used == Resources()  # a terminal task frees its resources at once
    assert to_master(agent.advance(9.9), StatusUpdate) == []  # the master may be busy
    assert to_master(agent.advance(2.1), StatusUpdate) == [first]  # retried in 10-12 s
    assert to_master(agent.advance(24), StatusUpdate) == [first]  # then 20-24 s later
    assert to_master(agent.ack(first), StatusUpdate) == [second]
    agent.ack(second)
    (executor,) = agent.state.snapshot()["frameworks"][0]["executors"]
    assert executor["tasks"] == [] and [t["state"] for t in executor["completed_tasks"]] == [
        "TASK_FINISHED"]
    metrics = agent.state.metrics()
    assert metrics["agent/status_updates_acked"] == 2
    assert metrics["agent/status_updates_retried"] == 2
    assert metrics["agent/tasks_finished"] == 1


def test_resent_and_late_executor_updates_are_acked_but_not_forwarded() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"))
    for again in (status("t1", TaskState.TASK_RUNNING, "u1"),
                  status("t1", TaskState.TASK_FINISHED, "u2"),
                  status("t1", TaskState.TASK_RUNNING, "u3"),
                  status("nope", TaskState.TASK_RUNNING, "u4")):
        effects = agent.executor(again)
        assert to_peer(effects, kind=StatusUpdateAck)
    assert agent.state.updates.queued("F1", "t1")[-1].status.uuid == "u2"
    assert agent.state.metrics()["agent/status_updates_dropped"] == 3


def test_executor_may_not_speak_for_others() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    stranger = agent.executor(status("t1", TaskState.TASK_RUNNING, "u1"), peer=PEER2)
    assert to_peer(stranger, PEER2, Rejected)
    wrong = agent.executor(StatusUpdate(framework_id="F2", status=TaskStatus(
        task_id="t1", state=TaskState.TASK_RUNNING, uuid="u1")))
    assert to_peer(wrong, kind=Rejected)
    no_uuid = agent.executor(status("t1", TaskState.TASK_RUNNING, ""))
    assert to_peer(no_uuid, kind=Rejected)
    assert updates(stranger + wrong + no_uuid) == []
    assert agent.state.metrics()["agent/messages_invalid"] == 3


def test_second_registration_of_an_executor() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    again = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E1"))
    assert to_peer(again, kind=ExecutorRegistered) and not to_peer(again, kind=LaunchTask)
    other = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E1"), PEER2)
    assert to_peer(other, PEER2, ShutdownExecutor)
    unknown = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E9"), PEER2)
    assert to_peer(unknown, PEER2, ShutdownExecutor)
    rereg = agent.executor(ReregisterExecutor(framework_id="F1", executor_id="E1"), PEER2)
    assert to_peer(rereg, PEER2, ShutdownExecutor)
    # One connection is one executor: it cannot register as a second one.
    agent.run(executor_task("t2", custom_executor("E2")))
    twice = agent.executor(RegisterExecutor(framework_id="F1", executor_id="E2"))
    assert to_peer(twice, kind=Rejected)


# ------------------------------------------------------------------------ kills


def test_kill_of_a_queued_task_is_answered_by_the_agent() -> None:
    agent = Agent()
    agent.register()
    agent.run(command_task("t1"))
    effects = agent.master(KillTask(framework_id="F1", task_id="t1"))
    (killed,) = updates(effects)
    assert (killed.state, killed.reason) == (TaskState.TASK_KILLED,
                                             Reason.TASK_KILLED_DURING_LAUNCH)
    # The executor was started only for that task: it is stopped too.
    assert of_type(effects, KillExecutor) == [KillExecutor("F1", "t1", "id0", "TERM")]
    assert of_type(agent.advance(3), KillExecutor) == [KillExecutor("F1", "t1", "id0", "KILL")]
    assert agent.state.used == Resources()


def test_kill_of_a_launched_task_goes_to_its_executor() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    kill = KillTask(framework_id="F1", task_id="t1", kill_grace_period=2.0)
    effects = agent.master(kill)
    assert to_peer(effects) == [kill] and updates(effects) == []


def test_kill_of_an_unknown_task_answers_task_lost() -> None:
    agent = Agent()
    agent.register()
    effects = agent.master(KillTask(framework_id="F1", task_id="ghost"))
    (lost,) = updates(effects)
    assert (lost.task_id, lost.state, lost.reason) == ("ghost", TaskState.TASK_LOST,
                                                       Reason.TASK_UNKNOWN)
    assert agent.state.metrics()["agent/tasks_lost"] == 1
    # Killing a task that already completed here says nothing more.
    running_executor(agent, executor_task("t1"))
    done = status("t1", TaskState.TASK_FINISHED, "u1")
    agent.executor(done)
    agent.ack(done)
    assert updates(agent.master(KillTask(framework_id="F1", task_id="t1"))) == []


# ------------------------------------------------------------------------ exits


@pytest.mark.parametrize(("task", "reason"), [
    (command_task("t1"), Reason.COMMAND_EXECUTOR_FAILED),
    (executor_task("t1"), Reason.EXECUTOR_TERMINATED)])
def test_executor_exit_fails_unfinished_tasks_and_tells_the_master(task: TaskInfo,
                                                                   reason: str) -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, task)
    executor_id = task.executor.executor_id if task.executor else "t1"
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1", executor_id))
    effects = agent(ExecutorProcessExited("F1", executor_id, "id0", 3, describe_exit(3)))
    # A command task's executor is the agent's own: the master never hears of it
    # (as in Mesos), the terminal update is all it needs.
    assert to_master(effects, ExecutorExited) == ([] if task.command else [ExecutorExited(
        agent_id="A1", framework_id="F1", executor_id=executor_id, status=3)])
    assert agent.state.updates.queued("F1", "t1")[-1].status.state == TaskState.TASK_FAILED
    failed = agent.state.updates.queued("F1", "t1")[-1].status
    assert (failed.reason, failed.message) == (reason, "Executor exited with status 3")
    snapshot = agent.state.snapshot()
    assert snapshot["frameworks"] == []
    (framework,) = snapshot["completed_frameworks"]
    (executor,) = framework["completed_executors"]
    assert executor["exit_status"] == 3 and executor["state"] == "TERMINATED"
    assert [t["state"] for t in executor["completed_tasks"]] == ["TASK_FAILED"]
    assert agent.state.metrics()["agent/executors_running"] == 0
    # The update stream lives on until the master acknowledges it.
    assert [s.state for s in updates(agent.ack(agent.state.updates.pending()[0]))] == [
        TaskState.TASK_FAILED]


def test_stale_exit_and_launch_failure() -> None:
    agent = Agent()
    agent.register()
    agent.run(executor_task("t1"))
    assert agent(ExecutorProcessExited("F1", "E1", "other-run", 0)) == []
    effects = agent(ExecutorLaunchFailed("F1", "E1", "id0", "./my-executor: not found"))
    (failed,) = updates(effects)
    assert (failed.state, failed.reason) == (TaskState.TASK_FAILED,
                                             Reason.CONTAINER_LAUNCH_FAILED)
    assert "not found" in failed.message
    assert to_master(effects, ExecutorExited)[0].status == 127


def test_exit_messages_name_signals() -> None:
    assert describe_exit(0) == "Executor exited with status 0"
    assert describe_exit(-9) == "Executor terminated by signal SIGKILL"
    assert describe_exit(-99) == "Executor terminated by signal 99"


# --------------------------------------------------------------------- shutdown


def test_shutdown_framework_asks_then_terminates_then_kills() -> None:
    agent = Agent(executor_shutdown_grace_period=3.0, executor_kill_delay=3.0)
    agent.register()
    running_executor(agent, executor_task("t1"))
    effects = agent.master(ShutdownFramework(framework_id="F1"))
    assert to_peer(effects) == [ShutdownExecutor(grace_period=3.0)]
    assert of_type(agent.advance(2.9), KillExecutor) == []
    assert of_type(agent.advance(0.1), KillExecutor) == [KillExecutor("F1", "E1", "id0", "TERM")]
    assert of_type(agent.advance(3), KillExecutor) == [KillExecutor("F1", "E1", "id0", "KILL")]
    # While it is terminating, new tasks for it are refused.
    (lost,) = updates(agent.run(executor_task("t2")))
    assert (lost.state, lost.reason) == (TaskState.TASK_LOST, Reason.EXECUTOR_TERMINATED)
    effects = agent(ExecutorProcessExited("F1", "E1", "id0", -9))
    assert to_master(effects, ExecutorExited)
    assert agent.state.frameworks == {}


def test_agent_shutdown_stops_every_executor_then_exits_once() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    agent.run(command_task("t2"))  # still launching: signalled directly
    effects = agent(Shutdown())
    assert to_peer(effects) == [ShutdownExecutor(grace_period=3.0)]
    assert of_type(effects, KillExecutor) == [KillExecutor("F1", "t2", "id1", "TERM")]
    assert of_type(effects, Exit) == []
    assert of_type(agent(ExecutorProcessExited("F1", "t2", "id1", -15)), Exit) == []
    assert of_type(agent(ExecutorProcessExited("F1", "E1", "id0", 0)), Exit) == [Exit()]
    assert agent(Shutdown()) == []
    (lost,) = updates(agent.run(command_task("t3")))
    assert lost.state == TaskState.TASK_LOST


def test_agent_shutdown_gives_up_waiting_after_a_deadline() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    agent(Shutdown())
    effects = agent.advance(3 + 3 + 2)
    assert of_type(effects, Exit) == [Exit()]
    assert of_type(agent(ExecutorProcessExited("F1", "E1", "id0", -9)), Exit) == []


def test_shutdown_without_executors_exits_at_once() -> None:
    assert Agent()(Shutdown()) == [Exit()]


# -------------------------------------------------------------- messages, input


def test_framework_messages_are_forwarded_both_ways() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, executor_task("t1"))
    down = FrameworkToExecutor(framework_id="F1", agent_id="A1", executor_id="E1", data=b"hi")
    assert to_peer(agent.master(down)) == [down]
    up = ExecutorToFramework(framework_id="F1", agent_id="", executor_id="E1", data=b"yo")
    assert to_master(agent.executor(up)) == [attrs.evolve(up, agent_id="A1")]
    nowhere = attrs.evolve(down, executor_id="E9")
    assert agent.master(nowhere) == []
    assert agent.state.metrics()["agent/messages_dropped"] == 1


def test_invalid_frames_are_rejected_to_their_sender_and_counted() -> None:
    agent = Agent()
    agent.register()
    bad = MessageError("not JSON: nope")
    assert agent(InvalidFrame("executor", PEER, bad)) == [
        Send(PEER, Rejected(reason="not JSON: nope", message_type=""))]
    assert agent(InvalidFrame("master", "", MessageError("invalid kill_task: x", "kill_task"))) == [
        SendMaster(Rejected(reason="invalid kill_task: x", message_type="kill_task"))]
    assert agent(InvalidFrame("master", "", MessageError("invalid rejected", "rejected"))) == []
    assert to_master(agent.master(Subscribe(framework=FRAMEWORK)), Rejected)
    assert to_peer(agent.executor(Heartbeat()), kind=Rejected)
    assert agent.master(Rejected(reason="meh")) == []
    metrics = agent.state.metrics()
    assert metrics["agent/messages_invalid"] == 5
    assert metrics["agent/messages_received"] == 7


def test_tasks_that_do_not_fit_or_collide_are_refused() -> None:
    agent = Agent()
    agent.register()
    (error,) = updates(agent.run(command_task("big", Resources.parse("cpus:5;mem:1"))))
    assert (error.state, error.reason) == (TaskState.TASK_ERROR, Reason.TASK_INVALID)
    assert "cpus:5" in error.message
    agent.run(command_task("p1", Resources.parse("cpus:1;ports:[31000-31001]")))
    (clash,) = updates(agent.run(command_task("p2", Resources.parse("cpus:1;ports:[31001]"))))
    assert clash.state == TaskState.TASK_ERROR
    assert to_master(agent.run(command_task("p1")), Rejected)  # duplicate id
    (evil,) = updates(agent.run(executor_task("x", custom_executor("../../etc"))))
    assert evil.state == TaskState.TASK_ERROR and "cannot name" in evil.message
    neither = TaskInfo(task_id="n", name="n", agent_id="A1", resources=SMALL)
    assert updates(agent.run(neither))[0].state == TaskState.TASK_ERROR
    assert to_master(agent.run(command_task("t"), attrs.evolve(FRAMEWORK, id=None)), Rejected)
    assert agent.state.used == Resources.parse("cpus:1;ports:[31000-31001]")


def test_snapshot_and_metrics_shapes() -> None:
    agent = Agent()
    agent.register()
    running_executor(agent, command_task("t1", Resources.parse("cpus:1;mem:64;ports:[31005]")))
    agent.executor(status("t1", TaskState.TASK_RUNNING, "u1", "t1"))
    snapshot = agent.state.snapshot()
    assert snapshot["id"] == "A1" and snapshot["hostname"] == "agent-host"
    assert snapshot["master"]["zmq_port"] == 5055
    assert snapshot["resources"] == {"cpus": 4.0, "mem": 1024.0, "ports": "[31000-31009]"}
    assert snapshot["used_resources"] == {"cpus": 1.0, "mem": 64.0, "ports": "[31005-31005]"}
    assert snapshot["attributes"] == {"rack": "r1"}
    (framework,) = snapshot["frameworks"]
    assert (framework["id"], framework["name"]) == ("F1", "fw")
    (executor,) = framework["executors"]
    assert executor["directory"] == "/work/frameworks/F1/executors/t1/runs/id0"
    assert executor["queued_tasks"] == [] and executor["completed_tasks"] == []
    assert executor["tasks"][0]["state"] == "TASK_RUNNING"
    metrics = agent.state.metrics()
    assert metrics["agent/tasks_running"] == 1 and metrics["agent/executors_running"] == 1
    for name in ("messages_received", "messages_invalid", "tasks_finished", "tasks_failed",
                 "tasks_killed", "tasks_lost", "status_updates_sent", "status_updates_retried",
                 "status_updates_acked", "registered"):
        assert f"agent/{name}" in metrics


# ------------------------------------------------------------- nothing raises

IDS = st.sampled_from(["t1", "t2", "E1", "../x", ""])
STATES = st.sampled_from(list(TaskState))


def _messages() -> st.SearchStrategy[Any]:
    task = st.builds(
        lambda tid, custom, eid, cpus: TaskInfo(
            task_id=tid, name="n", agent_id="A1", resources=Resources.of(cpus=cpus),
            command=None if custom else CommandInfo(shell="true"),
            executor=custom_executor(eid or "E1") if custom else None),
        IDS, st.booleans(), IDS, st.sampled_from([0.5, 1, 3]))
    framework = st.sampled_from(["F1", "F2"])
    return st.one_of(
        st.builds(lambda t: MasterMessage(RunTask(framework=FRAMEWORK, task=t)), task),
        st.builds(lambda f, t: MasterMessage(KillTask(framework_id=f, task_id=t)), framework,
                  IDS),
        st.builds(lambda f: MasterMessage(ShutdownFramework(framework_id=f)), framework),
        st.builds(lambda t, u: MasterMessage(StatusUpdateAck(
            agent_id="A1", framework_id="F1", task_id=t, uuid=u)), IDS,
            st.sampled_from(["u1", "u2", "id1", "id2"])),
        st.builds(lambda: MasterMessage(Ping(agent_id="A1"))),
        st.builds(lambda: MasterMessage(AgentRegistered(agent_id="A1", master_info=MASTER))),
        st.builds(lambda: MasterDetected(MASTER)),
        st.builds(lambda p, e: ExecutorMessage(p, RegisterExecutor(framework_id="F1",
                                                                   executor_id=e)),
                  st.sampled_from([PEER, PEER2]), IDS),
        st.builds(lambda p, t, s, u: ExecutorMessage(p, StatusUpdate(
            framework_id="F1", status=TaskStatus(task_id=t, state=s, uuid=u))),
            st.sampled_from([PEER, PEER2]), IDS, STATES, st.sampled_from(["u1", "u2", ""])),
        st.builds(lambda p: InvalidFrame("executor", p, MessageError("bad")),
                  st.sampled_from([PEER, PEER2])),
        st.builds(lambda e, r, s: ExecutorProcessExited("F1", e, r, s), IDS,
                  st.sampled_from(["id0", "id1", "id2"]), st.integers(-15, 3)),
        st.builds(lambda e: ExecutorLaunchFailed("F1", e, "id0", "boom"), IDS),
        st.builds(lambda e, r: ExecutorStarted("F1", e, r, 4242, 17.0), IDS,
                  st.sampled_from(["id0", "id1"])),
        st.builds(lambda p, e, t: ExecutorMessage(p, ReregisterExecutor(
            framework_id="F1", executor_id=e, tasks=[command_task(t)])),
            st.sampled_from([PEER, PEER2]), IDS, IDS),
        st.builds(lambda e, r, rss, oom: UsageSampled((RunSample(
            "F1", e, r, 1.0, 1.0, 0.5, rss, 1, oom=oom),), ("http://x/a",)),
            IDS, st.sampled_from(["id0", "id1"]), st.sampled_from([0, 2 ** 40]), st.booleans()),
        st.builds(lambda t, ok: HealthCheckResult(HealthRound("F1", t, 0), ok), IDS,
                  st.booleans()),
        st.builds(lambda s: ("advance", s), st.floats(0, 70)),
        st.just(Drain()),
        st.just(Shutdown()),
    )


@pytest.mark.parametrize("command_tasks", ["executor", "direct"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_messages(), max_size=40))
def test_any_sequence_of_inputs_keeps_the_invariants(command_tasks: str,
                                                     events: list[Any]) -> None:
    agent = Agent(command_tasks=command_tasks)
    agent.register()
    for event in events:
        if isinstance(event, tuple):
            agent.advance(event[1])
        else:
            agent(event)
    # Whatever state it reached, a restarted agent can take it back.
    saved = agent.state.saved()
    alive = frozenset(e.key for f in agent.state.frameworks.values()
                      for e in f.executors.values())
    fresh = Agent(command_tasks=command_tasks)
    fresh(Recover(saved, alive))
    fresh.register()
    assert fresh.state.used == agent.state.used
