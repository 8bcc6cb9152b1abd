"""A secured cluster of real processes (`LocalCluster(secure=True)`: a master and
an agent with CURVE, TLS, credentials and ACLs), probed the way the issue's
probe did: without credentials, with another cluster's, and as a principal
acting on what is not its own. Every attempt must be refused, counted, and
change nothing."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

from dyad import keys_cli
from dyad.auth import ClientCredentials, load_keys
from dyad.local import LocalCluster
from dyad.messages import (
    Acknowledge,
    AgentInfo,
    CommandInfo,
    ExecutorInfo,
    FrameworkInfo,
    Kill,
    Message,
    Reconcile,
    RegisterAgent,
    RegisterExecutor,
    Rejected,
    Subscribe,
    TaskInfo,
)
from dyad.resources import Resources
from dyad.transport import Dealer
from frameworks import SchedulerDriver
from tests.helpers import wait_for

from .conftest import FAST_MASTER, Recorder

pytestmark = pytest.mark.integration

PRINCIPALS = ("alice", "bob", "carol", "mallory")
ACLS = {"permissive": False, "rules": [
    {"effect": "allow", "principals": ["*"], "actions": ["view_state"]},
    {"effect": "allow", "principals": ["agent"], "actions": ["register_agent"]},
    {"effect": "allow", "principals": ["alice", "bob"],
     "actions": ["register_framework", "run_task"]},
    {"effect": "allow", "principals": ["carol"], "actions": ["kill_task"], "objects": ["bob"]},
    {"effect": "allow", "principals": ["operator", "master"], "actions": ["*"]},
]}


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another cluster's credentials: valid keys and a CA ours never trusted."""
    directory = tmp_path_factory.mktemp("stranger") / "keys"
    keys_cli.generate(directory, ["alice", "agent"], hosts=["localhost", "127.0.0.1"])
    return directory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Command tasks under command executors: each run then has an executor that must
    # register with the key the agent gave that run (a direct run has none to give).
    cluster = LocalCluster(work_dir=tmp_path_factory.mktemp("secure"), agents=1,
                           resources="cpus:4;mem:2048;disk:1000", master_args=FAST_MASTER,
                           secure=True, principals=PRINCIPALS,
                           agent_args=["--command-tasks", "executor"])
    cluster._generate_keys()
    (cluster.keys_dir / "acls.json").write_text(json.dumps(ACLS))
    cluster.start()
    yield cluster
    cluster.stop()


def credentials(cluster: LocalCluster, principal: str) -> ClientCredentials:
    return ClientCredentials.from_env(cluster.client_env(principal))


def metric(cluster: LocalCluster, key: str) -> float:
    return float(cluster.get(f"{cluster.master.url}/metrics/snapshot").get(key, 0))


class Peer:
    """A raw DEALER speaking to the master (or an agent) as whoever its keys say."""

    def __init__(self, endpoint: str, keys: Any = None, server_key: bytes | None = None,
                 identity: str | None = None) -> None:
        self.dealer = Dealer(identity, curve=keys, server_key=server_key)
        self.dealer.connect(endpoint)

    async def ask(self, message: Message, timeout: float = 5.0) -> Message | None:
        await self.dealer.send(message)
        try:
            inbound = await asyncio.wait_for(self.dealer.recv(), timeout)
        except TimeoutError:
            return None
        return inbound.message

    def close(self) -> None:
        self.dealer.close()


def master_key(cluster: LocalCluster) -> bytes:
    return load_keys(cluster.keys_dir / "curve" / "master.key").public


def sleep_task(offer: Any, task_id: str) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                    resources=Resources.parse("cpus:0.1;mem:32"),
                    command=CommandInfo(shell="sleep 60"))


