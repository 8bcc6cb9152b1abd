"""An unmodified pymesos scheduler and executor, run by test_pymesos_executor.py.
They use nothing of Dyad.

`python pymesos_executor.py scheduler HOST:PORT`: subscribes, and from its first
offer launches two tasks on one custom executor -- this file again, as
`python pymesos_executor.py executor`, which the agent starts with Mesos'
environment and which speaks the v1 executor API. The executor says hello (a
framework message naming the agent it subscribed to) and reports each task
running; the scheduler pings the executor (a framework message the other way),
which answers and finishes the `echo` task; the scheduler kills `sleeper`, which
the executor reports killed. Every update is acknowledged explicitly. Then the
scheduler stops (pymesos tears the framework down, and the agent shuts the
executor down). It prints one JSON line saying what it saw and exits 0, or exits 3
if the flow does not complete within its deadline.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from typing import Any

from pymesos import Executor, MesosExecutorDriver, Scheduler
from pymesos_scheduler import run  # beside this file, on sys.path when run as a script

EXECUTOR_ID = "pymesos-executor"


def resources(cpus: float, mem: float) -> list[dict[str, Any]]:
    return [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}}]


def encode(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def decode(data: str) -> str:
    return base64.b64decode(data).decode()


class Tasks(Executor):
    """Runs no processes: each task is running until killed, or until a ping ends
    `echo`."""

    def registered(self, driver: Any, executor_info: Any, framework_info: Any,
                   agent_info: Any) -> None:
        driver.sendFrameworkMessage(encode(f"hello from {agent_info['hostname']} as "
                                           f"{executor_info['executor_id']['value']}"))

    def launchTask(self, driver: Any, task: Any) -> None:
        driver.sendStatusUpdate({"task_id": task["task_id"], "state": "TASK_RUNNING",
                                 "message": f"running {decode(task['data'])}"})

    def killTask(self, driver: Any, task_id: Any) -> None:
        driver.sendStatusUpdate({"task_id": task_id, "state": "TASK_KILLED"})

    def frameworkMessage(self, driver: Any, message: str) -> None:
        driver.sendFrameworkMessage(encode(f"pong:{decode(message)}"))
        driver.sendStatusUpdate({"task_id": {"value": "echo"}, "state": "TASK_FINISHED"})


class Flow(Scheduler):
    def __init__(self, executor_command: str) -> None:
        self.executor_command = executor_command
        self.seen: dict[str, Any] = {"framework_id": None, "states": {}, "messages": [],
                                     "updates": []}
        self.launched = self.pinged = self.killed = False
        self.lock = threading.Lock()

    def registered(self, driver: Any, framework_id: Any, master_info: Any) -> None:
        self.seen["framework_id"] = framework_id["value"]

    def resourceOffers(self, driver: Any, offers: list[Any]) -> None:
        with self.lock:
            for offer in offers:
                if self.launched:
                    driver.declineOffer(offer["id"])
                    continue
                self.launched = True
                executor = {"executor_id": {"value": EXECUTOR_ID}, "name": "pymesos",
                            "command": {"value": self.executor_command},
                            "resources": resources(0.1, 32)}
                tasks = [{"name": name, "task_id": {"value": name},
                          "agent_id": offer["agent_id"], "resources": resources(0.1, 32),
                          "executor": executor, "data": encode(name)}
                         for name in ("echo", "sleeper")]
                driver.launchTasks(offer["id"], tasks)

    def statusUpdate(self, driver: Any, status: Any) -> None:
        task = status["task_id"]["value"]
        with self.lock:
            self.seen["states"].setdefault(task, []).append(status["state"])
            self.seen["updates"].append({key: status.get(key) for key in (
                "source", "message", "executor_id", "agent_id")})
            driver.acknowledgeStatusUpdate(status)
            if status["state"] != "TASK_RUNNING":
                self._maybe_done(driver)
                return
            if task == "echo" and not self.pinged:
                self.pinged = True
                driver.sendFrameworkMessage(status["executor_id"], status["agent_id"],
                                            encode("ping"))
            elif task == "sleeper" and not self.killed:
                self.killed = True
                driver.killTask({"value": "sleeper"})

    def frameworkMessage(self, driver: Any, executor_id: Any, agent_id: Any,
                         message: str) -> None:
        with self.lock:
            self.seen["messages"].append(decode(message))
            self._maybe_done(driver)

    def _maybe_done(self, driver: Any) -> None:
        states = self.seen["states"]
        if ("TASK_FINISHED" in states.get("echo", []) and "TASK_KILLED" in states.get(
                "sleeper", []) and any(m.startswith("pong:") for m in self.seen["messages"])):
            print(json.dumps(self.seen), flush=True)
            driver.stop()

    def error(self, driver: Any, message: str) -> None:
        self.seen.setdefault("errors", []).append(message)


def main() -> None:
    if sys.argv[1] == "executor":
        MesosExecutorDriver(Tasks(), use_addict=True).run()
    else:
        run(Flow(f"{sys.executable} {os.path.abspath(__file__)} executor"),
            "pymesos-executor-flow", sys.argv[2])


if __name__ == "__main__":
    main()
