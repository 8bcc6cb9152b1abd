"""A re-registering agent's report, checked: `plan_reregistration(state,
message)` compares what the agent says it runs (its frameworks, tasks and
executors) with the master's books before anything changes, and answers either
why the report is refused or a `ReregistrationPlan` that `MasterState` adopts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from dyad.messages import ExecutorInfo, FrameworkInfo, RegisterAgent, Task, TaskState
from dyad.resources import ResourcesError
from dyad.volumes import DynamicResources, total_of
from master.model import EMPTY, roles_problem
from master.volumes import adopted

if TYPE_CHECKING:
    from master.state import MasterState


@attrs.define
class ReregistrationPlan:
    """What a re-registration brings back, checked before anything is changed."""

    infos: dict[str, FrameworkInfo] = attrs.field(factory=dict)
    tasks: list[Task] = attrs.field(factory=list)
    executors: list[tuple[str, ExecutorInfo]] = attrs.field(factory=list)
    orphaned: set[str] = attrs.field(factory=set)  # torn-down frameworks still running
    # What this master launched on the agent and never heard of (TASK_STAGING),
    # which the agent does not report: sent to the connection of a process that
    # has since restarted, so it never got there.
    missing_tasks: list[tuple[str, str]] = attrs.field(factory=list)
    missing_executors: list[tuple[str, str]] = attrs.field(factory=list)
    # Reservations and volumes to keep (master/volumes.py `adopted`), and why the
    # agent's own report of them was ignored, if it was.
    dynamic: DynamicResources = attrs.field(factory=DynamicResources)
    ignored_report: str = ""


def plan_reregistration(state: MasterState, message: RegisterAgent) -> ReregistrationPlan | str:
    """Check a re-registration before touching any state: what to adopt, or why
    it is refused."""
    info = message.agent
    agent_id = info.id
    assert agent_id is not None
    agent = state.agents.get(agent_id)
    infos: dict[str, FrameworkInfo] = {}
    for framework_info in message.frameworks:
        if framework_info.id is None:
            return f"framework {framework_info.name!r} is reported without an id"
        problem = roles_problem(framework_info.roles)
        if problem:
            return f"framework {framework_info.id}: {problem}"
        infos[framework_info.id] = framework_info
    plan = ReregistrationPlan(infos=infos)
    if agent is not None:  # registered here: this master's record is the newest
        plan.dynamic = agent.dynamic
    else:
        plan.dynamic, plan.ignored_report = adopted(
            info.resources, state.parked_dynamic.get(agent_id), message.dynamic)
    seen: set[tuple[str, str]] = set()
    for task in message.tasks:
        key = (task.framework_id, task.task_id)
        if task.agent_id != agent_id:
            return f"task {task.task_id} is reported on agent {task.agent_id}"
        if key in seen:
            return f"task {task.task_id} is reported twice"
        seen.add(key)
        if task.state.is_terminal:
            continue
        if task.framework_id in state.completed_frameworks:
            plan.orphaned.add(task.framework_id)
            continue
        if task.framework_id not in state.frameworks and task.framework_id not in infos:
            return f"task {task.task_id} belongs to unreported framework {task.framework_id}"
        framework = state.frameworks.get(task.framework_id)
        if framework is not None and task.task_id in framework.tasks:
            continue  # the master's record is newer than the report
        plan.tasks.append(task)
    executor_frameworks = {t.executor_id: t.framework_id for t in message.tasks}
    for executor in message.executors:
        framework_id = executor.framework_id or executor_frameworks.get(executor.executor_id)
        if framework_id is None:
            return f"executor {executor.executor_id} has no framework id"
        if framework_id in state.completed_frameworks:
            plan.orphaned.add(framework_id)
            continue
        if framework_id not in state.frameworks and framework_id not in infos:
            return f"executor {executor.executor_id} belongs to unreported framework {framework_id}"
        if agent is not None and (framework_id, executor.executor_id) in agent.executors:
            continue
        plan.executors.append((framework_id, executor))
    if agent is not None:
        plan.missing_tasks = sorted(
            (framework_id, task_id) for framework_id, task_id in agent.tasks - seen
            if state.frameworks[framework_id].tasks[task_id].state is TaskState.TASK_STAGING)
        reported = {(executor.framework_id or executor_frameworks.get(executor.executor_id),
                     executor.executor_id) for executor in message.executors}
        plan.missing_executors = sorted(set(agent.executors) - reported)
    try:
        needed = agent.used if agent is not None else EMPTY
        for task in plan.tasks:
            if not task.revocable:  # lent resources are not the agent's own
                needed = needed + task.resources
        for _, executor in plan.executors:
            needed = needed + executor.resources
    except ResourcesError as exc:
        return f"reported tasks and executors overlap: {exc}"
    total = total_of(info.resources, plan.dynamic)
    if not needed <= total:
        return (f"reported tasks and executors use {needed}, more than the agent's "
                f"{total}")
    return plan
