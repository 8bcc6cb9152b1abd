"""Usage rows of command tasks count the command executor's RSS too, and their runs
may use the task's `mem` plus the executor's allowance: the service framework passes
that allowance on with each sample, so the autopilot sizes `mem` in `mem`'s terms
(docs/autopilot.md)."""

from __future__ import annotations

from dyad.clock import FakeClock
from frameworks.autopilot import MIB, Recommendation
from frameworks.service.rightsizing import Sample
from frameworks.service.runtime import ServiceRuntime
from tests.helpers import wait_for
from tests.unit.test_service_rightsizing import APP, runtime, start  # noqa: F401 (fixture)


async def _feed(runtime: ServiceRuntime, task_id: str, limit: float) -> int:  # noqa: F811
    clock = runtime.clock
    assert isinstance(clock, FakeClock)
    for _ in range(12):
        clock.advance(10)
        # 100 MiB in all: the task's own ~60 and the executor's Python ~40.
        runtime.sampled([Sample("/web", clock.now(), 0.05, 100 * MIB, task_id, limit)])

    def ready() -> Recommendation | None:
        rec = runtime.rightsizing.pilot.recommendation("/web")
        return rec if rec is not None and rec.ready else None

    return (await wait_for(ready, 5, "a recommendation")).mem_bytes


async def test_the_executors_allowance_is_taken_off_a_command_tasks_samples(runtime) -> None:  # noqa: F811
    start(runtime, APP)
    task = next(iter(runtime.core.tasks.values()))
    # The run's limit is the task's 512 MiB plus the executor's 64: 100 - 64 MiB in
    # mem terms, so the app's own minimum (64 MiB) is the recommendation.
    assert await _feed(runtime, task.task_id, (512 + 64) * MIB) == 64 * MIB


async def test_a_row_without_a_known_task_or_limit_is_taken_as_it_is(runtime) -> None:  # noqa: F811
    start(runtime, APP)
    assert await _feed(runtime, "gone", (512 + 64) * MIB) >= 100 * MIB
