"""A flood of status updates against a slow master: its queue stays bounded.

A model master takes messages from one FIFO queue, `service` seconds each. For a
`StatusUpdate` it forwards the update to the framework (remembering the uuid as
*pending* for that agent and framework), and the framework acknowledges at once,
which puts an `Acknowledge` at the back of the same queue. For an `Acknowledge`
it forgets the pending uuid and relays the ack to the agent. Agents are real
`StatusUpdateManager`s, each handed a burst of updates for several tasks at time 0.

What must hold however large the burst: the master never holds more than two
pending uuids per stream (the head, and a stale copy of the one before it), and
its queue never grows past a bound set by the number of streams and how slow the
master is -- not by the number of updates. With the old schedule (a resend every
second) a master slower than one message per stream per second drowns: its queue
grows with the burst. The same holds when the framework acknowledges together
(`together`: an ack joins the framework's `Acknowledgements` still waiting at the
back of the queue, as a driver's run of acks does, and each ack of it is then
handled as if alone).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.status_updates import SendMaster, StatusUpdateManager, UpdateRetry
from dyad.effects import ArmTimer, CancelTimer
from dyad.messages import Acknowledge, StatusUpdate, TaskState, TaskStatus


class FloodModel:
    """Agents (real managers) and a model master, driven by a discrete event queue."""

    def __init__(self, agents: int, tasks: int, burst: int, service: float,
                 make_manager: Any, together: bool = False) -> None:
        self.service = service
        self.together = together
        self.managers = [make_manager(f"agent-{a}") for a in range(agents)]
        self.streams = agents * tasks
        self.queue: deque[tuple[int, StatusUpdate | Acknowledge | list[Any]]] = deque()
        self.pending: dict[tuple[int, str], set[tuple[str, str]]] = {}
        self.timers: dict[tuple[int, UpdateRetry], float] = {}
        self.agenda: list[tuple[float, int, str, Any]] = []
        self.tick = 0
        self.now = 0.0
        self.busy = False
        self.max_queue = 0
        self.max_pending_per_stream = 0.0
        self.delivered: Counter[tuple[int, str]] = Counter()
        self.processed = 0
        for a, manager in enumerate(self.managers):
            self.perform(a, manager.resume(0.0))
            for n in range(burst):
                last = n == burst - 1
                for t in range(tasks):
                    state = TaskState.TASK_FINISHED if last else TaskState.TASK_RUNNING
                    status = TaskStatus(task_id=f"t{t}", state=state, uuid=f"a{a}t{t}u{n}")
                    self.perform(a, manager.add(
                        StatusUpdate(framework_id="F", status=status), 0.0))

    def at(self, when: float, kind: str, data: Any) -> None:
        self.tick += 1
        heapq.heappush(self.agenda, (when, self.tick, kind, data))

    def perform(self, agent: int, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, SendMaster):
                self.enqueue(agent, effect.message)
            elif isinstance(effect, ArmTimer):
                self.timers[(agent, effect.key)] = effect.at
                self.at(effect.at, "timer", (agent, effect.key))
            elif isinstance(effect, CancelTimer):
                self.timers.pop((agent, effect.key), None)
            else:
                raise AssertionError(effect)

    def enqueue(self, agent: int, message: StatusUpdate | Acknowledge) -> None:
        self.queue.append((agent, message))
        self.max_queue = max(self.max_queue, len(self.queue))
        if not self.busy:
            self.busy = True
            self.at(self.now + self.service, "served", None)

    def serve(self) -> None:
        agent, message = self.queue.popleft()
        self.processed += 1
        if isinstance(message, StatusUpdate):
            status = message.status
            pending = self.pending.setdefault((agent, message.framework_id), set())
            pending.add((status.task_id, status.uuid))
            per_stream = Counter(task for task, _ in pending)
            self.max_pending_per_stream = max(self.max_pending_per_stream,
                                              max(per_stream.values()))
            self.delivered[(agent, status.uuid)] += 1
            ack = Acknowledge(framework_id=message.framework_id, agent_id=f"agent-{agent}",
                              task_id=status.task_id, uuid=status.uuid)
            if not self.together:
                self.queue.append((agent, ack))
            elif self.queue and isinstance(self.queue[-1][1], list):
                self.queue[-1][1].append((agent, ack))  # joins the waiting Acknowledgements
            else:
                self.queue.append((-1, [(agent, ack)]))
            self.max_queue = max(self.max_queue, len(self.queue))
        elif isinstance(message, list):
            for one_agent, ack in message:  # as if each had come alone
                self.acknowledge(one_agent, ack)
        else:
            self.acknowledge(agent, message)
        if self.queue:
            self.at(self.now + self.service, "served", None)
        else:
            self.busy = False

    def acknowledge(self, agent: int, message: Acknowledge) -> None:
        self.pending[(agent, message.framework_id)].discard((message.task_id, message.uuid))
        self.perform(agent, self.managers[agent].acknowledge(
            message.framework_id, message.task_id, message.uuid, self.now))

    def run(self, horizon: float) -> bool:
        """Run until every stream is closed (True) or `horizon` passes (False)."""
        while self.agenda:
            when, _, kind, data = heapq.heappop(self.agenda)
            if when > horizon:
                return False
            self.now = when
            if kind == "served":
                self.serve()
            else:
                agent, key = data
                if self.timers.get((agent, key)) == when:
                    del self.timers[(agent, key)]
                    self.perform(agent, self.managers[agent].timer_fired(key, when))
            if not any(m.pending() for m in self.managers) and not self.queue:
                return True
        return True


def queue_bound(streams: int, service: float, backoff: float) -> int:
    """Per stream: the head and its ack, a stale copy of the previous head, and
    the resends a head makes while its copy and its ack wait in a queue of this
    size (the first after `backoff`, then doubling)."""
    wait = 4 * streams * service  # two trips through a queue of ~2 messages a stream
    resends = 1 + math.ceil(math.log2(1 + wait / backoff))
    return streams * (3 + resends)


@settings(max_examples=60, deadline=None)
@given(agents=st.integers(1, 4), tasks=st.integers(1, 4), burst=st.integers(1, 40),
       service=st.floats(0.01, 1.5), together=st.booleans())
def test_a_flood_never_grows_the_masters_queue_beyond_a_bound_of_its_streams(
        agents: int, tasks: int, burst: int, service: float, together: bool) -> None:
    model = FloodModel(agents, tasks, burst, service,
                       lambda seed: StatusUpdateManager(seed=seed), together)
    assert model.run(horizon=1e7), "every stream ends"
    assert model.max_pending_per_stream <= 2
    assert model.max_queue <= queue_bound(model.streams, service, 10.0), (
        model.max_queue, queue_bound(model.streams, service, 10.0))
    # Every update reached the framework, in order of its stream, at least once.
    for a in range(agents):
        for t in range(tasks):
            for n in range(burst):
                assert model.delivered[(a, f"a{a}t{t}u{n}")] >= 1


def test_the_bound_does_not_depend_on_the_size_of_the_burst() -> None:
    peaks = set()
    for burst in (1, 10, 100):
        model = FloodModel(4, 4, burst, 1.0, lambda seed: StatusUpdateManager(seed=seed))
        assert model.run(horizon=1e7)
        peaks.add(model.max_queue)
    assert max(peaks) <= queue_bound(16, 1.0, 10.0)


def test_with_a_resend_every_second_a_slow_master_drowns_in_the_flood() -> None:
    """The schedule issue 19 measured: 16 streams against a master that needs 0.2 s
    a message cannot keep up with one resend per stream per second."""
    peaks = []
    for burst in (5, 20):
        model = FloodModel(4, 4, burst, 0.2, lambda seed: StatusUpdateManager(
            backoff=1.0, max_backoff=1.0, jitter=0.0, seed=seed))
        model.run(horizon=burst * 100.0)
        peaks.append(model.max_queue)
    assert peaks[1] > 2 * peaks[0] > 2 * queue_bound(16, 0.2, 10.0), peaks
    bounded = FloodModel(4, 4, 20, 0.2, lambda seed: StatusUpdateManager(seed=seed))
    assert bounded.run(horizon=1e7)
    assert bounded.max_queue <= queue_bound(16, 0.2, 10.0)
