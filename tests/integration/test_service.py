"""`dyad-service` as a real process on a real 3-agent cluster: apps of
`python3 -m http.server` with agent HTTP health checks come up, heal, spread,
upgrade, roll back, survive a framework restart, and fail over between two
instances through a real ZooKeeper."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest
from kazoo.client import KazooClient

from dyad.local import PROJECT_ROOT, LocalCluster, _die_with_parent, agent_address
from frameworks.service.core import Persist, Snapshot
from frameworks.service.store import StoreError, ZkStore

from .conftest import wait_for
from .zookeeper import ZooKeeperServer, zookeeper  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

# A long grace: on a busy machine Python may take seconds to start listening.
HEALTH = {"protocol": "HTTP", "path": "/", "portIndex": 0, "gracePeriodSeconds": 20,
          "intervalSeconds": 1, "timeoutSeconds": 2, "delaySeconds": 0,
          "maxConsecutiveFailures": 3}
# Every address: clients use the task's host (its agent's own 127.0.0.N in `dyad
# local`), while the agent's health checks probe 127.0.0.1.
WEB = {"id": "/web", "cmd": "exec python3 -m http.server --bind $HOST $PORT0",
       "instances": 3, "cpus": 0.1, "mem": 32, "ports": [0],
       "constraints": [["hostname", "UNIQUE"]], "healthChecks": [HEALTH],
       "upgradeStrategy": {"minimumHealthCapacity": 1.0, "maximumOverCapacity": 0.5},
       "backoffSeconds": 0.5, "taskKillGracePeriodSeconds": 1}


class Service:
    """One `dyad-service` process and a tiny client for its API."""

    def __init__(self, log_path: Path, argv: list[str]) -> None:
        self.log_path = log_path
        env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "frameworks.service.main", "--port", "0",
                 "--deployment-timeout", "30s", "--decline-refuse", "2s", *argv],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=_die_with_parent)
        self.url = ""

    async def started(self) -> Service:
        def listening() -> str | None:
            found = re.findall(r"listening on (http://\S+)", self.log_path.read_text())
            assert self.process.poll() is None, self.log_path.read_text()[-3000:]
            return found[-1] if found else None
        self.url = await wait_for(listening, 20, "the service's API")

        def settled_role() -> bool:
            # The API listens before the state is loaded: until this instance
            # leads (or names another leader) it answers 503.
            if "dyad-service leading" in self.log_path.read_text():
                return True
            status, answer = self.call("GET", "/v2/leader")  # 404: no leader yet
            leader = answer.get("leader") if status == 200 else None
            return leader is not None and f"http://{leader}" != self.url
        await wait_for(settled_role, 20, "the service to lead or name its leader")
        return self

    def call(self, method: str, path: str, body: Any = None,
             raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, (status, body)
        return body

    def app(self, app_id: str = "/web") -> dict[str, Any]:
        return self.get(f"/v2/apps{app_id}")["app"]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def services(tmp_path: Path) -> Any:
    started: list[Service] = []

    def start(name: str, *argv: str) -> Service:
        service = Service(tmp_path / f"{name}.log", list(argv))
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop(signal.SIGKILL)


def settled(service: Service, healthy: int) -> Callable[[], bool]:
    def check() -> bool:
        app = service.app()
        return app["tasksHealthy"] == healthy and app["tasksRunning"] == healthy \
            and not app["deployments"]
    return check


def answers_http(task: dict[str, Any]) -> bool:
    address = task["ipAddresses"][0]["ipAddress"]
    with urllib.request.urlopen(f"http://{address}:{task['ports'][0]}/", timeout=5) as resp:
        return resp.status == 200


def framework_tasks(cluster: LocalCluster, framework_id: str) -> list[str]:
    (framework,) = [f for f in cluster.state()["frameworks"] if f["id"] == framework_id]
    return sorted(t["id"] for t in framework["tasks"])


def process_of(task_id: str) -> psutil.Process:
    """The task's own process (the http.server), found by the id the executor gives it."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "http.server" in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get("DYAD_TASK_ID") == task_id:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process for task {task_id}")


