"""Revocable resources on the master (master/revocable.py): offered apart and
marked, only to frameworks that opt in, never in DRF shares or quota; tasks on
them are marked; offers the agent no longer covers are rescinded. Every step is
validated by the harness (the books, revocable amounts included)."""

from __future__ import annotations

from dyad.messages import (
    Decline,
    Filters,
    Kill,
    KillTask,
    Rescind,
    Revive,
    RunTask,
    StatusUpdate,
    Suppress,
    TaskState,
    UsageReport,
)
from dyad.resources import Resources
from master.model import MasterConfig
from tests.unit.test_master_state import Harness, launch, messages, status, task

REVOCABLE = ["REVOCABLE_RESOURCES"]


def lend(h: Harness, aid: str, peer: str = "a1", text: str = "cpus:2;mem:1024") -> list:
    return h.recv(peer, UsageReport(agent_id=aid, revocable=Resources.parse(text),
                                    reservation=Resources.parse("cpus:1;mem:256")))


def full_cluster(h: Harness) -> tuple[str, str, str]:
    """A service framework holding the whole agent, and a batch framework that
    opts in to revocable resources; the agent lends cpus:2;mem:1024."""
    service = h.subscribe("s1", name="service")
    aid = h.register("a1", resources="cpus:4;mem:4096")
    (offer,) = h.offers_to(h.allocate(), "s1")
    h.recv("s1", launch(service, [offer], task("svc", aid, "cpus:4;mem:4096")))
    batch = h.subscribe("b1", name="batch", capabilities=REVOCABLE)
    h.allocate()
    return service, batch, aid


def test_opted_in_framework_gets_revocable_offers_and_others_never() -> None:
    h = Harness()
    service, batch, aid = full_cluster(h)
    plain = h.subscribe("p1", name="plain")
    lend(h, aid)
    sends = h.allocate()
    (offer,) = h.offers_to(sends, "b1")
    assert offer.resources == Resources() and offer.revocable == Resources.parse("cpus:2;mem:1024")
    assert not h.offers_to(sends, "p1") and not h.offers_to(sends, "s1")
    assert h.metric("master/cpus_revocable_offered") == 2
    view = next(f for f in h.state.snapshot()["frameworks"] if f["id"] == batch)
    assert view["offers"][0]["revocable"]["mem"] == 1024
    assert plain != batch != service


def test_revocable_task_is_marked_and_counts_toward_no_share() -> None:
    h = Harness()
    _, batch, aid = full_cluster(h)
    lend(h, aid)
    (offer,) = h.offers_to(h.allocate(), "b1")
    share = h.state.allocator.share(batch)
    sends = h.recv("b1", launch(batch, [offer], task("be", aid, "cpus:1;mem:512",
                                                      revocable=True, priority=50)))
    (run,) = messages(sends, RunTask, to="a1")
    assert run.task.revocable and run.task.priority == 50
    assert h.state.allocator.share(batch) == share == 0.0
    agent = h.state.agents[aid]
    assert agent.revocable_used == Resources.parse("cpus:1;mem:512")
    assert agent.used == Resources.parse("cpus:4;mem:4096")  # the service's, untouched
    (view,) = [t for f in h.state.snapshot()["frameworks"] for t in f["tasks"] if t["id"] == "be"]
    assert view["revocable"] and view["band"] == "best-effort"
    # It ends: what it held is lendable again.
    h.recv("a1", StatusUpdate(framework_id=batch, status=status(
        "be", TaskState.TASK_KILLED, reason="REASON_CONTAINER_PREEMPTED")))
    assert agent.revocable_used == Resources()


def test_revocable_launches_are_checked() -> None:
    h = Harness()
    _, batch, aid = full_cluster(h)
    lend(h, aid)
    (offer,) = h.offers_to(h.allocate(), "b1")
    sends = h.recv("b1", launch(batch, [offer],
                                task("big", aid, "cpus:3;mem:512", revocable=True),
                                task("ports", aid, "cpus:1;ports:[31000-31000]", revocable=True),
                                task("own", aid, "cpus:1", revocable=False)))
    errors = {u.status.task_id: u.status.message for u in messages(sends, type(sends[0].message))
              if u.status.state == TaskState.TASK_ERROR}
    assert "revocable" in errors["big"]
    assert "cpus and mem only" in errors["ports"]
    assert "only nothing remains" in errors["own"] or "remains" in errors["own"]
    assert h.state.agents[aid].revocable_used == Resources()


