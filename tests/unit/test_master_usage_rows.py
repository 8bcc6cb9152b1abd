"""The master core's `RecordUsage` rows (master/usage_rows.py): what the usage store
receives for usage reports, status updates and the states the master makes up."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.effects import ArmTimer, TimerFired
from dyad.messages import (
    AgentInfo, ExecutorUsage, Reason, RegisterAgent, StatusUpdate, Suppress, Task, TaskState,
    UsageReport,
)
from dyad.resources import Resources
from master.model import MasterConfig, Received, UsageDue
from master.state import MasterState
from master.usage.schema import (
    EVENT_COLUMNS, STATE_ROW_LENGTH, Dimensions, KnownTasks, StateRow, TaskFacts, event_items,
    is_state_row)
from master.usage_rows import RecordUsage, dimensions
from tests.unit.test_master_state import AGENT_RES, Harness, launch, status, task

TASK_STATE_FIELDS = StateRow._fields
NOW = MasterConfig(record_usage=True, usage_batch=0)
"""Rows at the end of every step (`usage_batch` 0), as most tests here want them."""


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

    @property
    def state_rows(self) -> list[tuple]:
        return [e for e in self.events if is_state_row(e)]


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
    h = Recording(NOW)
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
    facts once; joined, they must be the very values `event_items` gives with
    the task's `dimensions`, of the same types. The stream holds plain values
    only: times as floats, facts and state rows as plain tuples."""
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_RUNNING, uuid="r1", healthy=True, message="up")))
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="r2", reason=Reason.COMMAND_EXECUTOR_FAILED)))
    assert len(h.state_rows) == 3
    assert all(type(e) in (float, tuple) for e in h.events)
    assert sum(not is_state_row(e) and type(e) is tuple for e in h.events) == 1  # facts once
    framework, agent = h.state.frameworks[h.fid], h.state.agents[h.aid]
    record = framework.completed["t1"]
    who = dimensions("t1", framework, agent, record, "eng")
    checked = []
    at = 0.0
    for item in h.events:
        if type(item) is float:
            at = item
        elif is_state_row(item):
            row = dict(zip(TASK_STATE_FIELDS, item))
            checked += event_items(at, who, row["state"], reason=row["reason"],
                                   message=row["message"], source=row["source"],
                                   healthy=row["healthy"], cpus=0.5, mem_bytes=256 * 2 ** 20)
    assert h.rows == joined(checked)
    assert [type(v) for r in h.rows for v in r.values()] == [
        type(v) for r in joined(checked) for v in r.values()]
    assert [r["state"] for r in h.rows] == ["TASK_STAGING", "TASK_RUNNING", "TASK_FINISHED"]
    assert h.rows[2]["reason"] == Reason.COMMAND_EXECUTOR_FAILED


def test_the_stream_carries_the_events_logs_own_tuples(h: Recording) -> None:
    """A state row is the values of the events log's `task_state` entry, the very
    tuple: the master builds one an event for both."""
    (entry,) = [e for e in h.state.events._entries if e[2] == "task_state"]
    (row,) = h.state_rows
    assert entry[3] == (TASK_STATE_FIELDS, row) and entry[3][1] is row
    assert len(row) == STATE_ROW_LENGTH and type(row) is tuple


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
    h = Recording(MasterConfig(usage_batch=0))
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    h.recv("a1", UsageReport(agent_id=aid, executors=[ExecutorUsage(
        framework_id=fid, executor_id="t1", task_ids=["t1"], cpus_used=0.1)]))
    assert h.records == []


def test_a_task_is_told_once_and_again_after_it_ended(h: Recording) -> None:
    """A task's facts go ahead of its first row, with its agent's registration,
    and again with its next row after a terminal one (the store forgets a task
    there: `usage_told` is cleared)."""
    record = h.state.frameworks[h.fid].tasks["t1"]
    assert record.usage_told
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status("t1", TaskState.TASK_RUNNING,
                                                                agent_id=h.aid)))
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="u2", agent_id=h.aid)))
    first, running, finished = (r.events for r in h.records)
    assert [type(e) for e in first] == [float, tuple, tuple]
    assert len(first[1]) == len(TaskFacts._fields) and first[1][:2] == (h.fid, "t1")
    assert [type(e) for e in running] == [float, tuple] == [type(e) for e in finished]
    assert not record.usage_told
    assert [r["hostname"] for r in h.rows] == ["host-1"] * 3
    assert [r["agent_attributes"] for r in h.rows] == [{"rack": "r1"}] * 3