async def test_apps_heal_spread_survive_a_restart_and_roll_back_a_broken_upgrade(
        make_cluster: Any, services: Any, tmp_path: Path) -> None:
    cluster = make_cluster(agents=3, resources="cpus:2;mem:1024;disk:1000")
    argv = ["--master", cluster.master_address, "--work-dir", str(tmp_path / "state")]
    service = await services("first", *argv).started()

    # Three instances, one per host, each answering HTTP and passing its health check.
    status, created = service.call("POST", "/v2/apps", WEB)
    assert status == 201, created
    await wait_for(settled(service, 3), 60, "3 healthy tasks")
    tasks = service.app()["tasks"]
    hosts = [agent_address(i) for i in range(3)]
    assert sorted(t["host"] for t in tasks) == hosts
    assert all(answers_http(t) for t in tasks)
    listing = subprocess.run([sys.executable, "-m", "dyad.cli", "apps", "--service",
                              service.url, "list"], capture_output=True, text=True,
                             timeout=20, env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
    assert listing.returncode == 0 and "/web" in listing.stdout, listing.stderr

    # Kill one task's process: it fails, and a replacement takes its place.
    victim = tasks[0]["id"]
    process_of(victim).kill()
    await wait_for(lambda: victim not in {t["id"] for t in service.app()["tasks"]}
                   and settled(service, 3)(), 60, "a replacement")
    assert service.app()["lastTaskFailure"]["taskId"] == victim
    assert all(answers_http(t) for t in service.app()["tasks"])

    # Five instances spread over the racks (agent0, agent2 in r1; agent1 in r2).
    status, answer = service.call("PUT", "/v2/apps/web", {
        "instances": 5, "constraints": [["rack", "GROUP_BY"]]})
    assert status == 200, answer
    await wait_for(settled(service, 5), 60, "5 healthy tasks")
    racks = Counter(f"r{hosts.index(t['host']) % 2 + 1}" for t in service.app()["tasks"])
    assert racks == {"r1": 3, "r2": 2}
    good = {t["id"] for t in service.app()["tasks"]}

    # Kill the framework outright and start it again: same framework id, same tasks.
    framework_id = service.get("/v2/info")["frameworkId"]
    assert framework_tasks(cluster, framework_id) == sorted(good)
    service.stop(signal.SIGKILL)
    # (The new instance gives upgrades 6 s to show a ready task, for the next step.)
    restarted = await services("second", *argv, "--deployment-timeout", "6s").started()
    await wait_for(lambda: restarted.get("/v2/info?dyad=true")["connected"], 20, "re-registration")
    assert restarted.get("/v2/info")["frameworkId"] == framework_id
    await wait_for(settled(restarted, 5), 30, "5 healthy tasks after the restart")
    time.sleep(1)  # reconciliation answers and a few offer rounds
    assert {t["id"] for t in restarted.app()["tasks"]} == good
    assert framework_tasks(cluster, framework_id) == sorted(good)
    assert restarted.get("/metrics")["counters"].get("tasks_launched", 0) == 0

    # A broken upgrade (never healthy) keeps 5 healthy tasks and rolls back on its own.
    status, answer = restarted.call("PUT", "/v2/apps/web", {"cmd": "sleep 600"})
    assert status == 200, answer
    upgrade = answer["deploymentId"]
    lowest, saw_new = 5, False
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        app = restarted.app()
        lowest = min(lowest, app["tasksHealthy"])
        saw_new |= len(app["tasks"]) > 5
        assert len(app["tasks"]) <= 7          # (1 + 0.5) x 5, rounded down
        kinds = [d["kind"] for d in restarted.get("/v2/deployments?dyad=true")]
        if not kinds and upgrade not in {d["id"] for d in app["deployments"]}:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the broken upgrade did not roll back")
    assert saw_new and lowest >= 5
    app = restarted.app()
    assert app["cmd"] == WEB["cmd"] and {t["id"] for t in app["tasks"]} == good
    metrics = restarted.get("/metrics")["counters"]
    assert metrics["deployments_rolled_back"] == 1


async def test_a_standby_takes_over_through_zookeeper(
        make_cluster: Any, services: Any, zookeeper: ZooKeeperServer) -> None:  # noqa: F811
    cluster = make_cluster(agents=2, resources="cpus:2;mem:1024;disk:1000")
    argv = ["--master", cluster.master_address, "--zk", zookeeper.url("/dyad-service"),
            "--zk-session-timeout", "5s"]
    pair = [await services("first", *argv).started(), await services("second", *argv).started()]

    def roles() -> tuple[Service, Service] | None:
        infos = [service.get("/v2/info?dyad=true") for service in pair]
        leading = [s for s, i in zip(pair, infos) if i["elected"] and i["connected"]]
        # A standby stands by once it knows, through ZooKeeper, who leads.
        waiting = [s for s, i in zip(pair, infos) if not i["elected"] and i["leader"]]
        return (leading[0], waiting[0]) if len(leading) == len(waiting) == 1 else None

    leader, standby = await wait_for(roles, 30, "one leader and one standby")
    status, body = standby.call("GET", "/v2/apps")
    assert status == 503 and body["leader"] == leader.url.removeprefix("http://")

    status, created = leader.call("POST", "/v2/apps", {
        **WEB, "instances": 2, "healthChecks": [], "constraints": []})
    assert status == 201, created
    await wait_for(lambda: leader.app()["tasksRunning"] == 2 and not leader.app()["deployments"],
                   60, "2 running tasks")
    tasks = {t["id"] for t in leader.app()["tasks"]}
    framework_id = leader.get("/v2/info")["frameworkId"]

    leader.stop(signal.SIGKILL)   # its ZooKeeper session expires after 5 s
    await wait_for(lambda: standby.get("/v2/info?dyad=true")["connected"], 30, "the standby to lead")
    assert standby.get("/v2/info")["frameworkId"] == framework_id
    await wait_for(lambda: standby.app()["tasksRunning"] == 2, 20, "the tasks, reconciled")
    time.sleep(1)
    assert {t["id"] for t in standby.app()["tasks"]} == tasks
    assert framework_tasks(cluster, framework_id) == sorted(tasks)
    assert standby.get("/metrics")["counters"].get("tasks_launched", 0) == 0


async def test_bad_requests_get_4xx_and_leave_the_service_working(
        make_cluster: Any, services: Any, tmp_path: Path) -> None:
    """Issue 12's reproducers against a real process over a real socket: each one
    answered at once with a 4xx and a reason, and the service still runs apps."""
    cluster = make_cluster(agents=1, resources="cpus:2;mem:1024;disk:1000")
    service = await services("only", "--master", cluster.master_address,
                             "--work-dir", str(tmp_path / "state")).started()
    redos = {**WEB, "constraints": [["hostname", "CLUSTER", "a" * 40 + "!"],
                                    ["hostname", "LIKE", "(a+)+"]]}
    bad: list[tuple[str, str, bytes]] = [
        ("POST", "/v2/apps", b"[" * 1000 + b"]" * 1000),
        ("PUT", "/v2/apps/web", b'{"cpus": 1' + b"0" * 309 + b"}"),
        ("POST", "/v2/apps", b'{"id": "/web", "cmd": "x", "cpus": 1e309}'),
        ("POST", "/v2/apps", b'{"id": "/web", "cmd": "\\ud800"}'),
        ("POST", "/v2/apps", json.dumps({**WEB, "constraints": [
            ["hostname", "MAX_PER", "\u00b2"]]}).encode()),
        ("POST", "/v2/apps", json.dumps(redos).encode()),   # hours with Python's re
        ("DELETE", "/v2/apps/web/tasks/a%0Ab", b""),
    ]
    for method, path, raw in bad:
        started = time.monotonic()
        status, body = service.call(method, path, raw=raw)   # urllib: 5 s timeout
        assert 400 <= status < 500 and body["message"], (method, path, status, body)
        assert time.monotonic() - started < 5
    assert service.get("/metrics")["counters"].get("http_responses_5xx", 0) == 0
    status, created = service.call("POST", "/v2/apps", {
        **WEB, "instances": 2, "healthChecks": [], "constraints": []})
    assert status == 201, created
    await wait_for(lambda: service.app()["tasksRunning"] == 2, 60, "the honest app's tasks")


def test_the_zookeeper_store_refuses_a_deposed_leaders_writes(
        zookeeper: ZooKeeperServer) -> None:  # noqa: F811
    clients = [KazooClient(hosts=zookeeper.hosts) for _ in range(2)]
    for client in clients:
        client.start(15)
    try:
        lock = clients[0].Lock("/svc/leader", "a")
        lock.acquire()
        store = ZkStore(clients[0], "/svc", f"{lock.path}/{lock.node}")
        store.load()
        store.apply([Persist("framework", "id", "fw-1"), Persist("apps", "web", {"v": 1}),
                     Persist("tasks", "t1", {"v": 1})])
        store.apply([Persist("apps", "web", {"v": 2}), Persist("tasks", "t1", None)])
        reader = ZkStore(clients[1], "/svc", "/unused")
        assert reader.load() == Snapshot(framework_id="fw-1", apps={"web": {"v": 2}})
        lock.release()   # deposed: its fence znode is gone
        with pytest.raises(StoreError, match="no longer leads"):
            store.apply([Persist("apps", "web", {"v": 3})])
        assert reader.load().apps == {"web": {"v": 2}}
    finally:
        for client in clients:
            client.stop()
            client.close()
