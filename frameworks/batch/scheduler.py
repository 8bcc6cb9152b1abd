"""The batch framework's shell: `BatchScheduler` turns driver callbacks into
`BatchCore` events and its effects into driver calls and timers; `run_job` runs one
job from checks to committed output.

    from frameworks.batch import Job, run_job
    result = run_job(Job(module="examples/wordcount.py", inputs=["data/*.txt"],
                         output="out", reducers=4), master="127.0.0.1:5050")
    print(result.summary())

Each job is its own framework (``dyad-batch:<name>``): it registers, takes offers
until its reduces are done, then tears itself down, so the master kills whatever
it still runs (speculative losers) and its executors, and it never holds resources
after the job.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import attrs

from dyad.effects import ArmTimer, TimerFired
from dyad.timers import TimerTable
from dyad.messages import FrameworkInfo, MasterInfo, Offer, TaskStatus
from frameworks.batch.core import (
    AgentLost, BatchCore, Effect, Event, JobDone, OffersMade, Progress, Reregistered, Started,
    TaskUpdate)
from frameworks.batch.job import Job, commit_output, create_output, prepare, remove_output
from frameworks.batch.status import FAILED, RUNNING, SUCCEEDED, JobRecord, progress_dict
from frameworks.effects import perform
from frameworks.scheduler import Scheduler, SchedulerDriver

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
RECORD_INTERVAL = 0.5
"""Seconds between rewrites of a running job's record file."""
REVOCABLE = "REVOCABLE_RESOURCES"
"""The capability a job with `revocable` subscribes with (docs/oversubscription.md)."""


