"""The pi example's executor: one process per agent, running every pi task the
scheduler sends there. The agent starts it (see `pi_executor()` in scheduler.py);
it is not meant to be run by hand.

Each task's `data` is JSON ``{"samples": n, "seed": s}``. Sampling runs in a thread
so the driver's loop stays free to take more tasks, kills and acknowledgements.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys

from frameworks import DriverStatus, Executor, ExecutorDriver, TaskInfo, TaskState, TaskStatus

log = logging.getLogger("pi-executor")


def sample(samples: int, seed: int) -> int:
    """How many of `samples` random points in the unit square fall in the quarter
    circle (seeded, so a rerun of a task gives the same answer)."""
    rng = random.Random(seed)
    return sum(1 for _ in range(samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)


class PiExecutor(Executor):
    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task[None]] = {}

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        driver.send_status_update(TaskStatus(task_id=task.task_id, state=TaskState.TASK_RUNNING))
        self.running[task.task_id] = asyncio.create_task(self.compute(driver, task))

    async def compute(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        try:
            params = json.loads(task.data)
            samples, seed = int(params["samples"]), int(params["seed"])
        except (ValueError, KeyError, TypeError) as exc:
            self.running.pop(task.task_id, None)
            driver.send_status_update(TaskStatus(task_id=task.task_id,
                                                 state=TaskState.TASK_FAILED,
                                                 message=f"bad task data: {exc!r}"))
            return
        inside = await asyncio.to_thread(sample, samples, seed)
        self.running.pop(task.task_id, None)  # a kill from here on comes too late
        result = json.dumps({"task_id": task.task_id, "inside": inside,
                             "total": samples}).encode()
        log.info("%s: %d of %d inside", task.task_id, inside, samples)
        driver.send_framework_message(result)
        driver.send_status_update(TaskStatus(task_id=task.task_id, state=TaskState.TASK_FINISHED,
                                             data=result))

    def kill_task(self, driver: ExecutorDriver, task_id: str) -> None:
        # The sampling thread cannot be interrupted; its result is simply dropped.
        work = self.running.pop(task_id, None)
        if work is not None:
            work.cancel()
            driver.send_status_update(TaskStatus(task_id=task_id, state=TaskState.TASK_KILLED))


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s pi-executor %(levelname)s %(message)s")
    status = ExecutorDriver(PiExecutor()).run()
    return 0 if status is DriverStatus.STOPPED else 1


if __name__ == "__main__":
    sys.exit(main())
