"""Who may do what in the master: every message and operator call is checked
here, in one place, before the core acts on it. Pure.

The principal of a message is the one ZAP gave its connection (`Received.principal`,
stamped by libzmq, never what the message claims); an operator call's is the
HTTP request's. None means security is off: with open ACLs (the default then)
everything passes unchanged.

Besides the ACLs (`dyad.authz`), ids are bound to principals:

- a framework belongs to the principal that subscribed it, recorded as its
  `FrameworkInfo.principal` (so agents keep it too, and it survives a master
  failover through their re-registration). A Subscribe naming another principal,
  or re-subscribing with the id of another principal's framework, is refused;
  so is any scheduler message about a framework that is not the sender's,
  except kill, acknowledge, reconcile and teardown where the ACLs allow them.
- an agent id belongs to the principal that registered it; re-registering with
  it as anyone else is refused. The registry keeps these owners
  (`RegistryData.agent_owners`), so a failover does not hand a known agent's id
  to the first principal that asks for it.

A refusal is a reason (a `str`); the core answers it `Rejected` (or a 403 reply),
counts it in ``master/auth_failures/forbidden`` and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from dyad.authz import Acls, Action, Permission
from dyad.messages import (
    Accept,
    Acknowledge,
    Acknowledgements,
    Decline,
    FrameworkToExecutor,
    Kill,
    Message,
    OperationType,
    Reconcile,
    RegisterAgent,
    RequestResources,
    Revive,
    SchedulerHeartbeat,
    Subscribe,
    Suppress,
    Teardown,
    Unsubscribe,
)
from master.books import MasterBooks
from master.model import Received
from master.operator import (
    DrainMachine,
    KillLiveTask,
    OperatorCall,
    SetQuota,
    SetWeights,
    TeardownFramework,
)

FORBIDDEN_COUNTER = "master/auth_failures/forbidden"

# An agent's hostname and ip end up in the URL the master calls to drain it:
# nothing that could change the URL's host or path gets through.
_HOST = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,253}$")

_OWNER_ACTIONS: dict[type, Action] = {
    Kill: Action.KILL_TASK, Acknowledge: Action.ACKNOWLEDGE,
    Acknowledgements: Action.ACKNOWLEDGE, Reconcile: Action.RECONCILE,
    Teardown: Action.TEARDOWN_FRAMEWORK,
}
_FRAMEWORK_MESSAGES = (Accept, Decline, Revive, Suppress, RequestResources, SchedulerHeartbeat,
                       Unsubscribe, FrameworkToExecutor, *_OWNER_ACTIONS)


class Authorizer:
    """The master's checks; `agent_owners` remembers who registered each agent."""

    def __init__(self, acls: Acls) -> None:
        self.acls = acls
        self.agent_owners: dict[str, str] = {}

    @property
    def open(self) -> bool:
        return self.acls.permissive and not self.acls.rules

    def owners_of(self, agent_ids: Iterable[str]) -> dict[str, str]:
        """The owners the registry keeps: those of the agents it still knows."""
        return {agent_id: self.agent_owners[agent_id] for agent_id in agent_ids
                if agent_id in self.agent_owners}

    def restore_owners(self, owners: Mapping[str, str]) -> None:
        """A new leader takes over the owners its predecessor recorded."""
        self.agent_owners.update(owners)

    # ------------------------------------------------------------- messages

    def admit(self, books: MasterBooks, event: Received) -> Message | str:
        """The message to act on (a Subscribe gets its principal filled in), or
        why it is refused."""
        message, principal = event.message, event.principal
        if isinstance(message, RegisterAgent):
            problem = _host_problem(message)
            if problem:
                return problem
        if principal is None and self.open:
            return message
        if isinstance(message, Subscribe):
            return self._subscribe(books, message, principal)
        if isinstance(message, RegisterAgent):
            return self._register_agent(books, message, principal)
        if isinstance(message, _FRAMEWORK_MESSAGES):
            return self._framework_message(books, message, principal)
        return message

    def admitted(self, books: MasterBooks, event: Received) -> None:
        """After the core acted on `event`: remember who registered an agent."""
        if isinstance(event.message, RegisterAgent) and event.principal is not None:
            agent_id = books.agent_by_peer.get(event.peer)
            if agent_id is not None:
                self.agent_owners.setdefault(agent_id, event.principal)

    def _subscribe(self, books: MasterBooks, message: Subscribe,
                   principal: str | None) -> Message | str:
        info = message.framework
        if principal is not None and info.principal and info.principal != principal:
            return (f"the framework says it is principal {info.principal!r}, but it "
                    f"authenticated as {principal!r}")
        decision = self.acls.authorize_all(principal, [
            Permission(Action.REGISTER_FRAMEWORK, role) for role in info.roles])
        if not decision:
            return decision.reason
        known = books.frameworks.get(info.id) if info.id is not None else None
        if known is not None and known.info.principal and known.info.principal != principal:
            return (f"framework {info.id} belongs to principal {known.info.principal!r}; "
                    "subscribe without an id to start a framework of your own")
        if principal is None or info.principal == principal:
            return message
        return attrs.evolve(message, framework=attrs.evolve(info, principal=principal))

    def _register_agent(self, books: MasterBooks, message: RegisterAgent,
                        principal: str | None) -> Message | str:
        agent_id = message.agent.id
        owner = self.agent_owners.get(agent_id) if agent_id is not None else None
        if owner is not None and owner != principal:
            return f"agent {agent_id} was registered by another principal"
        decision = self.acls.authorize(principal, Action.REGISTER_AGENT, message.agent.hostname)
        return message if decision else decision.reason

    def _framework_message(self, books: MasterBooks, message: Message,
                           principal: str | None) -> Message | str:
        framework = books.frameworks.get(message.framework_id)
        if framework is None:
            return message  # the core refuses unknown frameworks itself
        owner = framework.info.principal
        if owner and owner != principal:
            action = _OWNER_ACTIONS.get(type(message))
            if action is None:
                return f"framework {framework.id} belongs to another principal"
            decision = self.acls.authorize(principal, action, owner)
            if not decision:
                return decision.reason
        if isinstance(message, Accept):
            return self._launches(message, framework.info.user, principal)
        return message

    def _launches(self, message: Accept, framework_user: str,
                  principal: str | None) -> Message | str:
        commands = [task.command or (task.executor.command if task.executor else None)
                    for op in message.operations if op.type == OperationType.LAUNCH
                    for task in op.tasks]
        wanted = sorted({(command.user if command is not None else "") or framework_user
                         for command in commands})
        decision = self.acls.authorize_all(principal, [
            Permission(Action.RUN_TASK, user) for user in wanted])
        return message if decision else decision.reason

    # ------------------------------------------------------- operator calls

    def call_refusal(self, books: MasterBooks, call: OperatorCall) -> str | None:
        """Why the principal of `call` may not make it, or None."""
        if call.principal is None and self.open:
            return None
        decision = self.acls.authorize_all(call.principal, _permissions(books, call))
        return None if decision else decision.reason


