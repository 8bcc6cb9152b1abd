"""Oversubscription on the agent: the reclamation estimator (agent/reclaim.py),
the QoS controller (agent/qos.py), and the agent core lending, reporting and
evicting (agent/oversubscription.py) -- fake clock, made-up samples."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.model import LaunchExecutor, UsageSampled
from agent.qos import EPSILON, Lent, QosConfig, corrections, victim_order
from agent.reclaim import ZERO, Amount, ReclaimConfig, ReclaimEstimator, RunSample
from dyad.messages import KillTask, Reason, StatusUpdate, TaskState, UsageReport
from dyad.resources import Resources
from tests.unit.test_agent_state import (
    Agent,
    command_task,
    running_executor,
    status,
    to_master,
    to_peer,
    updates,
)
from tests.unit.test_agent_usage import sample


def run(alloc_mem: float, used_mem: float | None, cpus: float = 0.0,
        used_cpus: float = 0.0) -> RunSample:
    usage = None if used_mem is None else Amount(used_cpus, used_mem)
    return RunSample(Amount(cpus, alloc_mem), usage)


# ------------------------------------------------------------------ estimator


def test_reservation_decays_to_usage_plus_margin_within_the_window() -> None:
    estimator = ReclaimEstimator(ReclaimConfig(window=100.0))
    assert estimator.update({"svc": run(1024, None)}, 0).revocable == ZERO  # not measured
    assert estimator.update({"svc": run(1024, 50)}, 0).revocable == ZERO  # starts at its limit
    halfway = estimator.update({"svc": run(1024, 50)}, 50)
    assert halfway.reservation.mem == pytest.approx(512)
    settled = estimator.update({"svc": run(1024, 50)}, 100)
    assert settled.reservation.mem == pytest.approx(50 + 32)  # the margin's floor
    assert settled.revocable.mem == pytest.approx(1024 - 82)


def test_reservation_jumps_back_up_at_once_and_revocable_follows_down() -> None:
    estimator = ReclaimEstimator(ReclaimConfig(window=10.0))
    estimator.update({"svc": run(1024, 100)}, 0)
    assert estimator.update({"svc": run(1024, 100)}, 10).revocable.mem == pytest.approx(1024 - 132)
    grown = estimator.update({"svc": run(1024, 700)}, 11)
    assert grown.reservation.mem == pytest.approx(840)  # 700 + 20%
    assert grown.revocable.mem == pytest.approx(184)
    assert estimator.update({"svc": run(1024, 1000)}, 12).revocable.mem == 0  # capped at the limit


def test_hysteresis_holds_small_increases_but_follows_every_decrease() -> None:
    estimator = ReclaimEstimator(ReclaimConfig(window=1.0, step=Amount(cpus=0.1, mem=32)))
    estimator.update({"svc": run(1024, 100)}, 0)
    first = estimator.update({"svc": run(1024, 100)}, 1).revocable.mem
    assert estimator.update({"svc": run(1024, 90)}, 2).revocable.mem == first  # +10 MB held
    assert estimator.update({"svc": run(1024, 60)}, 3).revocable.mem == pytest.approx(first + 40)
    assert estimator.update({"svc": run(1024, 99)}, 4).revocable.mem < first + 40


def test_gone_runs_are_forgotten_and_disabled_lends_nothing() -> None:
    estimator = ReclaimEstimator(ReclaimConfig(window=1.0))
    estimator.update({"a": run(512, 10), "b": run(512, 10)}, 0)
    both = estimator.update({"a": run(512, 10), "b": run(512, 10)}, 5)
    one = estimator.update({"a": run(512, 10)}, 6)
    assert one.revocable.mem == pytest.approx(both.revocable.mem / 2)
    assert estimator.reservation("b") is None
    off = ReclaimEstimator(ReclaimConfig(enabled=False, window=1.0))
    off.update({"a": run(512, 10)}, 0)
    assert off.update({"a": run(512, 10)}, 5).revocable == ZERO


def test_a_task_joining_a_run_starts_at_its_limit() -> None:
    estimator = ReclaimEstimator(ReclaimConfig(window=1.0))
    estimator.update({"a": run(512, 10)}, 0)
    estimator.update({"a": run(512, 10)}, 5)
    joined = estimator.update({"a": run(1024, None)}, 6)
    assert joined.reservation.mem == pytest.approx(42 + 512)


samples = st.lists(st.tuples(st.floats(0.0, 30.0),  # seconds since the last sample
                             st.sampled_from(["a", "b", "c"]),
                             st.floats(0.0, 4.0), st.floats(0.0, 2048.0),  # allocation
                             st.floats(0.0, 4.0), st.floats(0.0, 3000.0)),  # usage
                   min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(samples)
def test_estimates_stay_within_their_bounds(steps: list[tuple[float, ...]]) -> None:
    """Whatever the samples: no reservation exceeds its allocation or falls below
    usage plus margin (capped by the allocation); what is reported never exceeds
    allocation minus reservations, and is never negative."""
    config = ReclaimConfig(window=60.0)
    estimator = ReclaimEstimator(config)
    runs: dict[str, RunSample] = {}
    now = 0.0
    for gap, key, cpus, mem, used_cpus, used_mem in steps:
        now += gap
        runs[key] = RunSample(Amount(cpus, mem), Amount(used_cpus, used_mem))
        estimate = estimator.update(runs, now)
        for name, one in runs.items():
            reserved = estimator.reservation(name)
            assert reserved is not None
            usage = one.usage
            assert usage is not None
            floor = (usage + usage.scaled(config.margin).at_least(config.margin_floor)).at_most(
                one.allocation)
            assert reserved.cpus <= one.allocation.cpus + EPSILON
            assert reserved.mem <= one.allocation.mem + EPSILON
            assert reserved.cpus >= floor.cpus - 1e-9 and reserved.mem >= floor.mem - 1e-9
        slack = estimate.allocation - estimate.reservation
        assert 0 <= estimate.revocable.cpus <= estimate.unsmoothed.cpus + 1e-9 <= slack.cpus + 2e-3
        assert 0 <= estimate.revocable.mem <= estimate.unsmoothed.mem + 1e-9 <= slack.mem + 2e-3


# ------------------------------------------------------------------------ QoS

CAPACITY = Amount(4.0, 4096.0)


def lent(name: str, priority: int = 0, started: float = 0.0, mem: float = 256,
         used: float = 100) -> Lent:
    return Lent(("F", name), priority, started, Amount(0.5, mem), Amount(0.1, used))


def test_nothing_is_evicted_while_owners_leave_room() -> None:
    tasks = [lent("a"), lent("b")]
    assert corrections(QosConfig(), capacity=CAPACITY, revocable=Amount(1, 512), lent=tasks,
                       owners_used=Amount(1, 1000)) == []


def test_a_shrunk_estimate_evicts_lowest_priority_then_youngest() -> None:
    tasks = [lent("old-low", 10, started=1), lent("young-low", 10, started=5),
             lent("high", 150, started=9)]
    evicted = corrections(QosConfig(), capacity=CAPACITY, revocable=Amount(1, 300),
                          lent=tasks, owners_used=Amount(1, 1000))
    assert [e.key for e in evicted] == [("F", "young-low"), ("F", "old-low")]
    assert "need them back" in evicted[0].why


def test_memory_pressure_evicts_until_usage_is_under_the_watermark() -> None:
    tasks = [lent("a", used=300), lent("b", used=300, started=1)]
    evicted = corrections(QosConfig(mem_watermark=0.9), capacity=CAPACITY,
                          revocable=Amount(4, 4096), lent=tasks,
                          owners_used=Amount(1, 3500))  # 4100 of 4096 MB
    assert [e.key for e in evicted] == [("F", "b"), ("F", "a")]  # 3686 needs both gone
    assert "memory pressure" in evicted[0].why
    assert corrections(QosConfig(enabled=False), capacity=CAPACITY, revocable=ZERO,
                       lent=tasks, owners_used=Amount(1, 3500)) == []


lent_tasks = st.lists(st.builds(
    Lent, key=st.tuples(st.just("F"), st.text("abcdef", min_size=1, max_size=3)),
    priority=st.integers(-5, 400), started=st.floats(0, 100),
    held=st.builds(Amount, st.floats(0, 2), st.floats(0, 1024)),
    used=st.builds(Amount, st.floats(0, 2), st.floats(0, 1024))),
    max_size=8, unique_by=lambda t: t.key)


@settings(max_examples=300, deadline=None)
@given(lent_tasks, st.builds(Amount, st.floats(0, 8), st.floats(0, 8192)),
       st.builds(Amount, st.floats(0, 4), st.floats(0, 4096)))
@example(  # found in CI: 0.500001 - 0.5 is just over EPSILON, and b was evicted too
    [Lent(("F", "a"), 0, 0.0, Amount(0.5, 0.0), ZERO), Lent(("F", "b"), 0, 0.0, Amount(1e-6, 0.0), ZERO)],
    ZERO, ZERO)
def test_evictions_follow_the_order_and_are_enough_and_no_more(
        tasks: list[Lent], revocable: Amount, owners: Amount) -> None:
    config = QosConfig()
    evicted = [e.key for e in corrections(config, capacity=CAPACITY, revocable=revocable,
                                          lent=tasks, owners_used=owners)]
    order = [t.key for t in victim_order(tasks)]
    assert evicted == order[:len(evicted)]  # a prefix of the order: never a higher one first
    kept = [t for t in tasks if t.key not in evicted]

    def wrong(left: list[Lent]) -> bool:
        held = sum((t.held for t in left), ZERO)
        used = owners + sum((t.used for t in left), ZERO)
        return (held.cpus > revocable.cpus + EPSILON or held.mem > revocable.mem + EPSILON
                or used.mem > config.mem_watermark * CAPACITY.mem + EPSILON
                or used.cpus > config.cpu_watermark * CAPACITY.cpus + EPSILON)

    assert not wrong(kept) or not kept  # enough: fixed, or nothing left to evict
    if evicted:  # no more: without the last victim something was still wrong
        last = next(t for t in tasks if t.key == evicted[-1])
        assert wrong([*kept, last])
    assert corrections(config, capacity=CAPACITY, revocable=revocable, lent=tasks,
                       owners_used=owners) == corrections(
        config, capacity=CAPACITY, revocable=revocable, lent=list(reversed(tasks)),
        owners_used=owners)  # deterministic, whatever order the agent lists them in


# ------------------------------------------------------------------ the agent


def agent_with_owner(window: float = 10.0) -> Agent:
    agent = Agent(reclaim=ReclaimConfig(window=window), usage_report_interval=0.0)
    agent.register()
    running_executor(agent, command_task("svc", Resources.parse("cpus:1;mem:800")))
    return agent


def report_of(effects: list[Any]) -> UsageReport:
    (report,) = to_master(effects, UsageReport)
    return report


def test_an_idle_owner_lends_and_the_report_says_so() -> None:
    agent = agent_with_owner()
    first = report_of(agent(UsageSampled((sample("svc", at=0, rss_mib=50),))))
    assert first.revocable == Resources()  # a reservation starts at the limit
    agent.clock.advance(10)
    later = report_of(agent(UsageSampled((sample("svc", at=10, rss_mib=50),))))
    assert later.revocable.get("mem") == pytest.approx(800 - 82)
    assert later.reservation.get("mem") == pytest.approx(82)
    view = agent.state.snapshot()["oversubscription"]
    assert view["revocable"]["mem"] == pytest.approx(718) and view["enabled"]


def test_revocable_tasks_do_not_count_against_the_agents_resources() -> None:
    agent = agent_with_owner()
    # 800 of 1024 MB are the owner's; a revocable task of 700 MB still runs.
    effects = agent.run(attrs.evolve(command_task("be", Resources.parse("cpus:1;mem:700")),
                                     revocable=True, priority=50))
    assert not [u for u in updates(effects) if u.state == TaskState.TASK_ERROR]
    assert agent.state.used == Resources.parse("cpus:1;mem:800")
    (task,) = [t for f in agent.state.snapshot()["frameworks"] for e in f["executors"]
               for t in e["tasks"] + e["queued_tasks"] if t["id"] == "be"]
    assert task["revocable"] and task["priority"] == 50


def test_a_revocable_task_is_launched_with_no_cpu_weight_of_its_own() -> None:
    agent = agent_with_owner()
    effects = agent.run(attrs.evolve(command_task("be", Resources.parse("cpus:0.5;mem:100")),
                                     revocable=True))
    (launch,) = [e for e in effects if isinstance(e, LaunchExecutor)]
    # Only the command executor's own 0.1 cpus carry weight (agent/isolation.py).
    assert launch.limits.revocable_cpus == 0.5
    assert launch.limits.weight_share == pytest.approx(0.1 / 0.6)


def test_owner_growth_evicts_the_revocable_task_with_the_preempted_reason() -> None:
    agent = agent_with_owner()
    agent(UsageSampled((sample("svc", at=0, rss_mib=50),)))
    agent.clock.advance(10)
    agent(UsageSampled((sample("svc", at=10, rss_mib=50),)))
    running_executor(agent, attrs.evolve(command_task("be", Resources.parse("cpus:0.5;mem:600")),
                                         revocable=True), peer="bb02")
    (started,) = to_master(agent.executor(status("be", TaskState.TASK_RUNNING, "r1", "be"),
                                          peer="bb02"), StatusUpdate)
    agent.ack(started)
    agent.clock.advance(1)
    calm = agent(UsageSampled((sample("svc", at=11, rss_mib=50),
                               sample("be", at=11, rss_mib=300))))
    assert not to_peer(calm, "bb02", KillTask)
    agent.clock.advance(1)
    effects = agent(UsageSampled((sample("svc", at=12, rss_mib=600),
                                  sample("be", at=12, rss_mib=300))))
    (kill,) = to_peer(effects, "bb02", KillTask)
    assert kill.task_id == "be"
    assert report_of(effects).revocable.get("mem") == pytest.approx(80)  # told at once
    (update,) = updates(agent.executor(status("be", TaskState.TASK_KILLED, "k1", "be"),
                                       peer="bb02"))
    assert update.state == TaskState.TASK_KILLED
    assert update.reason == Reason.CONTAINER_PREEMPTED
    assert "need them back" in update.message
    assert agent.state.metrics()["agent/tasks_evicted"] == 1
    # Being killed, it is never chosen twice.
    again = agent(UsageSampled((sample("svc", at=13, rss_mib=600),)))
    assert not to_peer(again, "bb02", KillTask)


def test_a_kill_with_a_reason_from_the_master_ends_with_that_reason() -> None:
    agent = agent_with_owner()
    (started,) = to_master(agent.executor(status("svc", TaskState.TASK_RUNNING, "r1", "svc")),
                           StatusUpdate)
    agent.ack(started)
    effects = agent.master(KillTask(framework_id="F1", task_id="svc",
                                    reason=Reason.CONTAINER_PREEMPTED,
                                    message="preempted for a priority 300 task"))
    assert to_peer(effects, kind=KillTask)
    (update,) = updates(agent.executor(status("svc", TaskState.TASK_KILLED, "k1", "svc")))
    assert (update.reason, update.message.startswith("preempted for")) == (
        Reason.CONTAINER_PREEMPTED, True)
