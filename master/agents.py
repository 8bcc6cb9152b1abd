"""The agent half of the master core: registration and re-registration (taking
over what a returning agent runs), liveness pings, unreachable agents and the
removal rate limit, the re-registration window after a failover, and what
agents report (status updates, executor exits, usage, draining).

`AgentHandlers` extends `MasterBooks`; `MasterState` (master/state.py) adds the
framework half and the one way in, `handle`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from dyad.messages import (
    ACK_BATCH_CAPABILITY, LIVENESS_CAPABILITY, AgentInfo, AgentRegistered, CheckpointResources,
    DrainAgent, ExecutorExited, ExecutorToFramework, Failure, KillTask, Ping, Pong, Reason, RegisterAgent,
    ShutdownFramework, StatusUpdate, StatusUpdateAck, TaskState, Update, UsageReport,
)
from dyad.volumes import DynamicResources
from master import revocable
from master.allocator import Quota
from master.model import (
    EMPTY, Effect, FailoverTimeout, MasterAgent, PingDue, RemovalDue, ReregisterTimeout,
    UnreachableAgent,
)
from master.reregistration import ReregistrationPlan, plan_reregistration
from master.tasks import record_from_report, status_of, story_lines
from master.books import MasterBooks
from master.usage_rows import RecordUsage, usage_samples


class AgentHandlers(MasterBooks):
    """What the master does for and about agents (see the module docstring)."""

    # ====================================================== registration

    def _on_register_agent(self, peer: str, message: RegisterAgent) -> None:
        info = message.agent
        if not info.hostname:
            self._refuse(peer, message, "agent hostname is empty")
            return
        if info.id is None:
            self._register_new_agent(peer, message)
            return
        plan = plan_reregistration(self, message)
        if isinstance(plan, str):
            self._refuse(peer, message, plan)
            return
        agent = self.agents.get(info.id)
        if agent is not None and agent.info.resources != info.resources:
            self._refuse(peer, message,
                         f"agent {info.id} registered with {agent.total}, now reports "
                         f"{info.resources}; restart it without its id")
            return
        came_back = self.unreachable.pop(info.id, None) is not None
        if agent is None:
            agent = self._add_agent(peer, info, plan.dynamic)
        else:
            self._rebind_agent(agent, peer)
        agent.reregistered_time = self._now
        _take_capabilities(agent, message)
        self._drop_missing(agent, plan)
        self._adopt(agent, plan, kill_lost=came_back)
        self._send(peer, AgentRegistered(agent_id=agent.id, master_info=self.info,
                                         ping_interval=self.config.agent_ping_timeout))
        if plan.ignored_report:
            self.counters.inc("master/agent_dynamic_reports_ignored")
            self.events.record(self._now, "agent_dynamic_report_ignored", agent_id=agent.id,
                               reason=plan.ignored_report)
        if message.dynamic != agent.dynamic and (message.dynamic or agent.dynamic.version):
            self._send(peer, CheckpointResources(agent_id=agent.id, resources=agent.dynamic))
        self._request_allocation()

    def _register_new_agent(self, peer: str, message: RegisterAgent) -> None:
        known = self.agent_by_peer.get(peer)
        if known is None:
            if message.tasks or message.executors:
                self._refuse(peer, message, "a first registration cannot carry tasks or "
                                            "executors; re-register with the agent id")
                return
            known = self._add_agent(peer, attrs.evolve(message.agent, id=self._ids.next("S"))).id
            self._request_allocation()
        # else: a retry whose answer crossed it on the wire; answer again.
        _take_capabilities(self.agents[known], message)
        self._send(peer, AgentRegistered(agent_id=known, master_info=self.info,
                                         ping_interval=self.config.agent_ping_timeout))

    def _add_agent(self, peer: str, info: AgentInfo,
                   dynamic: DynamicResources | None = None) -> MasterAgent:
        agent = MasterAgent(info=info, peer=peer, registered_time=self._now,
                            dynamic=dynamic or DynamicResources())
        parked = self.parked_dynamic.pop(agent.id, None)
        # else the registry has it
        if self.recovering.pop(agent.id, None) != info or (parked or agent.dynamic) != agent.dynamic:
            self._persist()
        self._removals.forget(agent.id)
        self._drop_peer(peer)
        self.agents[agent.id] = agent
        self.agent_by_peer[peer] = agent.id
        self.allocator.add_agent(agent.id, agent.total)
        self._arm(PingDue(agent.id), self._now)
        self.events.record(self._now, "agent_registered", agent_id=agent.id,
                           hostname=info.hostname, url=info.url)
        return agent

    def _rebind_agent(self, agent: MasterAgent, peer: str) -> None:
        """A registered agent re-registers (it lost us, or restarted with its id)."""
        self.agent_by_peer.pop(agent.peer, None)
        self._drop_peer(peer)
        agent.peer = peer
        self.agent_by_peer[peer] = agent.id
        agent.awaiting_pong = False
        agent.missed_pongs = 0
        self._removals.forget(agent.id)
        for offer_id in sorted(agent.offers):  # the agent's view may have changed
            self._rescind(self.offers[offer_id], notify=True)

    def _drop_peer(self, peer: str) -> None:
        """A peer can be one agent only; a new registration from it replaces the old."""
        old = self.agent_by_peer.pop(peer, None)
        if old is not None and old in self.agents:
            self._agent_unreachable(self.agents[old])

    def _drop_missing(self, agent: MasterAgent, plan: ReregistrationPlan) -> None:
        """Staging tasks and executors the agent does not report never reached it
        (sent to the connection of a process that has since restarted): their
        frameworks hear they are lost (dropped if partition-aware) rather than wait
        for them forever, and the agent is told to kill each task in case it is
        still on its way there."""
        for framework_id, executor_id in plan.missing_executors:
            executor = agent.remove_executor(framework_id, executor_id)
            assert executor is not None  # the plan lists executors the master knows
            agent.used = agent.used - executor.resources
            self.allocator.release(agent.id, framework_id, executor.resources)
        for framework_id, task_id in plan.missing_tasks:
            framework = self.frameworks[framework_id]
            task = framework.tasks[task_id]
            state = (TaskState.TASK_DROPPED if framework.info.partition_aware
                     else TaskState.TASK_LOST)
            why = f"agent {agent.id} re-registered without it: it never reached the agent"
            self._note(task, why)
            self._end_task(framework, task, state, counted=True)
            self._master_update(framework, task_id, state, Reason.RECONCILIATION, why, agent.id,
                                task.executor_id)
            self._send(agent.peer, KillTask(framework_id=framework_id, task_id=task_id,
                                            kill_grace_period=task.kill_grace_period))

    def _adopt(self, agent: MasterAgent, plan: ReregistrationPlan, kill_lost: bool) -> None:
        """Take over what a re-registering agent runs. `kill_lost`: the agent comes
        back from unreachable, and non-partition-aware frameworks were told its tasks
        are lost (and may have replaced them), so those tasks are killed."""
        for framework_id in sorted(plan.orphaned):
            self._send(agent.peer, ShutdownFramework(framework_id=framework_id))
        for framework_id, info in plan.infos.items():
            if framework_id not in self.frameworks and framework_id not in self.completed_frameworks:
                framework = self._add_framework(info, active=False)
                framework.disconnected_time = self._now
                # Its driver needs 3 heartbeat intervals to notice that the master
                # changed and one more to subscribe here; a shorter failover timeout
                # (0 is the default) would kill its tasks before it could return.
                grace = max(info.failover_timeout, 4 * self.config.heartbeat_interval)
                self._arm(FailoverTimeout(framework_id), self._now + grace)
        for framework_id, executor in plan.executors:
            agent.add_executor(framework_id, executor)
            agent.used = agent.used + executor.resources
            self.allocator.update_used(agent.id, framework_id, executor.resources)
        for task in plan.tasks:
            framework = self.frameworks[task.framework_id]
            record = record_from_report(task, self.config.max_task_story, self._now)
            self._note(record, f"restored from agent {agent.id} re-registration")
            framework.unreachable_tasks.pop(task.task_id, None)
            framework.tasks[task.task_id] = record
            agent.tasks.add((framework.id, task.task_id))
            if task.revocable:
                agent.revocable_used = agent.revocable_used + task.resources
            else:
                agent.used = agent.used + task.resources
                self.allocator.update_used(agent.id, framework.id, task.resources)
            if kill_lost and not framework.info.partition_aware:
                self._note(record, "killed: it was reported lost while its agent was unreachable")
                self._send(agent.peer, KillTask(framework_id=framework.id, task_id=task.task_id,
                                                kill_grace_period=record.kill_grace_period))
            elif kill_lost:  # it was reported TASK_UNREACHABLE: give the real state back
                self._to_framework(framework, Update(status=status_of(record, self._now)))

    # ========================================================== liveness

    def _on_pong(self, peer: str, message: Pong) -> None:
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is not None and agent.awaiting_pong:
            self._answered(agent)

    def _ping_due(self, agent_id: str) -> None:
        """The agent's tick, every `agent_ping_timeout`. A tick that finds the last
        one unanswered counts a miss; `max_agent_ping_timeouts` in a row make the
        agent unreachable. An agent with LIVENESS_CAPABILITY that spoke to us since
        its last tick (answering it) and was sent something other than a ping (so
        it knows we are alive) is not pinged: the tick stands for a ping all the
        same, and the next tick counts a miss unless it says something meanwhile.
        So a silent agent is declared gone as many intervals after its last frame
        as with a ping every tick, and a busy one costs no pings."""
        agent = self.agents.get(agent_id)
        if agent is None:
            return
        heard, told = agent.heard, agent.told
        agent.heard = agent.told = False
        if agent.awaiting_pong:
            agent.missed_pongs += 1
            if (agent.missed_pongs >= self.config.max_agent_ping_timeouts
                    and self._removal_permitted(agent.id)):
                self._agent_unreachable(agent)
                return
            # else: waiting for a removal permit; a pong meanwhile cancels it
        agent.awaiting_pong = True
        if heard and told and agent.any_frame_liveness:
            self.counters.inc("master/agent_pings_skipped")
        else:
            self._send(agent.peer, Ping(agent_id=agent.id))
            agent.told = False  # a ping is not news that lets the next one go
        self._arm(PingDue(agent.id), self._now + self.config.agent_ping_timeout)

    def _agent_unreachable(self, agent: MasterAgent) -> None:
        """Stop counting on the agent: rescind its offers, report its tasks lost
        (unreachable for partition-aware frameworks), drop its resources."""
        for offer_id in sorted(agent.offers):
            self._rescind(self.offers[offer_id], notify=True)
        for framework_id, task_id in sorted(agent.tasks):
            framework = self.frameworks[framework_id]
            task = framework.tasks.pop(task_id)
            state = (TaskState.TASK_UNREACHABLE if framework.info.partition_aware
                     else TaskState.TASK_LOST)
            task.state = state
            task.statuses.append((state, self._now))
            self._note(task, f"agent {agent.id} unreachable")
            if state is TaskState.TASK_UNREACHABLE:
                framework.unreachable_tasks[task_id] = task
            else:
                self._complete(framework, task)
            self._master_update(framework, task_id, state, Reason.AGENT_UNREACHABLE,
                                f"agent {agent.id} is unreachable", agent.id, task.executor_id)
        self.allocator.remove_agent(agent.id)
        if agent.dynamic.version:
            self.parked_dynamic[agent.id] = agent.dynamic
        del self.agents[agent.id]
        if self.agent_by_peer.get(agent.peer) == agent.id:
            del self.agent_by_peer[agent.peer]
        self._cancel(PingDue(agent.id))
        self._mark_unreachable(agent.info)

    def _mark_unreachable(self, info: AgentInfo) -> None:
        """Remember an agent as unreachable (persisted) and tell every framework."""
        assert info.id is not None
        self._removals.forget(info.id)
        self.unreachable[info.id] = UnreachableAgent(info=info, since=self._now)
        self.events.record(self._now, "agent_unreachable", agent_id=info.id,
                           hostname=info.hostname)
        while len(self.unreachable) > self.config.max_unreachable_agents:
            self.unreachable.popitem(last=False)
        self._persist()
        for framework in self.frameworks.values():
            self._to_framework(framework, Failure(agent_id=info.id))

    # =========================================================== reports

    def _on_status_update(self, peer: str, message: StatusUpdate) -> None:
        agent = self._sending_agent(peer, message, message.status.agent_id or None)
        if agent is None:
            return
        self.counters.inc("master/status_updates")
        status = message.status
        if not status.agent_id:
            status = attrs.evolve(status, agent_id=agent.id)
        framework = self.frameworks.get(message.framework_id)
        if framework is None:
            if message.framework_id in self.completed_frameworks and status.uuid:
                # Nobody will ever acknowledge it; do so, or the agent retries forever.
                self._send(peer, StatusUpdateAck(agent_id=agent.id,
                                                 framework_id=message.framework_id,
                                                 task_id=status.task_id, uuid=status.uuid))
            else:
                self._refuse(peer, message, f"unknown framework {message.framework_id}")
            return
        task = framework.tasks.get(status.task_id)
        if task is not None:
            if task.agent_id != agent.id:
                self._refuse(peer, message,
                             f"task {task.task_id} runs on agent {task.agent_id}, not "
                             f"{agent.id}; story: {' | '.join(story_lines(task))}")
                return
            self.admission.started((framework.id, task.task_id), self._now)
            self._note(task, "%s from %s (%s)", status.state._name_, status.source or "agent",
                       status.uuid)
            task.healthy = status.healthy
            if status.executor_id:
                task.executor_id = status.executor_id
            if status.state.is_terminal:
                self._end_task(framework, task, status.state, status.timestamp)
            else:
                task.state = status.state
                task.statuses.append((status.state, status.timestamp or self._now))
            self._task_event(task, status.source or "agent", status.reason, status.message)
        # Forwarded even for tasks no longer live: a retried terminal update must
        # reach the framework again, or the agent never gets its acknowledgement.
        self._to_framework(framework, Update(status=status))

    def _on_executor_to_framework(self, peer: str, message: ExecutorToFramework) -> None:
        if self._sending_agent(peer, message, message.agent_id) is None:
            return
        framework = self.frameworks.get(message.framework_id)
        if framework is None:
            self._refuse(peer, message, f"unknown framework {message.framework_id}")
            return
        self._to_framework(framework, message)  # best effort, like Mesos

    def _on_usage_report(self, peer: str, message: UsageReport) -> None:
        """Record what each executor uses on its tasks (`/state` shows it beside what
        they were given) and which URIs the agent's fetcher cache holds."""
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is None:
            return
        self.cached_uris[agent.id] = sorted(set(message.cached_uris))
        if self.config.record_usage:  # before task.usage is replaced: deltas need it
            self._record_samples(agent, message)
        self._lent(agent, message)
        for usage in message.executors:
            framework = self.frameworks.get(usage.framework_id)
            for task_id in usage.task_ids:
                task = framework.tasks.get(task_id) if framework else None
                if task is not None and task.agent_id == agent.id:
                    task.usage = {
                        "executor_id": usage.executor_id, "tasks_sharing": len(usage.task_ids),
                        "timestamp": usage.timestamp, "cpus_used": usage.cpus_used,
                        "cpus_limit": usage.cpus_limit,
                        "mem_rss_mb": round(usage.mem_rss_bytes / 2 ** 20, 1),
                        "mem_limit_mb": round(usage.mem_limit_bytes / 2 ** 20, 1),
                        "cpus_throttled_time_secs": usage.cpus_throttled_time_secs}

    def _record_samples(self, agent: MasterAgent, message: UsageReport) -> None:
        rows = usage_samples(message, agent, self.frameworks, self._role_of, self._now)
        self.counters.inc("master/usage_samples", len(rows.samples))
        self.counters.inc("master/usage_samples_unmatched", rows.unmatched)
        self.counters.inc("master/usage_samples_rejected", rows.rejected)
        if rows.samples:
            self._out.append(RecordUsage(samples=rows.samples))
    def _lent(self, agent: MasterAgent, message: UsageReport) -> None:
        """Take in what the agent can lend now (master/revocable.py): rescind the
        revocable offers it no longer covers, offer more if it grew."""
        agent.reservation = message.reservation
        lent = (revocable.lendable(message.revocable, agent.total)
                if self.config.oversubscription else EMPTY)
        if lent == agent.revocable:
            return
        grew = not lent <= agent.revocable
        agent.revocable = lent
        if lent:
            self.lending.add(agent.id)
        if revocable.overcommitted(agent):
            for offer_id in sorted(agent.offers):
                if self.offers[offer_id].revocable:
                    self._rescind(self.offers[offer_id], notify=True)
        if grew:
            self._request_allocation()

    def _on_drain_agent(self, peer: str, message: DrainAgent) -> None:
        """The agent is draining (its tasks are being killed): offer nothing more."""
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is None or agent.id in self.drained:
            return
        self.drained.add(agent.id)
        self.counters.inc("master/agents_drained")
        for offer_id in sorted(agent.offers):
            self._rescind(self.offers[offer_id], notify=True)

    def _on_executor_exited(self, peer: str, message: ExecutorExited) -> None:
        agent = self._sending_agent(peer, message, message.agent_id)
        if agent is None:
            return
        executor = agent.remove_executor(message.framework_id, message.executor_id)
        if executor is not None:
            agent.used = agent.used - executor.resources
            self.allocator.release(agent.id, message.framework_id, executor.resources)
            self._request_allocation()
        framework = self.frameworks.get(message.framework_id)
        if framework is not None:
            self._to_framework(framework, Failure(agent_id=agent.id,
                                                  executor_id=message.executor_id,
                                                  status=message.status))

    # ================================================ registry, recovery

    def restore(self, agents: Iterable[AgentInfo], unreachable: Iterable[UnreachableAgent],
                weights: Mapping[str, float], quotas: Mapping[str, Quota],
                now: float, dynamic: Mapping[str, DynamicResources] | None = None) -> list[Effect]:
        """Call once, before any event, with what the registry held. Admitted agents
        become *recovering*: none of their resources are offered until they
        re-register (with their tasks), and those still away after
        `agent_reregister_timeout` are marked unreachable; their reservations and
        volumes (`dynamic`) wait for them. Raises `PolicyError` if the weights or
        quota are invalid."""
        self._now = now
        self._out = []
        self.parked_dynamic.update(dynamic or {})
        self._apply_weights(weights)
        self._apply_quota(quotas)
        for entry in unreachable:
            if entry.info.id is not None:
                self.unreachable[entry.info.id] = entry
        for info in agents:
            if info.id is not None and info.id not in self.unreachable:
                self.recovering[info.id] = info
        if self.recovering:
            self._arm(ReregisterTimeout(), now + self.config.agent_reregister_timeout)
        self._usage_out()
        out, self._out = self._out, []
        return out

    def _recovery_timed_out(self) -> None:
        for agent_id in sorted(self.recovering):
            if self._removal_permitted(agent_id):
                self._recovered_unreachable(agent_id)

    def _recovered_unreachable(self, agent_id: str) -> None:
        """A registry agent did not re-register in time. Its tasks were never
        learned; frameworks find out through `agent_lost` and reconciliation."""
        info = self.recovering.pop(agent_id)
        self.counters.inc("master/recovery_agents_unreachable")
        self._mark_unreachable(info)

    def _removal_permitted(self, agent_id: str) -> bool:
        """May `agent_id` be marked unreachable now? If not, it waits for a permit
        of the rate limit (master/removals.py), and `RemovalDue` brings it back."""
        decision = self._removals.ask(agent_id, self._now)
        if decision.queued:
            self.counters.inc("master/agent_removals_deferred")
        if decision.wake_at is not None:
            self._arm(RemovalDue(), decision.wake_at)
        return decision.remove

    def _removal_due(self) -> None:
        """Spend one permit on the oldest queued agent that is still failing."""
        def still_failing(agent_id: str) -> bool:
            agent = self.agents.get(agent_id)
            return agent_id in self.recovering or (
                agent is not None and agent.missed_pongs >= self.config.max_agent_ping_timeouts)

        chosen, wake_at = self._removals.due(self._now, still_failing)
        if chosen in self.agents:
            self._agent_unreachable(self.agents[chosen])
        elif chosen is not None:
            self._recovered_unreachable(chosen)
        if wake_at is not None:
            self._arm(RemovalDue(), wake_at)


def _take_capabilities(agent: MasterAgent, message: RegisterAgent) -> None:
    """What the agent said it takes, as each (re-)registration says it afresh."""
    agent.any_frame_liveness = LIVENESS_CAPABILITY in message.capabilities
    agent.ack_batches = ACK_BATCH_CAPABILITY in message.capabilities
