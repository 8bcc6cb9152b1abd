"""`dyad apps`: manage the service framework's apps from a terminal.

    dyad apps list
    dyad apps show /web [--json]
    dyad apps add web.json          # an app definition (Marathon JSON); - reads stdin
    dyad apps scale /web 5
    dyad apps restart /web
    dyad apps remove /web
    dyad apps deployments
    dyad apps recommend /web [--json]   # the autopilot's limits vs the app's

It talks to `dyad-service`'s REST API at ``--service`` (default ``$DYAD_SERVICE``,
else ``127.0.0.1:8080``). ``--force`` overrides a deployment that locks the app. A
standby instance names its leader, and the request is sent there instead. Exit
status: 0 done, 1 the service refused (its message is printed), 2 bad usage or no
service reachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from dyad.auth import ClientCredentials

DEFAULT_SERVICE = "127.0.0.1:8080"
TIMEOUT = 10.0


class ApiError(Exception):
    """The service answered with an error status; `message` is its explanation."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Unreachable(Exception):
    """No service answered at the address."""


class UsageError(Exception):
    """The command line asks for something impossible (bad file, negative count)."""


def add_parser(commands: Any) -> None:
    """Register ``apps`` on the `dyad` command's subparsers."""
    apps = commands.add_parser("apps", help="manage long-running apps (dyad-service)",
                               description=__doc__.split("\n\n")[0])
    apps.add_argument("--service", default=os.environ.get("DYAD_SERVICE", DEFAULT_SERVICE),
                      help="dyad-service address host:port (default $DYAD_SERVICE or "
                           f"{DEFAULT_SERVICE})")
    apps.add_argument("--force", action="store_true",
                      help="override a deployment that locks the app")
    actions = apps.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="apps with their task counts")
    show = actions.add_parser("show", help="one app and its tasks")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print the API's JSON")
    add = actions.add_parser("add", help="create an app from a JSON file (- for stdin)")
    add.add_argument("file")
    scale = actions.add_parser("scale", help="set the number of instances")
    scale.add_argument("id")
    scale.add_argument("instances", type=int)
    restart = actions.add_parser("restart", help="replace every task (rolling)")
    restart.add_argument("id")
    remove = actions.add_parser("remove", help="delete an app and kill its tasks")
    remove.add_argument("id")
    actions.add_parser("deployments", help="deployments in progress")
    recommend = actions.add_parser("recommend", help="the autopilot's recommended limits")
    recommend.add_argument("id")
    recommend.add_argument("--json", action="store_true", help="print the API's JSON")


def base_url(address: str) -> str:
    """http://, or https:// when $DYAD_CA names the cluster CA."""
    return ClientCredentials.from_env().base_url(address)


