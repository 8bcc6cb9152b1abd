"""The batch scheduler's brain: which map or reduce task runs on which offer, and
what happens when attempts finish, fail or vanish. Pure: no asyncio, sockets or
files. One way in, ``BatchCore.handle(event, now) -> effects``; the shell
(`frameworks.batch.scheduler`) turns driver callbacks into events and effects into
driver calls.

Theory of operation
-------------------
A job is M map tasks, one per input `Split`, and R reduce tasks. A task is a
logical unit of work; each time it is launched it gets a new *attempt* with its
own task id (``map-00007-2`` is the second attempt of map 7). Reduce tasks become
eligible only once every map has an output, and each reduce attempt is told where
every map output lives (agent URL and sandbox path) for the shuffle.

**Offers and delay scheduling.** Offers are answered at once: tasks are dealt to
the offers of a batch one at a time in turn (spreading work over agents) while
they fit (the first task on an agent also pays for the executor); offers that
get nothing are declined, in one `DeclineOffers` per run of consecutive offers
with the same filter (one Decline message for hundreds of offers, not one each;
runs keep the master seeing declines and launches in offer order). Maps are
picked data-local first (the offer's host is one of the split's preferred
hosts), then maps with no preference. When only
non-local maps are left for an offer, the job *skips* it, and remembers since when
it has been skipping; it takes a non-local map only once it has skipped for
`locality_wait` seconds. Every data-local launch resets that clock. This is delay
scheduling (Zaharia et al., EuroSys 2010) at the job level. A stolen map is taken
from the host with the longest backlog. A declined offer carries a filter as long
as the reason lasts: the rest of the locality wait, or `refuse_seconds` when
nothing fits or nothing is pending (the job revives when that changes).

**Offer interest.** With nothing eligible to launch the job suppresses offers;
when something becomes eligible, or one of its attempts ends (a slot is free
again on an agent it may have filtered), it revives. Before it revives, and
whenever what is eligible changes (a launch, a task pending again), it
declares its demand (`RequestResources`: the eligible tasks' shape and how
many), so the master offers it room for about twice that, and a few offers
too small for any task (more only beside its own executors), rather than the
whole free cell (`master.allocator.demand`). The shape includes the
executor, as a task on a new agent needs it: an offer with room for the task
alone counted as room and starved reduces in a full cell (8 of 956 jobs of
the benchmark's day failed so). The cost: while the job declares, an agent
that runs its executor and has room for a task but not for a second
executor is not offered to it. A job whose pending maps
prefer hosts (data locality) declares nothing: delay scheduling needs to
hear of the preferred hosts, and the allocator knows nothing of them.

**Faults.** A failed or lost attempt makes the task pending again, to run on
another agent if there is one, until it has failed `max_attempts` times, which
fails the job. A launch the master or agent refused (TASK_DROPPED, or TASK_ERROR
not from the executor: the task never started, e.g. the agent's books lagged the
master's) is not the task's failure: it is retried after a backoff (0.1 s doubling
to 5 s), wherever offered, up to `REFUSAL_LIMIT` times. A map whose output sits on
a lost agent runs again if any reduce still needs it. A reduce that cannot fetch a
map's output reports which outputs it could not fetch (`FETCH_FAILED_KEY` in its
TASK_FAILED data): those maps run again, and that reduce failure is not held
against the reduce. Losing an output counts as a failure of the map, which bounds
re-runs. A *preempted* attempt (TASK_KILLED with REASON_CONTAINER_PREEMPTED: the
agent took back revocable resources, or the master made room for more important
work) is no failure either: the task is pending again at once, anywhere, and
`max_attempts` is not charged.

**Revocable resources** (`CoreConfig.revocable`, off by default): the framework
then opts in (REVOCABLE_RESOURCES) and a task that does not fit an offer's
ordinary resources runs on its revocable part (`TaskInfo.revocable`), which the
agent may take back at any time (a preemption, above). The executor always comes
from the ordinary part: the master does not launch executors on revocable
resources.

**Speculation** (optional): when no task of the running phase is waiting for a slot,
a task running for more than `SPECULATIVE_FACTOR` times the median duration of its
finished peers (and at least `SPECULATIVE_MIN_RUNTIME`) gets one extra attempt on
another agent; the first attempt to finish wins and the others are killed.

**Starvation.** If tasks wait, none runs, and for `starvation_timeout` seconds no
offer was big enough for the next task, the job fails (at that deadline: the
`Tick` is armed for it) with a message that says what was needed and the
biggest offer seen, instead of waiting forever.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import attrs

from dyad.effects import ArmTimer, TimerFired, TimerKey, UnknownTimer
from dyad.messages import Offer, Reason, Source, TaskInfo, TaskState, TaskStatus
from dyad.resources import Resources
from frameworks.batch.config import CoreConfig
from frameworks.batch.placement import Placement, Why
from frameworks.batch.tasks import Attempt, MapOutput, Progress, Task, TaskPhase
from frameworks.batch.wire import MAP, REDUCE, parse_fetch_failures, parse_result, task_data
from frameworks.effects import (
    DeclineOffers, DriverEffect, LaunchTasks, ReconcileTasks, RequestKill, RequestResources,
    ReviveOffers, SuppressOffers)

TICK_INTERVAL = 0.5
_NONE = Resources()
MIN_REFUSE = 0.1
"""Shortest filter put on a declined offer: shorter ones only add offer traffic."""
REFUSAL_LIMIT = 10
"""Launches of one task the master or an agent may refuse before the job fails."""
REFUSAL_BACKOFF = 0.1
MAX_REFUSAL_BACKOFF = 5.0
SPECULATIVE_FACTOR = 1.5
SPECULATIVE_MIN_RUNTIME = 1.0


# ------------------------------------------------------------------------ events


@attrs.frozen
class Started:
    """The framework is registered: the job begins."""


@attrs.frozen
class Reregistered:
    """The driver subscribed again after losing the master: updates may be missing."""


@attrs.frozen
class OffersMade:
    offers: tuple[Offer, ...]


@attrs.frozen
class TaskUpdate:
    status: TaskStatus


@attrs.frozen
class AgentLost:
    agent_id: str


Event = Started | Reregistered | OffersMade | TaskUpdate | AgentLost | TimerFired


@attrs.frozen
class Tick(TimerKey):
    """The check of what time alone changes: a refusal backoff ended, the
    starvation timeout ran out (armed for the earliest of them, only while one
    is pending), and with speculation on, stragglers (every `TICK_INTERVAL`)."""


# ----------------------------------------------------------------------- effects


@attrs.frozen
class JobDone:
    """The job ended: the shell stops the driver (tearing the framework down)."""

    succeeded: bool
    error: str = ""


Effect = DriverEffect | ArmTimer | JobDone


# ------------------------------------------------------------------------- state


@attrs.define(eq=False)
class _Fill:
    """An offer being answered: what is left of it and what it got."""

    offer: Offer
    left: Resources
    left_revocable: Resources
    executor_here: bool
    tasks: list[TaskInfo] = attrs.field(factory=list)
    refuse: float = 0.0


class BatchCore:
    """See the module docstring. Create it, feed it `Started` once the framework is
    registered, then every offer, update and timer; carry out what it returns."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self._maps = [Task(MAP, s.index) for s in config.splits]
        self._reduces = [Task(REDUCE, i) for i in range(config.reducers)]
        self._pending: dict[str, dict[int, None]] = {
            MAP: dict.fromkeys(range(len(self._maps))),
            REDUCE: dict.fromkeys(range(len(self._reduces)))}
        self._copies: dict[tuple[str, int], None] = {}
        self._placement = Placement(config.splits, config.locality_wait, self._maps,
                                    self._reduces, self._pending, self._copies)
        self._splits = self._placement.splits
        self._maps_done = 0
        self._attempts: dict[str, Attempt] = {}
        self._suppressed = False
        self._declared: tuple[tuple[Resources, int], ...] = ()  # last demand declared
        self._prefers_hosts = any(split.hosts for split in config.splits)
        self._shapes = {kind: self._resources(kind) + config.executor.resources
                        for kind in (MAP, REDUCE)}
        self._new_work = False  # something became eligible since `_interest` last ran
        self._started = False
        self._tick_at: float | None = None  # when the armed `Tick` fires
        self._live_count = 0  # attempts launched and not ended
        self._done: JobDone | None = None
        self._last_launch = 0.0
        self._too_small: Resources | None = None  # biggest offer a task did not fit
        self.failed_attempts = 0
        self.refused_launches = 0
        self.preempted_attempts = 0
        self.revocable_launches = 0
        self._backoff_until: float | None = None  # the earliest end of a refusal backoff
        self.maps_rerun = 0
        self.speculative_attempts = 0
        self.invalid_updates = 0
        self.records_in = 0
        self.records_out = 0

    # ------------------------------------------------------------------ entry

    @property
    def done(self) -> JobDone | None:
        return self._done

    def handle(self, event: Event, now: float) -> list[Effect]:
        if self._done is not None:
            return []
        effects = self._handle(event, now)
        if self._started and self._done is None:
            due = self._tick_due(now)
            if due is not None and due != self._tick_at:
                self._tick_at = due
                effects.append(ArmTimer(Tick(), due))
        return effects

    def _handle(self, event: Event, now: float) -> list[Effect]:
        match event:
            case Started():
                return self._start(now)
            case Reregistered():
                return [ReconcileTasks(tuple((a.task_id, a.agent_id) for a in self._live()))]
            case OffersMade(offers):
                return self._answer_offers(offers, now)
            case TaskUpdate(status):
                return self._on_update(status, now)
            case AgentLost(agent_id):
                return self._on_agent_lost(agent_id, now)
            case TimerFired(Tick()):
                self._tick_at = None
                return self._tick(now)
            case TimerFired(key):
                raise UnknownTimer("BatchCore", key)
            case _:
                raise TypeError(f"BatchCore cannot handle {event!r}")

    def _start(self, now: float) -> list[Effect]:
        if not self._started:
            self._started = True
            self._last_launch = now
        return []

    def _tick_due(self, now: float) -> float | None:
        """When the next `Tick` must come (None: nothing to check). With
        speculation, every `TICK_INTERVAL`; else when a refusal backoff ends or
        the starvation timeout runs out, and not before: a job waiting for its
        tasks to end has nothing to check, so it costs no timer events."""
        if self.config.speculative:
            return now + TICK_INTERVAL if self._tick_at is None else self._tick_at
        due = self._backoff_until
        if self._too_small is not None and not self._live_count and self._eligible():
            starving = self._last_launch + self.config.starvation_timeout
            due = starving if due is None else min(due, starving)
        return due

    # ----------------------------------------------------------------- offers

    def _answer_offers(self, offers: Sequence[Offer], now: float) -> list[Effect]:
        """Deal tasks to the offers one at a time in turn, so a batch of offers
        spreads the work (and the risk of losing an agent) over the agents."""
        agents, lost = self._placement.agents, self._placement.lost_hosts
        revocable = self.config.revocable
        executor_id = self.config.executor.executor_id
        fills = []
        for offer in offers:
            agents[offer.agent_id] = offer.hostname
            if lost:
                lost.discard(offer.hostname)
            fills.append(_Fill(offer, offer.resources, offer.revocable if revocable else _NONE,
                               executor_id in offer.executor_ids))
        dealing = fills
        while dealing:
            dealing = [fill for fill in dealing if self._deal_one(fill, now)]
        effects: list[Effect] = []
        declined: list[str] = []  # a run of offers declined with the same filter
        last = len(fills) - 1
        for at, fill in enumerate(fills):
            if fill.tasks:
                effects.append(LaunchTasks(fill.offer.id, tuple(fill.tasks), fill.refuse))
                continue
            declined.append(fill.offer.id)
            if at == last or (following := fills[at + 1]).tasks \
                    or following.refuse != fill.refuse:
                effects.append(DeclineOffers(tuple(declined), fill.refuse))
                declined = []
        return effects + self._interest(freed=False)

    def _deal_one(self, fill: _Fill, now: float) -> bool:
        """Give the offer one more task if one is eligible and fits. When not, note
        how long the offer should be refused and return False."""
        if not self._copies and not self._pending[REDUCE if self._maps_done == len(self._maps)
                                                  else MAP]:
            fill.refuse = self.config.refuse_seconds  # what `pick` would say: nothing
            return False
        pick = self._placement.pick(fill.offer, now, self._all_maps_done())
        if isinstance(pick, Why):
            fill.refuse = self.config.refuse_seconds
            if pick is Why.LOCALITY and self._placement.waiting_since is not None:
                left = self._placement.waiting_since + self.config.locality_wait - now
                fill.refuse = max(MIN_REFUSE, left)  # back when the wait is over
            return False
        task, speculative, local = pick
        need = self._resources(task.kind)
        executor = _NONE if fill.executor_here else self.config.executor.resources
        if need + executor <= fill.left:
            fill.left = fill.left - need - executor
            revocable = False
        elif executor <= fill.left and need <= fill.left_revocable:
            fill.left = fill.left - executor
            fill.left_revocable = fill.left_revocable - need
            revocable = True
        else:
            if not fill.tasks:
                self._note_too_small(fill.offer.resources)
            fill.refuse = self.config.refuse_seconds
            return False
        fill.executor_here = True
        fill.tasks.append(self._launch(task, fill.offer, speculative, local, now, revocable))
        return True

    def _note_too_small(self, resources: Resources) -> None:
        if self._too_small is None or self._too_small <= resources:
            self._too_small = resources

    def _resources(self, kind: str) -> Resources:
        return self.config.map_resources if kind == MAP else self.config.reduce_resources

    def _launch(self, task: Task, offer: Offer, speculative: bool, local: bool | None,
                now: float, revocable: bool) -> TaskInfo:
        task.launches += 1
        task_id = f"{task.kind}-{task.index:05d}-{task.launches}"
        attempt = Attempt(task_id=task_id, task=task, agent_id=offer.agent_id,
                           hostname=offer.hostname, url=offer.url, launched_at=now,
                           local=local)
        self._attempts[task_id] = attempt
        task.live.append(attempt)
        self._live_count += 1
        if revocable:
            self.revocable_launches += 1
        if local:
            self._placement.waiting_since = None  # delay scheduling: a local launch resets it
        if speculative:
            self.speculative_attempts += 1
            task.wants_copy = False
            del self._copies[(task.kind, task.index)]
        else:
            task.phase = TaskPhase.RUNNING
            del self._pending[task.kind][task.index]
        self._last_launch = now
        self._too_small = None
        return TaskInfo(task_id=task_id, name=f"dyad-batch {task.kind} {task.index}",
                        agent_id=offer.agent_id, resources=self._resources(task.kind),
                        executor=self.config.executor, data=self._task_data(task, task_id),
                        priority=self.config.priority, revocable=revocable)

    def _task_data(self, task: Task, task_id: str) -> bytes:
        spec: dict[str, Any] = {"type": task.kind, "index": task.index, "task_id": task_id,
                                "reducers": self.config.reducers, "output": self.config.output}
        if task.kind == MAP:
            spec["split"] = self._splits[task.index].to_json()
        else:
            spec["inputs"] = [{"map": m.index, "task_id": m.output.task_id, "url": m.output.url,
                               "path": m.output.paths[task.index]}
                              for m in self._maps if m.output is not None]
        return task_data(self.config.job_payload, spec)

    # ---------------------------------------------------------------- updates

    def _on_update(self, status: TaskStatus, now: float) -> list[Effect]:
        attempt = self._attempts.get(status.task_id)
        if attempt is None:
            self.invalid_updates += 1
            return []
        if attempt.ended or not status.state.is_terminal:
            return []  # a duplicate (at-least-once delivery) or progress
        attempt.ended = True
        attempt.task.live.remove(attempt)
        self._live_count -= 1
        if status.state is TaskState.TASK_FINISHED:
            effects = self._succeeded(attempt, status, now)
        elif _refused(status):
            effects = self._refused(attempt, status, now)
        elif _preempted(status):
            effects = self._preempted(attempt)
        else:
            effects = self._failed(attempt, status)
        if self._done is not None:
            return effects
        return effects + self._interest(freed=True)

    def _succeeded(self, attempt: Attempt, status: TaskStatus, now: float) -> list[Effect]:
        task = attempt.task
        if attempt.killed or task.phase is TaskPhase.DONE:
            return []  # a speculative loser that finished anyway
        try:
            result = parse_result(task.kind, status.data, self.config.reducers)
        except ValueError as exc:
            self.invalid_updates += 1
            return self._failed(attempt, attrs.evolve(
                status, message=f"finished without a valid result ({exc})"))
        task.phase = TaskPhase.DONE
        task.duration = now - attempt.launched_at
        if task.kind == MAP:
            self._maps_done += 1
        self.records_in += int(result.get("records_in", 0))
        self.records_out += int(result.get("records_out", 0))
        self._drop_copy(task)
        effects: list[Effect] = []
        for other in task.live:
            other.killed = True
            effects.append(RequestKill(other.task_id))
        if task.kind == MAP:
            task.output = MapOutput(
                task_id=attempt.task_id, agent_id=attempt.agent_id, hostname=attempt.hostname,
                url=attempt.url, paths=tuple(result["outputs"]), local=attempt.local)
            split = self._splits[task.index]
            if split.is_uri and result.get("cached"):
                self._placement.cached.setdefault(split.path, set()).add(attempt.hostname)
            if self._all_maps_done():
                self._new_work = True  # the reduces are eligible now
        else:
            task.result = str(result["output"])
            if all(r.phase is TaskPhase.DONE for r in self._reduces):
                self._done = JobDone(True)
                effects.append(self._done)
        return effects

    def _failed(self, attempt: Attempt, status: TaskStatus) -> list[Effect]:
        task = attempt.task
        if attempt.killed or task.phase is TaskPhase.DONE:
            return []
        if task.kind == REDUCE and status.state is TaskState.TASK_FAILED:
            lost = parse_fetch_failures(status.data)
            if lost:
                effects = self._lose_outputs(lost, attempt.hostname)
                if not task.live and self._done is None:
                    self._make_pending(task)
                return effects
        self.failed_attempts += 1
        task.avoid.add(attempt.agent_id)
        why = status.message or status.reason or "no reason given"
        task.failures.append(f"{status.state.name} on {attempt.hostname}: {why}")
        if task.live:
            return []  # another attempt of it is still running
        if len(task.failures) >= self.config.max_attempts:
            return [self._fail(f"{task.name} failed {len(task.failures)} times; "
                               f"last: {task.failures[-1]}")]
        self._make_pending(task)
        return []

    def _refused(self, attempt: Attempt, status: TaskStatus, now: float) -> list[Effect]:
        task = attempt.task
        if attempt.killed or task.phase is TaskPhase.DONE:
            return []
        task.refusals += 1
        self.refused_launches += 1
        if task.refusals >= REFUSAL_LIMIT:
            return [self._fail(
                f"{task.name} was refused at launch {task.refusals} times; last: "
                f"{status.state.name} on {attempt.hostname}: {status.message or status.reason}")]
        if not task.live:
            backoff = min(MAX_REFUSAL_BACKOFF, REFUSAL_BACKOFF * 2 ** (task.refusals - 1))
            task.not_before = now + backoff
            if self._backoff_until is None or task.not_before < self._backoff_until:
                self._backoff_until = task.not_before
            self._make_pending(task)
        return []

    def _preempted(self, attempt: Attempt) -> list[Effect]:
        """Evicted or preempted: run it again, free of charge (module docstring)."""
        task = attempt.task
        if attempt.killed or task.phase is TaskPhase.DONE:
            return []
        self.preempted_attempts += 1
        if not task.live:
            self._make_pending(task)
        return []

    def _lose_outputs(self, lost: list[tuple[int, str]], reporter: str) -> list[Effect]:
        """A reduce could not fetch these (map index, attempt id) outputs."""
        effects: list[Effect] = []
        for index, task_id in lost:
            if not 0 <= index < len(self._maps):
                self.invalid_updates += 1
                continue
            task = self._maps[index]
            if task.output is not None and task.output.task_id == task_id:
                effects += self._rerun_map(
                    task, f"output on {task.output.hostname} could not be fetched "
                          f"by a reduce on {reporter}")
        return effects

    def _rerun_map(self, task: Task, why: str) -> list[Effect]:
        task.output = None
        self._maps_done -= 1
        task.failures.append(why)
        self.maps_rerun += 1
        if len(task.failures) >= self.config.max_attempts:
            return [self._fail(f"{task.name} failed {len(task.failures)} times; last: {why}")]
        self._make_pending(task)
        return []

    def _make_pending(self, task: Task) -> None:
        task.phase = TaskPhase.PENDING
        self._pending[task.kind][task.index] = None
        self._new_work = True
        self._drop_copy(task)

    def _drop_copy(self, task: Task) -> None:
        task.wants_copy = False
        self._copies.pop((task.kind, task.index), None)

    def _fail(self, error: str) -> JobDone:
        self._done = JobDone(False, error)
        return self._done

    def _on_agent_lost(self, agent_id: str, now: float) -> list[Effect]:
        """Its attempts end through the TASK_LOST updates the master sends; here
        only the map outputs it held matter, if a reduce still needs them."""
        hostname = self._placement.agents.pop(agent_id, agent_id)
        if hostname not in self._placement.agents.values():
            self._placement.lost_hosts.add(hostname)
        effects: list[Effect] = []
        if all(r.phase is TaskPhase.DONE for r in self._reduces):
            return effects
        for task in self._maps:
            if task.output is not None and task.output.agent_id == agent_id:
                effects += self._rerun_map(task, f"output lost with agent {hostname}")
                if self._done is not None:
                    return effects
        return effects + self._interest(freed=False)

    # ------------------------------------------------------------------ ticks

    def _tick(self, now: float) -> list[Effect]:
        if self._backoff_until is not None and self._backoff_until <= now:
            self._new_work = True  # refused tasks may launch again: offers back
            waiting = [t.not_before for t in (*self._maps, *self._reduces)
                       if t.phase is TaskPhase.PENDING and t.not_before > now]
            self._backoff_until = min(waiting, default=None)
        if self.config.speculative:
            self._speculate(now)
        if self._starving(now):
            return [self._fail(self._starvation_message())]
        return self._interest(freed=False)

    def _speculate(self, now: float) -> None:
        kind = REDUCE if self._all_maps_done() else MAP
        tasks = self._maps if kind == MAP else self._reduces
        if self._pending[kind]:
            return
        durations = [t.duration for t in tasks if t.duration is not None]
        if not durations:
            return
        limit = max(SPECULATIVE_MIN_RUNTIME, SPECULATIVE_FACTOR * statistics.median(durations))
        budget = max(1, len(tasks) // 10) - len(self._copies)
        for task in tasks:
            if budget <= 0:
                return
            if (task.phase is TaskPhase.RUNNING and len(task.live) == 1
                    and not task.wants_copy and now - task.live[0].launched_at > limit):
                task.wants_copy = True
                self._copies[(task.kind, task.index)] = None
                self._new_work = True
                budget -= 1

    def _starving(self, now: float) -> bool:
        return (self._too_small is not None and self._eligible() and not self._live_count
                and now >= self._last_launch + self.config.starvation_timeout)

    def _starvation_message(self) -> str:
        kind = REDUCE if self._all_maps_done() else MAP
        need = self._resources(kind) + self.config.executor.resources
        return (f"no offer had room for a {kind} task for "
                f"{self.config.starvation_timeout:g}s: it needs {self._resources(kind)} "
                f"plus {self.config.executor.resources} for the executor on a new agent "
                f"({need} in all); the biggest offer seen was {self._too_small}")

    # --------------------------------------------------------------- interest

    def _interest(self, freed: bool) -> list[Effect]:
        """Suppress offers when nothing can launch. Revive when something can and
        offers may be held back: suppressed, or filtered by declines made before a
        slot was freed or before this work appeared."""
        new_work, self._new_work = self._new_work, False
        if self._eligible():
            effects: list[Effect] = []
            demand = self._demand()
            if demand != self._declared:
                self._declared = demand
                effects.append(RequestResources(demand))
            if self._suppressed or freed or new_work:
                self._suppressed = False
                effects.append(ReviveOffers())
            return effects
        if not self._suppressed:
            self._suppressed = True
            self._declared = ()  # suppressing clears the declaration
            return [SuppressOffers()]
        return []

    def declare(self) -> list[Effect]:
        """The demand to declare before subscribing (a shell performs it before
        it starts its driver), so the first offers are bounded by it too."""
        self._declared = self._demand()
        return [RequestResources(self._declared)] if self._declared else []

    def _demand(self) -> tuple[tuple[Resources, int], ...]:
        """What the eligible tasks need, each with an executor (a task on a new
        agent needs one); nothing while a pending map prefers hosts."""
        kind = REDUCE if self._all_maps_done() else MAP
        if kind == MAP and self._prefers_hosts and any(
                self._splits[i].hosts for i in self._pending[MAP]):
            return ()
        counts = {kind: len(self._pending[kind])}
        for copy_kind, _ in self._copies:
            counts[copy_kind] = counts.get(copy_kind, 0) + 1
        return tuple((self._shapes[k], n) for k, n in sorted(counts.items()) if n)

    def _eligible(self) -> bool:
        if self._copies:
            return True
        return bool(self._pending[MAP] if not self._all_maps_done() else self._pending[REDUCE])

    # ---------------------------------------------------------------- queries

    def waiting(self) -> int:
        """Tasks of the current phase (maps, then reduces) waiting to launch:
        `progress()`'s total less done and running, without building it."""
        return len(self._pending[REDUCE if self._all_maps_done() else MAP])

    def _all_maps_done(self) -> bool:
        return self._maps_done == len(self._maps)

    def _task(self, kind: str, index: int) -> Task:
        return self._maps[index] if kind == MAP else self._reduces[index]

    def _live(self) -> list[Attempt]:
        return [a for t in (*self._maps, *self._reduces) for a in t.live]

    def progress(self) -> Progress:
        finished = [m.output for m in self._maps if m.output is not None]
        preferred = [o for o in finished if o.local is not None]
        return Progress(
            maps_total=len(self._maps),
            # A map re-run after the last reduce had fetched from it is not needed:
            # once the job succeeded, every map's output has been consumed.
            maps_done=len(self._maps) if self._done == JobDone(True) else self._maps_done,
            maps_running=sum(1 for m in self._maps if m.phase is TaskPhase.RUNNING),
            reduces_total=len(self._reduces),
            reduces_done=sum(1 for r in self._reduces if r.phase is TaskPhase.DONE),
            reduces_running=sum(1 for r in self._reduces if r.phase is TaskPhase.RUNNING),
            failed_attempts=self.failed_attempts, refused_launches=self.refused_launches,
            preempted_attempts=self.preempted_attempts,
            revocable_launches=self.revocable_launches,
            maps_rerun=self.maps_rerun,
            speculative_attempts=self.speculative_attempts,
            local_maps=sum(1 for o in preferred if o.local), preferred_maps=len(preferred),
            records_in=self.records_in, records_out=self.records_out,
            invalid_updates=self.invalid_updates)

    def outputs_by_host(self) -> dict[str, int]:
        """How many current map outputs each host holds."""
        counts: dict[str, int] = {}
        for task in self._maps:
            if task.output is not None:
                counts[task.output.hostname] = counts.get(task.output.hostname, 0) + 1
        return counts

    def output_files(self) -> list[str]:
        """The committed part files, by reduce index (complete once the job is done)."""
        return [r.result for r in self._reduces if r.result]

    def validate(self) -> None:
        """Check the invariants; tests call it after every step."""
        if self._done is not None:
            return  # a failed job stops mid-step: its tasks stay as they were
        assert self._maps_done == sum(1 for m in self._maps if m.phase is TaskPhase.DONE)
        for kind, tasks in ((MAP, self._maps), (REDUCE, self._reduces)):
            for task in tasks:
                pending = task.index in self._pending[kind]
                assert pending == (task.phase is TaskPhase.PENDING), (task, pending)
                assert all(not a.ended and a.task is task for a in task.live), task
                if task.phase is TaskPhase.RUNNING:
                    assert task.live, f"{task.name} running without an attempt"
                if kind == MAP:
                    assert (task.output is not None) == (task.phase is TaskPhase.DONE), task
                wants = (kind, task.index) in self._copies
                assert wants == task.wants_copy, task
                if wants:
                    assert task.phase is TaskPhase.RUNNING, task


def _preempted(status: TaskStatus) -> bool:
    """Killed to give its resources back (QoS eviction or master preemption)."""
    return status.state is TaskState.TASK_KILLED and status.reason == Reason.CONTAINER_PREEMPTED


def _refused(status: TaskStatus) -> bool:
    """Whether the master or agent refused to start the attempt (so its code
    never ran): TASK_DROPPED, or TASK_ERROR not from the executor."""
    return status.state is TaskState.TASK_DROPPED or (
        status.state is TaskState.TASK_ERROR and status.source != Source.EXECUTOR)
