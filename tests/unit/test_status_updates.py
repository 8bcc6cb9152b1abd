"""The status-update manager: order, at-least-once, backoff, stale acks."""

from __future__ import annotations

from typing import Any, Hashable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent.status_updates import SendMaster, StatusUpdateManager, UpdateRetry
from dyad.effects import ArmTimer, CancelTimer
from dyad.messages import StatusUpdate, TaskState, TaskStatus

T0 = 1000.0


def update(task: str, n: int, state: TaskState = TaskState.TASK_RUNNING,
           framework: str = "F") -> StatusUpdate:
    status = TaskStatus(task_id=task, state=state, uuid=f"{task}-{n}")
    return StatusUpdate(framework_id=framework, status=status)


class Shell:
    """Performs the manager's effects like agent.server does, and records sends."""

    def __init__(self, manager: StatusUpdateManager) -> None:
        self.manager = manager
        self.timers: dict[Hashable, float] = {}
        self.sent: list[StatusUpdate] = []

    def apply(self, effects: list[Any]) -> list[StatusUpdate]:
        sent = []
        for effect in effects:
            if isinstance(effect, SendMaster):
                assert isinstance(effect.message, StatusUpdate)
                sent.append(effect.message)
            elif isinstance(effect, ArmTimer):
                self.timers[effect.key] = effect.at
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)
            else:
                raise AssertionError(effect)
        self.sent += sent
        self.manager.validate()
        return sent

    def fire(self, key: Hashable, now: float) -> list[StatusUpdate]:
        self.timers.pop(key)
        return self.apply(self.manager.timer_fired(key, now))

    def only_timer(self) -> tuple[Hashable, float]:
        (item,) = self.timers.items()
        return item


def connected() -> tuple[StatusUpdateManager, Shell]:
    manager = StatusUpdateManager()
    shell = Shell(manager)
    shell.apply(manager.resume(T0))
    return manager, shell


def uuids(updates: list[StatusUpdate]) -> list[str]:
    return [u.status.uuid for u in updates]


def test_first_update_is_sent_at_once_and_the_next_waits_for_the_ack() -> None:
    manager, shell = connected()
    assert uuids(shell.apply(manager.add(update("t", 1), T0))) == ["t-1"]
    assert shell.only_timer()[1] == T0 + 1
    assert shell.apply(manager.add(update("t", 2), T0)) == []
    assert uuids(shell.apply(manager.acknowledge("F", "t", "t-1", T0 + 0.5))) == ["t-2"]
    assert shell.only_timer()[1] == T0 + 1.5
    assert manager.pending() == [update("t", 2)]


def test_retries_back_off_from_one_second_doubling_to_thirty() -> None:
    manager, shell = connected()
    shell.apply(manager.add(update("t", 1), T0))
    now, gaps = T0, []
    for _ in range(8):
        key, at = shell.only_timer()
        gaps.append(at - now)
        now = at
        assert uuids(shell.fire(key, now)) == ["t-1"]
    assert gaps == [1, 2, 4, 8, 16, 30, 30, 30]
    assert (manager.sent, manager.retried) == (9, 8)
    # An ack resets the backoff for the next update.
    shell.apply(manager.add(update("t", 2), now))
    shell.apply(manager.acknowledge("F", "t", "t-1", now))
    assert shell.only_timer()[1] == now + 1


def test_stale_and_duplicate_acks_are_ignored_and_counted() -> None:
    manager, shell = connected()
    shell.apply(manager.add(update("t", 1), T0))
    shell.apply(manager.add(update("t", 2), T0))
    assert shell.apply(manager.acknowledge("F", "t", "t-2", T0)) == []  # not the head
    assert uuids(shell.apply(manager.acknowledge("F", "t", "t-1", T0))) == ["t-2"]
    assert shell.apply(manager.acknowledge("F", "t", "t-1", T0)) == []  # duplicate
    assert shell.apply(manager.acknowledge("F", "nope", "x", T0)) == []  # unknown stream
    assert (manager.acked, manager.stale_acks) == (1, 3)
    assert manager.queued("F", "t") == [update("t", 2)]


def test_terminal_ack_closes_the_stream_and_nothing_follows_a_terminal_update() -> None:
    manager, shell = connected()
    shell.apply(manager.add(update("t", 1, TaskState.TASK_FINISHED), T0))
    assert shell.apply(manager.add(update("t", 2), T0)) == []
    assert manager.refused == 1
    shell.apply(manager.acknowledge("F", "t", "t-1", T0))
    assert not manager.has_stream("F", "t")
    assert shell.timers == {}


def test_a_resent_uuid_is_queued_once() -> None:
    manager, shell = connected()
    shell.apply(manager.add(update("t", 1), T0))
    shell.apply(manager.add(update("t", 1), T0))
    assert manager.queued("F", "t") == [update("t", 1)] and manager.refused == 1


def test_streams_are_independent() -> None:
    manager, shell = connected()
    shell.apply(manager.add(update("a", 1), T0))
    assert uuids(shell.apply(manager.add(update("b", 1), T0))) == ["b-1"]
    assert uuids(shell.apply(manager.add(update("a", 1, framework="G"), T0))) == ["a-1"]
    assert len(shell.timers) == 3


