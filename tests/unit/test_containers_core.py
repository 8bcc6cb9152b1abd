"""Container runs in the agent core (`agent.containers_core`), event by event with a
fake clock and `validate()` after every step; and the master's check of a task's
container."""

from __future__ import annotations

from typing import Any

import attrs

from agent.checkpoint import Recover, decode, encode
from agent.container_runs import MIB
from agent.containers_core import (
    ContainerExited, ContainerLaunchFailed, ContainerLogPosition, ContainerStarted,
    ImagePullProgress, LaunchContainer, RemoveContainer,
)
from agent.docker_wire import ContainerState
from agent.health import RunHealthCheck
from agent.model import Checkpoint, KillDue, KillExecutor, LaunchExecutor, RegistrationTimeout
from dyad.containers import SANDBOX_MOUNT, ContainerInfo, DockerInfo, Network, PortMapping
from dyad.effects import ArmTimer, TimerFired
from dyad.messages import (
    CommandInfo, HealthCheck, HealthCheckType, KillTask, Reason, RegisterExecutor,
    ShutdownExecutor, TaskInfo, TaskState,
)
from dyad.resources import Resources
from tests.unit.test_agent_state import (
    Agent, custom_executor, executor_task, of_type, to_peer, updates,
)

KEY = ("F1", "web", "id0")
DOCKER = ("process", "docker")
BRIDGE = ContainerInfo(docker=DockerInfo(
    image="web:1", network=Network.BRIDGE,
    port_mappings=[PortMapping(host_port=31001, container_port=8080)]))


def container_task(task_id: str = "web", container: ContainerInfo = BRIDGE,
                   resources: str = "cpus:0.5;mem:64;ports:[31001-31001]",
                   **kw: Any) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id="A1",
                    resources=Resources.parse(resources),
                    command=CommandInfo(shell="httpd -f", environment={"PORT0": "31001"}),
                    container=container, **kw)


def exited(code: int = 0, oom: bool = False, error: str = "") -> ContainerState:
    return ContainerState(id="c0ffee", status="exited", running=False, exit_code=code,
                          oom_killed=oom, error=error, pid=0, labels={})


def docker_agent() -> Agent:
    agent = Agent(containerizers=DOCKER)
    agent.register()
    return agent


def started(agent: Agent, task: TaskInfo | None = None) -> list[Any]:
    """Run it and start its container; its TASK_RUNNING is acknowledged."""
    task = task or container_task()
    agent.run(task)
    effects = agent(ContainerStarted(*KEY, "c0ffee"))
    for update in agent.state.updates.queued("F1", task.task_id):
        agent.ack(update)
    return effects


def told(agent: Agent, task_id: str) -> list[TaskState]:
    """The task's updates not yet acknowledged (sent or queued), oldest first."""
    return [u.status for u in agent.state.updates.queued("F1", task_id)]


def test_a_container_task_is_launched_by_the_agent_without_an_executor_or_its_timer() -> None:
    agent = docker_agent()
    effects = agent.run(container_task())
    assert not of_type(effects, LaunchExecutor) and not of_type(effects, ArmTimer)
    (launch,) = of_type(effects, LaunchContainer)
    run = launch.run
    assert (run.agent_id, run.framework_id, run.executor_id, run.task_id) == (
        "A1", "F1", "web", "web")
    assert run.container == BRIDGE and run.command.shell == "httpd -f"
    assert run.mem_bytes == 64 * MIB and run.cpus == 0.5  # no command executor's share
    assert run.env["PORT0"] == "31001" and run.env["MESOS_TASK_ID"] == "web"
    assert run.env["MESOS_SANDBOX"] == SANDBOX_MOUNT == run.env["MESOS_DIRECTORY"]
    # Nothing may claim to be its executor.
    assert to_peer(agent.executor(RegisterExecutor(framework_id="F1", executor_id="web")),
                   kind=ShutdownExecutor)