async def framework_with_task(cluster: LocalCluster, principal: str,
                              tasks: int = 1) -> tuple[SchedulerDriver, Recorder, asyncio.Task[Any]]:
    recorder = Recorder()
    launched: list[str] = []

    def on_offers(driver: SchedulerDriver, offers: list[Any]) -> None:
        if len(launched) < tasks:
            ids = [f"{principal}-{n}" for n in range(tasks)]
            launched.extend(ids)
            driver.launch_tasks([offers[0].id], [sleep_task(offers[0], i) for i in ids])
        for offer in offers[1 if launched else 0:]:
            driver.decline_offer(offer.id)

    recorder.on_offers = on_offers
    driver = SchedulerDriver(recorder, FrameworkInfo(name=f"fw-{principal}"),
                             master=cluster.master_address,
                             credentials=credentials(cluster, principal))
    task = asyncio.ensure_future(driver.run_async())
    for n in range(tasks):
        await wait_for(lambda n=n: "TASK_RUNNING" in recorder.states(f"{principal}-{n}"), 30,
                       f"{principal}'s task {n} running")
    return driver, recorder, task


async def stop(driver: SchedulerDriver, task: asyncio.Task[Any]) -> None:
    driver.stop()
    await asyncio.wait_for(task, 15)


async def http(cluster: LocalCluster, method: str, url: str, principal: str | None,
               body: Any = None, ca: Path | None = None) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(ca or cluster.keys_dir / "tls" / "ca.pem"))
    headers = credentials(cluster, principal).headers() if principal else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, \
            session.request(method, url, json=body, headers=headers) as response:
        return response.status, await response.json()


# ------------------------------------------------------------------ the wire

async def test_agents_without_a_known_key_are_refused_and_counted(
        cluster: LocalCluster, stranger: Path) -> None:
    endpoint = cluster.master.zmq
    curve_before = metric(cluster, "master/auth_failures/curve")
    handshake_before = metric(cluster, "master/auth_failures/handshake")
    rogue = RegisterAgent(agent=AgentInfo(hostname="rogue", port=1,
                                          resources=Resources.parse("cpus:10000")))
    plain = Peer(endpoint)  # no CURVE at all
    wrong = Peer(endpoint, load_keys(stranger / "curve" / "agent.key_secret"),
                 master_key(cluster))
    try:
        assert await plain.ask(rogue, timeout=2) is None
        assert await wrong.ask(rogue, timeout=2) is None
        await wait_for(lambda: metric(cluster, "master/auth_failures/curve") > curve_before,
                       10, "the unknown key counted")
        await wait_for(lambda: metric(cluster, "master/auth_failures/handshake")
                       > handshake_before, 10, "the plain client counted")
    finally:
        plain.close()
        wrong.close()
    agents = cluster.state()["agents"]
    assert [a["hostname"] for a in agents] != ["rogue"] and len(agents) == 1


async def test_a_framework_with_another_clusters_key_hears_why(
        cluster: LocalCluster, stranger: Path) -> None:
    recorder = Recorder()
    wrong = ClientCredentials(keys=load_keys(stranger / "curve" / "alice.key_secret"),
                              master_keys=(master_key(cluster),),
                              ca=cluster.keys_dir / "tls" / "ca.pem",
                              token=credentials(cluster, "alice").token)
    driver = SchedulerDriver(recorder, FrameworkInfo(name="intruder"),
                             master=cluster.master_address, credentials=wrong)
    task = asyncio.ensure_future(driver.run_async())
    try:
        await wait_for(lambda: any("refused" in m for m in recorder.named("error")), 15,
                       "the refusal reported through error()")
        assert recorder.framework_id is None
    finally:
        driver.abort()
        await asyncio.wait_for(task, 10)