def test_paused_manager_queues_and_resume_replays_every_head() -> None:
    manager = StatusUpdateManager()
    shell = Shell(manager)
    assert shell.apply(manager.add(update("a", 1), T0)) == []
    assert shell.apply(manager.add(update("a", 2), T0)) == []
    assert shell.apply(manager.add(update("b", 1), T0)) == []
    assert shell.timers == {}
    assert uuids(shell.apply(manager.resume(T0))) == ["a-1", "b-1"]
    shell.apply(manager.pause())
    assert shell.timers == {}
    key = UpdateRetry("F", "a", 0)
    assert manager.timer_fired(key, T0 + 5) == []  # a timer that was already due
    assert uuids(shell.apply(manager.resume(T0 + 5))) == ["a-1", "b-1"]
    assert manager.retried == 2


def test_a_retry_already_due_when_the_head_changed_is_stale() -> None:
    manager, shell = connected()
    shell.apply(manager.add(update("t", 1), T0))
    shell.apply(manager.add(update("t", 2), T0))
    due, _ = shell.only_timer()
    shell.apply(manager.acknowledge("F", "t", "t-1", T0 + 1))
    assert manager.timer_fired(due, T0 + 1) == []


class StreamsMachine(RuleBasedStateMachine):
    """Random interleavings of adds, acks (fresh, stale, duplicate), timer fires and
    master loss. The model master checks that each stream arrives in order, that an
    update is sent only while it is the unacknowledged head, and that every update
    is eventually delivered."""

    TASKS = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self.manager = StatusUpdateManager(backoff=1.0, max_backoff=8.0)
        self.shell = Shell(self.manager)
        self.now = T0
        self.added: dict[str, list[str]] = {t: [] for t in self.TASKS}
        self.terminal: dict[str, bool] = {t: False for t in self.TASKS}
        self.acked: dict[str, int] = {t: 0 for t in self.TASKS}
        self.received: dict[str, list[str]] = {t: [] for t in self.TASKS}
        self.counter = 0

    def _perform(self, effects: list[Any]) -> None:
        for sent in self.shell.apply(effects):
            task = sent.status.task_id
            head = self.added[task][self.acked[task]]
            assert sent.status.uuid == head, "only the unacknowledged head is ever sent"
            self.received[task].append(sent.status.uuid)

    def _closed(self, task: str) -> bool:
        return self.terminal[task] and self.acked[task] == len(self.added[task])

    @rule(task=st.sampled_from(TASKS), terminal=st.booleans())
    def add(self, task: str, terminal: bool) -> None:
        if self._closed(task):
            return  # AgentState never reopens a closed stream
        self.counter += 1
        state = TaskState.TASK_FINISHED if terminal else TaskState.TASK_RUNNING
        msg = update(task, self.counter, state)
        effects = self.manager.add(msg, self.now)
        if self.terminal[task]:
            assert effects == [] and msg not in self.manager.pending()
            return
        self.added[task].append(msg.status.uuid)
        self.terminal[task] = terminal
        self._perform(effects)

    @rule(task=st.sampled_from(TASKS), pick=st.integers(0, 100))
    def master_acks_something(self, task: str, pick: int) -> None:
        # Anything it received (the head, or old ones again), or a queued update it
        # never saw (a bogus ack): only the head's ack may count.
        choices = self.received[task] + self.added[task][self.acked[task] + 1:]
        if not choices:
            return
        uuid = choices[pick % len(choices)]
        is_head = (self.acked[task] < len(self.added[task])
                   and self.added[task][self.acked[task]] == uuid)
        stale_before = self.manager.stale_acks
        effects = self.manager.acknowledge("F", task, uuid, self.now)
        if is_head:
            self.acked[task] += 1
        else:
            assert effects == [] and self.manager.stale_acks == stale_before + 1
        self._perform(effects)

    @precondition(lambda self: self.shell.timers)
    @rule(pick=st.integers(0, 100))
    def a_timer_fires(self, pick: int) -> None:
        key = sorted(self.shell.timers, key=str)[pick % len(self.shell.timers)]
        self.now = max(self.now, self.shell.timers[key])
        before = self.manager.retried
        self.shell.timers.pop(key)
        self._perform(self.manager.timer_fired(key, self.now))
        assert self.manager.retried == before + 1

    @rule()
    def master_lost(self) -> None:
        self._perform(self.manager.pause())

    @rule(seconds=st.floats(0, 20))
    def master_back(self, seconds: float) -> None:
        self.now += seconds
        self._perform(self.manager.resume(self.now))

    @invariant()
    def every_unacknowledged_head_is_out_and_will_be_retried(self) -> None:
        for task in self.TASKS:
            pending = self.acked[task] < len(self.added[task])
            assert self.manager.has_stream("F", task) == pending
            if pending and not self.manager.paused:
                head = self.added[task][self.acked[task]]
                assert self.received[task][-1] == head
                assert any(k.task_id == task for k in self.shell.timers)
        if self.manager.paused:
            assert self.shell.timers == {}

    def teardown(self) -> None:
        if self.manager.paused:
            self._perform(self.manager.resume(self.now))
        for _ in range(200):
            open_tasks = [t for t in self.TASKS if self.acked[t] < len(self.added[t])]
            if not open_tasks:
                break
            for task in open_tasks:
                effects = self.manager.acknowledge("F", task, self.received[task][-1], self.now)
                self.acked[task] += 1
                self._perform(effects)
        for task in self.TASKS:
            distinct = list(dict.fromkeys(self.received[task]))
            assert distinct == self.added[task], "every update arrives, in order"


TestStreams = StreamsMachine.TestCase
TestStreams.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
