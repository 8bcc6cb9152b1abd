"""The service framework's core: launching, replacing, backoff, constraints, offer
interest, deployments, rollback and recovery, all on fake offers and a fake clock."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from dyad.effects import ArmTimer, TimerFired, UnknownTimer
from dyad.messages import Reason, TaskState
from frameworks.service import views
from frameworks.service.appdef import parse_app
from frameworks.effects import (
    DeclineOffers, LaunchTasks, ReconcileTasks, RequestKill, ReviveOffers, SuppressOffers)
from frameworks.service.core import (
    AgentLost, CancelDeployment, Conflict, DeleteApp, KillTasks, NotFound, Persist, PutApp,
    ResetDelay, RestartApp, ServiceConfig, Wake)
from frameworks.service.testing import ServiceSim

WEB = {"id": "/web", "cmd": "python3 -m http.server $PORT0", "instances": 3, "cpus": 0.1,
       "mem": 64, "ports": [0]}


def app(**fields: Any) -> Any:
    return parse_app({**WEB, **fields})


def started(sim: ServiceSim, **fields: Any) -> ServiceSim:
    """`sim` with /web created, launched and running."""
    sim.register()
    sim.command(PutApp(app(**fields), create_only=True))
    sim.offer_all()
    sim.run_all("/web")
    return sim


def live(sim: ServiceSim, app_id: str = "/web") -> list[Any]:
    return [t for t in sim.tasks(app_id) if not t.killing]


# ------------------------------------------------------------------ launching


def test_a_timer_the_core_never_arms_is_a_bug() -> None:
    sim = ServiceSim(agents=1)
    sim.register()
    with pytest.raises(UnknownTimer):
        sim.step(TimerFired("wake"))


def test_app_launches_its_instances_one_per_host_with_ports_in_the_environment() -> None:
    sim = ServiceSim(agents=3)
    sim.register()
    outcome = sim.command(PutApp(app(constraints=[["hostname", "UNIQUE"]]), create_only=True))
    assert ReviveOffers() in outcome.effects
    effects = sim.offer_all()
    tasks = sim.launched()
    assert sorted(t.agent_id for t in tasks) == ["agent-0", "agent-1", "agent-2"]
    for task in tasks:
        (port,) = [p for p, _ in task.resources.ranges("ports")]
        env = task.command.environment
        assert env["PORT0"] == env["PORT"] == env["PORTS"] == str(port)
        assert env["MARATHON_APP_ID"] == "/web" and env["HOST"].startswith("agent")
        assert task.command.shell == WEB["cmd"] and task.name == "/web"
    # The store holds every task before the launch that covers it goes out.
    first_launch = next(i for i, e in enumerate(effects) if isinstance(e, LaunchTasks))
    persisted = [e.key for e in effects[:first_launch] if isinstance(e, Persist)]
    assert effects[first_launch].tasks[0].task_id in persisted
    assert effects[-1] == SuppressOffers()   # nothing more wanted: no more offers
    sim.run_all("/web")
    assert not sim.core.deployments


def test_tasks_spread_round_robin_over_offers_without_constraints() -> None:
    sim = started(ServiceSim(agents=3))
    assert Counter(t.hostname for t in sim.tasks("/web")) == {"agent0": 1, "agent1": 1,
                                                             "agent2": 1}


def test_unplaceable_tasks_wait_with_a_reason_and_offers_are_declined() -> None:
    sim = ServiceSim(agents=3)
    sim.register()
    sim.command(PutApp(app(instances=4, constraints=[["hostname", "UNIQUE"]])))
    sim.offer_all()
    assert len(sim.launched()) == 3
    sim.run_all("/web")
    effects = sim.offer_all()
    assert sim.launched(effects) == []
    (decline,) = [e for e in effects if isinstance(e, DeclineOffers)]
    assert len(decline.offer_ids) == 3 and decline.refuse_seconds == 30
    reason = views.waiting_reason(sim.core, "/web", sim.now)
    assert reason is not None and "UnfulfilledConstraint x3" in reason
    assert "hostname:UNIQUE" in reason
    (entry,) = views.queue_json(sim.core, sim.now)["queue"]
    assert entry["count"] == 1
    assert entry["processedOffersSummary"]["rejectSummaryLastOffers"] == [
        {"reason": "UnfulfilledConstraint", "declined": 3, "processed": 3}]


def test_resources_that_do_not_fit_are_named() -> None:
    sim = ServiceSim(agents=1, resources="cpus:0.05;mem:4096")
    sim.register()
    sim.command(PutApp(app(instances=1)))
    sim.offer_all()
    assert sim.launched() == []
    assert "InsufficientCpus" in (views.waiting_reason(sim.core, "/web", sim.now) or "")


def test_fixed_host_port_must_be_offered() -> None:
    sim = ServiceSim(agents=2)
    sim.register()
    sim.command(PutApp(app(instances=2, ports=[31500])))
    sim.offer_all()
    (task,) = sim.launched()
    assert task.agent_id == "agent-0" and task.resources.ranges("ports") == [(31500, 31500)]
    assert "InsufficientPorts" in (views.waiting_reason(sim.core, "/web", sim.now) or "")


def test_group_by_spreads_tasks_over_racks() -> None:
    sim = ServiceSim(agents=3)  # racks r1, r2, r1
    sim.register()
    sim.command(PutApp(app(instances=5, constraints=[["rack", "GROUP_BY"]])))
    sim.offer_all()
    sim.offer_all()
    racks = Counter(t.attributes["rack"] for t in sim.tasks("/web"))
    assert racks == {"r1": 3, "r2": 2}


def test_idle_framework_suppresses_and_new_demand_revives() -> None:
    sim = ServiceSim()
    sim.register()
    sim.command(PutApp(app()))
    assert SuppressOffers() in sim.offer_all()
    sim.run_all("/web")
    sim.offer_all()  # a late offer is declined, not held
    assert any(isinstance(e, DeclineOffers) for e in sim.last)
    outcome = sim.command(PutApp(app(instances=4)))
    assert ReviveOffers() in outcome.effects


# ------------------------------------------------------- failures and backoff


def test_failed_task_is_replaced_after_a_growing_backoff() -> None:
    sim = started(ServiceSim())
    delays = []
    for _ in range(4):
        victim = sim.tasks("/web")[0]
        effects = sim.update(victim.task_id, TaskState.TASK_FAILED, message="exit 1")
        (timer,) = [e for e in effects if isinstance(e, ArmTimer) and e.key == Wake()]
        delays.append(round(timer.at - sim.now, 4))
        assert sim.launched(sim.offer_all()) == []  # still backing off
        assert "backing off" in (views.waiting_reason(sim.core, "/web", sim.now) or "")
        assert ReviveOffers() in sim.advance(timer.at - sim.now)
        assert len(sim.launched(sim.offer_all())) == 1
        sim.run_all("/web")
    assert delays == [1.0, 1.15, 1.3225, 1.5209]
    failure = sim.core.runtime("/web").last_failure
    assert failure is not None and failure["state"] == "TASK_FAILED"
    assert failure["message"] == "exit 1"


def test_a_crash_looping_app_cannot_flood_the_cluster() -> None:
    sim = started(ServiceSim(), instances=1, maxLaunchDelaySeconds=60)
    launched_at = []
    for _ in range(2400):  # twenty minutes of offers every half second
        for task in live(sim):
            sim.update(task.task_id, TaskState.TASK_FAILED)
        sim.advance(0.5)
        if sim.launched(sim.offer_all()):
            launched_at.append(sim.now)
        sim.run_all("/web")
    gaps = [b - a for a, b in zip(launched_at, launched_at[1:])]
    # 1 s x 1.15^k: about 30 launches before the 60 s cap, then one a minute.
    assert 40 <= len(launched_at) <= 50
    assert gaps == sorted(gaps) and max(gaps) <= 60.5 and gaps[-1] >= 60


def test_backoff_restarts_after_a_task_ran_long_enough() -> None:
    sim = started(ServiceSim(config=ServiceConfig(backoff_reset_after=60)), instances=1)
    for _ in range(3):
        sim.update(live(sim)[0].task_id, TaskState.TASK_FAILED)
        sim.advance(10)
        sim.offer_all()
        sim.run_all("/web")
    assert sim.core.runtime("/web").failures == 3
    sim.advance(61)
    sim.update(live(sim)[0].task_id, TaskState.TASK_FAILED)
    assert sim.core.runtime("/web").failures == 1
    sim.command(ResetDelay("/web"))
    assert sim.core.runtime("/web").failures == 0
    assert len(sim.launched(sim.offer_all())) == 1


def test_lost_task_is_replaced_at_once() -> None:
    sim = started(ServiceSim())
    victim = sim.tasks("/web")[0]
    sim.step(AgentLost(victim.agent_id))
    sim.update(victim.task_id, TaskState.TASK_LOST, reason=Reason.AGENT_UNREACHABLE)
    assert len(sim.launched(sim.offer_all())) == 1


def test_health_check_failures_make_a_task_not_ready_then_replace_it() -> None:
    health = [{"protocol": "HTTP", "path": "/", "portIndex": 0, "gracePeriodSeconds": 5,
               "intervalSeconds": 2, "maxConsecutiveFailures": 2}]
    sim = started(ServiceSim(), healthChecks=health)
    task = sim.tasks("/web")[0]
    body = views.app_json(sim.core, sim.core.apps["/web"], sim.now)
    assert (body["tasksRunning"], body["tasksHealthy"], body["tasksUnhealthy"]) == (3, 3, 0)
    sim.update(task.task_id, TaskState.TASK_RUNNING, healthy=False)
    body = views.app_json(sim.core, sim.core.apps["/web"], sim.now)
    assert (body["tasksHealthy"], body["tasksUnhealthy"]) == (2, 1)
    sim.update(task.task_id, TaskState.TASK_FAILED, message="health check failed")
    sim.advance(1)
    assert len(sim.launched(sim.offer_all())) == 1


def test_health_check_is_bound_to_the_chosen_port() -> None:
    sim = ServiceSim(agents=1)
    sim.register()
    sim.command(PutApp(app(instances=1, healthChecks=[{"protocol": "MESOS_HTTP",
                                                       "path": "/ok", "portIndex": 0}])))
    (task,) = sim.launched(sim.offer_all())
    assert task.health_check.port == int(task.command.environment["PORT0"])
    assert (task.health_check.type, task.health_check.path) == ("HTTP", "/ok")


# ------------------------------------------------------------------- scaling


def test_scale_down_kills_the_youngest_first_and_passes_the_grace_period() -> None:
    sim = ServiceSim()
    sim.register()
    sim.command(PutApp(app(instances=2, taskKillGracePeriodSeconds=7)))
    sim.offer_all()
    sim.run_all("/web")
    sim.advance(5)
    sim.command(PutApp(app(instances=3, taskKillGracePeriodSeconds=7)))
    sim.offer_all()
    youngest = [t.task_id for t in sim.tasks("/web")][-1]
    sim.run_all("/web")
    outcome = sim.command(PutApp(app(instances=2, taskKillGracePeriodSeconds=7)))
    kills = [e for e in outcome.effects if isinstance(e, RequestKill)]
    assert kills == [RequestKill(youngest, 7.0)]
    sim.finish_kills()
    assert not sim.core.deployments


def test_scale_down_with_oldest_first() -> None:
    sim = started(ServiceSim(), killSelection="OLDEST_FIRST", instances=1)
    sim.advance(5)
    sim.command(PutApp(app(killSelection="OLDEST_FIRST", instances=2)))
    sim.offer_all()
    sim.run_all("/web")
    oldest = sim.tasks("/web")[0].task_id
    sim.command(PutApp(app(killSelection="OLDEST_FIRST", instances=1)))
    assert sim.killed() == [oldest]


def test_scale_keeps_tasks_and_their_version() -> None:
    sim = started(ServiceSim())
    before = {t.task_id for t in sim.tasks("/web")}
    sim.command(PutApp(app(instances=5)))
    assert sim.core.deployment_of("/web").kind == "scale"
    sim.offer_all()
    assert before < {t.task_id for t in sim.tasks("/web")}
    assert len({t.config_version for t in sim.tasks("/web")}) == 1


def test_kill_with_scale_lowers_instances_and_without_it_replaces() -> None:
    sim = started(ServiceSim())
    first, second = [t.task_id for t in sim.tasks("/web")][:2]
    sim.command(KillTasks("/web", (first,)))
    assert sim.killed() == [first]
    sim.finish_kills()
    assert len(sim.launched(sim.offer_all())) == 1
    sim.run_all("/web")
    outcome = sim.command(KillTasks("/web", (second,), scale=True))
    assert sim.core.apps["/web"].instances == 2 and outcome.deployment_id
    sim.finish_kills()
    assert sim.launched(sim.offer_all()) == [] and not sim.core.deployments
    with pytest.raises(NotFound):
        sim.command(KillTasks("/web", ("web.nope",)))


def test_unanswered_kill_is_sent_again() -> None:
    sim = started(ServiceSim(config=ServiceConfig(kill_retry=30)))
    sim.command(PutApp(app(instances=2)))
    (victim,) = sim.killed()
    sim.advance(20)
    assert sim.killed() == []
    sim.advance(11)
    assert sim.killed() == [victim]


# --------------------------------------------------------------- deployments


def test_rolling_upgrade_starts_new_before_killing_old_within_bounds() -> None:
    strategy = {"minimumHealthCapacity": 1.0, "maximumOverCapacity": 0.5}
    sim = started(ServiceSim(), upgradeStrategy=strategy)
    old = {t.task_id for t in sim.tasks("/web")}
    outcome = sim.command(PutApp(app(cmd="python3 -m http.server $PORT0 --bind 127.0.0.1",
                                     upgradeStrategy=strategy)))
    assert sim.core.deployment_of("/web").kind == "upgrade"
    assert not [e for e in outcome.effects if isinstance(e, RequestKill)]
    for _ in range(3):
        assert len(sim.launched(sim.offer_all())) == 1   # 3 x 1.5 = 4 tasks at most
        assert len(sim.tasks("/web")) == 4
        assert sim.killed() == []
        sim.run_all("/web")                            # new one ready: one old goes
        (killed,) = sim.killed()
        assert killed in old
        sim.finish_kills()
    assert not sim.core.deployments
    assert not old & {t.task_id for t in sim.tasks("/web")}


def test_minimum_health_zero_kills_everything_first() -> None:
    strategy = {"minimumHealthCapacity": 0.0, "maximumOverCapacity": 0.0}
    sim = started(ServiceSim(), upgradeStrategy=strategy)
    sim.command(PutApp(app(cmd="sleep 1000", upgradeStrategy=strategy)))
    assert len(sim.killed()) == 3
    assert sim.launched(sim.offer_all()) == []
    sim.finish_kills()
    assert len(sim.launched(sim.offer_all())) == 3


def test_upgrade_whose_tasks_never_become_healthy_rolls_back() -> None:
    health = [{"protocol": "HTTP", "portIndex": 0}]
    strategy = {"minimumHealthCapacity": 1.0, "maximumOverCapacity": 0.5}
    sim = started(ServiceSim(config=ServiceConfig(deployment_timeout=60)),
                  healthChecks=health, upgradeStrategy=strategy)
    old_version = sim.core.apps["/web"].config_version
    old = {t.task_id for t in sim.tasks("/web")}
    sim.command(PutApp(app(cmd="sleep 1000", healthChecks=health, upgradeStrategy=strategy)))
    (new,) = sim.launched(sim.offer_all())
    sim.update(new.task_id, TaskState.TASK_RUNNING, healthy=False)
    assert sim.killed() == []
    sim.advance(59)
    assert sim.core.deployment_of("/web").kind == "upgrade"
    sim.advance(1)
    rollback = sim.core.deployment_of("/web")
    assert rollback.kind == "rollback" and not rollback.auto_rollback
    assert sim.killed() == [new.task_id]
    assert sim.core.apps["/web"].config_version == old_version
    assert sim.core.apps["/web"].cmd == WEB["cmd"]
    sim.finish_kills()
    assert not sim.core.deployments
    assert {t.task_id for t in sim.tasks("/web")} == old
    assert sim.core.counters["deployments_rolled_back"] == 1


def test_progress_postpones_the_rollback_deadline() -> None:
    strategy = {"minimumHealthCapacity": 1.0, "maximumOverCapacity": 0.34}
    sim = started(ServiceSim(config=ServiceConfig(deployment_timeout=60)),
                  upgradeStrategy=strategy)
    sim.command(PutApp(app(cmd="sleep 1000", upgradeStrategy=strategy)))
    for _ in range(2):
        sim.advance(50)
        sim.offer_all()
        sim.run_all("/web")
        sim.finish_kills()
    assert sim.core.deployment_of("/web").kind == "upgrade"


def test_locked_app_conflicts_unless_forced() -> None:
    sim = ServiceSim()
    sim.register()
    first = sim.command(PutApp(app()))
    with pytest.raises(Conflict) as info:
        sim.command(PutApp(app(instances=5)))
    assert info.value.deployment_ids == [first.deployment_id]
    assert sim.core.apps["/web"].instances == 3   # refused: nothing changed
    with pytest.raises(Conflict):
        sim.command(PutApp(app(), create_only=True))
    forced = sim.command(PutApp(app(instances=5), force=True))
    assert set(sim.core.deployments) == {forced.deployment_id}
    with pytest.raises(Conflict):
        sim.command(DeleteApp("/web"))
    with pytest.raises(NotFound):
        sim.command(RestartApp("/nope"))


def test_cancelling_a_deployment_rolls_it_back_or_with_force_just_stops() -> None:
    sim = started(ServiceSim())
    version = sim.core.apps["/web"].config_version
    upgrade = sim.command(PutApp(app(cmd="sleep 1000")))
    sim.offer_all()
    rollback = sim.command(CancelDeployment(upgrade.deployment_id))
    assert sim.core.deployment_of("/web").id == rollback.deployment_id
    assert sim.core.apps["/web"].config_version == version
    sim.finish_kills()
    assert not sim.core.deployments and len(sim.tasks("/web")) == 3
    restart = sim.command(RestartApp("/web"))
    sim.command(CancelDeployment(restart.deployment_id, force=True))
    assert not sim.core.deployments
    with pytest.raises(NotFound):
        sim.command(CancelDeployment("nope"))


def test_cancelling_a_create_removes_the_app() -> None:
    sim = ServiceSim()
    sim.register()
    create = sim.command(PutApp(app()))
    sim.offer_all()
    sim.command(CancelDeployment(create.deployment_id))
    assert "/web" not in sim.core.apps and len(sim.killed()) == 3


def test_delete_kills_everything_then_forgets_the_app() -> None:
    sim = started(ServiceSim())
    outcome = sim.command(DeleteApp("/web"))
    assert len(sim.killed()) == 3 and "/web" not in sim.core.apps
    assert sim.core.deployments[outcome.deployment_id].kind == "delete"
    sim.finish_kills()
    assert not sim.core.deployments and not sim.core.tasks
    assert sim.store["apps"] == {} and sim.store["tasks"] == {}


# ------------------------------------------------------ failover and recovery


def test_a_restarted_framework_reconciles_and_starts_no_duplicates() -> None:
    sim = started(ServiceSim())
    sim.command(PutApp(app(instances=4)))     # a deployment is still running...
    sim.offer_all()
    known = {t.task_id for t in sim.tasks("/web")}
    restarted = ServiceSim(snapshot=sim.snapshot())
    assert restarted.core.framework_id == "framework-1"
    effects = restarted.register("framework-1")
    reconciles = [e for e in effects if isinstance(e, ReconcileTasks)]
    assert {t for t, _ in reconciles[0].tasks} == known and reconciles[1].tasks == ()
    assert not [e for e in effects if isinstance(e, Persist) and e.kind == "framework"]
    assert restarted.launched(restarted.offer_all()) == []
    # The master answers; one task it does not know is replaced, nothing else.
    for task_id in sorted(known)[:-1]:
        restarted.update(task_id, TaskState.TASK_RUNNING, reason=Reason.RECONCILIATION)
    restarted.update(sorted(known)[-1], TaskState.TASK_LOST, reason=Reason.RECONCILIATION)
    assert len(restarted.launched(restarted.offer_all())) == 1
    restarted.run_all("/web")
    assert not restarted.core.deployments


def test_unconfirmed_tasks_are_reconciled_again() -> None:
    sim = started(ServiceSim(config=ServiceConfig(reconcile_retry=30)))
    restarted = ServiceSim(snapshot=sim.snapshot(), config=ServiceConfig(reconcile_retry=30))
    restarted.register()
    quiet = restarted.tasks("/web")[0]
    for task in restarted.tasks("/web")[1:]:
        restarted.update(task.task_id, TaskState.TASK_RUNNING)
    effects = restarted.advance(30)
    assert ReconcileTasks(((quiet.task_id, quiet.agent_id),)) in effects


def test_tasks_nobody_knows_are_killed() -> None:
    sim = started(ServiceSim())
    sim.update("old.task", TaskState.TASK_RUNNING)
    assert sim.killed() == ["old.task"]
    sim.update("old.task", TaskState.TASK_KILLED)
    assert sim.core.counters["orphans_killed"] == 1


def test_restored_deployments_get_a_fresh_deadline() -> None:
    sim = started(ServiceSim(config=ServiceConfig(deployment_timeout=60)))
    sim.command(PutApp(app(cmd="sleep 1000")))
    restarted = ServiceSim(snapshot=sim.snapshot(), config=ServiceConfig(deployment_timeout=60))
    restarted.clock.advance(500)
    restarted.register()
    restarted.advance(59)
    assert restarted.core.deployment_of("/web").kind == "upgrade"