def test_pull_progress_is_task_starting_coalesced_until_acknowledged() -> None:
    agent = docker_agent()
    agent.run(container_task())
    first = updates(agent(ImagePullProgress(*KEY, "web:1: 1/3 layers")))
    assert [(s.state, s.message) for s in first] == [(TaskState.TASK_STARTING,
                                                      "web:1: 1/3 layers")]
    assert not updates(agent(ImagePullProgress(*KEY, "web:1: 2/3 layers")))  # unacked
    agent.ack(agent.state.updates.queued("F1", "web")[0])
    assert [s.message for s in updates(agent(ImagePullProgress(*KEY, "web:1: 3/3")))] == [
        "web:1: 3/3"]


def test_a_started_container_is_checkpointed_before_running_and_health_checks_its_host_port(
        ) -> None:
    agent = docker_agent()
    check = HealthCheck(type=HealthCheckType.HTTP, port=8080, delay=1.0)
    effects = started(agent, container_task(health_check=check))
    assert effects[0] == Checkpoint()
    (running,) = updates(effects)
    assert running.state == TaskState.TASK_RUNNING and "c0ffee" in running.message
    assert agent.state.saved().executors[0].container_id == "c0ffee"
    (probe,) = of_type(agent.advance(1.0), RunHealthCheck)
    assert probe.check.port == 31001  # the host port mapped to 8080


def test_the_containers_end_is_the_tasks_and_the_container_is_removed() -> None:
    for state, expected, reason in [
            (exited(0), TaskState.TASK_FINISHED, ""),
            (exited(3), TaskState.TASK_FAILED, ""),
            (exited(137, oom=True), TaskState.TASK_FAILED, Reason.CONTAINER_LIMITATION_MEMORY),
            (exited(127, error="no such file"), TaskState.TASK_FAILED,
             Reason.CONTAINER_LAUNCH_FAILED)]:
        agent = docker_agent()
        started(agent)
        effects = agent(ContainerExited(*KEY, state))
        (end,) = updates(effects)
        assert (end.state, end.reason) == (expected, reason), end
        assert effects[-1] == RemoveContainer(*KEY)
        assert not agent.state.frameworks
    assert "64.0 MiB" in updates(_oom())[0].message


def _oom() -> list[Any]:
    agent = docker_agent()
    started(agent)
    return agent(ContainerExited(*KEY, exited(137, oom=True)))


