"""Operator commands: look at a running cluster and act on it from a terminal.

    dyad state                          # leader, agents, frameworks, tasks by state
    dyad agents | frameworks | offers | roles
    dyad tasks [--framework F] [--state RUNNING] [--all]
    dyad logs TASK_ID [--stderr] [--follow]
    dyad kill TASK_ID [--framework F]
    dyad quota set ROLE 'cpus:4;mem:8192' [--limit 'cpus:8']
    dyad weights set ROLE 2

Every command takes ``--master`` (default ``$DYAD_MASTER``, else
``127.0.0.1:5050``): ``host:port`` of any master (a standby redirects to the
leader) or ``zk://host:2181/dyad`` (the leader is looked up in ZooKeeper), and
``--json`` to print the master's JSON instead of a table. Exit status: 0 done,
1 the master refused (its reason is printed), 2 bad usage or no master reachable.

Tables are plain text on purpose: no extra dependency for an operator's box.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# The same three outcomes as `dyad apps`: refused (1), unreachable or misused (2).
from dyad.apps_cli import ApiError, Unreachable, UsageError
from dyad.auth import ClientCredentials, CredentialsError
from dyad.detector import make_detector, parse_http_address

DEFAULT_MASTER = "127.0.0.1:5050"
TIMEOUT = 10.0
FOLLOW_INTERVAL = 0.5  # seconds between reads of a followed log
TERMINAL = frozenset({"TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_LOST",
                      "TASK_ERROR", "TASK_DROPPED", "TASK_GONE"})
COMMANDS = ("state", "agents", "frameworks", "tasks", "offers", "roles", "logs", "kill",
            "quota", "weights")


# ------------------------------------------------------------------ arguments


def add_parsers(commands: Any) -> None:
    """Register the operator commands on the `dyad` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--master", default=os.environ.get("DYAD_MASTER", DEFAULT_MASTER),
                        help="host:port of a master or zk://host:2181/root (default "
                             f"$DYAD_MASTER or {DEFAULT_MASTER})")
    common.add_argument("--json", action="store_true", help="print JSON, not a table")
    add = commands.add_parser
    add("state", parents=[common], help="cluster summary: leader, agents, tasks by state")
    add("agents", parents=[common], help="agents with their resources")
    add("frameworks", parents=[common], help="frameworks with roles, share and usage")
    tasks = add("tasks", parents=[common], help="tasks (live and unreachable; --all: finished too)")
    tasks.add_argument("--framework", help="only this framework (id or name)")
    tasks.add_argument("--state", help="only this state (RUNNING or TASK_RUNNING)")
    tasks.add_argument("--all", action="store_true", help="include completed tasks")
    add("offers", parents=[common], help="outstanding offers")
    add("roles", parents=[common], help="roles with weight, quota, allocation and share")
    logs = add("logs", parents=[common], help="a task's stdout (or stderr) from its sandbox")
    logs.add_argument("task_id")
    logs.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing until the task ends (or Ctrl-C)")
    kill = add("kill", parents=[common], help="kill a live task (through the master)")
    kill.add_argument("task_id")
    kill.add_argument("--framework", help="framework id, if two frameworks use the task id")
    # --master/--json go on `set`: argparse lets a sub-command's defaults win.
    quota = add("quota", help="set a role's quota")
    quota_actions = quota.add_subparsers(dest="action", required=True)
    quota_set = quota_actions.add_parser("set", parents=[common],
                                         help="guarantee (and limit) for a role")
    quota_set.add_argument("role")
    quota_set.add_argument("guarantee", type=_amounts, help="e.g. 'cpus:4;mem:8192' ('' none)")
    quota_set.add_argument("--limit", type=_amounts, default={}, help="e.g. 'cpus:8;mem:16384'")
    weights = add("weights", help="set a role's weight")
    weights_actions = weights.add_subparsers(dest="action", required=True)
    weights_set = weights_actions.add_parser("set", parents=[common],
                                             help="weight for a role (1 resets it)")
    weights_set.add_argument("role")
    weights_set.add_argument("weight", type=float)


