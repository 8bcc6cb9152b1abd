"""Revocable resources on the master: what agents lend, and who is offered it.

Agents estimate what their tasks reserve but leave idle (agent/reclaim.py) and
report it in every `UsageReport`. The master offers it apart from the allocator:
in the `revocable` field of an `Offer`, beside (never inside) `resources`, and
only to frameworks with the REVOCABLE_RESOURCES capability. The allocator never
sees it, so it counts toward no DRF share and no quota, exactly as in Mesos.

Per agent the master keeps three amounts (cpus and MB, unreserved):
``available = lent - offered - used``, per kind never below zero, where *lent*
is the agent's latest report (capped by the agent's total), *offered* what
outstanding offers hold of it and *used* what live revocable tasks hold. When a
report shrinks below offered + used, the offers holding revocable resources on
that agent are rescinded; the agent's QoS controller evicts what its tasks hold
beyond the new amount.

Who gets it: per agent and pass, one framework, the eligible one with the lowest
DRF share of non-revocable resources (ties: framework id) -- connected, not
suppressed, opted in, not filtered for that agent, and holding no other offer
there (a framework allocated the agent's non-revocable resources in the same
pass gets the revocable part inside that offer). Priorities change nothing here.

A task launches on revocable resources when it says so (`TaskInfo.revocable`):
its resources come from the offers' revocable part, and a new executor's from
the offers' non-revocable part. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from dyad.messages import TaskInfo
from dyad.resources import Resources
from master.model import EMPTY, MasterAgent, MasterFramework
from master.tasks import task_problem

LENT_KINDS = ("cpus", "mem")
CAPABILITY = "REVOCABLE_RESOURCES"


def lendable(reported: Resources, total: Resources) -> Resources:
    """What an agent's report may lend: unreserved cpus and mem, at most the
    agent's total of each (anything else in a report is ignored)."""
    amounts = {kind: min(reported.unreserved().get_milli(kind), total.get_milli(kind))
               for kind in LENT_KINDS}
    return _of(amounts)


def available(agent: MasterAgent) -> Resources:
    """What of the agent's lent resources no offer or task holds."""
    return _of({kind: agent.revocable.get_milli(kind) - agent.revocable_offered.get_milli(kind)
                - agent.revocable_used.get_milli(kind) for kind in LENT_KINDS})


def overcommitted(agent: MasterAgent) -> bool:
    """The agent lends less than its offers and tasks hold: its revocable offers
    must be rescinded."""
    held = agent.revocable_offered + agent.revocable_used
    return any(held.get_milli(kind) > agent.revocable.get_milli(kind) for kind in LENT_KINDS)


def worth_offering(resources: Resources, min_cpus: float, min_mem: float) -> bool:
    """Like the allocator's rule: some cpus or some mem worth a task."""
    return resources.get("cpus") >= min_cpus or resources.get("mem") >= min_mem


def plan(agents: Mapping[str, MasterAgent], frameworks: Iterable[MasterFramework],
         share: Callable[[str], float], filtered: Callable[[str, str], bool],
         minimum: tuple[float, float]) -> dict[str, tuple[str, Resources]]:
    """Agent id -> (framework id, revocable resources) to offer in this pass.
    `share` is a framework's DRF share; `filtered(framework, agent)` says a
    refuse filter holds; `minimum` is the (cpus, mem) worth offering. The
    framework may already hold an offer made in this same pass on the agent
    (the caller merges the two); it holds no earlier one."""
    takers = sorted((f for f in frameworks if _opted_in(f)), key=lambda f: (share(f.id), f.id))
    chosen: dict[str, tuple[str, Resources]] = {}
    if not takers:
        return chosen
    for agent_id in sorted(agents):
        agent = agents[agent_id]
        lent = available(agent)
        if not worth_offering(lent, *minimum):
            continue
        for framework in takers:
            if filtered(framework.id, agent_id):
                continue
            if any(offer_id in agent.offers for offer_id in framework.offers):
                continue
            chosen[agent_id] = (framework.id, lent)
            break
    return chosen


def launch_problem(framework: MasterFramework, agent: MasterAgent, task: TaskInfo,
                   seen: set[str], remaining: Resources, lent: Resources
                   ) -> tuple[str, Resources, Resources]:
    """Why a revocable `task` cannot launch ('' if it can), what it takes of the
    offers' non-revocable part (a new executor), and what of their revocable part
    (the task itself)."""
    if not framework.info.revocable_resources:
        return f"framework {framework.id} lacks the {CAPABILITY} capability", EMPTY, EMPTY
    if task.resources.names() - set(LENT_KINDS) or task.resources.roles() - {"*"}:
        return (f"revocable resources are unreserved {' and '.join(LENT_KINDS)} only; "
                f"task asks for {task.resources}"), EMPTY, EMPTY
    # The protocol checks, with room enough that only they can fail; what it
    # takes from each part is checked below.
    problem, needed = task_problem(framework, agent, task, seen,
                                   remaining + lent + task.resources)
    if problem:
        return problem, EMPTY, EMPTY
    if not task.resources <= lent:
        return (f"task needs {task.resources} revocable but only {lent or 'nothing'} "
                "remains of the offered revocable resources"), EMPTY, EMPTY
    executor = needed - task.resources
    if not executor <= remaining:
        return (f"its new executor needs {executor} but only {remaining or 'nothing'} "
                "remains of the offered non-revocable resources"), EMPTY, EMPTY
    return "", executor, task.resources


def _opted_in(framework: MasterFramework) -> bool:
    return (framework.peer is not None and not framework.suppressed
            and framework.info.revocable_resources)


def _of(amounts: Mapping[str, int]) -> Resources:
    out = EMPTY
    for kind, milli in amounts.items():
        if milli > 0:
            out = out + Resources.scalar_milli(kind, milli)
    return out