async def test_a_framework_cannot_take_over_or_act_on_anothers(cluster: LocalCluster) -> None:
    driver, bob, task = await framework_with_task(cluster, "bob")
    assert bob.framework_id is not None
    forbidden = metric(cluster, "master/auth_failures/forbidden")
    alice = Peer(cluster.master.zmq, credentials(cluster, "alice").keys, master_key(cluster))
    try:
        takeover = await alice.ask(Subscribe(framework=FrameworkInfo(
            name="fw-bob", id=bob.framework_id)))
        assert isinstance(takeover, Rejected) and "belongs to principal 'bob'" in takeover.reason
        posing = await alice.ask(Subscribe(framework=FrameworkInfo(name="x", principal="bob")))
        assert isinstance(posing, Rejected) and "authenticated as 'alice'" in posing.reason
        for message in (Kill(framework_id=bob.framework_id, task_id="bob-0"),
                        Acknowledge(framework_id=bob.framework_id, agent_id="S1",
                                    task_id="bob-0", uuid="u"),
                        Reconcile(framework_id=bob.framework_id)):
            answer = await alice.ask(message)
            assert isinstance(answer, Rejected), message
            assert "no rule lets alice" in answer.reason, answer.reason
        assert metric(cluster, "master/auth_failures/forbidden") >= forbidden + 5
        await asyncio.sleep(0.5)  # time for a wrongly accepted kill to land
        assert bob.states("bob-0")[-1] == "TASK_RUNNING"
        assert not bob.named("error")
    finally:
        alice.close()
        await stop(driver, task)


async def test_the_master_advertises_its_key_and_a_client_pinning_none_learns_it(
        cluster: LocalCluster) -> None:
    status, info = await http(cluster, "GET", f"{cluster.master.url}/master/info", "alice")
    assert status == 200 and info["curve_key"] == master_key(cluster).decode()
    learner = attrs.evolve(credentials(cluster, "alice"), master_keys=())
    recorder = Recorder()
    driver = SchedulerDriver(recorder, FrameworkInfo(name="learner"),
                             master=cluster.master_address, credentials=learner)
    task = asyncio.ensure_future(driver.run_async())
    try:
        await wait_for(lambda: recorder.framework_id is not None, 20,
                       "registered with the key /master/info (over verified HTTPS) advertised")
    finally:
        await stop(driver, task)


async def test_a_pinned_master_key_wins_over_the_advertised_one(
        cluster: LocalCluster, stranger: Path) -> None:
    pinned_elsewhere = attrs.evolve(credentials(cluster, "alice"), master_keys=(
        load_keys(stranger / "curve" / "agent.key").public,))
    recorder = Recorder()
    driver = SchedulerDriver(recorder, FrameworkInfo(name="pinned"),
                             master=cluster.master_address, credentials=pinned_elsewhere)
    task = asyncio.ensure_future(driver.run_async())
    try:
        await wait_for(lambda: any("not among the keys we trust" in m
                                   for m in recorder.named("error")), 15,
                       "the advertised key refused, and error() told why")
        assert recorder.framework_id is None
    finally:
        driver.abort()
        await asyncio.wait_for(task, 10)


# ------------------------------------------------------------------ HTTP

async def test_http_needs_credentials_and_the_clusters_ca(
        cluster: LocalCluster, stranger: Path) -> None:
    master, agent = cluster.master.url, cluster.agent_children[0].url
    before = metric(cluster, "master/auth_failures/http_unauthenticated")
    for url in (f"{master}/state", f"{agent}/state", f"{master}/master/info"):
        status, body = await http(cluster, "GET", url, None)
        assert status == 401 and "authentication required" in body["error"]
    status, _ = await http(cluster, "GET", f"{master}/health", None)
    assert status == 200  # the one open path
    assert metric(cluster, "master/auth_failures/http_unauthenticated") >= before + 2
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await http(cluster, "GET", f"{master}/state", "operator",
                   ca=stranger / "tls" / "ca.pem")
    plain = master.replace("https://", "http://")
    with pytest.raises(aiohttp.ClientError):  # no plain-text HTTP at all
        async with aiohttp.ClientSession() as session, session.get(f"{plain}/state"):
            pass


