"""One simulation: a cell, a workload and a policy put on the engine, run, reported.

The cast: one real `MasterState` (node ``master``), one `SimAgent` per agent of
the cell (``agent:<hostname>``, all booting at time 0), and a framework per
workload framework, started at its first arrival. Every `report.interval`
seconds a sample is taken (allocation and offers as the master counts them,
usage from the ledger, each role's dominant share from the allocator).

The run ends at the policy's `run.until` or the workload's `end` record if
given; otherwise `run.settle` seconds after the workload is exhausted (every
arrival happened, every job ended, every greedy task ended), and at most one
simulated day after the last arrival (a task that can never be placed must not
keep a run going forever). Apps keep running at the end; they are counted in
`tasks.running_at_end`.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

from dyad.ids import IdGenerator
from dyad.messages import Address, FrameworkInfo, MasterInfo, TaskInfo
from dyad.priority import PRODUCTION_MIN
from master.operator import SetQuota, SetWeights
from master.model import VERSION
from master.state import MasterState
from sim.agent import AgentSettings, SimAgent
from sim.autopilot import RecommenderPolicy, UsageTap
from sim.cell import Cell
from sim.engine import Engine, SimulationError
from sim.frameworks import (
    BatchFramework, GreedyFramework, ServiceFramework, SimFramework, job_framework,
)
from sim.nodes import AgentNode, MasterNode
from sim.policy import Policy
from sim.report import Recorder, Series, build_report, capacity_json
from sim.usage import TaskPlan
from sim.workload import (
    AppArrival, AppDeletion, Arrival, JobArrival, RolesChange, TasksArrival, Workload,
)

REFUSED_PREEMPT = "master rejected preempt"

HORIZON = 86_400.0
"""Without an end, a run stops at most this long after the last arrival."""


def master_info() -> MasterInfo:
    return MasterInfo(id="sim-master", hostname="sim-master", ip="127.0.0.1", port=5050,
                      zmq_port=5055, version=VERSION,
                      address=Address(hostname="sim-master", ip="127.0.0.1", port=5050))


def apply_operator_policy(master: MasterNode, cell: Cell | RolesChange, now: float = 0.0
                          ) -> None:
    """The cell's (or a `roles` record's) weights and quota, set the way an
    operator would (`PUT /weights`, `PUT /quota`)."""
    for request in (SetWeights(cell.weights), SetQuota(cell.quota)):
        if not (request.weights if isinstance(request, SetWeights) else request.quotas):
            continue
        reply = master.call(request, now)
        if not reply.ok:
            raise SimulationError(f"the master refused the cell's {type(request).__name__}: "
                                  f"{reply.error}")


@contextlib.contextmanager
def _long_lived_heap() -> Iterator[None]:
    """What was built before the run (the cell's agents, the workload, the cores)
    lives through it, so it is frozen out of the cyclic collector's generations
    (`gc.freeze`) and no full collection walks it again: 22% of the CPU of a
    10,000-agent run before. Young collections are rarer too: the run's garbage is
    mostly messages, freed by reference counting. When the collector runs changes
    nothing a core decides (no finalizer or weak reference is involved)."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Simulation:
    def __init__(self, cell: Cell, workload: Workload, policy: Policy, seed: int = 0,
                 inputs: dict[str, Any] | None = None, validate: bool = False) -> None:
        self.cell = cell
        self.workload = workload
        self.policy = policy
        self.seed = seed
        self.inputs = inputs or {}
        self.engine = Engine(latency=policy.latency, codec=policy.codec)
        self.info = master_info()
        self.master = UsageTap(self.engine, MasterState(
            policy.master_config(), self.info, IdGenerator("sim"), start_time=0.0),
            validate=validate)
        apply_operator_policy(self.master, cell)
        self.recorder = Recorder()
        self.series = Series()
        settings = AgentSettings(launch_delay=policy.launch_delay,
                                 usage_report_interval=policy.report_interval_of_agents,
                                 reclaim=policy.reclaim if policy.oversubscription else None,
                                 qos=policy.qos)
        self._recommender = (RecommenderPolicy(policy.autopilot, policy.recommender_mode,
                                               policy.recommender_apps)
                             if policy.recommender else None)
        self.agents: list[AgentNode] = []
        for info in cell.agents():
            agent = SimAgent(info, self._plan, settings, self.recorder)
            node = AgentNode(self.engine, f"agent:{info.hostname}", agent)
            self.agents.append(node)
            self.engine.call_at(0.0, node.start)
        self.frameworks: dict[str, SimFramework] = {}
        self._arrivals_left = len(workload.arrivals)
        for arrival in workload.arrivals:
            self.engine.call_at(arrival.at, self._arrival(arrival))
        self.end = policy.until if policy.until is not None else workload.end
        self.stopped = "until" if self.end is not None else ""
        self._stop_at: float | None = None
        self.engine.call_at(0.0, self._sample)

    @property
    def horizon(self) -> float:
        """The latest the run can end (for a progress bar)."""
        if self.end is not None:
            return self.end
        return self.workload.last_arrival + HORIZON

    # ------------------------------------------------------------------- run

    def run(self, on_progress: Callable[[float], None] | None = None) -> dict[str, Any]:
        with _long_lived_heap():
            reached = self.engine.run(self.horizon, on_step=on_progress)
        if not self.stopped:
            self.stopped = "horizon"
        if not self.series.t or self.series.t[-1] < reached:
            self._take_sample(reached)
        return self.report(reached)

    def report(self, span: float) -> dict[str, Any]:
        capacity = self.cell.capacity()
        inputs = {"cell": self.cell.name, "agents": self.cell.agent_count,
                  "capacity": capacity_json(capacity), "seed": self.seed,
                  "policy": self.policy.to_json(), "arrivals": len(self.workload.arrivals),
                  **self.inputs}
        counters: dict[str, int] = dict(self.engine.counters)
        for node in self.agents:
            for key, value in node.agent.counters.items():
                counters[f"agents/{key}"] = counters.get(f"agents/{key}", 0) + value
        # A refused `Preempt` comes back as a driver error; it is the master's
        # answer (counted in master/preemptions_refused), not a protocol fault.
        counters["frameworks/driver_errors"] = sum(
            1 for f in self.frameworks.values() for e in f.driver.errors
            if not e.startswith(REFUSED_PREEMPT))
        unfinished = sorted(name for name, f in self.frameworks.items()
                            if isinstance(f, BatchFramework) and f.done is None)
        recommender = {name: f.recommender.report() for name, f in sorted(self.frameworks.items())
                       if isinstance(f, ServiceFramework) and f.recommender is not None}
        return build_report(inputs=inputs, span=span, stopped=self.stopped, series=self.series,
                            recorder=self.recorder, master_metrics=self.master.state.metrics(),
                            counters=counters, unfinished_jobs=unfinished,
                            recommender=recommender)

    # -------------------------------------------------------------- arrivals

    def _arrival(self, arrival: Arrival) -> Callable[[float], None]:
        def arrive(now: float) -> None:
            self._arrivals_left -= 1
            if isinstance(arrival, JobArrival):
                framework = BatchFramework(self.engine, arrival, self.seed, self.recorder,
                                           self.info, self.policy.batch_refuse_seconds,
                                           self.policy.batch_locality_wait,
                                           self._borrower(job_framework(arrival),
                                                          arrival.priority))
                self._add(framework, now)
            elif isinstance(arrival, AppArrival):
                framework = self.frameworks.get(arrival.framework)
                if framework is None:
                    framework = self._add(ServiceFramework(
                        self.engine, arrival.framework, arrival.role, self.seed, self.recorder,
                        self.info, self.policy.service_refuse_seconds, self._recommender,
                        self._ask_after(arrival.framework)), now)
                    if self._recommender is not None:
                        self.master.listeners.append(framework.usage)
                assert isinstance(framework, ServiceFramework)
                framework.put(arrival, now)
            elif isinstance(arrival, RolesChange):
                apply_operator_policy(self.master, arrival, now)
            elif isinstance(arrival, AppDeletion):
                framework = self.frameworks[arrival.framework]
                assert isinstance(framework, ServiceFramework)
                framework.delete(arrival, now)
            else:
                framework = self.frameworks.get(arrival.framework)
                if framework is None:
                    framework = self._add(GreedyFramework(
                        self.engine, arrival.framework, arrival.role, arrival.priority,
                        self.seed, self.recorder, self.info,
                        self._borrower(arrival.framework, arrival.priority),
                        self._ask_after(arrival.framework)), now)
                assert isinstance(framework, GreedyFramework)
                framework.add(arrival, now)
        return arrive

    def _borrower(self, framework: str, priority: int) -> bool:
        """Whether a `tasks` or job framework runs on revocable resources: with
        oversubscription on, those the policy names, else those below the
        production band (Borg puts non-production work in reclaimed room)."""
        if not self.policy.oversubscription:
            return False
        if self.policy.borrowers is not None:
            return framework in self.policy.borrowers
        return priority < PRODUCTION_MIN

    def _ask_after(self, framework: str) -> float | None:
        policy = self.policy
        if policy.preemption.enabled and framework in policy.askers:
            return policy.ask_after
        return None

    def _add(self, framework: SimFramework, now: float) -> SimFramework:
        if framework.name in self.frameworks:
            raise SimulationError(f"framework {framework.name!r} arrives twice")
        self.frameworks[framework.name] = framework
        framework.start(now)
        return framework

    def _plan(self, framework: FrameworkInfo, task: TaskInfo) -> TaskPlan:
        return self.frameworks[framework.name].plan(task)

    # --------------------------------------------------------------- samples

    def _sample(self, now: float) -> None:
        self._take_sample(now)
        if self._stop_at is None and self.end is None and self._exhausted():
            self._stop_at = now + self.policy.settle
            self.stopped = "workload done"
            self.engine.call_at(self._stop_at, self._final)
        next_at = now + self.policy.report_interval
        if self._stop_at is None or next_at < self._stop_at:
            self.engine.call_at(next_at, self._sample)

    def _final(self, now: float) -> None:
        self._take_sample(now)
        self.engine.stop()

    def _take_sample(self, now: float) -> None:
        state = self.master.state
        shares = {role["name"]: role["dominant_share"] for role in state.roles_json()}
        self.series.add(now, state.metrics(), self.recorder.usage(now), shares,
                        self.recorder.running,
                        sum(f.waiting() for f in self.frameworks.values()))

    def _exhausted(self) -> bool:
        """Every arrival happened, every job and every greedy task ended."""
        if self._arrivals_left:
            return False
        for framework in self.frameworks.values():
            if isinstance(framework, BatchFramework) and framework.done is None:
                return False
            if isinstance(framework, GreedyFramework) and (framework.waiting() or framework.live()):
                return False
        return True
