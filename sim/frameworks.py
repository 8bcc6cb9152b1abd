"""The simulated frameworks: the real batch and service cores, and a greedy one.

Each is a `frameworks.Scheduler` on a `sim.nodes.SimDriver`, so it meets the
master exactly as the production shells do: driver callbacks become core
events, core effects become driver calls. The production shells
(`frameworks.batch.scheduler`, `frameworks.service.runtime`) cannot be reused
as they are because they arm asyncio timers; these put the cores' timers on the
engine instead (node ``<framework>/core``).

Each also stands in for its executor: `plan(task)` says how a launched task
plays out (`sim.usage.TaskPlan`), drawn from the workload's shapes with a
random generator seeded by (seed, framework, task id), so a task's fate never
depends on the order things happened in.

Pending time -- how long a task waited between being wanted and being
launched -- is measured here, where "wanted" is known: a job's maps from the
job's arrival, its reduces from the end of its last map; an app's instances
from when the service core first wanted them (an app put, a scale-up, a
replacement after a failure; backoff counts as waiting); greedy tasks from
their arrival.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any, Protocol

import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    PREEMPTION_CAPABILITY, CommandInfo, ExecutorInfo, Filters, FrameworkInfo, MasterInfo,
    Message, Offer, Preempt, Reason, TaskInfo, TaskState, TaskStatus,
)
from dyad.resources import Resources
from frameworks.autopilot import Evaluate
from frameworks.batch import core as batch
from frameworks.batch.config import CoreConfig, Split
from frameworks.batch.wire import MAP
from frameworks.effects import LaunchTasks, perform
from frameworks.scheduler import Scheduler
from frameworks.service import core as service
from master import revocable
from master.usage.schema import UsageSample
from sim.autopilot import Recommender, RecommenderPolicy
from sim.engine import Engine
from sim.nodes import SimDriver
from sim.usage import Curve, TaskPlan
from sim.workload import (
    AppArrival, AppDeletion, JobArrival, Shape, TasksArrival, UsageSpec, band,
)


class Recorder(Protocol):
    """What the frameworks tell the report (sim.report.Recorder)."""

    def launched(self, band_name: str, waited: float) -> None: ...

    def task_ended(self, framework: str, status: TaskStatus) -> None: ...

    def job_ended(self, name: str, succeeded: bool, error: str, now: float) -> None: ...


class SimFramework(Scheduler):
    """What the three frameworks share: a driver, a timer node for the core, and
    the seeded plans of the tasks it launched."""

    kind = ""

    def __init__(self, engine: Engine, name: str, role: str, priority: int, seed: int,
                 recorder: Recorder, master_info: MasterInfo,
                 capabilities: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.name = name
        self.role = role
        self.band = band(priority)
        self.seed = seed
        self.recorder = recorder
        self.timer_owner = f"{name}/core"
        # Resolved usage curves by (spec, amount): a job's maps share one shape,
        # and a curve is immutable, so they share its curves too.
        self._curves: dict[tuple[UsageSpec, float, float], Curve] = {}
        self.driver = SimDriver(engine, f"fw:{name}", FrameworkInfo(
            name=name, roles=[role], capabilities=list(capabilities)), self, master_info)
        engine.add_node(self.timer_owner, self)

    def start(self, now: float) -> None:
        self.driver.start(now)

    def rng(self, task_id: str) -> random.Random:
        return random.Random(f"{self.seed}/{self.name}/{task_id}")

    def plan_shape(self, shape: Shape, index: int, task: TaskInfo,
                   data: bytes = b"", draw_as: str = "") -> TaskPlan:
        """`draw_as`: the task id whose draws to take (a relaunch repeats its
        first launch's duration and fate)."""
        rng = self.rng(draw_as or task.task_id)
        duration = None if shape.duration is None else shape.duration.draw(index, rng)
        failed = shape.fail > 0 and rng.random() < shape.fail
        return TaskPlan(
            duration=duration,
            cpus=self._usage(shape.cpus_usage, shape.cpus, task.resources.get("cpus")),
            mem=self._usage(shape.mem_usage, shape.mem, task.resources.get("mem")),
            end=TaskState.TASK_FAILED if failed else TaskState.TASK_FINISHED,
            data=b"" if failed else data, message="simulated failure" if failed else "")

    def _usage(self, spec: UsageSpec, declared: float, given: float) -> Curve:
        """A fraction is of what the workload declared (so a task the recommender
        resized keeps using what it did); no curve means all the task was given."""
        key = (spec, declared, given)
        curve = self._curves.get(key)
        if curve is None:
            curve = self._curves[key] = spec.resolve(given if spec.curve is None else declared)
        return curve

    def plan(self, task: TaskInfo) -> TaskPlan:
        raise NotImplementedError

    def waiting(self) -> int:
        """Tasks wanted but not launched (a gauge for the report)."""
        return 0

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        if status.state.is_terminal:
            self.recorder.task_ended(self.name, status)

    # Core timers come back through the engine.
    def deliver(self, sender: str, message: Message, now: float) -> None:
        raise AssertionError(f"{self.timer_owner} is not on the wire")

    def fire(self, key: Hashable, now: float) -> None:
        raise NotImplementedError

    def _timer(self, effect: ArmTimer | CancelTimer) -> None:
        if isinstance(effect, ArmTimer):
            self.engine.arm(self.timer_owner, effect.key, effect.at)
        else:
            self.engine.cancel(self.timer_owner, effect.key)


# ------------------------------------------------------------------------ greedy


SCAN = 1000
"""Queued tasks the greedy framework looks at per offer (first fit)."""

MASTER = "master"


@attrs.frozen
class AskPreempt(TimerKey):
    """An asker's next look at its oldest waiting task."""


class GreedyFramework(SimFramework):
    """Launches queued tasks in arrival order (first fit among the first `SCAN`
    that wait), at most `per_offer` (of the oldest waiting arrival) per offer, and
    refuses the rest of each offer for the arrival's `refuse_seconds`: small
    steps, so the allocator's DRF order decides who gets what. Suppresses offers
    while nothing waits; a failed task is not retried.

    A *borrower* (oversubscription on, sim/policy.py) has the REVOCABLE_RESOURCES
    capability: what an offer's non-revocable part cannot hold it launches on
    the offer's revocable part (`TaskInfo.revocable`). A task killed with
    REASON_CONTAINER_PREEMPTED (a QoS eviction or a master preemption) goes back
    to the head of the queue and is relaunched later with the same plan (a
    fresh run, as a batch framework retries it). An *asker* (preemption on,
    `preemption.askers`) has the PREEMPTION capability and, while its oldest
    waiting task has waited `preemption.ask_after`, sends the master a `Preempt`
    for it every `ask_after` seconds."""

    kind = "tasks"

    def __init__(self, engine: Engine, name: str, role: str, priority: int, seed: int,
                 recorder: Recorder, master_info: MasterInfo, borrower: bool = False,
                 ask_after: float | None = None) -> None:
        capabilities = ((revocable.CAPABILITY,) if borrower else ()) + (
            (PREEMPTION_CAPABILITY,) if ask_after is not None else ())
        super().__init__(engine, name, role, priority, seed, recorder, master_info,
                         capabilities)
        self.ask_after = ask_after
        # (wanted since, arrival, index, the first launch's task id or "")
        self._queue: deque[tuple[float, TasksArrival, int, str]] = deque()
        self._plans: dict[str, tuple[TasksArrival, int, str]] = {}
        self._launched = 0
        self._suppressed = False
        self.borrower = borrower
        self.asked = 0

    def add(self, arrival: TasksArrival, now: float) -> None:
        self._queue.extend((now, arrival, i, "") for i in range(arrival.count))
        self._revive()

    def _revive(self) -> None:
        if self._suppressed:
            self._suppressed = False
            self.driver.revive_offers()
        if self.ask_after is not None and not self.engine.armed(self.timer_owner, AskPreempt()):
            self.engine.arm(self.timer_owner, AskPreempt(), self.engine.now + self.ask_after)

    def waiting(self) -> int:
        return len(self._queue)

    def live(self) -> int:
        """Tasks launched and not yet ended, of those that end by themselves."""
        return sum(1 for arrival, _, _ in self._plans.values()
                   if arrival.shape.duration is not None)

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        for offer in offers:
            refuse = self._queue[0][1].refuse_seconds if self._queue else 1.0
            per_offer = self._queue[0][1].per_offer if self._queue else 0
            tasks = self._fill(offer, offer.resources, per_offer, False)
            if self.borrower and offer.revocable:
                tasks += self._fill(offer, offer.revocable, per_offer - len(tasks), True)
            if tasks:
                driver.launch_tasks([offer.id], tasks, Filters(refuse_seconds=refuse))
            else:
                driver.decline_offer(offer.id, Filters(refuse_seconds=refuse))
        if not self._queue and not self._suppressed:
            self._suppressed = True
            driver.suppress_offers()

    def _fill(self, offer: Offer, left: Resources, most: int, on_revocable: bool
              ) -> list[TaskInfo]:
        """First fit over the head of the queue, so one big task does not block
        the small ones behind it."""
        now = self.engine.now
        tasks: list[TaskInfo] = []
        position = 0
        while position < min(len(self._queue), SCAN) and len(tasks) < most:
            since, arrival, index, first = self._queue[position]
            need = arrival.shape.resources
            if not need <= left or arrival.agent not in (None, offer.hostname) or (
                    on_revocable and need.names() - set(revocable.LENT_KINDS)):
                position += 1
                continue
            del self._queue[position]
            left = left - need
            self._launched += 1
            task_id = f"{self.name}-{self._launched:06d}"
            self._plans[task_id] = (arrival, index, first or task_id)
            tasks.append(TaskInfo(task_id=task_id, name=f"{self.name} task",
                                  agent_id=offer.agent_id, resources=need,
                                  command=CommandInfo(shell="sim"), priority=arrival.priority,
                                  revocable=on_revocable))
            if not first:
                self.recorder.launched(self.band, now - since)
        return tasks

    def plan(self, task: TaskInfo) -> TaskPlan:
        arrival, index, first = self._plans[task.task_id]
        return self.plan_shape(arrival.shape, index, task, draw_as=first)

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        super().status_update(driver, status)
        if not status.state.is_terminal:
            return
        launched = self._plans.pop(status.task_id, None)
        if launched is not None and status.reason == Reason.CONTAINER_PREEMPTED:
            arrival, index, first = launched
            self._queue.appendleft((self.engine.now, arrival, index, first))
            self._revive()

    def fire(self, key: Hashable, now: float) -> None:
        """An asker (preemption policy): its oldest waiting task has waited
        `ask_after`: ask the master to make room for it (`Preempt`)."""
        match key:
            case AskPreempt():
                if not self._queue or self.driver.framework_id is None:
                    return
                since, arrival, _, _ = self._queue[0]
                assert self.ask_after is not None
                if now - since >= self.ask_after:
                    self.asked += 1
                    self.engine.send(self.driver.name, MASTER, Preempt(
                        framework_id=self.driver.framework_id,
                        resources=arrival.shape.resources, priority=arrival.priority))
                self.engine.arm(self.timer_owner, key, now + self.ask_after)
            case _:
                raise UnknownTimer("GreedyFramework", key)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- batch


class BatchFramework(SimFramework):
    """One MapReduce job on the real `frameworks.batch.core.BatchCore`; like
    `dyad-batch`, the job is its own framework and tears itself down when done.
    A *borrower* (oversubscription on) runs with the core's `revocable` option:
    what an offer's ordinary part cannot hold runs on its revocable part."""

    kind = "job"

    def __init__(self, engine: Engine, job: JobArrival, seed: int, recorder: Recorder,
                 master_info: MasterInfo, refuse_seconds: float, locality_wait: float,
                 borrower: bool = False) -> None:
        super().__init__(engine, job_framework(job), job.role, job.priority, seed,
                         recorder, master_info, (revocable.CAPABILITY,) if borrower else ())
        self.job = job
        self.arrived = engine.now
        self.core = batch.BatchCore(CoreConfig(
            splits=tuple(Split(index=i, path=f"/sim/{job.name}/input-{i}")
                         for i in range(job.maps)),
            reducers=job.reduces,
            executor=ExecutorInfo(executor_id=f"{job.name}-executor",
                                  name="simulated batch executor",
                                  command=CommandInfo(shell="sim"), resources=job.executor),
            map_resources=job.map.resources, reduce_resources=job.reduce.resources,
            job_payload="{}", output=f"/sim/{job.name}/output", max_attempts=job.max_attempts,
            locality_wait=locality_wait, refuse_seconds=refuse_seconds,
            starvation_timeout=job.starvation_timeout, priority=job.priority,
            revocable=borrower))
        self._maps_done: set[int] = set()
        self._reduces_since: float | None = None
        self.done: batch.JobDone | None = None

    def waiting(self) -> int:
        return 0 if self.done is not None else self.core.waiting()

    def start(self, now: float) -> None:
        self._perform(self.core.declare())  # carried by the driver's Subscribe
        super().start(now)

    def registered(self, driver: Any, framework_id: str, master_info: MasterInfo) -> None:
        self._handle(batch.Started())

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        self._handle(batch.Reregistered())

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        self._handle(batch.OffersMade(tuple(offers)))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        super().status_update(driver, status)
        kind, index, _ = _attempt(status.task_id)
        if kind == MAP and status.state is TaskState.TASK_FINISHED:
            self._maps_done.add(index)
            if len(self._maps_done) == self.job.maps and self._reduces_since is None:
                self._reduces_since = self.engine.now
        self._handle(batch.TaskUpdate(status))

    def agent_lost(self, driver: Any, agent_id: str) -> None:
        self._handle(batch.AgentLost(agent_id))

    def fire(self, key: Hashable, now: float) -> None:
        self._handle(TimerFired(key))

    def plan(self, task: TaskInfo) -> TaskPlan:
        kind, index, _ = _attempt(task.task_id)
        if kind == MAP:
            data = {"outputs": [f"/sim/{self.job.name}/map-{index}/part-{r}"
                                for r in range(self.job.reduces)]}
            return self.plan_shape(self.job.map, index, task, json.dumps(data).encode())
        data = {"output": f"/sim/{self.job.name}/output/part-{index:05d}"}
        return self.plan_shape(self.job.reduce, index, task, json.dumps(data).encode())

    def _handle(self, event: batch.Event) -> None:
        self._perform(self.core.handle(event, self.engine.now))

    def _perform(self, effects: Iterable[batch.Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ArmTimer):
                self._timer(effect)
            elif isinstance(effect, batch.JobDone):
                self._finish(effect)
            else:
                if isinstance(effect, LaunchTasks):
                    for task in effect.tasks:
                        self._note_launch(task)
                perform(effect, self.driver)

    def _note_launch(self, task: TaskInfo) -> None:
        kind, _, attempt = _attempt(task.task_id)
        if attempt != 1:
            return  # pending time is the first attempt's wait
        since = self.arrived if kind == MAP else (self._reduces_since or self.arrived)
        self.recorder.launched(self.band, self.engine.now - since)

    def _finish(self, done: batch.JobDone) -> None:
        self.done = done
        self.engine.cancel(self.timer_owner, batch.Tick())
        self.recorder.job_ended(self.name, done.succeeded, done.error, self.engine.now)
        # As `run_job` does, tear down once the callback that finished the job
        # returned (so its implicit acknowledgement still goes out).
        self.engine.call_at(self.engine.now, lambda now: self.driver.stop())


def job_framework(job: JobArrival) -> str:
    """A job's framework name, as `dyad-batch` subscribes it."""
    return f"dyad-batch:{job.name}"


def _attempt(task_id: str) -> tuple[str, int, int]:
    """``map-00007-2`` -> ("map", 7, 2)."""
    kind, index, attempt = task_id.rsplit("-", 2)
    return kind, int(index), int(attempt)


# ----------------------------------------------------------------------- service


class ServiceFramework(SimFramework):
    """The real `frameworks.service.core.ServiceCore` with the workload's apps put
    to it as `PUT /v2/apps?force=true` would (a workload does not wait for a
    deployment to finish before the next change). With a `recommender` policy
    the Autopilot right-sizes its apps as `dyad-service` does (sim/autopilot.py); an
    *asker* (preemption on, `preemption.askers`) asks for room for an app whose
    tasks wait `ask_after`, as `dyad-service --preemption-ask-after` does."""

    kind = "service"

    def __init__(self, engine: Engine, name: str, role: str, seed: int, recorder: Recorder,
                 master_info: MasterInfo, refuse_seconds: float,
                 recommender: RecommenderPolicy | None = None,
                 ask_after: float | None = None) -> None:
        super().__init__(engine, name, role, 200, seed, recorder, master_info,
                         (PREEMPTION_CAPABILITY,) if ask_after is not None else ())
        counter = iter(range(1, 1 << 62))
        self.core = service.ServiceCore(service.ServiceConfig(
            refuse_seconds=refuse_seconds, preemption_ask_after=ask_after),
            new_id=lambda: f"{next(counter):06d}")
        self._apps: dict[str, AppArrival] = {}
        self._since: dict[str, deque[float]] = {}  # app -> when each wanted task was wanted
        self.refused_commands = 0
        self.persisted = 0
        self.recommender = None if recommender is None else Recommender(
            recommender, self.core, self._timer, self._run)

    def put(self, arrival: AppArrival, now: float) -> None:
        self._apps[arrival.app.id] = arrival
        app = arrival.app if self.recommender is None else self.recommender.follow(arrival.app)
        self._execute(service.PutApp(app, force=True), now)

    def delete(self, deletion: AppDeletion, now: float) -> None:
        self._execute(service.DeleteApp(deletion.app_id, force=True), now)

    def waiting(self) -> int:
        return sum(len(q) for q in self._since.values())

    def usage(self, samples: tuple[UsageSample, ...], now: float) -> None:
        """Usage-store rows from the master (only with a recommender)."""
        if self.recommender is not None:
            self.recommender.sampled(samples, self.driver.framework_id, now)

    def _execute(self, command: service.Command, now: float) -> None:
        try:
            self._run(command, now)
        except service.ServiceError:
            self.refused_commands += 1

    def _run(self, command: service.Command, now: float) -> service.CommandResult:
        outcome = self.core.execute(command, now)
        self._perform(outcome.effects)
        if self.recommender is not None:
            self.recommender.after(now)
        return outcome

    def registered(self, driver: Any, framework_id: str, master_info: MasterInfo) -> None:
        self._handle(service.Registered(framework_id))

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        self._handle(service.Reregistered())

    def disconnected(self, driver: Any) -> None:
        self._handle(service.Disconnected())

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        self._handle(service.OffersReceived(tuple(offers)))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        super().status_update(driver, status)
        oom = ([] if self.recommender is None
               else self.recommender.before_status(status, self.engine.now))
        self._handle(service.StatusReceived(status), oom)

    def agent_lost(self, driver: Any, agent_id: str) -> None:
        self._handle(service.AgentLost(agent_id))

    def fire(self, key: Hashable, now: float) -> None:
        if isinstance(key, Evaluate) and self.recommender is not None:
            self.recommender.fire(key, now)
        else:
            self._handle(TimerFired(key))

    def plan(self, task: TaskInfo) -> TaskPlan:
        arrival = self._apps[task.name]
        return self.plan_shape(arrival.task, 0, task)

    def _handle(self, event: service.Event, before: list[Any] | None = None) -> None:
        self._perform(self.core.handle(event, self.engine.now))
        if self.recommender is not None:
            self.recommender.after(self.engine.now, before or [])
    def _perform(self, effects: list[service.Effect]) -> None:
        launched: dict[str, int] = {}
        for effect in effects:
            if isinstance(effect, service.Persist):
                self.persisted += 1  # the store is the framework's; nothing to simulate
            elif isinstance(effect, (ArmTimer, CancelTimer)):
                self._timer(effect)
            else:
                if isinstance(effect, LaunchTasks):
                    for task in effect.tasks:
                        launched[task.name] = launched.get(task.name, 0) + 1
                perform(effect, self.driver)
        self._account(launched)

    def _account(self, launched: dict[str, int]) -> None:
        """Pending time: launches take the oldest wanted slots; then the queue of
        each app is made as long as what the core still wants."""
        now = self.engine.now
        for app_id in sorted(set(self._since) | set(launched) | set(self.core.apps)):
            queue = self._since.setdefault(app_id, deque())
            for _ in range(launched.get(app_id, 0)):
                since = queue.popleft() if queue else now
                self.recorder.launched(band(self._apps[app_id].priority), now - since)
            wanted = self.core.wanted(app_id)
            while len(queue) > wanted:
                queue.pop()
            queue.extend([now] * (wanted - len(queue)))
            if not queue and app_id not in self.core.apps:
                del self._since[app_id]
