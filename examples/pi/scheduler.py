"""Estimate pi with Monte-Carlo sampling spread over a Dyad cluster.

    python examples/pi/scheduler.py --master 127.0.0.1:5050 --tasks 4 --samples 1000000

The scheduler launches `--tasks` tasks, spread over the agents it is offered, all
run by one custom executor process per agent (`executor.py`, executor id
"pi-executor"). Each task samples points in the unit square and reports how many
fell inside the quarter circle, once as a framework message and again in its
TASK_FINISHED update: framework messages are best effort, status updates are
delivered reliably, so whichever arrives first is counted and none is missed.

Exit status: 0 with the estimate printed, 1 if a task failed, 2 on --timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import frameworks
from frameworks import (
    CommandInfo, ExecutorInfo, Filters, FrameworkInfo, Offer, Resources, Scheduler,
    SchedulerDriver, TaskInfo, TaskState, TaskStatus)

EXECUTOR_ID = "pi-executor"
EXECUTOR_RESOURCES = Resources.parse("cpus:0.1;mem:32")
TASK_RESOURCES = Resources.parse("cpus:0.5;mem:32")


def pi_executor() -> ExecutorInfo:
    """The same ExecutorInfo for every task: the master refuses an executor id reused
    with a different one. The agent runs this argv, so the path must exist on every
    agent (true for `dyad local`); PYTHONPATH lets the script import `frameworks`
    from this checkout even if it is not installed."""
    checkout = str(Path(frameworks.__file__).resolve().parent.parent)
    return ExecutorInfo(
        executor_id=EXECUTOR_ID, name="pi", resources=EXECUTOR_RESOURCES,
        command=CommandInfo(argv=[sys.executable, str(Path(__file__).resolve().parent / "executor.py")],
                            environment={"PYTHONPATH": checkout}))


class PiScheduler(Scheduler):
    def __init__(self, tasks: int, samples: int) -> None:
        self.samples = samples
        self.executor = pi_executor()
        self.unlaunched = [f"pi-{i}" for i in range(tasks)]
        self.total_tasks = tasks
        self.results: dict[str, tuple[int, int]] = {}  # task id -> (inside, total)
        self.failure: str | None = None

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        plans = self.plan(offers)
        for offer in offers:
            if plans[offer.id]:
                driver.launch_tasks([offer.id], plans[offer.id])
            else:
                driver.decline_offer(offer.id, Filters(refuse_seconds=30))
        if not self.unlaunched:
            driver.suppress_offers()  # everything is placed: stop the offers

    def plan(self, offers: list[Offer]) -> dict[str, list[TaskInfo]]:
        """Deal tasks out one per offer in turn (spreading them over agents) while
        they fit; the first task on an agent also pays for the executor."""
        plans: dict[str, list[TaskInfo]] = {offer.id: [] for offer in offers}
        left = {offer.id: offer.resources for offer in offers}
        placed = True
        while self.unlaunched and placed:
            placed = False
            for offer in offers:
                if not self.unlaunched:
                    break
                has_executor = EXECUTOR_ID in offer.executor_ids or bool(plans[offer.id])
                need = TASK_RESOURCES + (Resources() if has_executor else EXECUTOR_RESOURCES)
                if need <= left[offer.id]:
                    left[offer.id] = left[offer.id] - need
                    plans[offer.id].append(self.task(self.unlaunched.pop(0), offer))
                    placed = True
        return plans

    def task(self, task_id: str, offer: Offer) -> TaskInfo:
        seed = int(task_id.rsplit("-", 1)[1])
        return TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                        resources=TASK_RESOURCES, executor=self.executor,
                        data=json.dumps({"samples": self.samples, "seed": seed}).encode())

    def framework_message(self, driver: Any, executor_id: str, agent_id: str,
                          data: bytes) -> None:
        self.record(driver, data)

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        if status.state is TaskState.TASK_FINISHED:
            if status.data:  # master-made updates (reconciliation) carry no result
                self.record(driver, status.data)
        elif status.state.is_terminal:
            self.failure = f"{status.task_id} {status.state.name}: {status.message}"
            driver.stop()

    def record(self, driver: Any, data: bytes) -> None:
        result = json.loads(data)
        self.results.setdefault(result["task_id"], (result["inside"], result["total"]))
        if len(self.results) == self.total_tasks:
            driver.stop()

    def error(self, driver: Any, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)

    def estimate(self) -> tuple[float, int]:
        inside = sum(i for i, _ in self.results.values())
        total = sum(t for _, t in self.results.values())
        return 4 * inside / total, total


async def run(args: argparse.Namespace) -> int:
    scheduler = PiScheduler(args.tasks, args.samples)
    driver = SchedulerDriver(scheduler, FrameworkInfo(name="pi"), master=args.master)
    running = asyncio.create_task(driver.run_async())
    done, _ = await asyncio.wait([running], timeout=args.timeout)
    if not done:
        driver.stop()
        await running
        print(f"gave up after {args.timeout:.0f}s with {len(scheduler.results)} of "
              f"{args.tasks} results", file=sys.stderr)
        return 2
    if scheduler.failure is not None:
        print(f"failed: {scheduler.failure}", file=sys.stderr)
        return 1
    if len(scheduler.results) < args.tasks:
        return 1  # the master ended us (see the error above)
    pi, samples = scheduler.estimate()
    print(f"pi ≈ {pi:.6f} ({samples} samples over {args.tasks} tasks; "
          f"off by {abs(pi - math.pi):.6f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Estimate pi on a Dyad cluster.")
    parser.add_argument("--master", default=os.environ.get("DYAD_MASTER"),
                        help="the master's host:port (default: $DYAD_MASTER)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks to run (default 4)")
    parser.add_argument("--samples", type=int, default=1_000_000,
                        help="samples per task (default 1000000)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before giving up (default 120)")
    args = parser.parse_args(argv)
    if not args.master:
        parser.error("give --master host:port or set DYAD_MASTER")
    if args.tasks < 1 or args.samples < 1:
        parser.error("--tasks and --samples must be positive")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
