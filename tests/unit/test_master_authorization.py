"""`master.authorization` through the master core: the principal a frame came
with decides, ids stay with the principal that registered them, and a refusal
is a counted `Rejected` (or a FORBIDDEN reply) that changes nothing."""

from __future__ import annotations

import attrs

from dyad.authz import parse_acls
from dyad.messages import (
    AgentInfo,
    AgentRegistered,
    FrameworkInfo,
    Message,
    Offers,
    RegisterAgent,
    Rejected,
    Subscribe,
    Subscribed,
)
from dyad.resources import Resources
from master import registry
from master.model import MasterConfig, Received
from master.operator import FORBIDDEN, OperatorCall, SetWeights, TeardownFramework
from master.restore import restore
from tests.unit.test_master_state import AGENT_RES, CMD, Harness, launch, messages, task

ACLS = parse_acls({"rules": [
    {"effect": "allow", "principals": ["agent"], "actions": ["register_agent"]},
    {"effect": "allow", "principals": ["alice", "bob"], "actions": ["register_framework"]},
    {"effect": "allow", "principals": ["alice", "bob"], "actions": ["run_task"],
     "objects": ["nobody"]},
    {"effect": "allow", "principals": ["ops"], "actions": ["*"]},
]})


def secured() -> Harness:
    return Harness(MasterConfig(acls=ACLS))


def send(h: Harness, peer: str, principal: str | None, message: Message) -> list:
    return h.handle(Received(peer, message, principal))


def subscribe(h: Harness, peer: str, who: str, **info: object) -> list:
    return send(h, peer, who, Subscribe(framework=FrameworkInfo(name="fw", **info)))


def agent(h: Harness, peer: str, principal: str, agent_id: str | None = None,
          hostname: str = "h1") -> list:
    return send(h, peer, principal, RegisterAgent(agent=AgentInfo(
        hostname=hostname, port=5051, resources=Resources.parse(AGENT_RES), id=agent_id)))


def rejected(sends: list) -> str:
    (refusal,) = messages(sends, Rejected)
    return refusal.reason


def test_without_security_everything_passes_unchanged() -> None:
    h = Harness()
    (subscribed,) = messages(h.recv("d1", Subscribe(framework=FrameworkInfo(name="fw"))),
                             Subscribed)
    assert h.state.frameworks[subscribed.framework_id].info.principal == ""


def test_a_framework_is_stamped_with_its_principal_and_keeps_it() -> None:
    h = secured()
    (subscribed,) = messages(subscribe(h, "d1", "alice"), Subscribed)
    fid = subscribed.framework_id
    assert h.state.frameworks[fid].info.principal == "alice"
    before = h.metric("master/auth_failures/forbidden")
    assert "belongs to principal 'alice'" in rejected(subscribe(h, "d2", "bob", id=fid))
    assert "authenticated as 'bob'" in rejected(subscribe(h, "d3", "bob", principal="alice"))
    assert h.metric("master/auth_failures/forbidden") == before + 2
    assert h.state.frameworks[fid].peer == "d1"  # nothing changed hands
    assert messages(subscribe(h, "d4", "alice", id=fid), Subscribed)  # its owner may


def test_roles_and_users_need_their_permissions() -> None:
    h = secured()
    assert "no rule lets mallory register_framework" in rejected(subscribe(h, "d1", "mallory"))
    messages(agent(h, "a1", "agent"), AgentRegistered)
    (subscribed,) = messages(subscribe(h, "d2", "alice", user="root"), Subscribed)
    offers = [o for s in h.allocate() for o in getattr(s.message, "offers", [])
              if isinstance(s.message, Offers)]
    accept = launch(subscribed.framework_id, offers, task("t1", offers[0].agent_id))
    assert "run_task 'root'" in rejected(send(h, "d2", "alice", accept))
    assert not h.state.frameworks[subscribed.framework_id].tasks
    as_nobody = launch(subscribed.framework_id, offers,
                       task("t2", offers[0].agent_id, command=attrs.evolve(CMD, user="nobody")))
    assert not messages(send(h, "d2", "alice", as_nobody), Rejected)
    assert "t2" in h.state.frameworks[subscribed.framework_id].tasks


def test_an_agent_id_stays_with_the_principal_that_registered_it() -> None:
    h = secured()
    (registered,) = messages(agent(h, "a1", "agent"), AgentRegistered)
    assert "registered by another principal" in rejected(
        agent(h, "a2", "ops", agent_id=registered.agent_id))
    assert h.state.agents[registered.agent_id].peer == "a1"
    assert "no rule lets alice register_agent 'h2'" in rejected(agent(h, "a3", "alice",
                                                                      hostname="h2"))


def test_an_agent_ids_owner_survives_a_failover_through_the_registry() -> None:
    old = secured()
    (registered,) = messages(agent(old, "a1", "agent"), AgentRegistered)
    kept = registry.decode(registry.encode(registry.snapshot_of(old.state)))
    assert kept.agent_owners == {registered.agent_id: "agent"}
    new = secured()
    restore(new.state, kept, new.clock.now())
    assert "registered by another principal" in rejected(
        agent(new, "a2", "ops", agent_id=registered.agent_id))
    assert registered.agent_id not in new.state.agents  # still recovering, still its own
    assert messages(agent(new, "a1", "agent", agent_id=registered.agent_id), AgentRegistered)


def test_an_agent_hostname_cannot_steer_the_masters_requests() -> None:
    h = Harness()
    sends = h.recv("a1", RegisterAgent(agent=AgentInfo(
        hostname="evil.example/metadata?", port=80, resources=Resources.parse(AGENT_RES))))
    assert "is not a host name" in rejected(sends)
    assert not h.state.agents


def test_operator_calls_are_authorized_by_their_principal() -> None:
    h = secured()
    (subscribed,) = messages(subscribe(h, "d1", "alice"), Subscribed)
    for principal in ("bob", None):
        h._calls += 1
        h.handle(OperatorCall(h._calls, TeardownFramework(subscribed.framework_id), principal))
        (reply,) = [r for r in h.replies if r.call_id == h._calls]
        assert reply.refusal == FORBIDDEN and "teardown_framework 'alice'" in reply.error
    assert subscribed.framework_id in h.state.frameworks
    h._calls += 1
    h.handle(OperatorCall(h._calls, SetWeights({"eng": 2.0}), "ops"))
    assert h.replies[-1].ok and h.state.weights == {"eng": 2.0}