def _host_problem(message: RegisterAgent) -> str:
    info = message.agent
    for what, value in (("hostname", info.hostname), ("ip", info.ip)):
        if value and not _HOST.match(value):
            return f"agent {what} {value[:80]!r} is not a host name or address"
    return ""


def _owner(books: MasterBooks, framework_id: str | None) -> str:
    framework = books.frameworks.get(framework_id) if framework_id is not None else None
    return framework.info.principal if framework is not None else ""


def _permissions(books: MasterBooks, call: OperatorCall) -> list[Permission]:
    match call.request:
        case SetWeights(weights=weights):
            return [Permission(Action.SET_WEIGHTS, role) for role in sorted(weights)]
        case SetQuota(quotas=quotas):
            return [Permission(Action.SET_QUOTA, role) for role in sorted(quotas)]
        case KillLiveTask(task_id=task_id, framework_id=framework_id):
            owners = sorted({_owner(books, fid) for fid, framework in books.frameworks.items()
                             if task_id in framework.tasks and framework_id in (None, fid)})
            return [Permission(Action.KILL_TASK, owner) for owner in owners or [""]]
        case DrainMachine(agent_id=agent_id):
            agent = books.agents.get(agent_id)
            return [Permission(Action.DRAIN_AGENT, agent.info.hostname if agent else "")]
        case TeardownFramework(framework_id=framework_id):
            return [Permission(Action.TEARDOWN_FRAMEWORK, _owner(books, framework_id))]
    return []
