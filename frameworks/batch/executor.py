"""The batch executor: one process per agent a job uses, running every map and
reduce task the job sends there in a pool of worker threads, the role a Hadoop
TaskTracker played under Mesos. The agent starts it (`job.executor_info`); it is
not run by hand.

Tasks report TASK_RUNNING at once, then TASK_FINISHED with their result as JSON in
the update's data (a map: its partition files; a reduce: its part file), or
TASK_FAILED with the error in the message (and, for a reduce that could not fetch
map outputs, which ones in the data). Updates are delivered reliably; nothing
relies on framework messages.

A kill sets the task's cancel flag (checked every few records) and kills a command
task's process group; TASK_KILLED is reported at once and a late result is
dropped. When the agent goes away the executor stops: the master reports its
tasks lost and the scheduler runs them elsewhere, so work here would be wasted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from frameworks import DriverStatus, Executor, ExecutorDriver, TaskInfo, TaskState, TaskStatus
from frameworks.batch.work import Cancelled, FetchFailed, TaskError, run_task

log = logging.getLogger("dyad-batch-executor")

WORKERS = 16
"""Worker threads: tasks beyond this many wait for one (the scheduler sizes how many
run here by their cpus)."""


class BatchExecutor(Executor):
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="batch-task")
        self.cancels: dict[str, threading.Event] = {}

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        driver.send_status_update(TaskStatus(task_id=task.task_id, state=TaskState.TASK_RUNNING))
        cancel = self.cancels[task.task_id] = threading.Event()
        asyncio.create_task(self._run(driver, task, cancel))

    async def _run(self, driver: ExecutorDriver, task: TaskInfo,
                   cancel: threading.Event) -> None:
        sandbox = os.path.abspath(driver.sandbox_directory)
        loop = asyncio.get_running_loop()
        data, message, state = b"", "", TaskState.TASK_FINISHED
        try:
            result = await loop.run_in_executor(self.pool, run_task, task.data, sandbox, cancel)
            data = json.dumps(result).encode()
        except Cancelled:
            return
        except FetchFailed as exc:
            state, message, data = TaskState.TASK_FAILED, str(exc), exc.data()
        except TaskError as exc:
            state, message = TaskState.TASK_FAILED, str(exc)
        except Exception as exc:  # a bug or an OS error: the task fails, we carry on
            log.exception("task %s failed", task.task_id)
            state, message = TaskState.TASK_FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            self.cancels.pop(task.task_id, None)
        if cancel.is_set():
            return  # killed meanwhile: TASK_KILLED has gone out already
        log.info("%s %s %s", task.task_id, state.name, message.splitlines()[0] if message else "")
        driver.send_status_update(TaskStatus(task_id=task.task_id, state=state,
                                             message=message, data=data))

    def kill_task(self, driver: ExecutorDriver, task_id: str) -> None:
        cancel = self.cancels.pop(task_id, None)
        if cancel is not None:
            cancel.set()
            driver.send_status_update(TaskStatus(task_id=task_id, state=TaskState.TASK_KILLED))

    def shutdown(self, driver: ExecutorDriver) -> None:
        self._cancel_all()

    def disconnected(self, driver: ExecutorDriver) -> None:
        log.warning("the agent is gone; stopping")
        self._cancel_all()
        driver.stop()

    def _cancel_all(self) -> None:
        for cancel in self.cancels.values():
            cancel.set()
        self.cancels.clear()


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s dyad-batch-executor %(levelname)s %(message)s")
    status = ExecutorDriver(BatchExecutor()).run()
    logging.shutdown()
    # Worker threads may still be inside user code that ignores the cancel flag;
    # exiting without joining them is what a killed TaskTracker child would do.
    os._exit(0 if status is DriverStatus.STOPPED else 1)


if __name__ == "__main__":
    main()
