"""A Dyad executor (frameworks.ExecutorDriver, over ZMQ) that answers each
framework message with ``pong:<message>``; its tasks run until killed. Started
by the agent for test_mesos_v1.py's v1 framework: messages cross both APIs."""

from __future__ import annotations

import sys

from frameworks import DriverStatus, Executor, ExecutorDriver, TaskInfo, TaskState, TaskStatus


class Echo(Executor):
    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        driver.send_status_update(TaskStatus(task_id=task.task_id, state=TaskState.TASK_RUNNING))

    def kill_task(self, driver: ExecutorDriver, task_id: str) -> None:
        driver.send_status_update(TaskStatus(task_id=task_id, state=TaskState.TASK_KILLED))

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> None:
        driver.send_framework_message(b"pong:" + data)


if __name__ == "__main__":
    sys.exit(0 if ExecutorDriver(Echo()).run() is DriverStatus.STOPPED else 1)