def test_a_framework_without_the_capability_cannot_launch_revocable() -> None:
    h = Harness()
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    sends = h.recv("f1", launch(fid, [offer], task("t", aid, revocable=True)))
    (update,) = [s.message for s in sends if s.to == "f1"]
    assert update.status.state == TaskState.TASK_ERROR
    assert "REVOCABLE_RESOURCES" in update.status.message


def test_shrinking_report_rescinds_revocable_offers() -> None:
    h = Harness()
    _, _, aid = full_cluster(h)
    lend(h, aid)
    (offer,) = h.offers_to(h.allocate(), "b1")
    sends = lend(h, aid, text="cpus:1;mem:256")
    assert [m.offer_id for m in messages(sends, Rescind, to="b1")] == [offer.id]
    (again,) = h.offers_to(h.allocate(), "b1")
    assert again.revocable == Resources.parse("cpus:1;mem:256")


def test_decline_filters_revocable_offers_until_revive() -> None:
    h = Harness()
    _, batch, aid = full_cluster(h)
    lend(h, aid)
    (offer,) = h.offers_to(h.allocate(), "b1")
    h.recv("b1", Decline(framework_id=batch, offer_ids=[offer.id],
                         filters=Filters(refuse_seconds=60)))
    assert not h.offers_to(h.advance(5), "b1")
    h.recv("b1", Revive(framework_id=batch))
    assert h.offers_to(h.allocate(), "b1")


def test_suppressed_or_disabled_gets_nothing() -> None:
    h = Harness()
    _, batch, aid = full_cluster(h)
    h.recv("b1", Suppress(framework_id=batch))
    lend(h, aid)
    assert not h.offers_to(h.allocate(), "b1")
    off = Harness(MasterConfig(oversubscription=False))
    _, _, aid2 = full_cluster(off)
    lend(off, aid2)
    assert not off.offers_to(off.allocate(), "b1")
    assert off.state.agents[aid2].revocable == Resources()


def test_reports_lend_at_most_the_agent_and_only_cpus_and_mem() -> None:
    h = Harness()
    _, _, aid = full_cluster(h)
    lend(h, aid, text="cpus:99;mem:100;gpus:3;disk:50")
    assert h.state.agents[aid].revocable == Resources.parse("cpus:4;mem:100")


def test_non_revocable_offer_on_the_same_agent_absorbs_a_revocable_only_one() -> None:
    h = Harness()
    fid = h.subscribe("f1", capabilities=REVOCABLE)
    aid = h.register("a1", resources="cpus:4;mem:4096")
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(fid, [offer], task("svc", aid, "cpus:2;mem:2048"), refuse=6))
    lend(h, aid, text="cpus:1;mem:1024")
    (lent,) = h.offers_to(h.allocate(), "f1")  # the rest is filtered for 6 s
    assert lent.resources == Resources() and lent.revocable
    sends = h.advance(7)
    assert [m.offer_id for m in messages(sends, Rescind, to="f1")] == [lent.id]
    (both,) = h.offers_to(sends, "f1")
    assert both.resources == Resources.parse("cpus:2;mem:2048")
    assert both.revocable == Resources.parse("cpus:1;mem:1024")
    sends = h.recv("f1", launch(fid, [both], task("be", aid, "cpus:1;mem:512", revocable=True),
                                task("prod", aid, "cpus:2;mem:2048")))
    assert {m.task.task_id for m in messages(sends, RunTask)} == {"be", "prod"}
    # A kill of a revocable task goes to the agent as any other.
    h.recv("f1", Kill(framework_id=fid, task_id="be"))
    assert messages(h.log, KillTask)