async def test_operator_calls_need_their_permission(cluster: LocalCluster) -> None:
    driver, bob, task = await framework_with_task(cluster, "bob", tasks=2)
    master = cluster.master.url
    agent_id = cluster.state()["agents"][0]["id"]
    calls = [("PUT", "/quota", {"role": "eng", "guarantee": {"cpus": 1}}),
             ("PUT", "/weights", [{"role": "eng", "weight": 2}]),
             ("POST", "/machine/drain", {"agent_id": agent_id}),
             ("POST", "/teardown", {"framework_id": bob.framework_id}),
             ("POST", "/tasks/kill", {"task_id": "bob-0"})]
    try:
        for method, path, body in calls:
            for who in ("mallory", "alice"):
                status, answer = await http(cluster, method, master + path, who, body)
                assert status == 403, (who, path, answer)
                assert f"no rule lets {who}" in answer["error"], answer
        assert bob.states("bob-0")[-1] == "TASK_RUNNING"
        # The ACLs let carol kill bob's tasks, and nothing more.
        status, answer = await http(cluster, "POST", master + "/tasks/kill", "carol",
                                    {"task_id": "bob-0"})
        assert status == 202, answer
        await wait_for(lambda: "TASK_KILLED" in bob.states("bob-0"), 20, "carol's kill")
        status, _ = await http(cluster, "PUT", master + "/weights", "carol",
                               [{"role": "eng", "weight": 2}])
        assert status == 403
        status, answer = await http(cluster, "PUT", master + "/weights", "operator",
                                    [{"role": "eng", "weight": 2}])
        assert status == 200, answer
    finally:
        await stop(driver, task)


async def test_sandboxes_are_read_by_their_framework_only(cluster: LocalCluster) -> None:
    driver, bob, task = await framework_with_task(cluster, "bob")
    agent = cluster.agent_children[0].url
    try:
        state = cluster.get(f"{agent}/state")
        directory = next(e["directory"] for f in state["frameworks"]
                         if f["id"] == bob.framework_id for e in f["executors"])

        def files(path: str) -> str:
            return f"{agent}/files/read?{urllib.parse.urlencode({'path': path, 'offset': 0})}"

        status, _ = await http(cluster, "GET", files(f"{directory}/stdout"), "bob")
        assert status == 200
        status, _ = await http(cluster, "GET", files(f"{directory}/stdout"), "operator")
        assert status == 200
        status, answer = await http(cluster, "GET", files(f"{directory}/stdout"), "alice")
        assert status == 403 and "no rule lets alice read_sandbox 'bob'" in answer["error"]
        status, answer = await http(cluster, "GET",
                                    files(f"{directory}/.dyad/executor.key_secret"), "bob")
        assert status == 403 and ".dyad" in answer["error"]
        status, _ = await http(cluster, "POST", f"{agent}/drain", "alice")
        assert status == 403
    finally:
        await stop(driver, task)


# ------------------------------------------------------------- executors

async def test_executors_register_only_with_their_own_runs_key(
        cluster: LocalCluster, stranger: Path) -> None:
    driver, bob, task = await framework_with_task(cluster, "bob", tasks=2)
    agent = cluster.agent_children[0]
    try:
        state = cluster.get(f"{agent.url}/state")
        executors = {e["id"]: e["directory"] for f in state["frameworks"]
                     if f["id"] == bob.framework_id for e in f["executors"]}
        (first, first_dir), (second, _) = sorted(executors.items())
        run_key = load_keys(Path(first_dir) / ".dyad" / "executor.key_secret")
        agent_key = load_keys(Path(first_dir) / ".dyad" / "agent.key").public
        impostor = Peer(agent.zmq, run_key, agent_key)
        stranger_peer = Peer(agent.zmq, load_keys(stranger / "curve" / "agent.key_secret"),
                             agent_key)
        try:
            answer = await impostor.ask(RegisterExecutor(framework_id=bob.framework_id,
                                                         executor_id=second))
            assert isinstance(answer, Rejected), answer
            assert "must register with the key its agent gave its run" in answer.reason
            assert await stranger_peer.ask(RegisterExecutor(
                framework_id=bob.framework_id, executor_id=first), timeout=2) is None
            metrics = cluster.get(f"{agent.url}/metrics/snapshot")
            assert metrics["agent/auth_failures/forbidden"] >= 1
            await wait_for(lambda: cluster.get(f"{agent.url}/metrics/snapshot").get(
                "agent/auth_failures/curve", 0) >= 1, 10, "the stranger's key counted")
        finally:
            impostor.close()
            stranger_peer.close()
        assert bob.states("bob-0")[-1] == "TASK_RUNNING"
        assert bob.states("bob-1")[-1] == "TASK_RUNNING"
    finally:
        await stop(driver, task)


