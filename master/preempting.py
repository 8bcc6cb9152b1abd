"""The master's preemption: when to preempt, and carrying it out.

Off unless the master runs with `--preemption` (`PreemptionConfig.enabled`).
Victims are chosen by master/allocator/preemption.py; this module turns two
triggers into kills:

- **A framework asks** (`Preempt`: a task of `priority` needing `resources`
  cannot be placed). Honoured when the framework has the PREEMPTION capability,
  or one of its roles has a quota guarantee not yet met. If some agent already
  has the room free, nothing is killed (the framework's filters are dropped so
  it is offered that room). Otherwise the agent chosen by `place` has its
  victims killed.
- **A guarantee is unmet** (checked after every allocation pass, when
  `guarantees` is on): a role with a quota guarantee, an active unsuppressed
  framework and no outstanding offer, whose allocation plus what is free for it
  plus what is already being freed for it falls short of its guarantee, has
  the shortfall reclaimed (`reclaim`) at `guarantee_priority`.

Either way: victims are never tasks of roles at or below their own guarantee
(protected), never on revocable resources (killing those frees nothing the
allocator offers; the agent's QoS controller handles them), and never tasks
already being preempted. Each victim gets a `KillTask` with
REASON_CONTAINER_PREEMPTED and a message naming why, so its framework hears
TASK_KILLED with that reason; the events log records `task_preempted`. The
agents that victims free are *held*: every other framework is filtered from
them for `hold` seconds, so the room goes to the preemptor rather than back
into the general pool (no cascade). A hold outlives a `Revive`: the victim's
framework typically revives when it hears of the preemption, and dropping its
hold filter then would hand the room straight back to it, to be preempted
again (the simulator found that loop). At most `max_per_minute` victims a minute.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from dyad.messages import PREEMPTION_CAPABILITY, KillTask, Preempt, Reason
from dyad.resources import Resources
from master.allocator.preemption import Candidate, place, reclaim
from master.books import MasterBooks
from master.model import MasterFramework, MasterTask

MINUTE = 60.0


class PreemptionHandlers(MasterBooks):
    """Preemption for the master core; see the module docstring."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # Victims killed and not yet ended:
        # (framework, task) -> (agent, resources, role, frameworks the room is for).
        self.preempting: dict[tuple[str, str], tuple[str, Resources, str, frozenset[str]]] = {}
        self._preempted_at: collections.deque[float] = collections.deque()
        # Agents held for preemptors: agent -> (until, frameworks the room is for).
        self._holds: dict[str, tuple[float, frozenset[str]]] = {}

    # ----------------------------------------------------------- triggers

    def _on_preempt(self, peer: str, message: Preempt) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        why = self._preempt_refusal(framework, message)
        if why:
            self.counters.inc("master/preemptions_refused")
            self._refuse(peer, message, why)
            return
        self._settle()
        free = {agent_id: self._free_for(framework, agent_id) for agent_id in self.agents
                if agent_id not in self.drained}
        plan = place(message.resources, message.priority, free, self._candidates(),
                     self._protected_roles())
        if plan is None:
            self.counters.inc("master/preemptions_refused")
            self._refuse(peer, message, f"no agent can be made to fit {message.resources} by "
                                        f"preempting tasks below priority {message.priority}")
            return
        if plan.victims:
            why_text = (f"preempted for framework {framework.id}'s priority "
                        f"{message.priority} task needing {message.resources}")
            self._kill_victims(plan.victims, why_text, role=framework.info.roles[0],
                               beneficiaries={framework.id})
        if not framework.suppressed:
            self._revive(framework.id)  # its filters must not hide the room
        self._request_allocation()

    def _preempt_refusal(self, framework: MasterFramework, message: Preempt) -> str:
        if not self.config.preemption.enabled:
            return "preemption is off on this master (start it with --preemption)"
        if message.resources.is_empty():
            return "nothing to make room for: resources are empty"
        if PREEMPTION_CAPABILITY in framework.info.capabilities:
            return ""
        if any(self._shortfall(role) for role in framework.info.roles):
            return ""
        return (f"framework {framework.id} may not preempt: it lacks the "
                f"{PREEMPTION_CAPABILITY} capability and none of its roles is below its quota guarantee")

    def _guarantee_preemption(self) -> None:
        """After an allocation pass: reclaim what starved guarantees miss."""
        config = self.config.preemption
        if not (config.enabled and config.guarantees) or not self.quota:
            return
        self._settle()
        for role in sorted(self.quota):
            frameworks = [f for f in self.frameworks.values() if role in f.info.roles]
            if not any(f.peer is not None and not f.suppressed for f in frameworks):
                continue
            if any(f.offers for f in frameworks):
                continue  # it holds offers: it is not starved, it is choosing
            short = self._shortfall(role, count_free=True)
            if not short:
                continue
            victims = reclaim(short, config.guarantee_priority, self._candidates(),
                              self._protected_roles())
            if victims:
                self._kill_victims(victims, f"preempted to meet role {role}'s quota guarantee",
                                   role=role, beneficiaries={f.id for f in frameworks})
                for framework in frameworks:
                    if not framework.suppressed:  # its declines must not hide the room
                        self._revive(framework.id)

    def _revive(self, framework_id: str) -> None:
        """Drop a framework's filters, except the holds that keep room freed by
        preemption for someone else."""
        self.allocator.revive(framework_id)
        for agent_id, (until, beneficiaries) in list(self._holds.items()):
            if until <= self._now:
                del self._holds[agent_id]
            elif framework_id not in beneficiaries and agent_id in self.agents:
                self.allocator.add_filter(framework_id, agent_id, until)

    # ------------------------------------------------------------ helpers

    def _shortfall(self, role: str, count_free: bool = False) -> dict[str, int]:
        """What `role`'s guarantee still misses (kind -> milli), less what is being
        freed for it and, with `count_free`, less what is free for it now."""
        quota = self.quota.get(role)
        if quota is None or not quota.guarantee:
            return {}
        have = collections.Counter(self.allocator.role_allocation(role))
        for _, resources, for_role, _ in self.preempting.values():
            if for_role == role:
                have.update(resources.scalar_items())
        if count_free:
            for agent_id in self.agents:
                if agent_id not in self.drained:
                    have.update(self.allocator.free(agent_id).allocatable_for(role)
                                .scalar_items())
        return {kind: milli - have[kind] for kind, milli in quota.guarantee.items()
                if milli > have[kind]}

    def _free_for(self, framework: MasterFramework, agent_id: str) -> Resources:
        """Free resources on the agent a framework's role may use, and what victims
        already being killed there for it will free (room freed for another is not
        this framework's: a lower-priority asker must not be told it is free)."""
        free = self.allocator.free(agent_id).allocatable_for(framework.info.roles[0])
        for agent, resources, _, beneficiaries in self.preempting.values():
            if agent == agent_id and framework.id in beneficiaries:
                free = free + resources
        return free

    def _protected_roles(self) -> set[str]:
        """Roles at or below their quota guarantee: none of their tasks is preempted."""
        protected = set()
        for role, quota in self.quota.items():
            if quota.guarantee:
                have = self.allocator.role_allocation(role)
                if all(have.get(kind, 0) <= milli for kind, milli in quota.guarantee.items()):
                    protected.add(role)
        return protected

    def _candidates(self) -> list[Candidate]:
        out = []
        for framework in self.frameworks.values():
            for task in framework.tasks.values():
                if task.revocable or (framework.id, task.task_id) in self.preempting:
                    continue
                role = self.allocator.allocation_role(task.agent_id, framework.id)
                out.append(Candidate(
                    framework_id=framework.id, task_id=task.task_id, agent_id=task.agent_id,
                    role=role or framework.info.roles[0], priority=task.priority,
                    started=_started(task), resources=task.resources))
        return out

    def _settle(self) -> None:
        """Forget victims that have ended."""
        for key in [k for k in self.preempting
                    if k[0] not in self.frameworks or k[1] not in self.frameworks[k[0]].tasks]:
            del self.preempting[key]
        while self._preempted_at and self._preempted_at[0] <= self._now - MINUTE:
            self._preempted_at.popleft()
        for agent_id in [a for a, (until, _) in self._holds.items() if until <= self._now]:
            del self._holds[agent_id]

    def _kill_victims(self, victims: Iterable[Candidate], why: str, role: str,
                      beneficiaries: set[str]) -> None:
        config = self.config.preemption
        held: set[str] = set()
        for victim in victims:
            if len(self._preempted_at) >= config.max_per_minute:
                self.counters.inc("master/preemptions_rate_limited")
                break
            self._preempted_at.append(self._now)
            task = self.frameworks[victim.framework_id].tasks[victim.task_id]
            self.preempting[victim.key] = (victim.agent_id, victim.resources, role,
                                           frozenset(beneficiaries))
            self.counters.inc("master/preemptions")
            self._note(task, why)
            self.events.record(self._now, "task_preempted", framework_id=victim.framework_id,
                               task_id=victim.task_id, agent_id=victim.agent_id,
                               priority=victim.priority, reason=why)
            self._send(self.agents[victim.agent_id].peer, KillTask(
                framework_id=victim.framework_id, task_id=victim.task_id,
                kill_grace_period=task.kill_grace_period, reason=Reason.CONTAINER_PREEMPTED,
                message=why))
            held.add(victim.agent_id)
        if config.hold > 0:
            until = self._now + config.hold
            for agent_id in sorted(held):
                self._holds[agent_id] = (until, frozenset(beneficiaries))
                for framework_id in sorted(set(self.frameworks) - beneficiaries):
                    self.allocator.add_filter(framework_id, agent_id, until)


def _started(task: MasterTask) -> float:
    return task.statuses[0][1] if task.statuses else 0.0