def test_a_task_restored_from_a_re_registration_is_told_again(h: Recording) -> None:
    """The agent goes away and comes back with its task: the master's record is
    a new one, so its facts go again (with the registration it came back with)."""
    h.silent_agents.add(h.aid)
    h.advance(15 * 7)
    assert h.rows[-1]["state"] == "TASK_LOST"
    h.recv("a1", RegisterAgent(
        agent=AgentInfo(hostname="host-2", port=5051, id=h.aid,
                        resources=Resources.parse(AGENT_RES)),
        tasks=[Task(task_id="t1", framework_id=h.fid, agent_id=h.aid, executor_id="t1",
                    name="t1", state=TaskState.TASK_RUNNING,
                    resources=Resources.parse("cpus:0.5;mem:256"))]))
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="u9", agent_id=h.aid)))
    assert (h.rows[-1]["state"], h.rows[-1]["hostname"]) == ("TASK_FINISHED", "host-2")
    assert h.rows[-1]["agent_attributes"] == {}


def test_a_steps_task_events_are_one_record_at_its_end() -> None:
    """An Accept of several launches hands the store one `RecordUsage` holding
    every launch's row in launch order, after the step's other effects."""
    h = Harness(NOW)
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    effects = h.state.handle(Received("f1", launch(fid, [offer], *[
        task(f"t{i}", aid, "cpus:0.5;mem:64") for i in range(3)])), h.clock.now())
    records = [e for e in effects if isinstance(e, RecordUsage)]
    assert len(records) == 1 and effects[-1] is records[0]
    assert [(e[1], e[2]) for e in records[0].events if is_state_row(e)] == [
        (f"t{i}", "TASK_STAGING") for i in range(3)]
    assert records[0].rows == 3 and h.state.counters["master/usage_events"] == 3
    # A step with no task event has no record, and the next step's are its own.
    assert not [e for e in h.state.handle(Received("f1", Suppress(framework_id=fid)),
                                          h.clock.now()) if isinstance(e, RecordUsage)]
    (running,) = [e for e in h.state.handle(Received("a1", StatusUpdate(
        framework_id=fid, status=status("t1", TaskState.TASK_RUNNING))), h.clock.now())
        if isinstance(e, RecordUsage)]
    assert running.events == [h.clock.now(), (fid, "t1", "TASK_RUNNING", aid, "agent", "",
                                              "", None)]


def test_rows_are_gathered_for_usage_batch_then_go_as_one_record() -> None:
    """With `usage_batch`, the steps' rows wait in the core: the first arms
    `UsageDue`, and they go together at the end of the first step at or after
    it, or when it fires, each step's behind its own time."""
    h = Harness(MasterConfig(record_usage=True, usage_batch=0.05))
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")

    def step(message: object) -> list[Any]:
        effects = h.state.handle(Received("a1" if isinstance(message, StatusUpdate) else "f1",
                                          message), h.clock.now())  # type: ignore[arg-type]
        return effects

    launched = step(launch(fid, [offer], task("t1", aid, "cpus:0.5;mem:64"),
                           task("t2", aid, "cpus:0.5;mem:64")))
    started = h.clock.now()
    assert ArmTimer(UsageDue(), started + 0.05) in launched
    assert not [e for e in launched if isinstance(e, RecordUsage)]
    h.clock.advance(0.02)
    assert not [e for e in step(StatusUpdate(framework_id=fid, status=status(
        "t1", TaskState.TASK_RUNNING))) if isinstance(e, RecordUsage)]
    h.clock.advance(0.03)
    (record,) = [e for e in step(StatusUpdate(framework_id=fid, status=status(
        "t2", TaskState.TASK_RUNNING, uuid="u2"))) if isinstance(e, RecordUsage)]
    times = [e for e in record.events if type(e) is float]
    assert times == [started, started + 0.02, started + 0.05]
    assert [(e[1], e[2]) for e in record.events if is_state_row(e)] == [
        ("t1", "TASK_STAGING"), ("t2", "TASK_STAGING"), ("t1", "TASK_RUNNING"),
        ("t2", "TASK_RUNNING")]
    assert record.rows == 4
    # A lone row goes when its timer fires, even if no other step comes.
    h.clock.advance(1)
    armed = step(StatusUpdate(framework_id=fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="u3")))
    assert ArmTimer(UsageDue(), h.clock.now() + 0.05) in armed
    h.clock.advance(0.05)
    (late,) = [e for e in h.state.handle(TimerFired(UsageDue()), h.clock.now())
               if isinstance(e, RecordUsage)]
    assert [e[2] for e in late.events if is_state_row(e)] == ["TASK_FINISHED"]
    assert not [e for e in h.state.handle(TimerFired(UsageDue()), h.clock.now())
                if isinstance(e, RecordUsage)]  # nothing waits: nothing goes


