"""The agent's side of liveness (agent/master_link.py): any frame from the master
it is registered with proves that master alive, not only a `Ping`; it says so as
it registers; and nothing from a master it has left counts for the next one."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.model import DetectMaster, MasterDetected
from dyad.effects import ArmTimer, CancelTimer
from dyad.messages import (
    ACK_BATCH_CAPABILITY, BATCH_CAPABILITY, LIVENESS_CAPABILITY, AgentRegistered, Message, Ping, RegisterAgent,
    Rejected, StatusUpdateAck,
)
from tests.unit.test_agent_state import MASTER, Agent, of_type, to_master

INTERVAL = 2.0
SUCCESSOR = attrs.evolve(MASTER, id="m2", ip="10.0.0.2")
FRAMES: list[Message] = [
    Ping(agent_id="A1"),
    StatusUpdateAck(agent_id="A1", framework_id="F1", task_id="t9", uuid="u9"),
]
REFUSAL = Rejected(reason="this connection has no registered agent; register first",
                   message_type="usage_report")


def test_the_agent_declares_that_any_frame_proves_the_master_alive() -> None:
    (register,) = to_master(Agent()(MasterDetected(MASTER)), RegisterAgent)
    assert set(register.capabilities) == {
        ACK_BATCH_CAPABILITY, BATCH_CAPABILITY, LIVENESS_CAPABILITY}


@settings(max_examples=50, deadline=None)
@given(gaps=st.lists(st.tuples(st.floats(0.01, 3 * INTERVAL - 0.01), st.sampled_from(FRAMES)),
                     max_size=30))
def test_the_master_is_given_up_exactly_three_intervals_after_its_last_frame(
        gaps: list[tuple[float, Message]]) -> None:
    """Whatever frames arrive (any kind, each under 3 intervals after the one
    before), the agent stays; it detects the master again exactly 3 intervals
    after the last one, not earlier and not later."""
    agent = Agent()
    agent.register(ping_interval=INTERVAL)
    for gap, frame in gaps:
        assert not of_type(agent.advance(gap), DetectMaster)
        agent.master(frame)
    assert not of_type(agent.advance(3 * INTERVAL - 1e-6), DetectMaster)
    assert of_type(agent.advance(2e-6), DetectMaster) == [DetectMaster()]
    assert agent.state.metrics()["agent/registered"] == 0


def test_a_busy_link_costs_no_timer_per_frame() -> None:
    """A frame only moves the deadline: the silence timer is re-armed when it
    fires, not on every frame."""
    agent = Agent()
    agent.register(ping_interval=INTERVAL)
    for frame in FRAMES * 5:
        effects = agent.master(frame)
        assert not of_type(effects, ArmTimer) and not of_type(effects, CancelTimer), effects

def test_frames_from_a_master_the_agent_left_never_count_for_its_successor() -> None:
    """ZooKeeper names a successor while the old master's frames are still on
    their way: the link is REGISTERING with the successor, so they count for
    nothing, and a successor that never answers is given up 3 intervals after it
    was named."""
    agent = Agent()
    agent.register(ping_interval=INTERVAL)
    agent(MasterDetected(SUCCESSOR))
    for _ in range(5):  # up to 2.5 intervals after the successor was named
        assert not of_type(agent.advance(INTERVAL / 2), DetectMaster)
        agent.master(Ping(agent_id="A1"))  # the old master's, late
    assert not of_type(agent.advance(INTERVAL / 2 - 1e-6), DetectMaster)
    assert of_type(agent.advance(2e-6), DetectMaster) == [DetectMaster()]

def test_frames_count_again_once_the_successor_registered_the_agent() -> None:
    agent = Agent()
    agent.register(ping_interval=INTERVAL)
    agent(MasterDetected(SUCCESSOR))
    agent.master(AgentRegistered(agent_id="A1", master_info=SUCCESSOR, ping_interval=INTERVAL))
    for _ in range(10):
        assert not of_type(agent.advance(2 * INTERVAL), DetectMaster)
        agent.master(FRAMES[1])
    assert of_type(agent.advance(3 * INTERVAL), DetectMaster) == [DetectMaster()]


def test_refusals_never_prove_the_master_alive() -> None:
    """A master restarted on the same address does not know the agent and answers
    its usage reports with refusals: the agent still gives it up 3 intervals after
    its last real frame, and registers again (found in CI: refusals every 5 s kept
    an agent from ever re-registering with a restarted master)."""
    agent = Agent()
    agent.register(ping_interval=INTERVAL)
    for _ in range(5):  # 2.5 intervals of refusals
        assert not of_type(agent.advance(INTERVAL / 2), DetectMaster)
        agent.master(REFUSAL)
    assert of_type(agent.advance(INTERVAL / 2 + 1e-6), DetectMaster) == [DetectMaster()]