# ---------------------------------------------------------- task users

@pytest.fixture
def task_user() -> Iterator[str]:
    """A Unix user made for this test (the agent, as root, switches to it)."""
    import os
    import shutil
    import subprocess
    import uuid

    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("useradd", "userdel", "setpriv")):
        pytest.skip("switching users needs root, useradd and setpriv")
    name = f"dyad-t{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


async def test_tasks_run_as_the_user_they_name_or_fail_saying_why(
        cluster: LocalCluster, task_user: str) -> None:
    recorder = Recorder()
    launched: list[str] = []
    record = "id -un > whoami; stat -c %U . > owner; printf %s \"$HOME\" > home"

    def on_offers(driver: SchedulerDriver, offers: list[Any]) -> None:
        offer, rest = offers[0], offers[1:]
        if not launched:
            launched.append(offer.id)
            custom = TaskInfo(task_id="as-user", name="as-user", agent_id=offer.agent_id,
                              resources=Resources.parse("cpus:0.1;mem:32"),
                              executor=ExecutorInfo(executor_id="as-user", command=CommandInfo(
                                  shell=record, user=task_user)))
            missing = TaskInfo(task_id="no-user", name="no-user", agent_id=offer.agent_id,
                               resources=Resources.parse("cpus:0.1;mem:32"),
                               command=CommandInfo(shell="true", user="no-such-user-dyad"))
            driver.launch_tasks([offer.id], [custom, missing])
        else:
            rest = offers
        for other in rest:
            driver.decline_offer(other.id)

    recorder.on_offers = on_offers
    driver = SchedulerDriver(recorder, FrameworkInfo(name="users"), master=cluster.master_address,
                             credentials=credentials(cluster, "alice"))
    task = asyncio.ensure_future(driver.run_async())
    try:
        await wait_for(lambda: "TASK_FAILED" in recorder.states("no-user"), 30,
                       "the task naming a missing user failed")
        (failed,) = [s for s in recorder.statuses
                     if s.task_id == "no-user" and s.state.name == "TASK_FAILED"]
        assert "'no-such-user-dyad' does not exist" in failed.message
        runs = cluster.work_dir / "agent0"
        await wait_for(lambda: any(p.read_text().strip() for p in runs.glob(
            "**/executors/as-user/runs/*/home")), 30, "the custom executor ran")
        (run,) = [p.parent for p in runs.glob("**/executors/as-user/runs/*/home")]
        assert (run / "whoami").read_text().strip() == task_user
        assert (run / "owner").read_text().strip() == task_user  # its sandbox is its own
        assert (run / "home").read_text() == "/nonexistent"
    finally:
        await stop(driver, task)


# ------------------------------------------------------------ end to end

def test_dyad_local_secure_runs_the_demo(tmp_path: Path) -> None:
    import subprocess

    from dyad.local import PROJECT_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "dyad.cli", "local", "--secure", "--agents", "2", "--port", "0",
         "--work-dir", str(tmp_path / "local"), "--run", "examples/demo.py"],
        check=False, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "https://" in result.stdout and "top words" in result.stdout


# Last: it adds an agent to the shared cluster.
async def test_an_agent_pinning_no_master_key_learns_it_and_registers(
        cluster: LocalCluster, tmp_path: Path) -> None:
    import os
    import subprocess

    from dyad.local import agent_address

    env = {**os.environ, **cluster.client_env("agent")}
    del env["DYAD_MASTER_KEY"]  # learn it from /master/info, over HTTPS verified by the CA
    host = agent_address(2)
    log = open(tmp_path / "learner.log", "wb")
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent.main", "--master", cluster.master_address,
         "--ip", host, "--hostname", host, "--port", "0", "--executor-port", "0",
         "--work-dir", str(tmp_path / "agent"), "--resources", "cpus:1;mem:128;disk:100",
         *cluster._server_args("agent")], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        await wait_for(lambda: any(a["hostname"] == host for a in cluster.state()["agents"]),
                       30, "the learning agent registered")
    finally:
        agent.terminate()
        agent.wait(15)
        log.close()