def test_a_kill_is_sigterm_then_sigkill_after_the_tasks_grace() -> None:
    agent = docker_agent()
    started(agent, container_task(kill_grace_period=2.5))
    effects = agent.master(KillTask(framework_id="F1", task_id="web"))
    assert [s.state for s in updates(effects)] == [TaskState.TASK_KILLING]
    agent.ack(agent.state.updates.queued("F1", "web")[0])
    assert of_type(effects, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    assert not of_type(agent.advance(2.4), KillExecutor)
    assert of_type(agent.advance(0.1), KillExecutor) == [KillExecutor(*KEY, "KILL")]
    (end,) = updates(agent(ContainerExited(*KEY, exited(137))))
    assert end.state == TaskState.TASK_KILLED and "137" in end.message


def test_a_kill_while_pulling_abandons_the_launch() -> None:
    agent = docker_agent()
    agent.run(container_task())
    effects = agent.master(KillTask(framework_id="F1", task_id="web"))
    assert [s.state for s in updates(effects)] == [TaskState.TASK_KILLED]
    assert of_type(effects, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    agent(ContainerLaunchFailed(*KEY, "killed while launching"))
    assert not agent.state.frameworks
    # A container the shell started anyway is nobody's: removed.
    assert agent(ContainerStarted(*KEY, "late")) == [RemoveContainer(*KEY)]


def test_launch_failures_and_refusals_say_why() -> None:
    agent = docker_agent()
    agent.run(container_task())
    (failed,) = updates(agent(ContainerLaunchFailed(*KEY, "pull web:1: connection refused")))
    assert (failed.state, failed.reason) == (TaskState.TASK_FAILED,
                                             Reason.CONTAINER_LAUNCH_FAILED)
    assert "connection refused" in failed.message

    plain = Agent()
    plain.register()
    (refused,) = updates(plain.run(container_task("t2")))
    assert refused.state == TaskState.TASK_ERROR and "--containerizers" in refused.message

    bad = attrs.evolve(BRIDGE, docker=attrs.evolve(BRIDGE.docker, port_mappings=[
        PortMapping(host_port=32000, container_port=80)]))
    (invalid,) = updates(agent.run(container_task("t3", bad)))
    assert (invalid.state, invalid.reason) == (TaskState.TASK_ERROR, Reason.TASK_INVALID)
    assert "host port 32000 is not among the task's ports" in invalid.message


def test_a_custom_executor_in_an_image_must_register_once_its_container_started() -> None:
    agent = docker_agent()
    image = ContainerInfo(docker=DockerInfo(image="exec:1", network=Network.HOST))
    key = ("F1", "E1", "id0")
    effects = agent.run(executor_task("t1", attrs.evolve(custom_executor(), container=image)))
    (launch,) = of_type(effects, LaunchContainer)
    assert launch.run.command.argv == ["./my-executor", "--fast"] and not launch.run.task_id
    assert not of_type(effects, ArmTimer)  # the pull is not timed by registration
    effects = agent(ContainerStarted(*key, "e0"))
    (timer,) = of_type(effects, ArmTimer)
    assert isinstance(timer.key, RegistrationTimeout)
    effects = agent(TimerFired(timer.key))
    assert [(s.state, s.reason) for s in updates(effects)] == [
        (TaskState.TASK_FAILED, Reason.EXECUTOR_REGISTRATION_TIMEOUT)]
    assert of_type(effects, KillExecutor) == [KillExecutor(*key, "KILL")]
    bridged = attrs.evolve(custom_executor("E2"), container=BRIDGE)
    (refused,) = updates(agent.run(executor_task("t2", bridged)))
    assert "must be HOST" in refused.message


def test_recovery_reattaches_running_containers_and_fails_vanished_ones() -> None:
    agent = docker_agent()
    started(agent)
    plain = attrs.evolve(BRIDGE, docker=attrs.evolve(BRIDGE.docker, port_mappings=[]))
    agent.run(container_task("late", plain, "cpus:0.5"))  # launching when the agent died
    agent.run(container_task("gone", plain, "cpus:0.5"))
    agent(ContainerLogPosition(*KEY, 1234))
    saved = decode(encode(agent.state.saved()))
    assert saved.executors[0].log_since_nanos == 1234

    back = Agent(containerizers=DOCKER)
    late = ("F1", "late", "id2")
    back(Recover(saved, frozenset({KEY, late}), {KEY: "c0ffee", late: "1a7e"}))
    by_task = {s.task_id: s for s in (*told(back, "web"), *told(back, "late"),
                                      *told(back, "gone"))}
    assert "web" not in by_task  # running as before: nothing to say
    assert by_task["gone"].state == TaskState.TASK_FAILED
    assert "container vanished while the agent was down" in by_task["gone"].message
    executors = {e.executor_id: e for e in back.state.records.executors()}
    assert executors["web"].container_id == "c0ffee"
    assert executors["late"].container_id == "1a7e"  # found by its labels
    assert not executors["late"].queued  # its TASK_RUNNING goes out now
    assert by_task["late"].state == TaskState.TASK_RUNNING
    back.register()
    kill = back.master(KillTask(framework_id="F1", task_id="web"))
    assert of_type(kill, KillExecutor) == [KillExecutor(*KEY, "TERM")]
    assert any(isinstance(t.key, KillDue) for t in of_type(kill, ArmTimer))