def request(service: str, method: str, path: str, body: Any = None,
            query: dict[str, str] | None = None, follow_leader: bool = True) -> Any:
    """One API call; the decoded JSON answer (None if empty)."""
    url = base_url(service) + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    try:
        with ClientCredentials.from_env().urlopen(req, timeout=TIMEOUT) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        answer = _decode(exc.read())
        message = answer.get("message", exc.reason) if isinstance(answer, dict) else exc.reason
        leader = answer.get("leader") if isinstance(answer, dict) else None
        if exc.code == 503 and leader and follow_leader and leader != service:
            return request(leader, method, path, body, query, follow_leader=False)
        if isinstance(answer, dict) and answer.get("details"):
            message += "".join(f"\n  {d.get('path')}: {'; '.join(d.get('errors', []))}"
                               for d in answer["details"])
        raise ApiError(exc.code, str(message)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(f"no dyad-service at {url}: {getattr(exc, 'reason', exc)}") from None
    return _decode(raw)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace").strip()}


DYAD = {"dyad": "true"}
"""Asks for Dyad's extra fields (waitingReason, deployment progress...) beside
Marathon's (frameworks/service/marathon_shape.py)."""


def app_path(app_id: str) -> str:
    return "/v2/apps/" + urllib.parse.quote(app_id.strip("/"))


def format_apps(apps: list[dict[str, Any]]) -> str:
    rows = [("ID", "INSTANCES", "RUNNING", "HEALTHY", "STAGED", "DEPLOYING", "WAITING")]
    for app in apps:
        rows.append((app["id"], str(app["instances"]), str(app["tasksRunning"]),
                     str(app["tasksHealthy"]) if app.get("healthChecks") else "-",
                     str(app["tasksStaged"]), "yes" if app["deployments"] else "no",
                     app.get("waitingReason") or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                     for row in rows).rstrip() + "\n"


def format_app(app: dict[str, Any]) -> str:
    command = app.get("cmd") or " ".join(app.get("args") or [])
    lines = [f"{app['id']}  version {app['version']}",
             f"  command    {command}",
             f"  instances  {app['instances']} (running {app['tasksRunning']}, staged "
             f"{app['tasksStaged']}, healthy {app['tasksHealthy']}, unhealthy "
             f"{app['tasksUnhealthy']})",
             f"  resources  cpus {app['cpus']:g}, mem {app['mem']:g}, disk {app['disk']:g}, "
             f"ports {app['ports']}"]
    if app.get("constraints"):
        lines.append("  constraints " + ", ".join(":".join(c) for c in app["constraints"]))
    if app.get("deployments"):
        lines.append("  deployment " + ", ".join(d["id"] for d in app["deployments"]))
    if app.get("waitingReason"):
        lines.append(f"  waiting    {app['waitingReason']}")
    failure = app.get("lastTaskFailure")
    if failure:
        lines.append(f"  last failure {failure['taskId']} {failure['state']} on "
                     f"{failure['host']}: {failure['message']}")
    for task in app.get("tasks", []):
        address = task["ipAddresses"][0]["ipAddress"] if task["ipAddresses"] else task["host"]
        ports = ",".join(map(str, task["ports"]))
        results = task["healthCheckResults"]
        health = "" if not results else " healthy" if results[0]["alive"] else " unhealthy"
        lines.append(f"  task {task['id']}  {task['state']}{health}  {task['host']} "
                     f"{address}:{ports}")
    return "\n".join(lines) + "\n"


def format_deployments(deployments: list[dict[str, Any]]) -> str:
    if not deployments:
        return "no deployments in progress\n"
    lines = []
    for d in deployments:
        progress = d.get("progress", {})
        lines.append(f"{d['id']}  {d.get('kind', '')} {', '.join(d['affectedApps'])}  "
                     f"new ready {progress.get('newReady', '?')}/"
                     f"{progress.get('targetInstances', '?')}, old {progress.get('old', '?')}")
    return "\n".join(lines) + "\n"


def format_recommendation(answer: dict[str, Any]) -> str:
    current, rec = answer["current"], answer["recommendation"]
    mode = answer["autopilot"]["mode"]
    if rec is None:
        return (f"{answer['appId']}: autopilot {mode}; give the app "
                '"autopilot": {"mode": "recommend"} (or "auto") to get recommendations\n')
    lines = [f"{answer['appId']}  autopilot {mode}, {rec['samples']} samples, "
             f"{rec['ooms']} OOM kill(s)",
             f"  {'':12}{'current':>10}{'recommended':>14}",
             f"  {'cpus':12}{current['cpus']:>10g}{rec['cpus']:>14g}",
             f"  {'mem (MiB)':12}{current['mem']:>10g}{rec['mem']:>14g}"]
    instances = rec.get("instances")  # only with a horizontal spec
    if instances is not None:
        lines.append(f"  {'instances':12}{instances['current']:>10}{instances['recommended']:>14}")
    if rec["ready"]:
        lines.append(f"  variants    {rec['cpuVariant']}, {rec['memVariant']}; would free "
                     f"cpus {rec['slackRemoved']['cpus']:g}, mem "
                     f"{rec['slackRemoved']['mem']:g} MiB")
    lines += [f"  - {reason}" for reason in rec["reasons"]]
    if instances is not None:
        lines.append(f"  - instances: {instances['reason']}")
    return "\n".join(lines) + "\n"


def _deployment_line(answer: Any, what: str) -> str:
    return f"{what}: deployment {answer.get('deploymentId')} (version {answer.get('version')})\n"


def _read_definition(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None


def execute(args: argparse.Namespace) -> str:
    """Carry out one `dyad apps` action; the text to print."""
    service = args.service
    force = {"force": "true"} if args.force else None
    if args.action == "list":
        return format_apps(request(service, "GET", "/v2/apps", query=DYAD)["apps"])
    if args.action == "show":
        app = request(service, "GET", app_path(args.id), query=DYAD)["app"]
        return json.dumps(app, indent=2) + "\n" if args.json else format_app(app)
    if args.action == "add":
        app = request(service, "POST", "/v2/apps", _read_definition(args.file), force)
        return f"created {app['id']}: deployment {app['deployments'][0]['id']}\n"
    if args.action == "scale":
        if args.instances < 0:
            raise UsageError("instances must not be negative")
        answer = request(service, "PUT", app_path(args.id), {"instances": args.instances}, force)
        return _deployment_line(answer, f"scaling {args.id} to {args.instances}")
    if args.action == "restart":
        answer = request(service, "POST", app_path(args.id) + "/restart", None, force)
        return _deployment_line(answer, f"restarting {args.id}")
    if args.action == "remove":
        answer = request(service, "DELETE", app_path(args.id), None, force)
        return _deployment_line(answer, f"removing {args.id}")
    if args.action == "deployments":
        return format_deployments(request(service, "GET", "/v2/deployments", query=DYAD))
    if args.action == "recommend":
        answer = request(service, "GET", app_path(args.id) + "/recommendation")
        return json.dumps(answer, indent=2) + "\n" if args.json else format_recommendation(answer)
    raise ValueError(f"unknown action {args.action}")


def run(args: argparse.Namespace) -> int:
    try:
        sys.stdout.write(execute(args))
    except ApiError as exc:
        print(f"dyad apps: {exc.message}", file=sys.stderr)
        return 1
    except (Unreachable, UsageError) as exc:
        print(f"dyad apps: {exc}", file=sys.stderr)
        return 2
    return 0
