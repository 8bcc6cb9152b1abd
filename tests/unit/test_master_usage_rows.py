"""The master core's `RecordUsage` rows (master/usage_rows.py): what the usage store
receives for usage reports, status updates and the states the master makes up."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.messages import (
    ExecutorUsage, Reason, StatusUpdate, Suppress, TaskState, UsageReport,
)
from master.model import MasterConfig, Received
from master.state import MasterState
from master.usage.schema import (
    EVENT_COLUMNS, FORGET_ALL, Dimensions, KnownTasks, TaskEvent, TaskFacts)
from master.usage_rows import RecordUsage, ToldTasks, dimensions
from tests.unit.test_master_state import Harness, launch, status, task


class Recording(Harness):
    """The harness, keeping the `RecordUsage` effects aside."""

    def __init__(self, config: MasterConfig) -> None:
        super().__init__(config)
        self.records: list[RecordUsage] = []
        self.state = _Sifted(self.state, self.records)  # type: ignore[assignment]

    @property
    def samples(self) -> list:
        return [s for r in self.records for s in r.samples]

    @property
    def events(self) -> list:
        return [e for r in self.records for e in r.events]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The events as the store's `task_events` rows, joined to their facts."""
        return joined(self.events)


def joined(events: list) -> list[dict[str, Any]]:
    names = [name for name, _ in EVENT_COLUMNS]
    return [dict(zip(names, values)) for values in KnownTasks(most=10 ** 6).values(events)]


class _Sifted:
    """A core whose `RecordUsage` effects go to `records` instead of its caller."""

    def __init__(self, state: MasterState, records: list[RecordUsage]) -> None:
        self._state = state
        self._records = records

    def handle(self, event: Any, now: float) -> list[Any]:
        effects = self._state.handle(event, now)
        self._records.extend(e for e in effects if isinstance(e, RecordUsage))
        return [e for e in effects if not isinstance(e, RecordUsage)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


LABELS = {"DYAD_APP_ID": "/web", "team": "search"}


@pytest.fixture
def h() -> Recording:
    h = Recording(MasterConfig(record_usage=True))
    h.fid = h.subscribe("f1", roles=["eng"])
    h.aid = h.register("a1", hostname="host-1", attributes={"rack": "r1"})
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(h.fid, [offer], task("t1", h.aid, "cpus:0.5;mem:256",
                                             labels=LABELS)))
    return h


def usage(h: Recording, throttled: float, task_ids: tuple[str, ...] = ("t1",),
          **kw: object) -> None:
    h.recv("a1", UsageReport(agent_id=h.aid, executors=[ExecutorUsage(
        framework_id=h.fid, executor_id="t1", task_ids=list(task_ids), timestamp=1.0,
        cpus_used=0.2, cpus_limit=0.5, cpus_throttled_time_secs=throttled,
        mem_rss_bytes=30_000_000, mem_limit_bytes=256 * 2 ** 20, **kw)]))


def test_a_launch_and_its_status_updates_become_events_with_dimensions(h: Recording) -> None:
    h.clock.advance(2)
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_RUNNING, uuid="r1", healthy=True, message="up")))
    staging, running_ = h.rows
    assert (staging["state"], staging["source"]) == ("TASK_STAGING", "SOURCE_MASTER")
    assert (running_["state"], running_["source"], running_["message"],
            running_["healthy"]) == ("TASK_RUNNING", "SOURCE_AGENT", "up", True)
    assert running_["ts"] == staging["ts"] + 2
    assert [running_[c] for c in ("task_id", "framework_id", "role", "app", "agent_id",
                                   "hostname", "priority", "revocable")] == [
        "t1", h.fid, "eng", "/web", h.aid, "host-1", 100, False]
    assert running_["agent_attributes"] == {"rack": "r1"} and running_["labels"] == LABELS
    assert (running_["cpus"], running_["mem_bytes"]) == (0.5, 256 * 2 ** 20)
    assert h.metric("master/usage_events") == 2


def test_the_cores_unchecked_rows_join_to_what_the_checked_constructor_makes(
        h: Recording) -> None:
    """The core builds its rows without the row types' checks, and sends a task's
    facts once; joined, they must be the very values `TaskEvent.of` gives with
    the task's `dimensions`, of the same types."""
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_RUNNING, uuid="r1", healthy=True, message="up")))
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="r2", reason=Reason.COMMAND_EXECUTOR_FAILED)))
    assert len(h.events) == 3
    framework, agent = h.state.frameworks[h.fid], h.state.agents[h.aid]
    record = framework.completed["t1"]
    who = dimensions("t1", framework, agent, record, "eng")
    for event in h.events:
        assert type(event) is TaskEvent
        assert event.facts is None or type(event.facts) is TaskFacts
    checked = [TaskEvent.of(e.at, who, e.state, reason=e.reason, message=e.message,
                            source=e.source, healthy=e.healthy, cpus=0.5,
                            mem_bytes=256 * 2 ** 20) for e in h.events]
    assert h.rows == joined(checked)
    assert [r["state"] for r in h.rows] == ["TASK_STAGING", "TASK_RUNNING", "TASK_FINISHED"]
    assert h.rows[2]["reason"] == Reason.COMMAND_EXECUTOR_FAILED


