"""The master's task records: making them, checking a launch before it
happens, and answering reconciliation. Pure functions over the records; only
`MasterState` changes them.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping

from dyad.containers import problems as container_problems
from dyad.messages import Offer, Reason, Source, Task, TaskInfo, TaskState, TaskStatus
from dyad.resources import Resources, ResourcesError
from master.model import EMPTY, MAX_STATUSES, MasterAgent, MasterFramework, MasterTask


def launched(framework_id: str, agent_id: str, executor_id: str, task: TaskInfo,
             story: int, now: float) -> MasterTask:
    """The record of a task the master has just sent to its agent (TASK_STAGING)."""
    return MasterTask(
        task_id=task.task_id, framework_id=framework_id, agent_id=agent_id,
        executor_id=executor_id, name=task.name, resources=task.resources,
        state=TaskState.TASK_STAGING, labels=dict(task.labels),
        kill_grace_period=task.kill_grace_period,
        statuses=collections.deque([(TaskState.TASK_STAGING, now)], maxlen=MAX_STATUSES),
        story=collections.deque(maxlen=story), priority=task.priority,
        revocable=task.revocable)


def story_lines(task: MasterTask) -> list[str]:
    """The task's story as text, oldest first: "<time> <what happened>" (see
    `MasterBooks._note`)."""
    return [f"{at:.3f} {text % args if args else text}" for at, text, args in task.story]


def record_from_report(task: Task, story: int, now: float) -> MasterTask:
    """The record of a task a re-registering agent reports."""
    return MasterTask(
        task_id=task.task_id, framework_id=task.framework_id, agent_id=task.agent_id,
        executor_id=task.executor_id, name=task.name, resources=task.resources,
        state=task.state, labels=dict(task.labels), kill_grace_period=None,
        statuses=collections.deque([(task.state, now)], maxlen=MAX_STATUSES),
        story=collections.deque(maxlen=story), priority=task.priority,
        revocable=task.revocable)


def claim_offers(outstanding: Mapping[str, Offer], framework: MasterFramework,
                 offer_ids: list[str]) -> tuple[list[Offer], str]:
    """The framework's offers among `offer_ids` and, if the set is unusable for
    an accept, why."""
    offers: list[Offer] = []
    problems: list[str] = []
    if not offer_ids:
        problems.append("no offers given")
    for offer_id in dict.fromkeys(offer_ids):
        offer = outstanding.get(offer_id)
        if offer is None:
            problems.append(f"offer {offer_id} is unknown or no longer valid")
        elif offer.framework_id != framework.id:
            problems.append(f"offer {offer_id} belongs to another framework")
        else:
            offers.append(offer)
    if len(offer_ids) != len(set(offer_ids)):
        problems.append("an offer is listed twice")
    agents = sorted({offer.agent_id for offer in offers})
    if len(agents) > 1:
        problems.append(f"offers span several agents ({', '.join(agents)})")
    return offers, "; ".join(problems)



def task_problem(framework: MasterFramework, agent: MasterAgent, task: TaskInfo,
                 seen: set[str], remaining: Resources) -> tuple[str, Resources]:
    """Why `task` cannot launch ('' if it can), and what it takes from the offer."""
    if not task.task_id:
        return "task id is empty", EMPTY
    if task.task_id in framework.tasks or task.task_id in seen:
        return f"task id {task.task_id} is already in use", EMPTY
    if task.agent_id != agent.id:
        return f"task agent id {task.agent_id} is not the offer's agent {agent.id}", EMPTY
    if (task.command is None) == (task.executor is None):
        return "a task needs exactly one of command or executor", EMPTY
    if task.resources.is_empty():
        return "task resources are empty", EMPTY
    found = _container_problems(task)
    if found:
        return "; ".join(found), EMPTY
    needed = task.resources
    if task.executor is not None:
        executor = task.executor
        if executor.framework_id not in (None, framework.id):
            return (f"executor {executor.executor_id} names framework "
                    f"{executor.framework_id}, not {framework.id}"), EMPTY
        running = agent.executors.get((framework.id, executor.executor_id))
        if running is not None and running != executor:
            return (f"executor {executor.executor_id} is already running on agent "
                    f"{agent.id} with a different ExecutorInfo"), EMPTY
        if running is None:
            try:
                needed = needed + executor.resources
            except ResourcesError as exc:
                return f"task and executor resources overlap: {exc}", EMPTY
    if not needed <= remaining:
        return (f"task needs {needed} but only {remaining or 'nothing'} remains "
                "of the offered resources"), EMPTY
    return "", needed


def _container_problems(task: TaskInfo) -> list[str]:
    """What is wrong with the task's (or its executor's) container, each reason
    naming its field (docs/containers.md)."""
    found = []
    if task.container is not None:
        if task.executor is not None:
            found.append("container is for command tasks: put it on the executor instead")
        found += container_problems(task.container, task.resources)
    if task.executor is not None and task.executor.container is not None:
        found += [f"executor.{problem}" for problem in
                  container_problems(task.executor.container, task.executor.resources)]
    return found


def reconciled(framework: MasterFramework, task_id: str, agent_id: str | None,
               recovering: Collection[str], unreachable: Collection[str],
               now: float) -> TaskStatus | None:
    """The master's best knowledge of a task, as a reconciliation answer; None
    (no answer yet, as in Mesos) while the task may be on an agent that is
    still `recovering` (re-registering after a failover)."""
    task = (framework.tasks.get(task_id) or framework.unreachable_tasks.get(task_id)
            or framework.completed.get(task_id))
    if task is not None:
        return status_of(task, now)
    if agent_id in recovering or (agent_id is None and recovering):
        return None
    aware = framework.info.partition_aware
    if agent_id in unreachable:
        return TaskStatus(task_id=task_id, state=(TaskState.TASK_UNREACHABLE if aware
                                                  else TaskState.TASK_LOST),
                          reason=Reason.RECONCILIATION, source=Source.MASTER,
                          message=f"agent {agent_id} is unreachable",
                          agent_id=agent_id or "", timestamp=now)
    unknown = TaskState.TASK_UNKNOWN if aware else TaskState.TASK_LOST
    return TaskStatus(task_id=task_id, state=unknown, reason=Reason.RECONCILIATION,
                      message="task is unknown to the master", source=Source.MASTER,
                      agent_id=agent_id or "", timestamp=now)


def status_of(task: MasterTask, now: float) -> TaskStatus:
    """What the master knows of a live or finished task, as a reconciliation answer."""
    return TaskStatus(task_id=task.task_id, state=task.state, reason=Reason.RECONCILIATION,
                      message="reconciliation", source=Source.MASTER,
                      agent_id=task.agent_id, executor_id=task.executor_id,
                      healthy=task.healthy, timestamp=now)