class BatchScheduler(Scheduler):
    """Adapter between a `SchedulerDriver` and a `BatchCore`. Everything runs on the
    driver's loop: callbacks are plain methods and timers live in a `TimerTable`
    on the same loop, so the core sees one event at a time. `on_change` is called after every event."""

    def __init__(self, core: BatchCore, on_change: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self.outcome: JobDone | None = None
        self.framework_id = ""
        self.errors: list[str] = []
        self.registered_event = asyncio.Event()
        self._on_change = on_change
        self._clock = clock
        self._driver: Any = None
        self._timers = TimerTable(clock, self._fire)

    # ---------------------------------------------------------- callbacks

    def registered(self, driver: Any, framework_id: str, master_info: MasterInfo) -> None:
        log.info("registered as framework %s", framework_id)
        self.framework_id = framework_id
        self.registered_event.set()
        self._handle(driver, Started())

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        self._handle(driver, Reregistered())

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        self._handle(driver, OffersMade(tuple(offers)))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        if status.state.is_terminal and status.message:
            log.info("%s %s: %s", status.task_id, status.state.name, status.message)
        self._handle(driver, TaskUpdate(status))

    def agent_lost(self, driver: Any, agent_id: str) -> None:
        log.warning("agent %s lost", agent_id)
        self._handle(driver, AgentLost(agent_id))

    def error(self, driver: Any, message: str) -> None:
        log.error("driver error: %s", message)
        self.errors.append(message)

    # ------------------------------------------------------------ effects

    def _handle(self, driver: Any, event: Event) -> None:
        self._driver = driver
        for effect in self.core.handle(event, self._clock()):
            self._perform(effect)
        if self._on_change is not None:
            self._on_change()

    def _perform(self, effect: Effect) -> None:
        if isinstance(effect, ArmTimer):
            self._timers.perform(effect)
        elif isinstance(effect, JobDone):
            self.outcome = effect
            self._timers.cancel_all()
            self._driver.stop()
        else:
            perform(effect, self._driver)

    def _fire(self, key: Hashable) -> None:
        self._handle(self._driver, TimerFired(key))


@attrs.frozen
class JobResult:
    """How a job ended. `output_files` are the committed part files (empty on
    failure: a failed job leaves no output directory)."""

    job_id: str
    name: str
    succeeded: bool
    error: str
    output: str
    output_files: tuple[str, ...]
    elapsed: float
    progress: Progress
    outputs_by_host: dict[str, int] = attrs.field(factory=dict)

    @property
    def locality(self) -> float | None:
        """Share of maps with preferred hosts that ran on one (None: none had any)."""
        return self.progress.locality

    def summary(self) -> str:
        p = self.progress
        locality = "n/a" if p.locality is None else f"{p.locality:.0%}"
        head = (f"job {self.job_id} ({self.name}) "
                + ("SUCCEEDED" if self.succeeded else "FAILED")
                + f" in {self.elapsed:.1f}s: {p.maps_done}/{p.maps_total} maps, "
                  f"{p.reduces_done}/{p.reduces_total} reduces, {p.failed_attempts} failed "
                  f"attempts, {p.refused_launches} refused launches, {p.maps_rerun} maps "
                  f"re-run, {p.speculative_attempts} speculative, {p.preempted_attempts} "
                  f"preempted ({p.revocable_launches} launches on revocable), locality {locality} ({p.local_maps}/{p.preferred_maps})")
        if self.succeeded:
            return head + f"\noutput: {len(self.output_files)} part files in {self.output}"
        return head + f"\nerror: {self.error}"


def new_job_id() -> str:
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


async def run_job_async(job: Job, master: str, *, timeout: float | None = None,
                        connect_timeout: float = CONNECT_TIMEOUT,
                        on_progress: Callable[[Progress], None] | None = None,
                        jobs_dir: Path | None = None,
                        core_hook: Callable[[BatchCore], None] | None = None) -> JobResult:
    """Run `job` on the cluster whose master is at `master` (``host:port``) and
    return how it went. Raises `JobError` before contacting the cluster if the job
    cannot run as given (no such input, output exists, module does not import).

    The job fails (without raising) if a task fails `max_attempts` times, if no
    master answers within `connect_timeout`, or if it runs past `timeout`; a failed
    job's output directory is removed. With `jobs_dir`, the job's record is kept
    there for `dyad-batch status`. `core_hook` sees the core once it exists (tests
    and benchmarks watch it)."""
    prepared = prepare(job)
    create_output(prepared.output)
    started = time.monotonic()
    record = JobRecord(job_id=new_job_id(), name=prepared.name, state=RUNNING, master=master,
                       output=prepared.output, pid=os.getpid(), started_at=time.time())
    core = BatchCore(prepared.core_config())
    if core_hook is not None:
        core_hook(core)
    last: dict[str, Any] = {"progress": None, "saved": 0.0}

    def changed() -> None:
        progress = core.progress()
        if progress != last["progress"]:
            last["progress"] = progress
            if on_progress is not None:
                on_progress(progress)
        if jobs_dir is not None and time.monotonic() - last["saved"] >= RECORD_INTERVAL:
            last["saved"] = time.monotonic()
            _save(record, jobs_dir, scheduler, core, started)

    scheduler = BatchScheduler(core, on_change=changed)
    if jobs_dir is not None:
        _save(record, jobs_dir, scheduler, core, started)
    capabilities = [REVOCABLE] if prepared.job.revocable else []
    driver = SchedulerDriver(scheduler, FrameworkInfo(name=f"dyad-batch:{prepared.name}",
                                                      capabilities=capabilities),
                             master=master)
    for effect in core.declare():  # carried by the driver's Subscribe
        perform(effect, driver)
    running = asyncio.ensure_future(driver.run_async())
    try:
        error = await _supervise(running, driver, scheduler, master, timeout, connect_timeout)
    except BaseException:  # cancelled (Ctrl-C): leave nothing behind, then go
        driver.stop()
        await asyncio.wait([running], timeout=10)
        remove_output(prepared.output)
        record.state, record.error = FAILED, "interrupted"
        if jobs_dir is not None:
            _save(record, jobs_dir, scheduler, core, started)
        raise
    outcome = scheduler.outcome
    files: list[str] = []
    if not error and outcome is not None and outcome.succeeded:
        files = commit_output(prepared.output)
    else:
        error = error or (outcome.error if outcome is not None else _driver_end(scheduler))
        remove_output(prepared.output)
    record.state, record.error = (FAILED, error) if error else (SUCCEEDED, "")
    if jobs_dir is not None:
        _save(record, jobs_dir, scheduler, core, started)
    return JobResult(job_id=record.job_id, name=prepared.name, succeeded=not error,
                     error=error, output=prepared.output, output_files=tuple(files),
                     elapsed=time.monotonic() - started, progress=core.progress(),
                     outputs_by_host=core.outputs_by_host())


async def _supervise(running: asyncio.Future[Any], driver: SchedulerDriver,
                     scheduler: BatchScheduler, master: str, timeout: float | None,
                     connect_timeout: float) -> str:
    """Wait for the driver to end; stop it on a deadline. The error, or ''."""
    began = time.monotonic()
    registered = asyncio.ensure_future(scheduler.registered_event.wait())
    try:
        await asyncio.wait([running, registered], timeout=connect_timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        registered.cancel()
    error = ""
    if not scheduler.registered_event.is_set() and not running.done():
        error = f"no master answered at {master} within {connect_timeout:g}s"
    elif timeout is not None:
        left = max(0.0, timeout - (time.monotonic() - began))
        done, _ = await asyncio.wait([running], timeout=left)
        if not done:
            error = f"the job did not finish within {timeout:g}s"
    if error:
        driver.stop()
    await running
    return error


def _driver_end(scheduler: BatchScheduler) -> str:
    if scheduler.errors:
        return f"the framework was stopped: {scheduler.errors[-1]}"
    return "the driver stopped before the job finished"


def _save(record: JobRecord, jobs_dir: Path, scheduler: BatchScheduler, core: BatchCore,
          started: float) -> None:
    record.framework_id = scheduler.framework_id
    record.elapsed = time.monotonic() - started
    record.progress = progress_dict(core.progress())
    try:
        record.save(jobs_dir)
    except OSError as exc:  # status display must never fail the job
        log.warning("cannot write the job record in %s: %s", jobs_dir, exc)


def run_job(job: Job, master: str, **options: Any) -> JobResult:
    """`run_job_async` on an event loop of its own (blocks until the job ends)."""
    return asyncio.run(run_job_async(job, master, **options))
