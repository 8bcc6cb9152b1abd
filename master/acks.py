"""A framework's acknowledgements, one (`Acknowledge`) or many (`Acknowledgements`)
at a time, on their way to the agents whose updates they acknowledge.

The master keeps no record of what was acknowledged: an ack is checked (the
framework owns the connection, the uuid is not empty, the agent is registered),
noted in the task's story and forwarded. Whether it acknowledges the head of the
agent's stream is the agent's business (agent/status_updates.py), so an
`Acknowledgements` does to each agent exactly what the same `Acknowledge`s one by
one would do, in the same order per agent. Those of one message for one agent
with `ACK_BATCH_CAPABILITY` go in one `StatusUpdateAcks` (issue 19: two
acknowledgements a task were four of the master's ~12 messages a task).
"""

from __future__ import annotations

from dyad.messages import (
    ACK_BATCH_CAPABILITY, AgentAck, Acknowledge, Acknowledgements, MasterCapabilities,
    StatusUpdateAck, StatusUpdateAcks)
from master.books import MasterBooks
from master.model import MasterFramework

MAX_PROBLEMS_NAMED = 3
"""A refusal of some acks of an `Acknowledgements` names at most this many."""


class AckHandlers(MasterBooks):
    """The master's acknowledgement handlers (a part of `MasterState`)."""

    def _on_acknowledge(self, peer: str, message: Acknowledge) -> None:
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        problem = self._ack_problem(framework, message.agent_id, message.task_id, message.uuid)
        if problem:
            self._refuse(peer, message, problem)
            return
        agent = self.agents[message.agent_id]
        self._send(agent.peer, StatusUpdateAck(agent_id=agent.id, framework_id=framework.id,
                                               task_id=message.task_id, uuid=message.uuid))

    def _on_acknowledgements(self, peer: str, message: Acknowledgements) -> None:
        """Each ack as an `Acknowledge` alone would be handled; those refused are
        refused together, in one `Rejected` (counted once) naming the first few."""
        framework = self._owned_framework(peer, message)
        if framework is None:
            return
        if not message.acks:
            self._refuse(peer, message, "nothing to acknowledge: acks is empty")
            return
        problems: list[str] = []
        by_agent: dict[str, list[AgentAck]] = {}
        for index, ack in enumerate(message.acks):
            problem = self._ack_problem(framework, ack.agent_id, ack.task_id, ack.uuid)
            if problem:
                problems.append(f"acks[{index}]: {problem}")
            else:
                by_agent.setdefault(ack.agent_id, []).append(AgentAck(
                    framework_id=framework.id, task_id=ack.task_id, uuid=ack.uuid))
        for agent_id, acks in by_agent.items():
            agent = self.agents[agent_id]
            if agent.ack_batches and len(acks) > 1:
                self._send(agent.peer, StatusUpdateAcks(agent_id=agent.id, acks=acks))
            else:
                for ack in acks:
                    self._send(agent.peer, StatusUpdateAck(
                        agent_id=agent.id, framework_id=ack.framework_id,
                        task_id=ack.task_id, uuid=ack.uuid))
        if problems:
            more = len(problems) - MAX_PROBLEMS_NAMED
            self._refuse(peer, message,
                         f"{len(problems)} of {len(message.acks)} acks refused: "
                         + "; ".join(problems[:MAX_PROBLEMS_NAMED])
                         + (f"; and {more} more" if more > 0 else ""))

    def _ack_problem(self, framework: MasterFramework, agent_id: str, task_id: str,
                     uuid: str) -> str:
        """Why an ack cannot be forwarded ('' if it can: then it is noted)."""
        if not uuid:
            return "nothing to acknowledge: the uuid is empty"
        if agent_id not in self.agents:
            return f"agent {agent_id} is not registered"
        task = framework.tasks.get(task_id) or framework.completed.get(task_id)
        if task is not None:
            self._note(task, f"acknowledged {uuid}")
        return ""

    def _offer_capabilities(self, framework: MasterFramework, peer: str) -> None:
        """Before `Subscribed`: which of the framework's capabilities this master
        honours beyond the first protocol (said only to those that ask)."""
        if ACK_BATCH_CAPABILITY in framework.info.capabilities:
            self._send(peer, MasterCapabilities(master_id=self.info.id,
                                                capabilities=[ACK_BATCH_CAPABILITY]))
