"""End to end: real master and agent processes, a real driver, real executors."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from dyad.local import agent_address, http_get_json
from dyad.resources import Resources
from frameworks import CommandInfo, Filters, FrameworkInfo, TaskInfo, TaskState

from .conftest import Recorder, wait_for

pytestmark = pytest.mark.integration

SMALL = Resources.parse("cpus:0.1;mem:32")


def command_task(offer: Any, task_id: str, shell: str, **kw: Any) -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                    resources=SMALL, command=CommandInfo(shell=shell), **kw)


async def first_offer(recorder: Recorder, after: int = 0) -> Any:
    await wait_for(lambda: len(recorder.offers) > after, what="an offer")
    return recorder.offers[after]


async def final_state(recorder: Recorder, task_id: str, timeout: float = 20.0) -> Any:
    def terminal() -> Any:
        done = [s for s in recorder.statuses
                if s.task_id == task_id and s.state.is_terminal]
        return done[-1] if done else None
    return await wait_for(terminal, timeout, f"{task_id} to end")


def task_state_in_master(cluster: Any, task_id: str) -> str | None:
    state = cluster.state()
    for framework in state["frameworks"] + state.get("completed_frameworks", []):
        for task in framework["tasks"] + framework.get("completed_tasks", []):
            if task["id"] == task_id:
                return task["state"]
    return None


async def test_launch_finish_and_sandbox_logs(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=2)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    runner.driver.launch_tasks([offer.id], [command_task(offer, "hello", "echo hello-dyad")])
    status = await final_state(recorder, "hello")
    assert status.state == TaskState.TASK_FINISHED
    assert recorder.states("hello")[-2:] == ["TASK_RUNNING", "TASK_FINISHED"]
    # The task's stdout is kept in its sandbox and served by the agent's /files API.
    agent_url = offer.url
    agent_state = http_get_json(f"{agent_url}/state")
    directories = [e["directory"] for f in agent_state["frameworks"] + agent_state.get(
        "completed_frameworks", []) for e in f["executors"] + f.get("completed_executors", [])
        if e["id"] == "hello"]
    assert directories, agent_state
    query = urllib.parse.urlencode({"path": f"{directories[0]}/stdout", "offset": 0})
    assert "hello-dyad" in http_get_json(f"{agent_url}/files/read?{query}")["data"]
    assert task_state_in_master(cluster, "hello") == "TASK_FINISHED"


async def test_failure_reports_exit_code(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    runner.driver.launch_tasks([offer.id], [command_task(offer, "bad", "exit 7")])
    status = await final_state(recorder, "bad")
    assert status.state == TaskState.TASK_FAILED
    assert "7" in status.message


async def test_kill_escalates_to_sigkill_after_grace(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    stubborn = command_task(offer, "stubborn", "trap '' TERM; echo ready; sleep 60",
                            kill_grace_period=1.0)
    runner.driver.launch_tasks([offer.id], [stubborn])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("stubborn"), what="running")

    def ready() -> bool:  # its trap is set: a SIGTERM before that would simply end it
        state = http_get_json(f"{offer.url}/state")
        runs = [e for f in state["frameworks"] for e in f["executors"] if e["id"] == "stubborn"]
        out = os.path.join(runs[0]["directory"], "stdout") if runs else ""
        if not out or not os.path.exists(out):
            return False
        with open(out, "rb") as handle:
            return b"ready" in handle.read()
    await wait_for(ready, what="the task to trap SIGTERM")
    started = time.monotonic()
    runner.driver.kill_task("stubborn")
    status = await final_state(recorder, "stubborn")
    elapsed = time.monotonic() - started
    assert status.state == TaskState.TASK_KILLED
    assert "TASK_KILLING" in recorder.states("stubborn")
    assert 1.0 <= elapsed < 10, elapsed


async def test_offer_timeout_rescinds_and_late_launch_is_dropped(
        make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1, master_args=["--offer-timeout", "1s"])
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    await wait_for(lambda: offer.id in recorder.named("rescinded"), what="rescind")
    runner.driver.launch_tasks([offer.id], [command_task(offer, "late", "true")])
    status = await final_state(recorder, "late")
    assert status.state == TaskState.TASK_DROPPED
    assert status.reason == "REASON_INVALID_OFFERS"
    # The rescinded resources went back to the pool and are offered again.
    await wait_for(lambda: any(o.agent_id == offer.agent_id and o.id != offer.id
                               for o in recorder.offers), what="a new offer")


async def offers_from_two_agents(make_cluster: Any,
                                 drivers: Any) -> tuple[Any, Recorder, Any]:
    """A framework registered on a new 2-agent cluster, once both agents offered."""
    cluster = make_cluster(agents=2)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
    await runner.registered()
    await wait_for(lambda: len({o.agent_id for o in recorder.offers}) == 2, what="2 offers")
    return cluster, recorder, runner


async def test_decline_filter_then_revive(make_cluster: Any, drivers: Any) -> None:
    cluster, recorder, runner = await offers_from_two_agents(make_cluster, drivers)
    declined = {o.agent_id for o in recorder.offers}
    for offer in list(recorder.offers):
        runner.driver.decline_offer(offer.id, Filters(refuse_seconds=60))
    seen = len(recorder.offers)
    # Let several allocation cycles run: filtered agents must not be offered again.
    runs = _allocation_runs(cluster)
    await wait_for(lambda: _allocation_runs(cluster) >= runs + 5, what="allocation cycles")
    assert [o for o in recorder.offers[seen:] if o.agent_id in declined] == []
    runner.driver.revive_offers()
    await wait_for(lambda: len(recorder.offers) > seen, what="offers after revive")


def _allocation_runs(cluster: Any) -> int:
    return http_get_json(f"{cluster.master.url}/metrics/snapshot")["allocator/allocation_runs"]


async def test_invalid_launches_are_rejected_with_reasons(make_cluster: Any,
                                                          drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="it"), cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    too_big = TaskInfo(task_id="huge", name="huge", agent_id=offer.agent_id,
                       resources=Resources.parse("cpus:64;mem:32"),
                       command=CommandInfo(shell="true"))
    neither = TaskInfo(task_id="neither", name="n", agent_id=offer.agent_id, resources=SMALL)
    duplicate = [command_task(offer, "dup", "true"), command_task(offer, "dup", "true")]
    runner.driver.launch_tasks([offer.id], [too_big, neither, *duplicate])
    await wait_for(lambda: len(recorder.statuses) >= 4, what="4 statuses")
    by_id: dict[str, list[Any]] = {}
    for status in recorder.statuses:
        by_id.setdefault(status.task_id, []).append(status)
    assert by_id["huge"][0].state == TaskState.TASK_ERROR
    assert by_id["neither"][0].state == TaskState.TASK_ERROR
    assert [s.state for s in by_id["dup"]].count(TaskState.TASK_ERROR) >= 1
    assert all(s.message for s in recorder.statuses if s.state == TaskState.TASK_ERROR)


async def test_agent_loss_lost_vs_unreachable(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    plain, aware = Recorder(), Recorder()
    r1 = drivers(plain, FrameworkInfo(name="plain"), cluster.master_address)
    r2 = drivers(aware, FrameworkInfo(name="aware", capabilities=["PARTITION_AWARE"]),
                 cluster.master_address)
    await r1.registered()
    await r2.registered()
    for recorder, runner, task_id in ((plain, r1, "p"), (aware, r2, "a")):
        offer = await first_offer(recorder)
        runner.driver.launch_tasks([offer.id], [command_task(offer, task_id, "sleep 60")])
        await wait_for(lambda: "TASK_RUNNING" in recorder.states(task_id), what="running")
    agent = cluster.agent_children[0].process
    agent.send_signal(signal.SIGSTOP)  # a partition: the agent stops answering pings
    try:
        assert (await final_state(plain, "p")).state == TaskState.TASK_LOST
        await wait_for(lambda: "TASK_UNREACHABLE" in aware.states("a"), what="unreachable")
        await wait_for(lambda: plain.named("agent_lost"), what="agent_lost")
        assert cluster.state()["unreachable_agents"]
    finally:
        agent.send_signal(signal.SIGCONT)


async def test_framework_failover_keeps_tasks_then_teardown(make_cluster: Any,
                                                            drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    first = Recorder()
    info = FrameworkInfo(name="fo", failover_timeout=60)
    runner = drivers(first, info, cluster.master_address)
    framework_id = await runner.registered()
    offer = await first_offer(first)
    runner.driver.launch_tasks([offer.id], [command_task(offer, "long", "sleep 60")])
    await wait_for(lambda: "TASK_RUNNING" in first.states("long"), what="running")
    await runner.stop(failover=True)

    second = Recorder()
    runner2 = drivers(second, FrameworkInfo(name="fo", failover_timeout=60, id=framework_id),
                      cluster.master_address)
    # A new driver with an old framework id is told `registered`, as in Mesos.
    assert await runner2.registered() == framework_id
    runner2.driver.reconcile_tasks([])
    await wait_for(lambda: "TASK_RUNNING" in second.states("long"), what="reconciled")
    assert task_state_in_master(cluster, "long") == "TASK_RUNNING"
    await runner2.stop(failover=False)  # teardown kills the task
    await wait_for(lambda: task_state_in_master(cluster, "long") == "TASK_KILLED",
                   what="teardown kill")


async def test_failover_timeout_tears_down(make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="brief", failover_timeout=1),
                     cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    runner.driver.launch_tasks([offer.id], [command_task(offer, "orphan", "sleep 60")])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("orphan"), what="running")
    await runner.stop(failover=True)
    await wait_for(lambda: task_state_in_master(cluster, "orphan") == "TASK_KILLED",
                   what="teardown after failover timeout")


async def test_master_restart_agents_reregister_with_tasks(make_cluster: Any,
                                                           drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="survivor", failover_timeout=60),
                     cluster.master_address)
    await runner.registered()
    offer = await first_offer(recorder)
    runner.driver.launch_tasks([offer.id], [command_task(offer, "steady", "sleep 60")])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("steady"), what="running")

    port = int(cluster.master.url.rsplit(":", 1)[1])
    zmq_port = int(cluster.master.zmq.rsplit(":", 1)[1])
    cluster.stop_child(cluster.master)
    cluster.port, cluster.zmq_port = port, zmq_port
    cluster.start_master()

    await wait_for(lambda: recorder.named("reregistered"), timeout=20, what="reregistered")
    await wait_for(lambda: task_state_in_master(cluster, "steady") == "TASK_RUNNING",
                   timeout=20, what="task learned from the agent")
    runner.driver.kill_task("steady")
    assert (await final_state(recorder, "steady")).state == TaskState.TASK_KILLED


async def test_bad_input_is_rejected_and_counted(make_cluster: Any) -> None:
    import zmq
    import zmq.asyncio

    cluster = make_cluster(agents=1)
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(cluster.master.zmq)
    try:
        for frame in (b"not json", b'{"type":"nope","v":1,"body":{}}',
                      b'{"type":"kill","v":1,"body":{"framework_id":1,"task_id":"t"}}',
                      b"x" * (4 * 1024 * 1024 + 10)):
            await sock.send(frame)
            reply = await asyncio.wait_for(sock.recv(), 10)
            assert b"rejected" in reply
    finally:
        sock.close()
    metrics = http_get_json(f"{cluster.master.url}/metrics/snapshot")
    assert metrics["master/messages_invalid"] >= 4
    assert http_get_json(f"{cluster.master.url}/health")["healthy"] is True
    agent_url = cluster.agent_children[0].url
    for path in ("/files/read?path=/etc/passwd", "/files/read?path=x&offset=abc"):
        try:
            http_get_json(agent_url + path)
        except Exception as exc:  # urllib raises HTTPError for 4xx
            assert getattr(exc, "code", 0) in (400, 403, 404)
        else:
            raise AssertionError(f"{path} was served")
    assert http_get_json(f"{agent_url}/health")


def _processes_under(path: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if path.encode() in handle.read():
                    found.append(int(pid))
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if path.encode() in handle.read():
                    found.append(int(pid))
        except OSError:
            continue
    return sorted(set(found) - {os.getpid()})


@pytest.mark.parametrize("program, expected", [
    ("examples/hello.py", "TASK_FINISHED"),
    # The main demo: the service and batch frameworks sharing the cluster.
    ("examples/demo.py", "top words"),
])
async def test_dyad_local_runs_a_program_and_leaves_nothing(
        tmp_path: Any, program: str, expected: str) -> None:
    work = tmp_path / "local"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dyad.cli", "local", "--agents", "3", "--port", "0",
        "--work-dir", str(work), "--run", program,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = out.decode()
    assert proc.returncode == 0, text
    assert expected in text
    assert _processes_under(str(work)) == []


async def test_local_task_hosts_resolve_and_answer(make_cluster: Any, drivers: Any) -> None:
    """A client of a task connects to `host:port` from the offer: in `dyad local`
    that host must resolve and answer, and differ per agent (issue 11, 2)."""
    _, recorder, runner = await offers_from_two_agents(make_cluster, drivers)
    hosts = {o.hostname for o in recorder.offers}
    assert hosts == {agent_address(0), agent_address(1)}
    offer = recorder.offers[-1]
    assert urllib.parse.urlsplit(offer.url).hostname == offer.hostname
    port = offer.resources.ranges("ports")[0][0]
    runner.driver.launch_tasks([offer.id], [TaskInfo(
        task_id="web", name="web", agent_id=offer.agent_id,
        resources=SMALL + Resources.parse(f"ports:[{port}-{port}]"),
        command=CommandInfo(shell="exec python3 -m http.server $PORT",
                            environment={"PORT": str(port)}))])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("web"), what="web running")
    socket.getaddrinfo(offer.hostname, port)  # resolves (raises socket.gaierror if not)

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://{offer.hostname}:{port}/", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False
    await wait_for(answers, 20, f"http://{offer.hostname}:{port}/ to answer")
    runner.driver.kill_task("web")
    await final_state(recorder, "web")


def _free_port_with_next_taken(offset: int) -> tuple[int, socket.socket]:
    """A port P that is free, with P + offset held by the returned socket."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + offset > 65535:
            continue
        blocker = socket.socket()
        try:
            blocker.bind(("127.0.0.1", port + offset))
        except OSError:
            blocker.close()
            continue
        blocker.listen()
        return port, blocker
    raise AssertionError("no free pair of ports found")


async def test_dyad_local_port_does_not_claim_port_plus_five(tmp_path: Any) -> None:
    """`dyad local --port P` starts although P+5 is taken: the master's ZMQ port is
    chosen freely unless `--zmq-port` pins it (issue 11, 3)."""
    port, blocker = _free_port_with_next_taken(5)
    with blocker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dyad.cli", "local", "--agents", "1", "--port", str(port),
            "--work-dir", str(tmp_path / "local"), "--run", sys.executable, "-c",
            "import os, urllib.request; print(urllib.request.urlopen("
            "'http://' + os.environ['DYAD_MASTER'] + '/master/info').read().decode())",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = out.decode()
    assert proc.returncode == 0, text
    assert f'"port": {port}' in text or f'"port":{port}' in text, text