def test_a_failed_steps_rows_go_with_a_later_step(
        h: Recording, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises returns no effects, but what it changed did happen (the
    events log kept it too): its rows go with the next step's, behind their own
    time, and the facts they carried are not sent twice."""
    state = h.state._state
    def broken(*_: object) -> None:
        raise RuntimeError("a bug")
    monkeypatch.setattr(state, "_to_framework", broken)
    failed_at = h.clock.now()
    with pytest.raises(RuntimeError):
        state.handle(Received("a1", StatusUpdate(framework_id=h.fid, status=status(
            "t1", TaskState.TASK_RUNNING))), failed_at)
    monkeypatch.undo()
    h.clock.advance(1)
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="u2")))
    assert h.records[-1].events == [
        failed_at, (h.fid, "t1", "TASK_RUNNING", h.aid, "agent", "", "", None),
        failed_at + 1, (h.fid, "t1", "TASK_FINISHED", h.aid, "agent", "", "", None)]
    assert [r["app"] for r in h.rows] == ["/web"] * 3


# -- the two halves of a task's facts, over any order of rows -------------------------

_STEP = st.tuples(st.integers(0, 2), st.sampled_from(
    ["launch", "running", "finished", "duplicate", "drop next"]))


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(_STEP, max_size=30))
def test_joined_rows_have_the_facts_of_their_task_at_the_time(
        steps: list[tuple[int, str]]) -> None:
    """Whatever the order of launches, updates, ends, relaunches under the same
    id, launches refused as duplicates, and records whose state rows the store
    dropped while full (it keeps the times and facts): each row the store gets
    joins to the facts of the task record the master had when it made it. The
    store's bound is the number of task ids, so it never drops one it needs."""
    h = Recording(NOW)
    fid = h.subscribe("f1")
    aid = h.register("a1", resources="cpus:8;mem:8192")
    launches = 0
    expected: list[str] = []
    dropped = False
    store = KnownTasks(most=3)
    names = [name for name, _ in EVENT_COLUMNS]
    got: list[str] = []
    for i, kind in steps:
        task_id = f"t{i}"
        framework = h.state.frameworks[fid]
        live = framework.tasks.get(task_id)
        before = len(h.records)
        if kind == "drop next":
            dropped = True
            continue
        if kind in ("launch", "duplicate"):
            if kind == "launch" and live is not None:
                continue
            if kind == "duplicate" and live is None:
                continue
            offers = h.offers_to(h.allocate(), "f1") or h.offers_to(h.advance(6), "f1")
            if not offers:
                continue
            launches += 1
            h.recv("f1", launch(fid, offers, task(task_id, aid, "cpus:0.5;mem:64", labels={
                "DYAD_APP_ID": f"/app{launches}"}), refuse=0))
        elif live is None:
            continue
        else:
            state = TaskState.TASK_RUNNING if kind == "running" else TaskState.TASK_FINISHED
            h.recv("a1", StatusUpdate(framework_id=fid, status=status(
                task_id, state, uuid=f"u{len(h.records)}")))
        for record in h.records[before:]:
            events = record.events
            if dropped:  # as `UsageStore.submit` drops while full
                events = [e for e in events if not is_state_row(e)]
            dropped = False
            for item in events:
                if is_state_row(item):
                    # What the master held for this task when it made the row: its
                    # live or just-ended record (a refused duplicate: the live one's).
                    holder = (framework.tasks.get(item[1]) or framework.completed.get(item[1]))
                    expected.append(holder.labels.get("DYAD_APP_ID", "") if holder else "")
            got += [dict(zip(names, v))["app"] for v in store.values(events)]
    assert got == expected
    assert store.unknown == 0


def test_the_store_keeps_at_most_its_bound_of_tasks_dropping_the_longest_known() -> None:
    def told(task_id: str) -> list[Any]:
        return event_items(1.0, Dimensions(task_id=task_id, framework_id="f", app=f"/{task_id}"),
                           "TASK_RUNNING")

    store = KnownTasks(most=2)
    store.values(told("a") + told("b") + told("a"))  # a again: still two
    assert len(store) == 2
    store.values(told("c"))
    names = [name for name, _ in EVENT_COLUMNS]
    (row,) = [dict(zip(names, v)) for v in store.values([2.0, ("f", "b", "TASK_RUNNING", "",
                                                                "agent", "", "", None)])]
    assert row["app"] == "" and store.unknown == 1  # b went first: a was told again later
