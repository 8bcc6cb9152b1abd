"""Agent liveness in the master core (master/agents.py `_ping_due`): an agent that
declares LIVENESS_CAPABILITY is not pinged while it and the master talk anyway,
is still declared gone as long after its last frame as a pinged one, and an agent
without the capability is pinged exactly as before.

Each test drives one registered agent (and one framework, whose
`FrameworkToExecutor` frames are what the master sends the agent) through random
activity, tick by tick, and then lets it fall silent."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.messages import (
    LIVENESS_CAPABILITY, AgentInfo, AgentRegistered, FrameworkToExecutor, Ping, RegisterAgent,
    Rejected, UsageReport,
)
from dyad.resources import Resources
from master.model import MasterConfig, PingDue
from tests.unit.test_master_state import AGENT_RES, Harness, messages

INTERVAL = MasterConfig().agent_ping_timeout
MISSES = MasterConfig().max_agent_ping_timeouts

# One step: how long until the next thing happens (under an interval, so at most
# one tick per step), whether the agent says something then, whether the master
# sends it something then.
STEPS = st.lists(st.tuples(st.floats(0.1, INTERVAL - 0.1), st.booleans(), st.booleans()),
                 max_size=40)


@attrs.define
class Run:
    """What one driven agent did and was sent, with times."""

    h: Harness
    aid: str
    fid: str
    capable: bool
    registered_at: float
    pings: list[float] = attrs.field(factory=list)  # ticks that sent a Ping
    ticks: list[float] = attrs.field(factory=list)
    spoke: list[float] = attrs.field(factory=list)  # agent frames, pongs included
    pongs: list[float] = attrs.field(factory=list)
    told: list[float] = attrs.field(factory=list)  # master frames to it, pings included
    news: list[float] = attrs.field(factory=list)  # master frames to it but pings

    @classmethod
    def start(cls, capable: bool) -> Run:
        h = Harness()
        fid = h.subscribe("f1")
        sends = h.recv("a1", RegisterAgent(
            agent=AgentInfo(hostname="h", port=5051, resources=Resources.parse(AGENT_RES)),
            capabilities=[LIVENESS_CAPABILITY] if capable else []))
        (registered,) = messages(sends, AgentRegistered)
        run = cls(h, registered.agent_id, fid, capable, registered_at=h.clock.now())
        run.told.append(run.registered_at)  # before its first tick, at this very time
        return run

    @property
    def alive(self) -> bool:
        return self.aid in self.h.state.agents

    def step(self, dt: float, speaks: bool, master_speaks: bool) -> None:
        """Advance `dt` (a tick on the way pings, and the agent answers unless it is
        silent), then let the agent and the master speak as told."""
        h = self.h
        tick = h.timers.get(PingDue(self.aid))
        if tick is not None and tick <= h.clock.now() + dt:
            self.ticks.append(tick)
        for send in h.advance(dt):
            if send.to == "a1" and isinstance(send.message, Ping):
                assert tick is not None and tick <= h.clock.now()
                self.pings.append(tick)
                self.told.append(tick)
                if self.aid not in h.silent_agents:
                    self.pongs.append(tick)
                    self.spoke.append(tick)
        if not self.alive:
            return
        now = h.clock.now()
        if speaks:
            h.recv("a1", UsageReport(agent_id=self.aid))
            self.spoke.append(now)
        if master_speaks:
            sends = h.recv("f1", FrameworkToExecutor(framework_id=self.fid, agent_id=self.aid,
                                                     executor_id="e1", data=b"x"))
            assert [s.to for s in sends] == ["a1"]
            self.told.append(now)
            self.news.append(now)

    def fall_silent(self) -> float:
        """The agent says nothing more; step tick by tick until it is gone. Returns
        the time it was declared gone."""
        self.h.silent_agents.add(self.aid)
        for _ in range(MISSES + 3):
            tick = self.h.timers[PingDue(self.aid)]
            self.step(tick - self.h.clock.now(), False, False)
            if not self.alive:
                return tick
        raise AssertionError("a silent agent was never declared gone")


def since(times: list[float], start: float, end: float) -> bool:
    """Anything in [start, end)? A frame at a tick's very time came after it."""
    return any(start <= t < end for t in times) if start < end else False


