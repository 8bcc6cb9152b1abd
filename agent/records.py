"""The agent's records: live frameworks, their executor runs and tasks, the
recently completed ones kept for `/state`, which executor connection is which
run -- and how to find things among them. Plain bookkeeping, no decisions:
`AgentState` decides, this holds what it decided.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from agent import checkpoint, limits
from agent.checkpoint import SavedAgent
from agent.model import (
    LAUNCHING, RECOVERING, RUNNING, TERMINATING, AgentExecutor, AgentFramework, AgentTask,
)
from dyad.messages import FrameworkInfo
from dyad.resources import Resources

LIVE_PHASES = (LAUNCHING, RECOVERING, RUNNING)


class Records:
    def __init__(self, completed_limit: int) -> None:
        self.completed_limit = completed_limit
        self.frameworks: dict[str, AgentFramework] = {}
        self.completed_frameworks: deque[AgentFramework] = deque(maxlen=completed_limit)
        self.peers: dict[str, tuple[str, str]] = {}  # executor peer -> (framework, executor)
        # (framework, task) -> the executor that holds the live or unacknowledged task:
        # a lookup is one step, not a walk over thousands of runs.
        self._homes: dict[tuple[str, str], str] = {}

    # ----------------------------------------------------------------- lookups

    def executors(self) -> list[AgentExecutor]:
        return [e for f in self.frameworks.values() for e in f.executors.values()]

    def executor(self, framework_id: str, executor_id: str) -> AgentExecutor | None:
        framework = self.frameworks.get(framework_id)
        return framework.executors.get(executor_id) if framework else None

    def by_peer(self, peer: str) -> AgentExecutor | None:
        ids = self.peers.get(peer)
        return self.executor(*ids) if ids else None

    def find(self, framework_id: str, task_id: str) -> tuple[AgentExecutor, AgentTask] | None:
        executor_id = self._homes.get((framework_id, task_id))
        executor = self.executor(framework_id, executor_id) if executor_id is not None else None
        task = executor.find(task_id) if executor is not None else None
        return (executor, task) if executor is not None and task is not None else None

    def find_task(self, framework_id: str, task_id: str) -> AgentTask | None:
        found = self.find(framework_id, task_id)
        return found[1] if found else None

    def is_completed(self, framework_id: str, task_id: str) -> bool:
        frameworks = [f for f in (*self.frameworks.values(), *self.completed_frameworks)
                      if f.id == framework_id]
        return any(t.task_id == task_id for f in frameworks
                   for e in (*f.executors.values(), *f.completed_executors) for t in e.completed)

    def charged(self) -> Resources:
        """What the live runs hold: each executor's resources and its live tasks'
        (not those on revocable resources: they are lent, not part of the agent's)."""
        total = Resources()
        for executor in self.executors():
            total = total + executor.info.resources
            for task in executor.live_tasks():
                if not task.info.revocable:
                    total = total + task.info.resources
        return total

    # ---------------------------------------------------------------- changes

    def attach(self, peer: str, executor: AgentExecutor) -> None:
        """`peer` is the connection `executor` registered on."""
        executor.peer = peer
        self.peers[peer] = (executor.framework_id, executor.executor_id)

    def place(self, task: AgentTask) -> None:
        """`task` is new on its executor (queued, launched or, recovered, any)."""
        self._homes[(task.framework_id, task.task_id)] = task.executor_id

    def complete_task(self, executor: AgentExecutor, task: AgentTask) -> None:
        """`task`'s terminal update was acknowledged: keep it among the completed."""
        del executor.terminated[task.task_id]
        self._homes.pop((task.framework_id, task.task_id), None)
        self._keep(executor.completed, task)

    def retire(self, executor: AgentExecutor) -> None:
        """The run is gone: it, and its framework if that was its last run, move to
        the completed records."""
        framework = self.frameworks[executor.framework_id]
        if executor.peer is not None:
            self.peers.pop(executor.peer, None)
        for task in executor.terminated.values():
            self._keep(executor.completed, task)
        for task in (*executor.live_tasks(), *executor.terminated.values()):
            self._homes.pop((task.framework_id, task.task_id), None)
        executor.terminated.clear()
        del framework.executors[executor.executor_id]
        self._keep(framework.completed_executors, executor)
        if not framework.executors:
            del self.frameworks[framework.id]
            self.completed_frameworks.append(framework)

    def restore(self, saved: SavedAgent) -> None:
        """Take back the runs of a checkpoint, each RECOVERING until `AgentState`
        decides what it is now."""
        assert not self.frameworks, "recovery comes first"
        infos = {f.id: f for f in saved.frameworks}
        for save in saved.executors:
            framework = self.frameworks.get(save.framework_id)
            if framework is None:
                info = infos.get(save.framework_id) or FrameworkInfo(name=save.framework_id,
                                                                     id=save.framework_id)
                framework = self.frameworks[save.framework_id] = AgentFramework(info)
            executor = checkpoint.load_executor(save, RECOVERING)
            executor.limits = limits.limits(executor)
            framework.executors[save.info.executor_id] = executor
            for task in (*executor.live_tasks(), *executor.terminated.values()):
                self.place(task)

    def _keep(self, into: deque[Any], item: Any) -> None:
        into.append(item)
        while len(into) > self.completed_limit:
            into.popleft()

    def validate(self) -> None:
        task_homes: dict[tuple[str, str], str] = {}
        for framework_id, framework in self.frameworks.items():
            assert framework.id == framework_id
            assert framework.executors, f"framework {framework_id} without executors"
            task_ids: set[str] = set()
            for executor_id, executor in framework.executors.items():
                assert executor.executor_id == executor_id
                assert executor.framework_id == framework_id
                assert executor.phase in (*LIVE_PHASES, TERMINATING), executor.phase
                # A direct run has no executor to register (and so no registration
                # timer); any run from an image pulls untimed.
                assert (executor.phase == RUNNING) <= (executor.peer is not None
                                                       or executor.direct)
                assert (executor.phase in (LAUNCHING, RECOVERING)) <= (
                    executor.timer is not None or executor.info.container is not None
                    or executor.direct)
                assert executor.limits == limits.limits(executor), executor
                assert not executor.pending_kills or executor.phase == RECOVERING
                if executor.peer is not None:
                    assert self.peers[executor.peer] == (framework_id, executor_id)
                if executor.phase == RUNNING:
                    assert not executor.queued, "a registered executor has no queue"
                groups = (executor.queued, executor.launched, executor.terminated)
                for group in groups:
                    for task_id, task in group.items():
                        assert task.task_id == task_id
                        assert (task.framework_id, task.executor_id) == (framework_id, executor_id)
                        assert task_id not in task_ids, f"task {task_id} twice"
                        task_ids.add(task_id)
                        task_homes[(framework_id, task_id)] = executor_id
                        assert task.state.is_terminal == (group is executor.terminated), task
        assert task_homes == self._homes, (task_homes, self._homes)
        for peer, (framework_id, executor_id) in self.peers.items():
            owner = self.executor(framework_id, executor_id)
            assert owner is not None and owner.peer == peer