def test_usage_reports_become_samples_with_throttled_time_as_deltas(h: Recording) -> None:
    usage(h, throttled=1.5)
    h.clock.advance(10)
    usage(h, throttled=4.0)
    usage(h, throttled=0.5)  # the counter restarted: counted afresh
    first, second, _ = h.samples
    assert [s.cpus_throttled_secs for s in h.samples] == [1.5, 2.5, 0.5]
    assert second.at == first.at + 10
    assert (second.cpus_used, second.cpus_limit, second.mem_rss_bytes,
            second.mem_limit_bytes, second.executor_id) == (
        0.2, 0.5, 30_000_000, 256 * 2 ** 20, "t1")
    assert (second.who.app, second.who.role, second.who.hostname) == ("/web", "eng", "host-1")
    assert h.metric("master/usage_samples") == 3


def test_samples_of_unknown_tasks_and_impossible_numbers_are_skipped_and_counted(
        h: Recording) -> None:
    usage(h, throttled=0.0, task_ids=("nobody",))
    usage(h, throttled=-1.0)
    assert h.samples == []
    assert h.metric("master/usage_samples_unmatched") == 1
    assert h.metric("master/usage_samples_rejected") == 1


def test_states_the_master_makes_are_events_too(h: Recording) -> None:
    (offer,) = h.offers_to(h.advance(6), "f1")
    h.recv("f1", launch(h.fid, [offer], task("t1", h.aid)))  # a duplicate id: TASK_ERROR
    error = h.rows[-1]
    assert (error["state"], error["reason"], error["source"]) == (
        "TASK_ERROR", Reason.TASK_INVALID, "SOURCE_MASTER")
    assert error["app"] == "/web"  # the record of the live t1 it collided with
    h.silent_agents.add(h.aid)
    h.advance(15 * 7)
    lost = h.rows[-1]
    assert (lost["state"], lost["reason"], lost["task_id"], lost["app"]) == (
        "TASK_LOST", Reason.AGENT_UNREACHABLE, "t1", "/web")


def test_without_a_store_the_core_builds_no_rows() -> None:
    h = Recording(MasterConfig())
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    h.recv("a1", UsageReport(agent_id=aid, executors=[ExecutorUsage(
        framework_id=fid, executor_id="t1", task_ids=["t1"], cpus_used=0.1)]))
    assert h.records == []


def test_told_tasks_know_a_task_only_while_its_record_and_agent_are_the_same() -> None:
    """`ToldTasks` has a row carry a task's facts only while the task record and
    the agent's registration are not the very ones they were sent with; past
    its bound it forgets all and asks for a `FORGET_ALL` row."""
    h = Recording(MasterConfig(record_usage=True))
    fid = h.subscribe("f1", roles=["eng"])
    aid = h.register("a1", hostname="host-1", attributes={"rack": "r1"})
    agent = h.state.agents[aid]
    told = ToldTasks(most=2)
    assert told.must_tell((fid, "t1"), None, agent)
    assert not told.must_tell((fid, "t1"), None, agent)
    agent.info = attrs.evolve(agent.info, hostname="host-2")  # re-registered, say
    assert told.must_tell((fid, "t1"), None, agent)
    assert not told.must_tell((fid, "t1"), None, agent)
    assert told.must_tell((fid, "t2"), None, agent)
    assert not told.pending
    assert told.must_tell((fid, "t3"), None, agent)  # over `most`: starts afresh
    assert told.pending and len(told) == 1
    told.pending = False
    assert told.must_tell((fid, "t1"), None, agent)
    told.forget((fid, "t1"))
    told.forget((fid, "t3"))
    assert len(told) == 0


def test_a_task_is_told_once_and_a_finished_task_is_forgotten(h: Recording) -> None:
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status("t1", TaskState.TASK_RUNNING,
                                                                agent_id=h.aid)))
    assert len(h.state._told) == 1
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, agent_id=h.aid)))
    staging, running, finished = h.events
    assert staging.facts is not None and running.facts is None and finished.facts is None
    assert len(h.state._told) == 0
    assert h.rows[2]["hostname"] == "host-1"


def test_a_re_registered_agent_is_told_again(h: Recording) -> None:
    agent = h.state.agents[h.aid]
    agent.info = attrs.evolve(agent.info, attributes={"rack": "r9"})  # as a re-registration
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status("t1", TaskState.TASK_RUNNING,
                                                                agent_id=h.aid)))
    assert h.events[1].facts is not None
    assert [r["agent_attributes"] for r in h.rows] == [{"rack": "r1"}, {"rack": "r9"}]


