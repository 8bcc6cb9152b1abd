"""The master's books, checked: `check(state)` raises `InvariantError` listing
every inconsistency (offers, tasks and executors against agents and frameworks,
and the allocator's view against the master's). Expensive; tests run it after
every step, and a failure is always a master bug, never bad input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyad.resources import Resources, ResourcesError
from master.model import EMPTY, InvariantError, MasterAgent
from master.tasks import story_lines

if TYPE_CHECKING:
    from master.state import MasterState


def check(state: MasterState) -> None:
    """Check every invariant; raise `InvariantError` listing all violations.
    Expensive; tests call it after every step."""
    errors: list[str] = []
    for offer in state.offers.values():
        framework = state.frameworks.get(offer.framework_id)
        if framework is None or framework.peer is None:
            errors.append(f"offer {offer.id} is held by unconnected framework {offer.framework_id}")
        elif offer.id not in framework.offers:
            errors.append(f"offer {offer.id} missing from framework {framework.id}")
        agent = state.agents.get(offer.agent_id)
        if agent is None:
            errors.append(f"offer {offer.id} is for unregistered agent {offer.agent_id}")
        elif offer.id not in agent.offers:
            errors.append(f"offer {offer.id} missing from agent {agent.id}")
    for framework in state.frameworks.values():
        agents = [state.offers[o].agent_id for o in framework.offers if o in state.offers]
        if len(agents) != len(framework.offers):
            errors.append(f"framework {framework.id} lists offers that do not exist")
        if len(agents) != len(set(agents)):
            errors.append(f"framework {framework.id} holds two offers for one agent")
        for task in framework.tasks.values():
            agent = state.agents.get(task.agent_id)
            if agent is None or (framework.id, task.task_id) not in agent.tasks:
                errors.append(f"task {task.task_id} is not on its agent {task.agent_id}; "
                              f"story: {' | '.join(story_lines(task))}")
            if task.state.is_terminal:
                errors.append(f"live task {task.task_id} is {task.state.name}")
    for agent_id in state.recovering:
        if agent_id in state.agents:
            errors.append(f"agent {agent_id} is both registered and recovering")
    for peer, agent_id in state.agent_by_peer.items():
        if agent_id not in state.agents or state.agents[agent_id].peer != peer:
            errors.append(f"peer {peer} maps to agent {agent_id}, which is not on it")
    for agent in state.agents.values():
        errors.extend(_agent_problems(state, agent))
    errors.extend(_timing_problems(state))
    if errors:
        raise InvariantError("\n".join(errors))


def _timing_problems(state: MasterState) -> list[str]:
    """Every outstanding offer is either held back by admission (no clock yet) or
    in exactly one group sent together, whose one `OfferTimeout` covers it."""
    errors: list[str] = []
    for offer_id in state.offers:
        sent, waiting = offer_id in state.group_of, state.admission.waiting(offer_id)
        if sent and waiting:
            errors.append(f"offer {offer_id} is timed and also waiting for admission")
        elif not sent and not waiting:
            errors.append(f"offer {offer_id} is neither timed nor waiting for admission")
    for first, members in state.offer_groups.items():
        if not members:
            errors.append(f"offer group {first} is empty but kept")
        for offer_id in members:
            if offer_id not in state.offers or state.group_of.get(offer_id) != first:
                errors.append(f"offer group {first} lists {offer_id}, not outstanding in it")
    return errors


def _agent_problems(state: MasterState, agent: MasterAgent) -> list[str]:
    errors: list[str] = []
    if state.agent_by_peer.get(agent.peer) != agent.id:
        errors.append(f"agent {agent.id} is not reachable through its peer")
    offered: dict[str, Resources] = {}
    used: dict[str, Resources] = {}
    lent_offered = lent_used = EMPTY
    try:
        for offer_id in agent.offers:
            offer = state.offers[offer_id]
            offered[offer.framework_id] = offered.get(offer.framework_id, EMPTY) + offer.resources
            lent_offered = lent_offered + offer.revocable
        for framework_id, task_id in agent.tasks:
            task = state.frameworks[framework_id].tasks[task_id]
            if task.revocable:
                lent_used = lent_used + task.resources
                continue
            used[framework_id] = used.get(framework_id, EMPTY) + task.resources
        for (framework_id, _), executor in agent.executors.items():
            used[framework_id] = used.get(framework_id, EMPTY) + executor.resources
        total_offered = sum(offered.values(), EMPTY)
        total_used = sum(used.values(), EMPTY)
        free = agent.total - total_offered - total_used
    except (ResourcesError, KeyError) as exc:
        return [f"agent {agent.id}: resources held twice or records dangling: {exc!r}"]
    by_framework: dict[str, list[str]] = {}
    for framework_id, executor_id in agent.executors:
        by_framework.setdefault(framework_id, []).append(executor_id)
    if by_framework != {fid: list(ids) for fid, ids in agent.executor_ids.items()}:
        errors.append(f"agent {agent.id}: executor_ids {agent.executor_ids} do not index "
                      f"its executors {sorted(agent.executors)}")
    if total_offered != agent.offered:
        errors.append(f"agent {agent.id}: offered {agent.offered} but offers sum to {total_offered}")
    if total_used != agent.used:
        errors.append(f"agent {agent.id}: used {agent.used} but tasks and executors sum to {total_used}")
    if (lent_offered, lent_used) != (agent.revocable_offered, agent.revocable_used):
        errors.append(f"agent {agent.id}: revocable offered {agent.revocable_offered} and used "
                      f"{agent.revocable_used}, but offers hold {lent_offered} and tasks "
                      f"{lent_used}")
    if state.allocator.free(agent.id) != free:
        errors.append(f"agent {agent.id}: allocator has {state.allocator.free(agent.id)} "
                      f"free, master has {free}")
    for framework_id in set(offered) | set(used) | set(state.frameworks):
        mine = offered.get(framework_id, EMPTY) + used.get(framework_id, EMPTY)
        theirs = state.allocator.allocated(agent.id, framework_id)
        if mine != theirs:
            errors.append(f"agent {agent.id}: framework {framework_id} holds {mine}, "
                          f"allocator says {theirs}")
    return errors

