"""Command tasks the agent runs itself, on the host -- pure, for the agent core.

With ``--command-tasks direct`` (the default) a plain command task (a `command`,
no `executor`, no `container`) gets no executor process: the agent plays its
executor, as it does for a command task in a container (`agent.containers_core`),
and as Borg's Borglet runs tasks. Its run (`AgentExecutor.host_direct`):

- LAUNCHING: `TASK_STARTING`, and a `LaunchExecutor` of the task's own command,
  `held`: the agent's holder (`agent.holder`) starts it, is its parent and keeps
  its exit status for an agent that restarts;
- `ExecutorStarted`: pid and process start time are checkpointed before
  `TASK_RUNNING` goes out (`ExecutorRuns._on_started`); health checks start;
- a kill: `TASK_KILLING`, SIGTERM to the run's process group, SIGKILL after the
  task's kill grace period (`ExecutorRuns._stop_direct`);
- `ExecutorProcessExited`: the command's status (as the holder reaped it) is
  the task's end: 0 `TASK_FINISHED`, else `TASK_FAILED`, `TASK_KILLED` once a kill began;
- after an agent restart, a run whose process lives is watched again (the shell
  adopts it by pid and start time) and RUNNING; one that ended while the agent
  was away ends by what its holder says (`Recover.exits`), or, when no holder
  knows (it died), as killed if a kill had begun and failed otherwise.

`--command-tasks executor` keeps the Python command executor, one per task
(`frameworks.executors.command`): for frameworks that rely on its process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.checkpoint import Recover
from agent.containers_core import ContainerRuns
from agent.model import (
    TERMINATING, UNKNOWN_EXIT, AgentExecutor, ExecutorProcessExited, KillDue,
    LaunchExecutor, TaskEnd, UpdateLimits,
)
from dyad.messages import Reason, Source, TaskInfo, TaskState

if TYPE_CHECKING:
    from agent.state import Effect

LOST_STATUS = ("Command ended while the agent was down, and its exit status is unknown "
               "(the agent's holder died)")


def host_ending(status: int, description: str, killed: bool) -> TaskEnd:
    """The task's end once its command ended with `status` (as the shell
    describes it). `killed`: the agent had begun to kill it."""
    if killed:
        return TaskEnd(TaskState.TASK_KILLED, "", description)
    if status == 0:
        return TaskEnd(TaskState.TASK_FINISHED, "", description)
    if status == UNKNOWN_EXIT:
        return TaskEnd(TaskState.TASK_FAILED, Reason.EXECUTOR_TERMINATED, description)
    return TaskEnd(TaskState.TASK_FAILED, "", description)


class HostRuns(ContainerRuns):
    """Direct host runs' launch, end and recovery (their start, health checks and
    kills are the direct runs' shared ones, in `agent.runs`)."""

    def _launch_host(self, executor: AgentExecutor, task: TaskInfo,
                     now: float) -> list[Effect]:
        assert task.command is not None
        record = executor.queued[task.task_id]
        start = LaunchExecutor(
            executor.framework_id, executor.executor_id, executor.run_id,
            task.command, self._task_env(executor, record),
            executor.directory, tuple(task.command.uris), executor.limits,
            self._run_user(executor, task), held=True)
        return [start, *self._transition(executor, record, self._status_update(
            record.framework_id, task.task_id, executor.executor_id, TaskState.TASK_STARTING,
            "", "", now, source=Source.EXECUTOR), now)]

    def _on_process_exited(self, event: ExecutorProcessExited, now: float) -> list[Effect]:
        executor = self.records.executor(event.framework_id, event.executor_id)
        if executor is not None and executor.run_id == event.run_id and executor.host_direct:
            return self._host_exited(executor, event.status, event.description, now)
        return self._on_executor_gone(event.framework_id, event.executor_id, event.run_id,
                                      event.status, now, message=event.description)

    def _host_exited(self, executor: AgentExecutor, status: int, description: str,
                     now: float) -> list[Effect]:
        end = host_ending(status, description or LOST_STATUS, executor.phase == TERMINATING)
        # A status the agent could not learn is its own word, not the command's.
        told = Source.AGENT if status == UNKNOWN_EXIT else Source.EXECUTOR
        return [*self._end_direct(executor, end, False, now, told),
                *self._on_executor_gone(*executor.key, status, now)]

    def _host_recovered(self, executor: AgentExecutor, was: str, event: Recover,
                        now: float) -> list[Effect]:
        """A direct run the checkpoint says started (its pid is written down)."""
        ended = event.exits.get(executor.key)
        if executor.key not in event.alive:
            executor.phase = was  # a kill that had begun counts
            if ended is None:
                return self._host_exited(executor, UNKNOWN_EXIT, LOST_STATUS, now)
            return self._host_exited(executor, ended.status, ended.description, now)
        effects: list[Effect] = [UpdateLimits(*executor.key, executor.limits)]
        if was == TERMINATING:  # it was being killed: finish the job
            executor.phase = TERMINATING
            return [*effects, self._kill(executor, "TERM"), *self._arm_executor_timer(
                executor, KillDue, now + self.config.executor_kill_delay)]
        for task in executor.launched.values():  # health is not checkpointed
            effects += self._start_direct_check(executor, task, now)
        # RUNNING again (and TASK_RUNNING for a task that never had it, if any).
        return effects + self._direct_running(executor, "command started before the agent "
                                              "restarted", now)
