"""An unmodified pymesos scheduler, run as its own process by test_pymesos.py:
`python pymesos_scheduler.py HOST:PORT`. It uses nothing of Dyad.

It subscribes, declines its first offer with a short filter, launches two
command tasks from the next (one that finishes, one it kills once running),
acknowledges every update explicitly, declines later offers, reconciles the finished task, then stops
(pymesos tears the framework down). It prints one JSON line saying what it saw
and exits 0, or exits 3 if the flow does not complete within its deadline.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from pymesos import MesosSchedulerDriver, Scheduler

DEADLINE = 60.0


def resources(cpus: float, mem: float) -> list[dict[str, Any]]:
    return [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}}]


class Flow(Scheduler):
    def __init__(self) -> None:
        self.seen: dict[str, Any] = {"registered": None, "offers": 0, "declined": 0,
                                     "states": {}, "reconciled": None, "hostnames": []}
        self.launched = False
        self.killed = False
        self.lock = threading.Lock()

    def registered(self, driver: Any, framework_id: Any, master_info: Any) -> None:
        self.seen["registered"] = {"framework_id": framework_id["value"],
                                   "master_version": master_info.get("version")}

    def resourceOffers(self, driver: Any, offers: list[Any]) -> None:
        with self.lock:
            self.seen["offers"] += len(offers)
            for offer in offers:
                self.seen["hostnames"].append(offer["hostname"])
                if self.launched or not self.seen["declined"]:
                    # The first offer is declined with a short filter: the agent
                    # is offered again once it expires, and then used.
                    driver.declineOffer(offer["id"], filters={"refuse_seconds": 0.3})
                    self.seen["declined"] += 1
                    continue
                self.launched = True
                tasks = [{"name": name, "task_id": {"value": name},
                          "agent_id": offer["agent_id"], "resources": resources(0.1, 32),
                          "command": {"value": command}}
                         for name, command in (("hello", "echo hello from pymesos"),
                                               ("sleeper", "sleep 120"))]
                driver.launchTasks(offer["id"], tasks)

    def statusUpdate(self, driver: Any, status: Any) -> None:
        task = status["task_id"]["value"]
        with self.lock:
            if status.get("reason") == "REASON_RECONCILIATION":
                self.seen["reconciled"] = status["state"]
            else:
                self.seen["states"].setdefault(task, []).append(status["state"])
            driver.acknowledgeStatusUpdate(status)
            states = self.seen["states"]
            if task == "sleeper" and status["state"] == "TASK_RUNNING" and not self.killed:
                self.killed = True
                driver.killTask({"value": "sleeper"})
            done = ("TASK_FINISHED" in states.get("hello", [])
                    and "TASK_KILLED" in states.get("sleeper", []))
            if done and self.seen["reconciled"] is None and status["state"] in (
                    "TASK_FINISHED", "TASK_KILLED"):
                driver.reconcileTasks([{"task_id": {"value": "hello"}}])
            if self.seen["reconciled"] is not None:
                print(json.dumps(self.seen), flush=True)
                driver.stop()

    def error(self, driver: Any, message: str) -> None:
        self.seen.setdefault("errors", []).append(message)


def run(flow: Scheduler, name: str, master: str) -> None:
    """Run `flow` as framework `name`, acknowledging explicitly; exit 3 after
    DEADLINE seconds (pymesos_executor.py runs its scheduler with this too)."""
    watchdog = threading.Timer(DEADLINE, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    framework = {"user": "nobody", "name": name, "hostname": "localhost"}
    driver = MesosSchedulerDriver(flow, framework, master, use_addict=True,
                                  implicit_acknowledgements=False)
    driver.run()


def main() -> None:
    run(Flow(), "pymesos-flow", sys.argv[1])


if __name__ == "__main__":
    main()
