"""The master core's `RecordUsage` rows (master/usage_rows.py): what the usage store
receives for usage reports, status updates and the states the master makes up."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from dyad.messages import (
    ExecutorUsage, Reason, StatusUpdate, Suppress, TaskState, UsageReport,
)
from master.model import MasterConfig, Received
from master.state import MasterState
from master.usage.schema import Dimensions, TaskEvent, event_values
from master.usage_rows import DimensionsCache, RecordUsage, dimensions, task_event
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
    staging, running_ = h.events
    assert (staging.state, staging.source) == ("TASK_STAGING", "SOURCE_MASTER")
    assert (running_.state, running_.source, running_.message, running_.healthy) == (
        "TASK_RUNNING", "SOURCE_AGENT", "up", True)
    assert running_.at == staging.at + 2
    who = running_.who
    assert (who.task_id, who.framework_id, who.role, who.app, who.agent_id, who.hostname) == (
        "t1", h.fid, "eng", "/web", h.aid, "host-1")
    assert who.agent_attributes == {"rack": "r1"} and who.labels == LABELS
    assert (running_.cpus, running_.mem_bytes) == (0.5, 256 * 2 ** 20)
    assert h.metric("master/usage_events") == 2


def test_the_cores_unchecked_rows_are_those_the_checked_constructors_make(
        h: Recording) -> None:
    """The core builds its rows without the row types' checks (`trusted_event`);
    they must be the very values the checked
    constructors give, of the same types."""
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_RUNNING, uuid="r1", healthy=True, message="up")))
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, uuid="r2", reason=Reason.COMMAND_EXECUTOR_FAILED)))
    assert len(h.events) == 3
    framework, agent = h.state.frameworks[h.fid], h.state.agents[h.aid]
    record = framework.completed["t1"]
    for event in h.events:
        assert type(event) is TaskEvent and type(event.who) is Dimensions
        assert event == TaskEvent(**event._asdict())
        assert event.who == Dimensions(**attrs.asdict(event.who, recurse=False))
        assert event_values(event) == event_values(task_event(
            "t1", framework, agent, record, "eng", event.state, event.at,
            reason=event.reason, message=event.message, source=event.source,
            healthy=event.healthy))
    assert [e.state for e in h.events] == ["TASK_STAGING", "TASK_RUNNING", "TASK_FINISHED"]
    assert h.events[2].reason == Reason.COMMAND_EXECUTOR_FAILED


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
    error = h.events[-1]
    assert (error.state, error.reason, error.source) == (
        "TASK_ERROR", Reason.TASK_INVALID, "SOURCE_MASTER")
    assert error.who.app == "/web"  # the record of the live t1 it collided with
    h.silent_agents.add(h.aid)
    h.advance(15 * 7)
    lost = h.events[-1]
    assert (lost.state, lost.reason, lost.who.task_id) == (
        "TASK_LOST", Reason.AGENT_UNREACHABLE, "t1")


def test_without_a_store_the_core_builds_no_rows() -> None:
    h = Recording(MasterConfig())
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    h.recv("a1", UsageReport(agent_id=aid, executors=[ExecutorUsage(
        framework_id=fid, executor_id="t1", task_ids=["t1"], cpus_used=0.1)]))
    assert h.records == []


def test_kept_dimensions_are_what_building_them_gives_and_follow_what_changed() -> None:
    """`DimensionsCache` reuses a task's dimensions only while the agent info,
    task record and role are the very ones they were built from."""
    h = Recording(MasterConfig(record_usage=True))
    fid = h.subscribe("f1", roles=["eng"])
    aid = h.register("a1", hostname="host-1", attributes={"rack": "r1"})
    framework, agent = h.state.frameworks[fid], h.state.agents[aid]
    cache = DimensionsCache(most=2)
    first = cache.parts("t1", framework, agent, None, "eng")[0]
    assert first == dimensions("t1", framework, agent, None, "eng")
    assert cache.parts("t1", framework, agent, None, "eng")[0] is first
    assert cache.parts("t1", framework, agent, None, "web")[0].role == "web"  # another role
    agent.info = attrs.evolve(agent.info, hostname="host-2")  # re-registered, say
    assert cache.parts("t1", framework, agent, None, "web")[0].hostname == "host-2"
    cache.parts("t2", framework, agent, None, "eng")[0]
    cache.parts("t3", framework, agent, None, "eng")[0]  # over `most`: starts afresh
    assert len(cache) == 1
    cache.forget(fid, "t3")
    assert len(cache) == 0


def test_a_tasks_events_share_its_dimensions_and_a_finished_task_is_forgotten(
        h: Recording) -> None:
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status("t1", TaskState.TASK_RUNNING,
                                                                agent_id=h.aid)))
    assert len(h.state._dimensions) == 1
    h.recv("a1", StatusUpdate(framework_id=h.fid, status=status(
        "t1", TaskState.TASK_FINISHED, agent_id=h.aid)))
    staging, running, finished = h.events
    assert staging.who is running.who is finished.who
    assert len(h.state._dimensions) == 0


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
    assert [(e.who.task_id, e.state) for e in records[0].events] == [
        (f"t{i}", "TASK_STAGING") for i in range(3)]
    assert h.state.counters["master/usage_events"] == 3
    # A step with no task event has no record, and the next step's are its own.
    assert not [e for e in h.state.handle(Received("f1", Suppress(framework_id=fid)),
                                          h.clock.now()) if isinstance(e, RecordUsage)]
    (running,) = [e for e in h.state.handle(Received("a1", StatusUpdate(
        framework_id=fid, status=status("t1", TaskState.TASK_RUNNING))), h.clock.now())
        if isinstance(e, RecordUsage)]
    assert [(e.who.task_id, e.state) for e in running.events] == [("t1", "TASK_RUNNING")]


def test_a_failed_steps_rows_go_with_it(h: Recording, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises returns no effects; its queued rows must not surface
    with the next step's."""
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