@settings(max_examples=60, deadline=None)
@given(capable=st.booleans(), steps=STEPS)
def test_a_silent_agent_is_declared_gone_as_long_after_its_last_frame_as_ever(
        capable: bool, steps: list[tuple[float, bool, bool]]) -> None:
    """Between 5 and 6 intervals after the last frame that counts (any frame from
    an agent with the capability, else its last pong): the bound a ping every tick
    gives, whatever was skipped."""
    run = Run.start(capable)
    for step in steps:
        run.step(*step)
    gone = run.fall_silent()
    frames = run.spoke if capable else run.pongs
    if frames:
        last = max(frames)
        assert MISSES * INTERVAL < gone - last <= (MISSES + 1) * INTERVAL + 1e-6, (last, gone)
    else:  # silent since it registered: pinged at once, never answered
        assert abs(gone - run.registered_at - MISSES * INTERVAL) < 1e-6
    assert run.h.metric("master/agents_unreachable") == 1


@settings(max_examples=60, deadline=None)
@given(steps=STEPS)
def test_a_busy_agent_is_pinged_only_when_needed(steps: list[tuple[float, bool, bool]]) -> None:
    """With the capability: a tick pings exactly when, since the tick before, the
    agent said nothing or the master sent it nothing but pings; so the agent
    still hears from the master at least every 2 intervals (its silence timer
    allows 3)."""
    run = Run.start(capable=True)
    for step in steps:
        run.step(*step)
    for before, tick in zip(run.ticks, run.ticks[1:]):
        busy = since(run.spoke, before, tick) and since(run.news, before, tick)
        assert (tick in run.pings) is not busy, (before, tick)
    told = [*run.told, run.h.clock.now()]
    assert all(b - a <= 2 * INTERVAL for a, b in zip(told, told[1:])), told
    assert run.h.metric("master/agent_pings_skipped") == len(run.ticks) - len(run.pings)


@settings(max_examples=30, deadline=None)
@given(steps=STEPS)
def test_an_agent_without_the_capability_is_pinged_every_tick(
        steps: list[tuple[float, bool, bool]]) -> None:
    """An older agent counts only pings as the master's word: every tick pings it,
    however busy it is, and only its pongs answer them."""
    run = Run.start(capable=False)
    for step in steps:
        run.step(*step)
    assert run.pings == run.ticks
    assert run.h.metric("master/agent_pings_skipped") == 0


def test_frames_that_answer_nothing_still_prove_a_capable_agent_alive() -> None:
    """A worked case: the agent never answers a ping but reports every 10 s: it
    stays registered with the capability and is declared gone without it."""
    for capable, survives in ((True, True), (False, False)):
        run = Run.start(capable)
        run.h.silent_agents.add(run.aid)
        for _ in range(20):
            run.step(10.0, True, False)
        assert run.alive is survives


def test_refusals_are_not_news_so_the_agent_is_still_pinged() -> None:
    """The master refuses every frame the agent sends (here: usage reports under
    another agent's id): the agent hears only `Rejected`, which it never takes for
    proof of life (agent/master_link.py), so the master must not skip its pings."""
    run = Run.start(capable=True)
    for _ in range(10):
        tick = run.h.timers[PingDue(run.aid)]
        run.step(tick - run.h.clock.now() + 0.1, False, False)
        sends = run.h.recv("a1", UsageReport(agent_id="someone-else"))
        assert [type(s.message) for s in sends] == [Rejected]
    assert run.pings == run.ticks and len(run.ticks) >= 10
    assert run.h.metric("master/agent_pings_skipped") == 0
