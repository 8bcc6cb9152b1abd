"""Preemption: victim choice (master/allocator/preemption.py), property-tested
with a stateful machine, and the master carrying it out (master/preempting.py):
asked by a framework, or on its own for an unmet quota guarantee."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dyad.messages import (
    Decline,
    Filters,
    KillTask,
    Preempt,
    Reason,
    Rejected,
    Revive,
    StatusUpdate,
    Suppress,
    TaskState,
)
from dyad.resources import Resources
from master.allocator import Quota
from master.allocator.preemption import (
    Candidate,
    PreemptionConfig,
    order,
    place,
    reclaim,
)
from master.model import MasterConfig
from master.operator import SetQuota
from tests.unit.test_master_state import Harness, launch, messages, status, task


def cand(task_id: str, agent: str = "a", priority: int = 100, started: float = 0.0,
         text: str = "cpus:1;mem:100", role: str = "batch", framework: str = "F") -> Candidate:
    return Candidate(framework_id=framework, task_id=task_id, agent_id=agent, role=role,
                     priority=priority, started=started, resources=Resources.parse(text))


R = Resources.parse


# ------------------------------------------------------------------ pure rules


def test_free_room_preempts_nobody() -> None:
    plan = place(R("cpus:1"), 300, {"a": R("cpus:0.5"), "b": R("cpus:2")}, [cand("t")])
    assert plan is not None and plan.agent_id == "b" and plan.victims == ()


def test_lowest_priority_then_youngest_and_only_as_many_as_needed() -> None:
    tasks = [cand("old", priority=50, started=1), cand("young", priority=50, started=9),
             cand("prod", priority=250), cand("mid", priority=120, started=5)]
    plan = place(R("cpus:2;mem:200"), 300, {"a": R("")}, tasks)
    assert plan is not None
    assert [v.task_id for v in plan.victims] == ["young", "old"]
    assert order(tasks)[0].task_id == "young"


def test_batch_never_preempts_production_or_monitoring_nor_equals() -> None:
    tasks = [cand("prod", priority=200), cand("mon", priority=400), cand("peer", priority=150)]
    assert place(R("cpus:1"), 150, {"a": R("")}, tasks) is None
    plan = place(R("cpus:1"), 151, {"a": R("")}, tasks)
    assert plan is not None and [v.task_id for v in plan.victims] == ["peer"]


def test_fewest_victims_wins_across_agents_and_protected_roles_are_spared() -> None:
    tasks = [cand("a1", "a", 10, text="cpus:1"), cand("a2", "a", 10, text="cpus:1"),
             cand("b1", "b", 90, text="cpus:2"), cand("c1", "c", 0, text="cpus:2", role="prod")]
    plan = place(R("cpus:2"), 100, {"a": R(""), "b": R(""), "c": R("")}, tasks,
                 protected={"prod"})
    assert plan is not None and plan.agent_id == "b" and [v.task_id for v in plan.victims] == ["b1"]


def test_a_victim_the_others_cover_for_is_spared() -> None:
    tasks = [cand("small", priority=10, started=9, text="cpus:0.5"),
             cand("big", priority=20, text="cpus:2")]
    plan = place(R("cpus:2"), 100, {"a": R("")}, tasks)
    assert plan is not None and [v.task_id for v in plan.victims] == ["big"]


def test_reclaim_covers_an_amount_over_the_cluster_or_nothing() -> None:
    tasks = [cand("x", "a", 10, text="cpus:1;mem:512;ports:[1-1]"),
             cand("y", "b", 20, text="cpus:1;mem:512;ports:[1-1]"),
             cand("z", "c", 300, text="cpus:4;mem:4096")]
    need = {"cpus": 1500, "mem": 600}
    assert {v.task_id for v in reclaim(need, 200, tasks)} == {"x", "y"}
    assert reclaim({"cpus": 9000}, 200, tasks) == []  # not coverable: kill nobody
    assert reclaim({}, 200, tasks) == []


# --------------------------------------------------------- stateful properties


class PreemptionMachine(RuleBasedStateMachine):
    """A cell of agents with running tasks; every `ask` checks the rules."""

    @initialize(agents=st.integers(1, 4))
    def cell(self, agents: int) -> None:
        self.free = {f"s{i}": R("cpus:1;mem:512") for i in range(agents)}
        self.tasks: list[Candidate] = []
        self.protected: set[str] = set()
        self.count = 0

    @rule(agent=st.integers(0, 3), priority=st.integers(0, 400), cpus=st.integers(1, 3),
          mem=st.integers(1, 8), role=st.sampled_from(["a", "b", "c"]),
          started=st.integers(0, 100))
    def run_task(self, agent: int, priority: int, cpus: int, mem: int, role: str,
                 started: int) -> None:
        agent_id = f"s{agent % len(self.free)}"
        self.count += 1
        self.tasks.append(cand(f"t{self.count}", agent_id, priority, float(started),
                               f"cpus:{cpus};mem:{mem * 128}", role))

    @rule(role=st.sampled_from(["a", "b", "c"]))
    def protect(self, role: str) -> None:
        self.protected ^= {role}

    @rule(priority=st.integers(0, 400), cpus=st.integers(1, 6), mem=st.integers(0, 16))
    def ask(self, priority: int, cpus: int, mem: int) -> None:
        need = R(f"cpus:{cpus};mem:{mem * 128}")
        plan = place(need, priority, self.free, self.tasks, self.protected)
        shuffled = list(self.tasks)
        random.Random(cpus * 1000 + mem).shuffle(shuffled)
        assert plan == place(need, priority, dict(reversed(self.free.items())), shuffled,
                             self.protected), "deterministic whatever the input order"
        if any(need <= have for have in self.free.values()):
            assert plan is not None and plan.victims == ()  # free room suffices
            return
        if plan is None:  # then even every allowed task on any one agent is not enough
            for agent_id, have in self.free.items():
                allowed = [t for t in self.tasks if t.agent_id == agent_id
                           and t.priority < priority and t.role not in self.protected]
                total = have
                for t in allowed:
                    total = total + t.resources
                assert not need <= total
            return
        freed = self.free[plan.agent_id]
        for victim in plan.victims:
            assert victim.priority < priority
            assert victim.role not in self.protected
            assert victim.agent_id == plan.agent_id
            freed = freed + victim.resources
        assert need <= freed  # the victims free enough
        for victim in plan.victims:  # ... and every one of them is needed
            rest = self.free[plan.agent_id]
            for other in plan.victims:
                if other is not victim:
                    rest = rest + other.resources
            assert not need <= rest
        # Carry it out: the victims are gone, what they held is free.
        gone = {v.key for v in plan.victims}
        self.tasks = [t for t in self.tasks if t.key not in gone]
        self.free[plan.agent_id] = freed - need

    @invariant()
    def tasks_are_unique(self) -> None:
        assert len({t.key for t in self.tasks}) == len(self.tasks)


PreemptionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestPreemptionRules = PreemptionMachine.TestCase


# ------------------------------------------------------------------- the master

PREEMPTING = MasterConfig(preemption=PreemptionConfig(enabled=True, guarantees=False))


def batch_cluster(h: Harness, priorities: tuple[int, ...] = (50, 150)) -> tuple[str, str]:
    """A batch framework filling one agent (cpus:4;mem:4096) with 2-cpu tasks."""
    batch = h.subscribe("b1", name="batch", roles=["batch"])
    aid = h.register("a1", resources="cpus:4;mem:4096")
    (offer,) = h.offers_to(h.allocate(), "b1")
    tasks = [task(f"job{p}", aid, "cpus:2;mem:2048", priority=p) for p in priorities]
    h.recv("b1", launch(batch, [offer], *tasks))
    for t in tasks:
        h.recv("a1", StatusUpdate(framework_id=batch, status=status(
            t.task_id, TaskState.TASK_RUNNING, uuid="r-" + t.task_id)))
    return batch, aid


def ask(h: Harness, peer: str, fid: str, text: str, priority: int) -> list:
    return h.recv(peer, Preempt(framework_id=fid, resources=R(text), priority=priority))


def test_preempt_is_refused_when_off_or_not_allowed() -> None:
    h = Harness()
    batch_cluster(h)
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    (refusal,) = messages(ask(h, "p1", prod, "cpus:2", 300), Rejected, to="p1")
    assert "--preemption" in refusal.reason
    h = Harness(PREEMPTING)
    batch_cluster(h)
    plain = h.subscribe("p1", name="plain")
    (refusal,) = messages(ask(h, "p1", plain, "cpus:2", 300), Rejected, to="p1")
    assert "PREEMPTION" in refusal.reason
    assert h.metric("master/preemptions_refused") == 1


def test_a_flagged_framework_preempts_the_lowest_priority_task_and_holds_the_room() -> None:
    h = Harness(PREEMPTING)
    batch, _ = batch_cluster(h)
    other = h.subscribe("o1", name="other")
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    sends = ask(h, "p1", prod, "cpus:2;mem:1024", 250)
    (kill,) = messages(sends, KillTask, to="a1")
    assert (kill.task_id, kill.reason) == ("job50", Reason.CONTAINER_PREEMPTED)
    assert "priority 250" in kill.message
    assert h.metric("master/preemptions") == 1
    assert [e for e in h.state.events.since(0) if e.kind == "task_preempted"]
    # Asking again while the victim dies preempts nobody more.
    assert not messages(ask(h, "p1", prod, "cpus:2;mem:1024", 250), KillTask)
    # The agent ends it with the reason; the room goes to the preemptor, not to others.
    h.recv("a1", StatusUpdate(framework_id=batch, status=status(
        "job50", TaskState.TASK_KILLED, uuid="k1", reason=Reason.CONTAINER_PREEMPTED)))
    sends = h.allocate()
    assert h.offers_to(sends, "p1") and not h.offers_to(sends, "o1")
    assert not h.offers_to(sends, "b1")
    assert other != prod


def test_the_victims_revive_does_not_lift_the_hold() -> None:
    """The victim's framework revives when it hears of the preemption (the batch
    core does): the freed room must still go to the preemptor, or it would be
    launched on again and preempted again, round after round."""
    h = Harness(PREEMPTING)
    batch, _ = batch_cluster(h)
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    (kill,) = messages(ask(h, "p1", prod, "cpus:2;mem:1024", 250), KillTask, to="a1")
    h.recv("a1", StatusUpdate(framework_id=batch, status=status(
        kill.task_id, TaskState.TASK_KILLED, uuid="k1", reason=Reason.CONTAINER_PREEMPTED)))
    (offer,) = h.offers_to(h.allocate(), "p1")
    # The preemptor declines for now (its task waits on something else) ...
    h.recv("p1", Decline(framework_id=prod, offer_ids=[offer.id],
                         filters=Filters(refuse_seconds=2)))
    # ... and the victim's framework revives: it is still held off the room.
    h.recv("b1", Revive(framework_id=batch))
    assert not h.offers_to(h.allocate(), "b1")


def test_room_freed_for_one_preemptor_is_not_free_for_another() -> None:
    h = Harness(PREEMPTING)
    batch_cluster(h)
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    low = h.subscribe("l1", name="best-effort", capabilities=["PREEMPTION"])
    (kill,) = messages(ask(h, "p1", prod, "cpus:2;mem:1024", 250), KillTask, to="a1")
    assert kill.task_id == "job50"
    # While job50 dies for prod, a best-effort asker is not told its room is free.
    (refusal,) = messages(ask(h, "l1", low, "cpus:2;mem:1024", 60), Rejected, to="l1")
    assert "below priority 60" in refusal.reason


def test_no_preemption_when_the_room_is_free() -> None:
    h = Harness(PREEMPTING)
    batch_cluster(h, priorities=(50,))
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    assert not messages(ask(h, "p1", prod, "cpus:2", 300), KillTask)
    (kill,) = messages(ask(h, "p1", prod, "cpus:3", 300), KillTask)
    assert kill.task_id == "job50"


def test_nothing_lower_to_preempt_is_refused() -> None:
    h = Harness(PREEMPTING)
    batch_cluster(h, priorities=(250, 260))
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    (refusal,) = messages(ask(h, "p1", prod, "cpus:2", 250), Rejected, to="p1")
    assert "below priority 250" in refusal.reason


def test_rate_limit_bounds_preemptions_per_minute() -> None:
    h = Harness(MasterConfig(preemption=PreemptionConfig(enabled=True, guarantees=False,
                                                         max_per_minute=1)))
    batch_cluster(h, priorities=(10, 20))
    prod = h.subscribe("p1", name="prod", capabilities=["PREEMPTION"])
    kills = messages(ask(h, "p1", prod, "cpus:4", 300), KillTask)
    assert [k.task_id for k in kills] == ["job10"]
    assert h.metric("master/preemptions_rate_limited") == 1


def test_an_unmet_guarantee_is_reclaimed_from_roles_above_theirs() -> None:
    h = Harness(MasterConfig(preemption=PreemptionConfig(enabled=True)))
    batch, aid = batch_cluster(h)
    assert h.call(SetQuota({"prod": Quota(guarantee={"cpus": 2000, "mem": 1024_000})})).ok
    prod = h.subscribe("p1", name="prod", roles=["prod"])
    sends = h.allocate()
    (kill,) = messages(sends, KillTask, to="a1")
    assert kill.task_id == "job50" and "quota guarantee" in kill.message
    h.recv("a1", StatusUpdate(framework_id=batch, status=status(
        "job50", TaskState.TASK_KILLED, uuid="k1", reason=Reason.CONTAINER_PREEMPTED)))
    (offer,) = h.offers_to(h.allocate(), "p1")
    assert offer.resources.get("cpus") == 2
    # Met: nothing more is preempted, and the guaranteed role's tasks are protected.
    h.recv("p1", launch(prod, [offer], task("web", aid, "cpus:2;mem:1024", priority=0)))
    assert not messages(h.advance(30), KillTask)


def test_a_guarantee_preemption_clears_the_starved_frameworks_filters() -> None:
    """A starved framework that declined earlier must be offered what is free and
    what is freed for it at once, not when its own filters expire."""
    h = Harness(MasterConfig(preemption=PreemptionConfig(enabled=True)))
    _, aid = batch_cluster(h, priorities=(50,))  # half of a1 stays free
    prod = h.subscribe("p1", name="prod", roles=["prod"])
    (offer,) = h.offers_to(h.allocate(), "p1")
    h.recv("p1", Decline(framework_id=prod, offer_ids=[offer.id],
                         filters=Filters(refuse_seconds=600)))
    assert h.call(SetQuota({"prod": Quota(guarantee={"cpus": 4000})})).ok
    sends = h.allocate()
    (kill,) = messages(sends, KillTask, to="a1")
    assert kill.task_id == "job50"
    (offer,) = h.offers_to(sends + h.allocate(), "p1")
    assert offer.agent_id == aid and offer.resources.get("cpus") == 2


@pytest.mark.parametrize("suppressed", [True, False])
def test_a_suppressed_role_preempts_nothing(suppressed: bool) -> None:
    h = Harness(MasterConfig(preemption=PreemptionConfig(enabled=True)))
    batch_cluster(h)
    assert h.call(SetQuota({"prod": Quota(guarantee={"cpus": 2000})})).ok
    prod = h.subscribe("p1", name="prod", roles=["prod"])
    if suppressed:
        h.recv("p1", Suppress(framework_id=prod))
        assert not messages(h.advance(5), KillTask)
    else:
        assert messages(h.allocate(), KillTask)  # starved and asking: it preempts
