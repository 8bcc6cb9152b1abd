"""The task half of `AgentState`: a task's life from `RunTask` to its last update.

A `RunTask` from the master is checked (ids, resources, the agent draining or
shutting down) and either placed on an executor run (`agent.runs`) or answered
with a terminal update for a task the agent never ran. Every later state of a
task -- from its executor, from the agent playing a direct run's executor, from
a health check, a kill or a preemption -- goes through `_transition`, which
keeps the records and the charged resources straight and hands the update to
its stream (`agent.status_updates`); acknowledgements from the master retire
streams, and a task whose stream is done moves to the completed records.

`AgentState` inherits these methods, as it does the runs' (`agent.runs`); they
use the parts of `AgentState` declared at the top of the class, and nothing else.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from agent import launch, persistent
from agent.health import HealthChanged, HealthCheckResult
from agent.host_runs import HostRuns
from agent.model import (
    LAUNCHING, RECOVERING, RUNNING, TERMINATING, AgentExecutor, AgentFramework, AgentTask,
    TaskEnd,
)
from agent.sandbox import InvalidId, check_id
from agent.status_updates import StatusUpdateManager
from dyad.effects import Send
from dyad.messages import (
    CheckpointResources, ExecutorInfo, KillTask, LaunchTask, Reason, RunTask, Source,
    StatusUpdate, StatusUpdateAck, TaskInfo, TaskState, TaskStatus,
)
from dyad.resources import Resources, ResourcesError
from dyad.volumes import DynamicResources, total_of

if TYPE_CHECKING:
    from agent.state import Effect

log = logging.getLogger(__name__)


class AgentTasks(HostRuns):
    """Run, kill, preempt and report tasks; take the master's acknowledgements."""

    updates: StatusUpdateManager
    dynamic: DynamicResources

    if TYPE_CHECKING:  # provided by AgentState
        @property
        def frameworks(self) -> dict[str, AgentFramework]: ...
        def _reject_master(self, reason: str, type_name: str) -> list[Effect]: ...

    def _on_run_task(self, msg: RunTask, now: float) -> list[Effect]:
        task, framework_id = msg.task, msg.framework.id
        if framework_id is None:
            return self._reject_master("run_task needs framework.id", msg.TYPE)
        if (self.records.find_task(framework_id, task.task_id) is not None
                or self.updates.has_stream(framework_id, task.task_id)):
            return self._reject_master(f"task {task.task_id} already exists on this agent",
                                       msg.TYPE)
        if (task.command is None) == (task.executor is None):
            return self._agent_update(framework_id, task.task_id, "", TaskState.TASK_ERROR,
                                      Reason.TASK_INVALID,
                                      "task needs exactly one of command or executor", now)
        executor_id = task.executor.executor_id if task.executor else task.task_id
        try:
            check_id("framework id", framework_id)
            check_id("executor id", executor_id)
        except InvalidId as exc:
            return self._agent_update(framework_id, task.task_id, executor_id,
                                      TaskState.TASK_ERROR, Reason.TASK_INVALID, str(exc), now)
        info = launch.executor_info_for(self.config, framework_id, task)
        if self.shutting_down:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_LOST, Reason.AGENT_RESTARTED,
                                      "agent is shutting down", now)
        if self.draining:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_DROPPED, Reason.AGENT_DRAINING,
                                      "agent is draining", now)
        framework = self.frameworks.get(framework_id)
        executor = framework.executors.get(info.executor_id) if framework else None
        if executor is not None and executor.phase == TERMINATING:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_LOST, Reason.EXECUTOR_TERMINATED,
                                      "executor is shutting down", now)
        problem = self._container_problem(task, info, executor is None)
        if problem:
            return self._agent_update(framework_id, task.task_id, info.executor_id,
                                      TaskState.TASK_ERROR, Reason.TASK_INVALID, problem, now)
        needed = self._needed(task, info, executor is None)
        if needed is None:
            return self._agent_update(
                framework_id, task.task_id, info.executor_id, TaskState.TASK_ERROR,
                Reason.TASK_INVALID,
                f"task needs {task.resources} but the agent has only "
                f"{self._free()} free", now)

        effects: list[Effect] = []
        if framework is None:
            framework = self.frameworks[framework_id] = AgentFramework(msg.framework)
        else:
            framework.info = msg.framework
        self.used = self.used + needed
        record = AgentTask(task, framework_id, info.executor_id)
        self.records.place(record)
        if executor is None:
            executor = self._new_executor(framework, info, task.command is not None)
            self._changed((executor,))
            executor.queued[task.task_id] = record
            return [*self._mounts(executor, needed), *self._launch_executor(executor, task, now)]
        self._changed((executor,))
        effects += self._mounts(executor, needed)
        if executor.phase == RUNNING:
            assert executor.peer is not None
            executor.launched[task.task_id] = record
            effects.append(Send(executor.peer, LaunchTask(framework=framework.info, task=task)))
        else:  # LAUNCHING, or RECOVERING: sent once it (re-)registers
            executor.queued[task.task_id] = record
        return effects + self._update_limits(executor)

    def _needed(self, task: TaskInfo, info: ExecutorInfo, new_executor: bool) -> Resources | None:
        """What accepting `task` adds to `used`, or None if that does not fit. A task
        on revocable resources adds only its new executor's: it runs in what others
        leave idle, and the QoS controller evicts it when they need that back."""
        own = Resources() if task.revocable else task.resources
        try:
            needed = own + info.resources if new_executor else own
            fits = self.used + needed <= self.total
        except ResourcesError:  # e.g. the same port twice
            return None
        return needed if fits else None

    @property
    def total(self) -> Resources:
        """The agent's resources with the master's dynamic reservations applied."""
        return total_of(self.config.resources, self.dynamic)

    def _free(self) -> Resources:
        try:
            return self.total - self.used
        except ResourcesError:
            return Resources()

    def _mounts(self, executor: AgentExecutor, needed: Resources) -> list[Effect]:
        """A process run sees its volumes through links in its sandbox; a container
        gets them bound when it is created (`_launch_container`)."""
        if executor.info.container is not None:
            return []
        return [*persistent.mounts(self.config.work_dir, self.dynamic, executor.directory,
                                   [needed])]

    def _on_checkpoint_resources(self, msg: CheckpointResources) -> list[Effect]:
        """The master changed this agent's reservations or volumes (agent.persistent)."""
        dynamic, effects, why = persistent.adopt(self.config.work_dir, self.config.resources,
                                                 self.dynamic, msg.resources,
                                                 self.used.volumes())
        if why:
            return self._reject_master(f"checkpoint_resources refused: {why}", msg.TYPE)
        if dynamic != self.dynamic:
            self.dynamic = dynamic
            self._changed()
        return [*effects]

    def _on_kill_task(self, msg: KillTask, now: float) -> list[Effect]:
        found = self.records.find(msg.framework_id, msg.task_id)
        if found is None:
            if self.records.is_completed(msg.framework_id, msg.task_id):
                return []  # its terminal update already went out
            return self._agent_update(msg.framework_id, msg.task_id, "", TaskState.TASK_LOST,
                                      Reason.TASK_UNKNOWN, "task is unknown to the agent", now)
        executor, task = found
        if msg.reason:  # the master preempts it
            return self._preempt(executor, task, msg.reason, msg.message, now)
        if task.task_id in executor.queued:
            killed = self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLED,
                Reason.TASK_KILLED_DURING_LAUNCH, "killed before the executor registered", now),
                now)
            if executor.phase == LAUNCHING and not any(executor.live_tasks()):
                killed += self._shutdown_executor(executor, now)  # launched for nothing
            return killed
        if task.task_id not in executor.launched:
            return []  # terminal already; its update is on its way
        if executor.direct:
            return self._stop_direct(executor, msg.kill_grace_period, now)
        effects: list[Effect] = [*self.health.stop(task.framework_id, task.task_id)]
        if executor.phase == RECOVERING:
            executor.pending_kills[task.task_id] = msg.kill_grace_period
            self._changed()
        elif executor.peer is not None:
            effects.append(Send(executor.peer, msg))
        return effects

    def _preempt(self, executor: AgentExecutor, task: AgentTask, reason: str, message: str,
                 now: float) -> list[Effect]:
        """End `task` TASK_KILLED with `reason`: evicted here, or preempted by the master."""
        if task.task_id in executor.queued:
            return self._transition(executor, task, self._status_update(
                task.framework_id, task.task_id, executor.executor_id, TaskState.TASK_KILLED,
                reason, message, now), now)
        if task.task_id not in executor.launched:
            return []  # terminal already
        return self._kill_launched(executor, task, TaskEnd(TaskState.TASK_KILLED, reason, message),
                                   now)

    def _kill_launched(self, executor: AgentExecutor, task: AgentTask,
                       outcome: TaskEnd, now: float) -> list[Effect]:
        """Ask the executor to kill `task` (its kill policy applies) and report the
        end as `outcome`, whatever the executor calls it."""
        task.kill_as = outcome
        self._changed()
        effects: list[Effect] = [*self.health.stop(task.framework_id, task.task_id)]
        if executor.direct:
            return effects + self._stop_direct(executor, None, now)
        if executor.phase == RUNNING and executor.peer is not None:
            effects.append(Send(executor.peer, KillTask(
                framework_id=task.framework_id, task_id=task.task_id,
                kill_grace_period=task.info.kill_grace_period)))
        return effects

    def _on_ack(self, msg: StatusUpdateAck, now: float) -> list[Effect]:
        acked = self.updates.acked
        effects: list[Effect] = [*self.updates.acknowledge(msg.framework_id, msg.task_id,
                                                            msg.uuid, now)]
        if self.updates.acked != acked:
            self._changed(())
        if not self.updates.has_stream(msg.framework_id, msg.task_id):
            found = self.records.find(msg.framework_id, msg.task_id)
            if found is not None and found[1].task_id in found[0].terminated:
                self.records.complete_task(*found)
                self._changed(found[:1])
        return effects

    def _on_executor_update(self, peer: str, executor: AgentExecutor, msg: StatusUpdate,
                            now: float) -> list[Effect]:
        status = msg.status
        if not status.uuid:
            return self._reject_executor(peer, "status update needs a uuid", msg.TYPE)
        ack: list[Effect] = [Send(peer, StatusUpdateAck(
            agent_id=self.agent_id or "", framework_id=msg.framework_id,
            task_id=status.task_id, uuid=status.uuid))]
        task = executor.launched.get(status.task_id) or executor.terminated.get(status.task_id)
        if task is None or status.uuid in task.seen_uuids or task.state.is_terminal:
            # Unknown task, an executor's resend, or news after the end: acknowledged
            # so the executor stops resending, but never forwarded.
            self.counters["status_updates_dropped"] += 1
            return ack
        status = attrs.evolve(status, agent_id=status.agent_id or self.agent_id or "",
                              executor_id=status.executor_id or executor.executor_id)
        outcome = task.kill_as
        if status.state.is_terminal and outcome is not None:
            told = f" ({status.message})" if status.message else ""
            status = attrs.evolve(status, state=outcome.state, reason=outcome.reason,
                                  message=outcome.message + told)
        effects = self._transition(executor, task, attrs.evolve(msg, status=status), now)
        check = task.info.health_check
        if status.state == TaskState.TASK_RUNNING and check is not None and outcome is None:
            effects += self.health.start(task.framework_id, task.task_id, check,
                                         executor.directory, self._task_env(executor, task), now,
                                         self._run_user(executor, task.info))
        return effects + ack

    def _transition(self, executor: AgentExecutor, task: AgentTask, update: StatusUpdate,
                    now: float) -> list[Effect]:
        """Record `update` as `task`'s latest state and hand it to its stream."""
        self._changed((executor,))
        state = update.status.state
        task.state = state
        task.status_uuid = update.status.uuid
        task.seen_uuids.add(update.status.uuid)
        effects: list[Effect] = []
        if state.is_terminal or state == TaskState.TASK_KILLING:
            effects += self.health.stop(task.framework_id, task.task_id)
        if state.is_terminal:
            del (executor.queued if task.task_id in executor.queued
                 else executor.launched)[task.task_id]
            executor.terminated[task.task_id] = task
            executor.pending_kills.pop(task.task_id, None)
            if not task.info.revocable:
                self.used = self.used - task.info.resources
            self.counters[_state_metric(state)] += 1
            effects += self._update_limits(executor)
        return effects + [*self.updates.add(update, now)]

    def _agent_update(self, framework_id: str, task_id: str, executor_id: str,
                      state: TaskState, reason: str, message: str,
                      now: float) -> list[Effect]:
        """A terminal update for a task the agent never ran (no record to keep)."""
        self._changed(())
        self.counters[_state_metric(state)] += 1
        update = self._status_update(framework_id, task_id, executor_id, state, reason,
                                     message, now)
        return [*self.updates.add(update, now)]

    def _status_update(self, framework_id: str, task_id: str, executor_id: str,
                       state: TaskState, reason: str, message: str, now: float,
                       healthy: bool | None = None, source: str = Source.AGENT) -> StatusUpdate:
        """An update the agent makes; `source` is SOURCE_EXECUTOR where the agent
        plays a direct run's executor (its start, kill and end)."""
        return StatusUpdate(framework_id=framework_id, status=TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message,
            source=source, agent_id=self.agent_id or "", executor_id=executor_id,
            uuid=self._new_id(), healthy=healthy, timestamp=now))

    # ------------------------------------------------------------------ health

    def _on_health_result(self, event: HealthCheckResult, now: float) -> list[Effect]:
        effects: list[Effect] = []
        results, outcomes = self.health.result(event, now)
        effects += results
        for outcome in outcomes:
            found = self.records.find(outcome.framework_id, outcome.task_id)
            if found is None or outcome.task_id not in found[0].launched:
                continue
            executor, task = found
            if isinstance(outcome, HealthChanged):
                self.counters["health_changes"] += 1
                effects += self._transition(executor, task, self._status_update(
                    task.framework_id, task.task_id, executor.executor_id,
                    TaskState.TASK_RUNNING, Reason.TASK_HEALTH_CHECK_STATUS_UPDATED,
                    outcome.message, now, healthy=outcome.healthy), now)
            else:
                log.warning("killing task %s: %s", task.task_id, outcome.message)
                self.counters["tasks_killed_unhealthy"] += 1
                effects += self._kill_launched(executor, task, TaskEnd(
                    TaskState.TASK_FAILED, Reason.TASK_UNHEALTHY, outcome.message), now)
        return effects


def _state_metric(state: TaskState) -> str:
    return "tasks_" + state.name.removeprefix("TASK_").lower()
