"""`dyad sim fit`: how many more instances of an app fit, and where.

The question is answered by asking the real service core: the cell is brought
to "now" (empty, or a workload replayed up to `at`), then a fresh service
framework in `role` is given the app with as many instances as could possibly
fit by resources alone, and the simulation runs until the number of running
instances stops growing. The service core places them as it would in
production -- its constraint checks, its round-robin spreading, the
allocator's offers to the role -- so what is running at the end is the answer:
how many, on which agents, and why the rest did not fit (the core's own
"unplaced" explanation, by reason).

The answer is for `role`: other roles' quota guarantees not yet in use are
held back from it by the allocator, as they would be in production.

"Now" moves on while the probe runs (about three offer-refusal periods of
simulated time): a workload with arrivals in that window affects the answer.
"""

from __future__ import annotations

from collections import Counter

import attrs

from dyad.resources import Resources
from frameworks.service.appdef import AppDefinition
from sim.cell import Cell
from sim.frameworks import ServiceFramework
from sim.policy import Policy
from sim.run import Simulation
from sim.workload import AppArrival, Shape, UsageSpec, Workload

PROBE = "dyad-sim-fit"


@attrs.frozen
class FitResult:
    app_id: str
    fits: int
    upper_bound: int
    by_agent: dict[str, int]
    unplaced: dict[str, int]
    example: str
    at: float


def upper_bound(cell: Cell, app: AppDefinition) -> int:
    """Instances the agents' totals could hold, ignoring everything else."""
    ask = {"cpus": app.cpus, "mem": app.mem, "disk": app.disk}
    count = 0
    for group in cell.groups:
        total: Resources = group.resources
        per_agent = min((int(total.get(kind) // want) for kind, want in ask.items() if want > 0),
                        default=0)
        count += group.count * per_agent
    return count


def fit(cell: Cell, app: AppDefinition, *, role: str = "*", policy: Policy | None = None,
        workload: Workload | None = None, at: float = 0.0, seed: int = 0) -> FitResult:
    policy = policy or Policy()
    simulation = Simulation(cell, workload or Workload((), None),
                            attrs.evolve(policy, until=None), seed=seed)
    engine = simulation.engine
    engine.run(at)
    bound = upper_bound(cell, app)
    probe = attrs.evolve(app, instances=bound)
    shape = Shape(cpus=app.cpus, mem=app.mem, disk=app.disk, duration=None,
                  cpus_usage=UsageSpec(None), mem_usage=UsageSpec(None))
    framework = ServiceFramework(engine, PROBE, role, seed, simulation.recorder, simulation.info,
                                 policy.service_refuse_seconds)
    simulation.frameworks[PROBE] = framework
    framework.start(engine.now)
    framework.put(AppArrival(at=engine.now, where="fit", framework=PROBE, role=role,
                             priority=200, app=probe, task=shape), engine.now)
    quiet_for = 3 * max(policy.service_refuse_seconds, policy.allocation_interval)
    running, stable_since = -1, engine.now
    while bound:
        engine.run(engine.now + policy.allocation_interval * 5)
        now_running = _running(framework, app.id)
        if now_running != running:
            running, stable_since = now_running, engine.now
        elif now_running >= bound or engine.now - stable_since >= quiet_for:
            break
    by_agent: Counter[str] = Counter()
    for task in framework.core.tasks_of(app.id):
        if task.started_at is not None:
            by_agent[task.hostname] += 1
    runtime = framework.core.runtime(app.id)
    return FitResult(app_id=app.id, fits=sum(by_agent.values()), upper_bound=bound,
                     by_agent=dict(sorted(by_agent.items())),
                     unplaced=dict(sorted(runtime.unplaced.items())),
                     example=runtime.unplaced_example, at=at)


def _running(framework: ServiceFramework, app_id: str) -> int:
    return sum(1 for task in framework.core.tasks_of(app_id) if task.started_at is not None)