def _amounts(text: str) -> dict[str, float]:
    """'cpus:4;mem:8192' -> {"cpus": 4.0, "mem": 8192.0}; the master checks names."""
    amounts: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition(":")
        try:
            amounts[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"{part!r} is not NAME:AMOUNT (e.g. cpus:4)")
    return amounts


# ------------------------------------------------------------------ HTTP


def master_url(address: str, zk_timeout: float = TIMEOUT) -> str:
    """The HTTP base URL of the master to talk to: the leader's for zk://."""
    if not address.startswith("zk://"):
        try:
            parse_http_address(address)
            return ClientCredentials.from_env().base_url(address)
        except (ValueError, CredentialsError) as exc:
            raise UsageError(str(exc)) from None

    async def lookup() -> str:
        try:
            detector = make_detector(address)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            info = await asyncio.wait_for(detector.detect(), zk_timeout)
            return ClientCredentials.from_env().base_url(f"{info.ip}:{info.port}")
        except asyncio.TimeoutError:
            raise Unreachable(f"no leading master found in {address} "
                              f"within {zk_timeout:g}s") from None
        finally:
            await detector.close()

    return asyncio.run(lookup())


def call(base: str, method: str, path: str, body: Any = None,
         query: dict[str, Any] | None = None, redirects: int = 3) -> Any:
    """One JSON call. Redirects (a standby names the leader) are followed for
    every method, which urllib alone does only for GET."""
    url = base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with ClientCredentials.from_env().urlopen(req, timeout=TIMEOUT) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location")
        if exc.code in (307, 308) and location and redirects > 0:
            target = urllib.parse.urlsplit(location)
            return call(f"{target.scheme}://{target.netloc}", method, target.path, body,
                        dict(urllib.parse.parse_qsl(target.query)), redirects - 1)
        try:
            answer = json.loads(exc.read() or b"{}")
        except ValueError:
            answer = {}
        reason = answer.get("error") if isinstance(answer, dict) else None
        raise ApiError(exc.code, str(reason or exc.reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(f"nothing answered at {url}: {getattr(exc, 'reason', exc)}") from None
    return json.loads(raw) if raw else None


# ------------------------------------------------------------------ tables


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    text_rows = [list(headers)] + [[_cell(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in text_rows) for i in range(len(headers))]
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                   + "\n" for row in text_rows)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if 0 < abs(value) < 0.01 else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return "-" if value is None or value == "" else str(value)


def _resources(used: dict[str, Any], total: dict[str, Any] | None = None) -> list[str]:
    """cpus, mem, disk as 'used/total' (or just 'used')."""
    cells = []
    for kind in ("cpus", "mem", "disk"):
        cell = _cell(float(used.get(kind, 0)))
        cells.append(cell if total is None else f"{cell}/{_cell(float(total.get(kind, 0)))}")
    return cells


def all_tasks(state: dict[str, Any], completed: bool) -> list[dict[str, Any]]:
    """Live and unreachable tasks of every framework (and finished ones if asked),
    each with its framework's name as `framework_name`."""
    kinds = ("tasks", "unreachable_tasks") + (("completed_tasks",) if completed else ())
    frameworks = state.get("frameworks", []) + \
        (state.get("completed_frameworks", []) if completed else [])
    return [{**task, "framework_name": framework["name"]}
            for framework in frameworks for kind in kinds for task in framework.get(kind, [])]


def select_tasks(state: dict[str, Any], framework: str | None, task_state: str | None,
                 completed: bool) -> list[dict[str, Any]]:
    """`dyad tasks` filtering; a terminal `task_state` implies completed tasks."""
    wanted = None
    if task_state:
        wanted = task_state.upper()
        wanted = wanted if wanted.startswith("TASK_") else "TASK_" + wanted
    tasks = all_tasks(state, completed or wanted in TERMINAL)
    return [task for task in tasks
            if (framework is None or framework in (task["framework_id"], task["framework_name"]))
            and (wanted is None or task["state"] == wanted)]


def format_state(state: dict[str, Any]) -> str:
    if not state.get("elected", True):
        return f"master {state['id']} is a standby; leader: {state.get('leader_url') or 'none'}\n"
    totals: Counter[str] = Counter()
    used: Counter[str] = Counter()
    for agent in state["agents"]:
        totals.update({k: v for k, v in agent["resources"].items() if isinstance(v, float | int)})
        used.update({k: v for k, v in agent["used_resources"].items()
                     if isinstance(v, float | int)})
    by_state = Counter(task["state"] for task in all_tasks(state, completed=False))
    lines = [f"leader      {state['id']} ({state['hostname']}, version {state['version']})",
             f"agents      {len(state['agents'])} active, "
             f"{len(state.get('unreachable_agents', []))} unreachable, "
             f"{len(state.get('recovering_agents', []))} recovering",
             f"frameworks  {len(state['frameworks'])} registered, "
             f"{len(state.get('completed_frameworks', []))} completed",
             "tasks       " + (", ".join(f"{n} {s.removeprefix('TASK_').lower()}"
                                         for s, n in sorted(by_state.items())) or "none"),
             "resources   " + ", ".join(f"{kind} {_cell(float(used[kind]))}/"
                                        f"{_cell(float(totals[kind]))} used"
                                        for kind in ("cpus", "mem", "disk"))]
    return "\n".join(lines) + "\n"


def format_agents(state: dict[str, Any]) -> str:
    rows = [[a["id"], a["hostname"], *_resources(a["used_resources"], a["resources"]),
             ",".join(f"{k}={v}" for k, v in sorted(a.get("attributes", {}).items())),
             "drained" if a.get("drained") else "active", a["url"]]
            for a in state["agents"]]
    rows += [[u["id"], u["hostname"], "", "", "", "", "unreachable", ""]
             for u in state.get("unreachable_agents", [])]
    return table(["ID", "HOST", "CPUS", "MEM", "DISK", "ATTRIBUTES", "STATUS", "URL"], rows)


def format_frameworks(state: dict[str, Any]) -> str:
    rows = [[f["id"], f["name"], f["roles"], "yes" if f["connected"] else "no",
             len(f["tasks"]), *_resources(f["used_resources"]), f["dominant_share"]]
            for f in state["frameworks"]]
    return table(["ID", "NAME", "ROLES", "CONNECTED", "TASKS", "CPUS", "MEM", "DISK",
                  "SHARE"], rows)


def format_tasks(tasks: list[dict[str, Any]]) -> str:
    rows = [[t["id"], t["framework_name"], t["state"].removeprefix("TASK_"),
             None if t.get("healthy") is None else "yes" if t["healthy"] else "no", t["agent_id"],
             *_resources(t["resources"]), t["name"]] for t in tasks]
    return table(["ID", "FRAMEWORK", "STATE", "HEALTHY", "AGENT", "CPUS", "MEM", "DISK",
                  "NAME"], rows)


def format_offers(state: dict[str, Any]) -> str:
    rows = [[o["id"], o["framework_id"], o["agent_id"], o["hostname"],
             *_resources(o["resources"])]
            for f in state["frameworks"] for o in f.get("offers", [])]
    return table(["ID", "FRAMEWORK", "AGENT", "HOST", "CPUS", "MEM", "DISK"], rows)


def format_roles(roles: list[dict[str, Any]]) -> str:
    def amounts(values: dict[str, Any]) -> str:
        return ";".join(f"{k}:{_cell(v)}" for k, v in sorted(values.items())) or "-"

    rows = [[r["name"], r["weight"], amounts(r["quota"].get("guarantee", {})),
             amounts(r["quota"].get("limit", {})), amounts(r["allocated"]), r["dominant_share"]]
            for r in roles]
    return table(["ROLE", "WEIGHT", "GUARANTEE", "LIMIT", "ALLOCATED", "SHARE"], rows)


# ------------------------------------------------------------------ logs


def find_sandbox(master_state: dict[str, Any], agent_state_of: Any,
                 task_id: str) -> tuple[str, str, dict[str, Any]]:
    """(agent URL, sandbox directory, master's task JSON) of `task_id`, newest run
    first. `agent_state_of(url)` fetches an agent's /state (a seam for tests)."""
    tasks = [t for t in all_tasks(master_state, completed=True) if t["id"] == task_id]
    if not tasks:
        raise UsageError(f"the master knows no task {task_id}")
    task = tasks[-1]
    urls = {a["id"]: a["url"] for a in master_state["agents"]}
    if task["agent_id"] not in urls:
        raise UsageError(f"task {task_id} ran on agent {task['agent_id']}, "
                         "which is not registered now")
    agent = agent_state_of(urls[task["agent_id"]])
    for framework in agent.get("frameworks", []) + agent.get("completed_frameworks", []):
        if framework["id"] != task["framework_id"]:
            continue
        for executor in framework["executors"] + framework["completed_executors"]:
            ids = {t["id"] for kind in ("tasks", "queued_tasks", "completed_tasks")
                   for t in executor.get(kind, [])}
            if task_id in ids:
                return urls[task["agent_id"]], executor["directory"], task
    raise UsageError(f"agent {task['agent_id']} has no sandbox for task {task_id} "
                     "(garbage-collected?)")


def stream_log(base: str, agent_url: str, directory: str, task_id: str, name: str,
               follow: bool, out: Any) -> None:
    """Print the file from the start; with `follow`, keep reading until the master
    reports the task terminal and the file has nothing more."""
    offset = 0
    path = f"{directory}/{name}"
    while True:
        chunk = call(agent_url, "GET", "/files/read", query={"path": path, "offset": offset})
        out.write(chunk["data"])
        out.flush()
        offset = chunk["offset"] + len(chunk["data"].encode("utf-8", errors="replace"))
        if chunk["data"]:
            continue
        if not follow or _task_state(base, task_id) in TERMINAL:
            return
        time.sleep(FOLLOW_INTERVAL)


def _task_state(base: str, task_id: str) -> str:
    states = [t["state"] for t in all_tasks(call(base, "GET", "/state"), completed=True)
              if t["id"] == task_id]
    return states[-1] if states else "TASK_UNKNOWN"


# ------------------------------------------------------------------ commands


def execute(args: argparse.Namespace, out: Any) -> None:
    """Carry out one operator command, writing to `out`."""
    base = master_url(args.master)

    def show(document: Any, text: str) -> None:
        out.write(json.dumps(document, indent=2) + "\n" if args.json else text)

    if args.command == "logs":
        agent_url, directory, _ = find_sandbox(
            call(base, "GET", "/state"), lambda url: call(url, "GET", "/state"), args.task_id)
        stream_log(base, agent_url, directory, args.task_id,
                   "stderr" if args.stderr else "stdout", args.follow, out)
        return
    if args.command == "kill":
        body = {"task_id": args.task_id, **({"framework_id": args.framework}
                                              if args.framework else {})}
        answer = call(base, "POST", "/tasks/kill", body)
        show(answer, f"killing {answer['task_id']} of framework {answer['framework_id']}\n")
        return
    if args.command == "quota":
        body = {"role": args.role, "guarantee": args.guarantee, "limit": args.limit}
        answer = call(base, "PUT", "/quota", body)
        show(answer, format_roles(call(base, "GET", "/state")["roles"]))
        return
    if args.command == "weights":
        answer = call(base, "PUT", "/weights", [{"role": args.role, "weight": args.weight}])
        show(answer, format_roles(call(base, "GET", "/state")["roles"]))
        return
    state = call(base, "GET", "/state")
    if args.command == "tasks":
        tasks = select_tasks(state, args.framework, args.state, args.all)
        show(tasks, format_tasks(tasks))
    elif args.command == "roles":
        show(state["roles"], format_roles(state["roles"]))
    elif args.command == "state":
        show(state, format_state(state))
    elif args.command == "agents":
        show(state["agents"], format_agents(state))
    elif args.command == "frameworks":
        show(state["frameworks"], format_frameworks(state))
    else:
        show([o for f in state["frameworks"] for o in f.get("offers", [])], format_offers(state))


def run(args: argparse.Namespace,
        carry_out: Callable[[argparse.Namespace, Any], None] | None = None) -> int:
    """Run one command (`execute`, or `carry_out` for a sibling module's command)
    and turn its failures into the exit status."""
    try:
        (carry_out or execute)(args, sys.stdout)
    except ApiError as exc:
        print(f"dyad {args.command}: {exc.message}", file=sys.stderr)
        return 1
    except (Unreachable, UsageError) as exc:
        print(f"dyad {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
