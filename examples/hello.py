"""Hello, Dyad: launch one shell task on the first offer and report how it ended.

    DYAD_MASTER=127.0.0.1:5050 python examples/hello.py
    python examples/hello.py --master 127.0.0.1:5050

Exit status: 0 if the task finished, 1 if it ended any other way (or the master
refused us), 2 if nothing was decided within --timeout seconds (no master, no agent
with room for the task, or a task that never ended).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from frameworks import (
    CommandInfo, DriverStatus, Filters, FrameworkInfo, MasterInfo, Offer, Resources,
    Scheduler, SchedulerDriver, TaskInfo, TaskState, TaskStatus)

TASK_RESOURCES = Resources.parse("cpus:0.1;mem:32")


class Hello(Scheduler):
    def __init__(self) -> None:
        self.offer: Offer | None = None  # the offer we launched on
        self.final: TaskStatus | None = None

    def registered(self, driver: Any, framework_id: str, master_info: MasterInfo) -> None:
        print(f"registered as {framework_id} with master at {master_info.http_url}")

    def resource_offers(self, driver: Any, offers: list[Offer]) -> None:
        for offer in offers:
            if self.offer is None and TASK_RESOURCES <= offer.resources:
                self.offer = offer
                task = TaskInfo(task_id="hello-1", name="hello", agent_id=offer.agent_id,
                                resources=TASK_RESOURCES,
                                command=CommandInfo(shell="echo hello from dyad"))
                print(f"launching {task.task_id} on {offer.hostname}")
                driver.launch_tasks([offer.id], [task])
            else:
                # We need nothing more: keep these agents out of our offers for a while.
                driver.decline_offer(offer.id, Filters(refuse_seconds=60))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        print(f"{status.task_id}: {status.state.name} {status.message}".rstrip())
        if status.state.is_terminal:
            self.final = status
            driver.stop()

    def error(self, driver: Any, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)


def sandbox_hint(framework_id: str | None, offer: Offer, task_id: str) -> str:
    where = f" (browse it at {offer.url}/files/browse)" if offer.url else ""
    return (f"the task's stdout is in its sandbox on {offer.hostname}{where}: "
            f"<agent work dir>/frameworks/{framework_id}/executors/{task_id}/runs/<run>/stdout")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=os.environ.get("DYAD_MASTER"),
                        help="the master's host:port (default: $DYAD_MASTER)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the whole thing (default 60)")
    args = parser.parse_args(argv)
    if not args.master:
        parser.error("give --master host:port or set DYAD_MASTER")

    hello = Hello()
    driver = SchedulerDriver(hello, FrameworkInfo(name="hello"), master=args.master)
    driver.start()
    try:
        status = driver.join(timeout=args.timeout)
    except KeyboardInterrupt:
        driver.stop()
        driver.join(timeout=5)
        return 130
    if status is DriverStatus.RUNNING:  # the timeout passed first
        driver.stop()
        driver.join(timeout=5)
        if hello.offer is None:
            print(f"no usable offer within {args.timeout:.0f}s: is the master at "
                  f"{args.master} up, with an agent that has {TASK_RESOURCES} free?",
                  file=sys.stderr)
        else:
            print(f"the task did not end within {args.timeout:.0f}s", file=sys.stderr)
        return 2
    if hello.final is None or hello.offer is None:
        return 1  # the master ended us (see the error above)
    print(sandbox_hint(driver.framework_id, hello.offer, hello.final.task_id))
    return 0 if hello.final.state is TaskState.TASK_FINISHED else 1


if __name__ == "__main__":
    sys.exit(main())
