"""The rolling-upgrade rule: its capacity bounds hold for any mix of tasks (a
property of `plan_deployment`) and through any sequence of events the core may
see while upgrading, scaling, failing and rolling back (a stateful test)."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule)

from dyad.messages import TaskState
from frameworks.service.appdef import AppInvalid, parse_app
from frameworks.service.core import CancelDeployment, PutApp, ServiceConfig
from frameworks.service.deployment import plan_deployment, plan_steady
from frameworks.service.records import AppTask
from frameworks.service.testing import ServiceSim

FRACTIONS = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])


def definition(instances: int, min_health: float, max_over: float, cmd: str = "sleep 1") -> Any:
    return parse_app({"id": "/svc", "cmd": cmd, "instances": instances, "cpus": 0.1,
                      "mem": 16, "upgradeStrategy": {"minimumHealthCapacity": min_health,
                                                     "maximumOverCapacity": max_over}})


def task(i: int, version: str, ready: bool, killing: bool, staged: float) -> AppTask:
    return AppTask(task_id=f"t{i}", app_id="/svc", config_version=version,
                      agent_id="a", hostname="h", staged_at=staged,
                      state=TaskState.TASK_RUNNING if ready else TaskState.TASK_STAGING,
                      kill_requested_at=0.0 if killing else None)


tasks_strategy = st.lists(st.tuples(st.sampled_from(["old", "new"]), st.booleans(),
                                    st.booleans(), st.floats(0, 100)), max_size=12)


@given(instances=st.integers(0, 8), min_health=FRACTIONS, max_over=FRACTIONS,
       described=tasks_strategy)
def test_a_step_never_breaks_the_capacity_bounds(instances: int, min_health: float,
                                                 max_over: float, described: Any) -> None:
    try:
        target = attrs.evolve(definition(instances, min_health, max_over), config_version="new")
    except AppInvalid:
        assume(False)
        raise
    tasks = [task(i, v, r, k, s) for i, (v, r, k, s) in enumerate(described)]
    plan = plan_deployment(target, tasks)
    least, most = target.upgrade_strategy.bounds(instances)
    ready = sum(t.ready for t in tasks)
    ready_killed = sum(t.ready for t in plan.kill)
    assert ready_killed <= max(0, ready - least)
    assert len(tasks) + plan.start <= max(most, len(tasks))
    assert all(not t.killing for t in plan.kill)
    new_kept = sum(t.config_version == "new" and not t.killing for t in tasks) - \
        sum(t.config_version == "new" for t in plan.kill)
    assert new_kept + plan.start <= instances
    if plan.done:
        assert plan.start == 0 and not plan.kill


@given(instances=st.integers(0, 6), described=tasks_strategy)
def test_steady_state_converges_on_instances(instances: int, described: Any) -> None:
    app = attrs.evolve(definition(instances, 1.0, 1.0), config_version="new")
    tasks = [task(i, v, r, k, s) for i, (v, r, k, s) in enumerate(described)]
    plan = plan_steady(app, tasks)
    active = [t for t in tasks if not t.killing]
    assert len(active) - len(plan.kill) + plan.start == instances
    # Unready and outdated tasks go before ready current ones.
    if plan.kill:
        worst_kept = [t for t in active if t not in plan.kill]
        for kept in worst_kept:
            for gone in plan.kill:
                assert (gone.ready, gone.config_version == "new") <= \
                    (kept.ready, kept.config_version == "new")


class DeploymentMachine(RuleBasedStateMachine):
    """Upgrades, scales, failures, kills and rollbacks in any order: every kill of a
    ready task leaves at least ``least`` ready tasks, every launch leaves at most
    ``most`` live ones (for the deployment in force after the step)."""

    @initialize(instances=st.integers(1, 5), min_health=FRACTIONS, max_over=FRACTIONS)
    def start(self, instances: int, min_health: float, max_over: float) -> None:
        try:
            app = definition(instances, min_health, max_over)
        except AppInvalid:
            assume(False)
            raise
        self.strategy = (min_health, max_over)
        self.sim = ServiceSim(agents=4, config=ServiceConfig(deployment_timeout=100))
        self.sim.register()
        self.sim.command(PutApp(app))
        self.sim.offer_all()
        self.sim.run_all("/svc")
        self.version = 0

    def _checked(self, action: Any) -> None:
        ready_before = {t.task_id for t in self.sim.tasks("/svc") if t.ready}
        action()
        app = self.sim.core.apps.get("/svc")
        if app is None:
            return
        least, most = app.upgrade_strategy.bounds(app.instances)
        deploying = self.sim.core.deployment_of("/svc") is not None
        live = self.sim.tasks("/svc")
        ready_now = sum(t.ready for t in live)
        if ready_before & set(self.sim.killed()) and deploying:
            assert ready_now >= least, (ready_now, least)
        if self.sim.launched():
            if deploying:
                assert len(live) <= most, (len(live), most)
            else:
                assert sum(not t.killing for t in live) <= app.instances

    @rule(instances=st.integers(0, 5), change=st.booleans())
    def update(self, instances: int, change: bool) -> None:
        """A new definition, forced over any deployment in progress."""
        if change:
            self.version += 1
        try:
            app = definition(instances, *self.strategy, cmd=f"sleep {self.version + 1}")
        except AppInvalid:
            return
        self._checked(lambda: self.sim.command(PutApp(app, force=True)))

    @rule()
    def offers(self) -> None:
        self._checked(self.sim.offer_all)

    @rule(data=st.data())
    def a_task_runs(self, data: st.DataObject) -> None:
        waiting = [t for t in self.sim.tasks("/svc") if t.state is not TaskState.TASK_RUNNING]
        if waiting:
            chosen = data.draw(st.sampled_from(waiting))
            self._checked(lambda: self.sim.update(chosen.task_id, TaskState.TASK_RUNNING))

    @rule(data=st.data(), state=st.sampled_from([TaskState.TASK_FAILED, TaskState.TASK_LOST]))
    def a_task_dies(self, data: st.DataObject, state: TaskState) -> None:
        tasks = self.sim.tasks("/svc")
        if tasks:
            chosen = data.draw(st.sampled_from(tasks))
            self._checked(lambda: self.sim.update(chosen.task_id, state))

    @rule()
    def kills_complete(self) -> None:
        self._checked(self.sim.finish_kills)

    @rule(seconds=st.sampled_from([1.0, 30.0, 120.0]))
    def time_passes(self, seconds: float) -> None:
        self._checked(lambda: self.sim.advance(seconds))

    @precondition(lambda self: bool(self.sim.core.deployments))
    @rule()
    def user_rolls_back(self) -> None:
        (deployment,) = self.sim.core.deployments.values()
        self._checked(lambda: self.sim.command(CancelDeployment(deployment.id)))

    @invariant()
    def never_more_than_one_deployment(self) -> None:
        assert len(self.sim.core.deployments) <= 1


TestDeploymentMachine = DeploymentMachine.TestCase
TestDeploymentMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
