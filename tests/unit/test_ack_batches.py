"""Acknowledgements carried together (`ACKNOWLEDGEMENT_BATCHES`, issue 19): a
driver's run of acks as one `Acknowledgements`, the master's acks for one agent
as one `StatusUpdateAcks`, and neither to a peer that did not say it takes them.

The central property: however acks are grouped, every agent is told exactly what
the same acks one by one would have told it, in the same order, so its update
streams end in the same state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.status_updates import SendMaster, StatusUpdateManager
from dyad.authz import parse_acls
from dyad.effects import Send
from dyad.messages import (
    ACK_BATCH_CAPABILITY, AckedUpdate, Acknowledge, Acknowledgements, AgentAck, AgentInfo,
    FrameworkInfo, Heartbeat, MasterCapabilities, Message, RegisterAgent, Rejected, StatusUpdate,
    StatusUpdateAck, StatusUpdateAcks, Subscribe, Subscribed, TaskState, TaskStatus, decode,
    encode)
from dyad.resources import Resources
from frameworks.outbox import Outbox, merged_acks
from frameworks.scheduler import Scheduler, SchedulerDriver
from master.model import MasterConfig, Received
from master.tasks import story_lines
from tests.unit.test_agent_state import Agent, executor_task, running_executor
from tests.unit.test_agent_state import status as executor_status
from tests.unit.test_agent_state import to_master
from tests.unit.test_master_state import AGENT_RES, INFO, Harness, launch, messages, task


# ----------------------------------------------------------------- the master

def cluster(capable: list[bool]) -> tuple[Harness, str, list[str]]:
    """A framework on peer 'f1' and one agent per entry (peer 'a<i>'), those
    marked True registered with ACK_BATCH_CAPABILITY, each running task 't<i>'."""
    h = Harness()
    fid = h.subscribe("f1")
    agents = []
    for i, batches in enumerate(capable):
        sends = h.recv(f"a{i}", RegisterAgent(
            agent=AgentInfo(hostname=f"h{i}", port=5051, resources=Resources.parse(AGENT_RES)),
            capabilities=[ACK_BATCH_CAPABILITY] if batches else []))
        agents.append(sends[-1].message.agent_id)
    for offer in h.offers_to(h.allocate(), "f1"):
        i = agents.index(offer.agent_id)
        h.recv("f1", launch(fid, [offer], task(f"t{i}", offer.agent_id)))
    return h, fid, agents


def told(sends: list[Send]) -> dict[str, list[StatusUpdateAck]]:
    """What each agent peer was told, acks in `StatusUpdateAcks` taken one by one."""
    out: dict[str, list[StatusUpdateAck]] = {}
    for send in sends:
        if isinstance(send.message, StatusUpdateAcks):
            out.setdefault(send.to, []).extend(send.message.each())
        elif isinstance(send.message, StatusUpdateAck):
            out.setdefault(send.to, []).append(send.message)
    return out


def test_acks_for_an_agent_that_takes_them_together_go_together() -> None:
    h, fid, (a0, a1) = cluster([True, False])
    acks = [AckedUpdate(agent_id=a0, task_id="t0", uuid="u1"),
            AckedUpdate(agent_id=a1, task_id="t1", uuid="u2"),
            AckedUpdate(agent_id=a0, task_id="t0", uuid="u3"),
            AckedUpdate(agent_id=a1, task_id="t1", uuid="u4")]
    sends = h.recv("f1", Acknowledgements(framework_id=fid, acks=acks))
    assert messages(sends, StatusUpdateAcks, to="a0") == [StatusUpdateAcks(agent_id=a0, acks=[
        AgentAck(framework_id=fid, task_id="t0", uuid="u1"),
        AgentAck(framework_id=fid, task_id="t0", uuid="u3")])]
    # An agent that did not say it takes them is told one by one, in order.
    assert messages(sends, StatusUpdateAck, to="a1") == [
        StatusUpdateAck(agent_id=a1, framework_id=fid, task_id="t1", uuid="u2"),
        StatusUpdateAck(agent_id=a1, framework_id=fid, task_id="t1", uuid="u4")]
    assert not messages(sends, Rejected)
    assert any("acknowledged u3" in line
               for line in story_lines(h.state.frameworks[fid].tasks["t0"]))


def test_a_lone_ack_goes_as_itself_even_to_an_agent_that_takes_them_together() -> None:
    h, fid, (a0,) = cluster([True])
    sends = h.recv("f1", Acknowledgements(framework_id=fid, acks=[
        AckedUpdate(agent_id=a0, task_id="t0", uuid="u1")]))
    assert [s.message for s in sends] == [
        StatusUpdateAck(agent_id=a0, framework_id=fid, task_id="t0", uuid="u1")]


def test_bad_acks_are_refused_together_and_the_good_ones_still_go() -> None:
    h, fid, (a0,) = cluster([True])
    invalid = h.metric("master/messages_invalid")
    sends = h.recv("f1", Acknowledgements(framework_id=fid, acks=[
        AckedUpdate(agent_id=a0, task_id="t0", uuid=""),
        AckedUpdate(agent_id=a0, task_id="t0", uuid="u1"),
        *[AckedUpdate(agent_id="nobody", task_id="t0", uuid=f"x{n}") for n in range(4)]]))
    assert told(sends) == {"a0": [StatusUpdateAck(agent_id=a0, framework_id=fid,
                                                  task_id="t0", uuid="u1")]}
    (rejected,) = messages(sends, Rejected, to="f1")
    assert rejected.reason.startswith("5 of 6 acks refused: acks[0]: nothing to acknowledge")
    assert "acks[2]: agent nobody is not registered" in rejected.reason
    assert rejected.reason.endswith("; and 2 more")
    assert rejected.message_type == "acknowledgements"
    assert h.metric("master/messages_invalid") == invalid + 1  # one message, refused once


def test_an_empty_or_foreign_acknowledgements_is_refused() -> None:
    h, fid, _ = cluster([True])
    (rejected,) = messages(h.recv("f1", Acknowledgements(framework_id=fid, acks=[])), Rejected)
    assert "acks is empty" in rejected.reason
    sends = h.recv("f2", Acknowledgements(framework_id=fid, acks=[
        AckedUpdate(agent_id="a", task_id="t", uuid="u")]))
    assert [type(s.message) for s in sends] == [Rejected]


def test_the_master_says_it_takes_acknowledgements_only_to_those_that_ask() -> None:
    h = Harness()
    sends = h.recv("f1", Subscribe(framework=FrameworkInfo(
        name="new", capabilities=[ACK_BATCH_CAPABILITY])))
    assert [type(s.message) for s in sends if s.to == "f1"][:2] == [MasterCapabilities, Subscribed]
    assert sends[0].message == MasterCapabilities(master_id="m",
                                                  capabilities=[ACK_BATCH_CAPABILITY])
    sends = h.recv("f2", Subscribe(framework=FrameworkInfo(name="old")))
    assert not messages(sends, MasterCapabilities)


acks_strategy = st.lists(st.tuples(
    st.integers(0, 3),                  # agent index (3: one never registered)
    st.integers(0, 2),                  # task index
    st.sampled_from(["u1", "u2", "u3", ""])), max_size=30)


@settings(max_examples=150, deadline=None)
@given(capable=st.lists(st.booleans(), min_size=3, max_size=3), acks=acks_strategy,
       cuts=st.lists(st.integers(1, 30), max_size=10))
def test_acks_together_tell_every_agent_what_acks_alone_would(
        capable: list[bool], acks: list[tuple[int, int, str]], cuts: list[int]) -> None:
    single, fid, agents = cluster(capable)
    together, _, _ = cluster(capable)
    names = [*agents, "never-registered"]
    wanted = [AckedUpdate(agent_id=names[a], task_id=f"t{t}", uuid=u) for a, t, u in acks]
    alone: list[Send] = []
    for ack in wanted:
        alone += single.recv("f1", Acknowledge(framework_id=fid, agent_id=ack.agent_id,
                                               task_id=ack.task_id, uuid=ack.uuid))
    grouped: list[Send] = []
    start = 0
    for cut in [*cuts, len(wanted)]:  # the same acks, in messages of any sizes
        chunk = wanted[start:start + cut]
        start += len(chunk)
        if chunk:
            grouped += together.recv("f1", Acknowledgements(framework_id=fid, acks=chunk))
    assert start == len(wanted)
    assert told(grouped) == told(alone)
    for i, batches in enumerate(capable):
        if not batches:  # an agent that did not ask never sees the new message
            assert not [s for s in grouped if s.to == f"a{i}"
                        and isinstance(s.message, StatusUpdateAcks)]
    stories = [{t: list(r.story) for t, r in h.state.frameworks[fid].tasks.items()}
               for h in (single, together)]
    assert stories[0] == stories[1]
    # Refused or not: a message with a bad ack is answered by one refusal.
    assert bool(messages(grouped, Rejected)) == bool(messages(alone, Rejected))

    # And the agents' streams end where they would have.
    def streams(sends: list[Send]) -> list[tuple[list[str], int, int]]:
        out = []
        for i in range(len(agents)):
            manager = StatusUpdateManager(seed=i)
            manager.resume(0.0)
            for t in range(3):
                for n, state in ((1, TaskState.TASK_RUNNING), (2, TaskState.TASK_RUNNING),
                                 (3, TaskState.TASK_FINISHED)):
                    manager.add(StatusUpdate(framework_id=fid, status=TaskStatus(
                        task_id=f"t{t}", state=state, uuid=f"u{n}")), 0.0)
            for ack in told(sends).get(f"a{i}", []):
                manager.acknowledge(ack.framework_id, ack.task_id, ack.uuid, 1.0)
            out.append(([u.status.uuid for u in manager.all_queued()], manager.acked,
                        manager.stale_acks))
        return out

    assert streams(grouped) == streams(alone)


# ----------------------------------------------------------------- the driver

def ack(n: int, framework_id: str = "F") -> Acknowledge:
    return Acknowledge(framework_id=framework_id, agent_id="A", task_id=f"t{n}", uuid=f"u{n}")


def test_a_run_of_acks_is_one_message_and_everything_else_keeps_its_place() -> None:
    beat = Heartbeat()
    units = merged_acks([ack(1), ack(2), beat, ack(3), ack(4, "G"), ack(5, "G"), ack(6)])
    assert [(type(m), n) for m, n in units] == [
        (Acknowledgements, 2), (Heartbeat, 1), (Acknowledge, 1), (Acknowledgements, 2),
        (Acknowledge, 1)]
    assert units[3][0] == Acknowledgements(framework_id="G", acks=[
        AckedUpdate(agent_id="A", task_id="t4", uuid="u4"),
        AckedUpdate(agent_id="A", task_id="t5", uuid="u5")])


def expand(message: Message) -> list[Message]:
    return message.each() if isinstance(message, Acknowledgements) else [message]  # type: ignore[return-value]


@given(st.lists(st.one_of(st.integers(0, 5).map(ack), st.integers(0, 5).map(
    lambda n: ack(n, "G")), st.just(Heartbeat())), max_size=40))
def test_merging_changes_envelopes_only(queued: list[Message]) -> None:
    units = merged_acks(queued)
    assert [m for unit, _ in units for m in expand(unit)] == queued
    assert sum(n for _, n in units) == len(queued)
    for (first, _), (second, _) in zip(units, units[1:]):  # no run left unmerged
        assert not (isinstance(first, Acknowledge | Acknowledgements)
                    and isinstance(second, Acknowledge | Acknowledgements)
                    and first.framework_id == second.framework_id)


def test_the_outbox_merges_only_for_a_master_that_takes_them() -> None:
    outbox = Outbox()
    for n in range(3):
        outbox.put(ack(n))
    frame, carried, held = outbox.next_frame(512, batch=True)
    assert (carried, held) == (3, 3) and decode(frame).messages == [ack(0), ack(1), ack(2)]
    outbox.merge_acks = True
    frame, carried, held = outbox.next_frame(512, batch=True)
    assert (carried, held) == (3, 1) and decode(frame).each() == [ack(0), ack(1), ack(2)]
    # Without batch frames a run still goes as one message, and the rest waits.
    outbox.put(Heartbeat())
    frame, carried, held = outbox.next_frame(512, batch=False)
    assert (carried, held) == (3, 1) and isinstance(decode(frame), Acknowledgements)
    assert outbox.framed == {"acknowledge": 3, "acknowledgements": 2}


# ------------------------------------------------------------------ the agent

def test_an_agent_takes_acks_together_as_if_each_had_come_alone() -> None:
    outcomes = []
    for together in (False, True):
        agent = Agent()
        agent.register()
        running_executor(agent, executor_task("t1"))
        agent.run(executor_task("t2"))  # to the same executor, registered by now
        ups = [executor_status(t, state, f"{t}-{n}") for t in ("t1", "t2")
               for n, state in ((1, TaskState.TASK_RUNNING), (2, TaskState.TASK_FINISHED))]
        for update in ups:
            agent.executor(update)
        heads = [ups[0], ups[2]]
        acks = [StatusUpdateAck(agent_id="A1", framework_id="F1", task_id=u.status.task_id,
                                uuid=u.status.uuid) for u in heads]
        if together:
            effects = agent.master(StatusUpdateAcks(agent_id="A1", acks=[
                AgentAck(framework_id=a.framework_id, task_id=a.task_id, uuid=a.uuid)
                for a in acks]))
        else:
            effects = [e for a in acks for e in agent.master(a)]
        outcomes.append(([m.status.uuid for m in to_master(effects, StatusUpdate)],
                         agent.state.metrics()["agent/status_updates_acked"]))
    assert outcomes[0] == outcomes[1] == (["t1-2", "t2-2"], 2)


def test_the_agent_says_it_takes_acks_together() -> None:
    agent = Agent()
    (register,) = [e.message for e in agent.register() if isinstance(e, SendMaster)
                   and isinstance(e.message, RegisterAgent)]
    assert ACK_BATCH_CAPABILITY in register.capabilities


def test_the_new_messages_round_trip() -> None:
    for message in (
            Acknowledgements(framework_id="F", acks=[AckedUpdate(agent_id="A", task_id="t",
                                                                 uuid="u")]),
            StatusUpdateAcks(agent_id="A", acks=[AgentAck(framework_id="F", task_id="t",
                                                          uuid="u")]),
            MasterCapabilities(master_id="m", capabilities=[ACK_BATCH_CAPABILITY])):
        assert decode(encode(message)) == message


def test_acknowledgements_are_authorized_as_acknowledge() -> None:
    acls = parse_acls({"rules": [
        {"effect": "allow", "principals": ["alice", "bob"], "actions": ["register_framework"]},
        {"effect": "allow", "principals": ["ops"], "actions": ["*"]}]})
    h = Harness(MasterConfig(acls=acls))
    sends = h.handle(Received("d1", Subscribe(framework=FrameworkInfo(name="fw")), "alice"))
    (subscribed,) = messages(sends, Subscribed)
    fid = subscribed.framework_id
    acks = Acknowledgements(framework_id=fid, acks=[
        AckedUpdate(agent_id="nobody", task_id="t", uuid="u")])
    before = h.metric("master/auth_failures/forbidden")
    (refused,) = messages(h.handle(Received("d1", acks, "bob")), Rejected)
    assert "acknowledge" in refused.reason.lower()
    assert h.metric("master/auth_failures/forbidden") == before + 1
    # One allowed to acknowledge for alice gets as far as the ack itself.
    (refused,) = messages(h.handle(Received("d1", acks, "ops")), Rejected)
    assert "agent nobody is not registered" in refused.reason


def test_the_driver_merges_only_after_its_own_master_says_so() -> None:
    driver = SchedulerDriver(Scheduler(), FrameworkInfo(name="fw"), master="127.0.0.1:5050")
    assert ACK_BATCH_CAPABILITY in driver._core.framework.capabilities
    driver._core.master = INFO
    driver._received(MasterCapabilities(master_id="another", capabilities=[ACK_BATCH_CAPABILITY]))
    assert not driver._outbox.merge_acks  # a word from a master it has left
    driver._received(MasterCapabilities(master_id=INFO.id, capabilities=[ACK_BATCH_CAPABILITY]))
    assert driver._outbox.merge_acks
