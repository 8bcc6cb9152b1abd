"""What an executor run is given: the executor a plain command task runs under,
the environment of the run and of its tasks, the `LaunchExecutor` effect, and how
long it gets to stop. Pure functions of the agent's config and one run's record.
"""

from __future__ import annotations

import attrs

from agent.model import (
    COMMAND_EXECUTOR_MODULE, AgentConfig, AgentExecutor, AgentTask, LaunchExecutor,
)
from dyad.containers import ContainerInfo, Network
from dyad.messages import CommandInfo, ExecutorInfo, HealthCheck, HealthCheckType, TaskInfo


def executor_info_for(config: AgentConfig, framework_id: str, task: TaskInfo) -> ExecutorInfo:
    if task.executor is not None:
        return attrs.evolve(task.executor, framework_id=framework_id)
    if task.container is not None or config.command_tasks == "direct":
        return direct_info(task, framework_id)
    # A plain command runs under the built-in command executor, one per task,
    # with the task's id and no resources of its own (docs/protocol.md).
    command = CommandInfo(argv=[config.python, "-m", COMMAND_EXECUTOR_MODULE])
    return ExecutorInfo(executor_id=task.task_id, command=command,
                        name=f"Command Executor (Task: {task.task_id})",
                        framework_id=framework_id)


def direct_info(task: TaskInfo, framework_id: str) -> ExecutorInfo:
    """What a command task the agent runs itself is recorded as (a direct run: no
    executor process): the task's own command, and container if it has one."""
    assert task.command is not None
    kind = "Container" if task.container is not None else "Command"
    return ExecutorInfo(executor_id=task.task_id, command=task.command,
                        name=f"{kind} (Task: {task.task_id})", framework_id=framework_id,
                        container=task.container)


def health_check(container: ContainerInfo | None, check: HealthCheck) -> HealthCheck:
    """Under BRIDGE an HTTP or TCP check of a container port goes to the host
    port mapped to it (checks run from the host); any other port is taken as a
    host port already."""
    docker = container.docker if container else None
    if docker is None or docker.network != Network.BRIDGE or check.type == HealthCheckType.COMMAND:
        return check
    for mapping in docker.port_mappings:
        if mapping.container_port == check.port and mapping.protocol == "tcp":
            return attrs.evolve(check, port=mapping.host_port)
    return check


def executor_env(config: AgentConfig, agent_id: str | None,
                 executor: AgentExecutor) -> dict[str, str]:
    """What the agent adds to a run's environment (docs/protocol.md)."""
    endpoint = config.executor_endpoint
    return {
        "DYAD_AGENT_ENDPOINT": endpoint, "DYAD_AGENT_ID": agent_id or "",
        "DYAD_FRAMEWORK_ID": executor.framework_id,
        "DYAD_EXECUTOR_ID": executor.executor_id,
        "DYAD_SANDBOX_DIRECTORY": executor.directory,
        "DYAD_RECOVERY_TIMEOUT": f"{config.recovery_timeout:g}s",
        # Where a task should listen: the address offers name as its host.
        "HOST": config.hostname, "LIBPROCESS_IP": config.ip,
        **mesos_env(config, agent_id, executor),
    }


def mesos_env(config: AgentConfig, agent_id: str | None,
              executor: AgentExecutor) -> dict[str, str]:
    """What a Mesos v1 executor reads (docs/mesos-compat.md): the agent's HTTP
    address (`POST /api/v1/executor`), its ids and sandbox. Dyad agents always
    checkpoint (a restarted agent takes its executors back), so MESOS_CHECKPOINT
    is 1, and the executor waits for an agent that went away rather than exiting."""
    return {
        "MESOS_AGENT_ENDPOINT": f"{config.ip}:{config.port}",
        "MESOS_AGENT_ID": agent_id or "", "MESOS_SLAVE_ID": agent_id or "",
        "MESOS_FRAMEWORK_ID": executor.framework_id, "MESOS_EXECUTOR_ID": executor.executor_id,
        "MESOS_DIRECTORY": executor.directory, "MESOS_SANDBOX": executor.directory,
        "MESOS_CHECKPOINT": "1",
        "MESOS_RECOVERY_TIMEOUT": f"{config.recovery_timeout:g}secs",
        "MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD": f"{config.executor_shutdown_grace_period:g}secs",
        "MESOS_HTTP_COMMAND_EXECUTOR": "0",
    }


def run_user(executor: AgentExecutor, task: TaskInfo, framework_user: str) -> str:
    """Whom the run is for: a command task's own `user`, a custom executor's
    command's, else the framework's (as the master authorized `run_task`)."""
    command = task.command if executor.is_command else executor.info.command
    return (command.user if command is not None else "") or framework_user


def launch(config: AgentConfig, agent_id: str | None, executor: AgentExecutor,
           task: TaskInfo, framework_user: str = "") -> LaunchExecutor:
    """Start `executor` for its first task `task` (its limits already set)."""
    info = executor.info
    env = dict(info.command.environment)
    env.update(executor_env(config, agent_id, executor))
    # A command task's URIs are fetched into its command executor's sandbox.
    uris = (task.command if executor.is_command and task.command else info.command).uris
    return LaunchExecutor(executor.framework_id, info.executor_id, executor.run_id,
                          info.command, env, executor.directory, tuple(uris), executor.limits,
                          run_user(executor, task, framework_user))


def task_env(config: AgentConfig, agent_id: str | None, executor: AgentExecutor,
             task: AgentTask) -> dict[str, str]:
    """The environment a COMMAND health check of `task` runs with: its executor's,
    its command's, and its id -- what the task itself saw."""
    env = dict(executor.info.command.environment)
    env.update(executor_env(config, agent_id, executor))
    if task.info.command is not None:
        env.update(task.info.command.environment)
    env["DYAD_TASK_ID"] = env["MESOS_TASK_ID"] = task.task_id
    return env


def shutdown_grace(config: AgentConfig, executor: AgentExecutor) -> float:
    """Time an executor gets to stop: its tasks' longest kill grace period (their
    kill policy holds) plus the agent's own grace period."""
    task_grace = max((t.info.kill_grace_period or 0.0 for t in executor.live_tasks()),
                     default=0.0)
    return config.executor_shutdown_grace_period + task_grace