def test_a_steps_task_events_are_one_record_at_its_end() -> None:
    """An Accept of several launches hands the store one `RecordUsage` holding
    every launch's row in launch order, after the step's other effects."""
    h = Harness(MasterConfig(record_usage=True))
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    effects = h.state.handle(Received("f1", launch(fid, [offer], *[
        task(f"t{i}", aid, "cpus:0.5;mem:64") for i in range(3)])), h.clock.now())
    records = [e for e in effects if isinstance(e, RecordUsage)]
    assert len(records) == 1 and effects[-1] is records[0]
    assert [(e.task_id, e.state) for e in records[0].events] == [
        (f"t{i}", "TASK_STAGING") for i in range(3)]
    assert h.state.counters["master/usage_events"] == 3
    # A step with no task event has no record, and the next step's are its own.
    assert not [e for e in h.state.handle(Received("f1", Suppress(framework_id=fid)),
                                          h.clock.now()) if isinstance(e, RecordUsage)]
    (running,) = [e for e in h.state.handle(Received("a1", StatusUpdate(
        framework_id=fid, status=status("t1", TaskState.TASK_RUNNING))), h.clock.now())
        if isinstance(e, RecordUsage)]
    assert [(e.task_id, e.state) for e in running.events] == [("t1", "TASK_RUNNING")]


def test_a_failed_steps_rows_go_with_it_and_what_they_told_is_told_again(
        h: Recording, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises returns no effects: its queued rows must not surface
    with the next step's, and the store, which never got them, must hear the
    facts they carried again, after a `FORGET_ALL`."""
    state = h.state._state
    def broken(*_: object) -> None:
        raise RuntimeError("a bug")
    monkeypatch.setattr(state, "_to_framework", broken)
    with pytest.raises(RuntimeError):
        state.handle(Received("a1", StatusUpdate(framework_id=h.fid, status=status(
            "t1", TaskState.TASK_RUNNING))), h.clock.now())
    monkeypatch.undo()
    effects = state.handle(Received("f1", Suppress(framework_id=h.fid)), h.clock.now())
    assert not [e for e in effects if isinstance(e, RecordUsage)]
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status("t1", TaskState.TASK_RUNNING)))
    forget, running = h.records[-1].events
    assert forget == FORGET_ALL and running.facts is not None
    assert h.rows[-1]["app"] == "/web"


# -- the two halves of a task's facts, over any order of rows -------------------------

_STEP = st.tuples(st.integers(0, 3), st.booleans(), st.sampled_from(
    ["event", "event", "end", "new record", "new agent", "lost step", "dropped"]))


@settings(max_examples=300, deadline=None)
@given(most=st.integers(1, 4), steps=st.lists(_STEP, max_size=40))
def test_joined_rows_have_the_facts_of_their_task_at_the_time(
        most: int, steps: list[tuple[int, bool, str]]) -> None:
    """Whatever the order of events, ends, replaced records and registrations, the
    `ToldTasks` bound, lost steps (their rows never sent) and rows the store
    dropped while full (all but those telling facts): each row the store gets
    joins to the facts the master holds for its task when it made it."""
    told = ToldTasks(most=most)
    made = itertools.count()
    records: dict[int, tuple[object, int]] = {}  # a task's record, and its number
    agent: Any = attrs.make_class("Agent", ["info"])(info=(object(), next(made)))
    sent: list[TaskEvent] = []
    expected: list[tuple[str, str]] = []
    for i, quiet, kind in steps:
        key = ("f1", f"t{i}")
        if kind == "new record" or i not in records:
            records[i] = (object(), next(made))
        if kind == "new agent":
            agent.info = (object(), next(made))
            if quiet:
                continue
        if kind == "lost step":
            told.forget_all()  # as `MasterState.handle` does when a step raised
            continue
        record, number = records[i]
        now = (f"/app{number}", f"host{agent.info[1]}")
        facts = None
        rows: list[TaskEvent] = []
        if told.must_tell(key, record, agent):  # type: ignore[arg-type]
            facts = TaskFacts("eng", now[0], "a1", now[1], {}, {}, 100, False, 1.0, 1)
        if told.pending:
            told.pending = False
            rows.append(FORGET_ALL)
        if kind == "end":
            told.forget(key)
            del records[i]
        rows.append(TaskEvent(1.0, "f1", key[1],
                              "TASK_FINISHED" if kind == "end" else "TASK_RUNNING",
                              facts=facts))
        if kind == "dropped":
            rows = [r for r in rows if r.facts is not None or not r.state]
        sent += rows
        expected += [now for r in rows if r.state]
    assert [(row["app"], row["hostname"]) for row in joined(sent)] == expected
