"""Failover fencing against a real ZooKeeper (master/election.py, master/liveness.py):
a dead leader is replaced before its session expires, a paused one is not, a
paused leader resumed after its successor took over never acts as leader again,
and the two halves of the proof and the conditional delete hold against real
processes and a real ZooKeeper.

Masters and agents are real processes, the framework a real `SchedulerDriver`.
Offer ids begin with the id of the master that made them, so "who offered" is read
from the framework's side."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from dyad.local import Child, LocalCluster, http_get_json
from dyad.zk import VersionConflict, ZkError, ZkSession
from frameworks import Filters, FrameworkInfo
from master.liveness import try_connect

from .conftest import FAST_MASTER, Recorder, wait_for
from .zookeeper import ZooKeeperServer, zookeeper  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

SESSION_TIMEOUT = 4.0  # ZooKeeper's stock minimum; the fast path must beat it


class Decliner(Recorder):
    """Records offers (their ids name the master that made them) and declines
    them with a short filter, so offers keep coming from whoever leads."""

    def resource_offers(self, driver: Any, offers: list[Any]) -> None:
        self.offers.extend(offers)
        for offer in offers:
            driver.decline_offer(offer.id, Filters(refuse_seconds=0.2))


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeperServer) -> Iterator[LocalCluster]:
    made = LocalCluster(work_dir=tmp_path / "cluster", agents=2, masters=2, zk=zookeeper.url(),
                        resources="cpus:2;mem:1024;disk:1000",
                        master_args=FAST_MASTER + ["--zk-session-timeout", f"{SESSION_TIMEOUT}s"])
    made.start()
    yield made
    for child in made.master_children:  # a test may leave one stopped
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGCONT)
    made.stop()


async def health(http: aiohttp.ClientSession, child: Child) -> Any:
    try:
        async with http.get(f"{child.url}/health",
                            timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return await resp.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def health_asked_now(child: Child) -> asyncio.Future[Any]:
    """Ask `child`'s /health now, even if it is stopped: this returns once the
    request sits in its kernel's buffers; the future answers when it replies."""
    url = urlsplit(child.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: dyad\r\nConnection: close\r\n\r\n")
    await writer.drain()

    async def answer() -> Any:
        try:
            reply = await asyncio.wait_for(reader.read(), 10)
            return json.loads(reply.partition(b"\r\n\r\n")[2])
        except (OSError, asyncio.TimeoutError, ValueError):
            return None
        finally:
            writer.close()
    return asyncio.ensure_future(answer())


async def leads(http: aiohttp.ClientSession, child: Child) -> bool:
    answer = await health(http, child)
    return bool(answer and answer["leader"])


def metrics(child: Child) -> dict[str, float]:
    return dict(http_get_json(f"{child.url}/metrics/snapshot", timeout=5))


def offers_by(recorder: Recorder, master_id: str, after: int = 0) -> int:
    return sum(1 for offer in recorder.offers[after:] if offer.id.startswith(master_id + "-"))


async def test_a_killed_leader_is_replaced_before_its_session_could_expire(
        cluster: LocalCluster, drivers: Any) -> None:
    recorder = Decliner()
    drivers(recorder, FrameworkInfo(name="watcher", failover_timeout=60), cluster.master_address)
    await wait_for(lambda: len(recorder.offers) >= 3, 30, "offers")
    leader = cluster.leader()
    (standby,) = [m for m in cluster.master_children if m is not leader]
    await wait_for(lambda: metrics(standby)["master/election/watching"] == 1, 15,
                   "the standby to hold a connection to the leader")
    killed_at = time.monotonic()
    leader.process.send_signal(signal.SIGKILL)
    async with aiohttp.ClientSession() as http:
        await wait_for(lambda: leads(http, standby), 3 * SESSION_TIMEOUT, "the standby to lead")
    elected_in = time.monotonic() - killed_at
    figures = metrics(standby)
    assert figures["master/election/proven_dead"] == 1, figures
    assert figures["master/election/fast_failovers"] == 1, figures
    # Its session would have lived SESSION_TIMEOUT more; the lease fence costs 1 s.
    assert elected_in < SESSION_TIMEOUT, elected_in
    await wait_for(lambda: len(cluster.state()["agents"]) == 2, 15, "agents at the new leader")
    offered = len(recorder.offers)
    await wait_for(lambda: offers_by(recorder, figures_id(standby), offered) > 0, 15,
                   "offers from the new leader")


def figures_id(child: Child) -> str:
    return str(http_get_json(f"{child.url}/master/info", timeout=5)["id"])


async def test_a_paused_leader_is_not_proven_dead_and_resumed_it_never_leads_again(
        cluster: LocalCluster, drivers: Any, zookeeper: ZooKeeperServer) -> None:
    """SIGSTOP keeps every socket open: the standby sees no proof and waits for
    ZooKeeper to expire the session. Resumed, the old leader finds its lease long
    lapsed and its znode gone: it reports itself not leading, makes no offer,
    writes no registry, and exits for its supervisor."""
    recorder = Decliner()
    runner = drivers(recorder, FrameworkInfo(name="watcher", failover_timeout=60), cluster.master_address)
    await runner.registered()
    await wait_for(lambda: len(recorder.offers) >= 3, 30, "offers")
    old = cluster.leader()
    (standby,) = [m for m in cluster.master_children if m is not old]
    old_id = figures_id(old)
    old_writes = metrics(old)["master/registry_writes"]
    await wait_for(lambda: metrics(standby)["master/election/watching"] == 1, 15,
                   "the standby to hold a connection to the leader")

    old.process.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    async with aiohttp.ClientSession() as http:
        try:
            await wait_for(lambda: leads(http, standby), 4 * SESSION_TIMEOUT + 10,
                           "the standby to take over from the paused leader")
            took_over_in = time.monotonic() - stopped_at
            # No false proof: the expiry did it, a session timeout after the
            # leader's last word (a renewal up to a lease before the stop; ZooKeeper
            # expires on tick boundaries).
            figures = metrics(standby)
            assert figures["master/election/proven_dead"] == 0, figures
            assert figures["master/election/fast_failovers"] == 0, figures
            assert took_over_in >= SESSION_TIMEOUT - 1.0, took_over_in
            await wait_for(lambda: len(cluster.state()["agents"]) == 2, 15,
                           "agents at the new leader")
            new_id = figures_id(standby)
            # Asked while paused, answered (if at all) after resuming.
            asked = await health_asked_now(old)
            offered = len(recorder.offers)
        finally:
            old.process.send_signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        answers = [await asked]
        while old.process.poll() is None and time.monotonic() < resumed_at + 20:
            answers.append(await health(http, old))
        code = await wait_for(lambda: old.process.poll(), 20, "the resumed leader to exit")
    assert code == 75, code
    heard = [a for a in answers if a is not None]
    assert all(a["leader"] is False for a in heard), heard
    log_text = old.log_path.read_text()
    assert "stepping down" in log_text
    assert "resumed: the ZooKeeper session is confirmed" not in log_text
    assert "registry write failed" not in log_text  # it did not even try

    # The new leader goes on offering; the old one offered nothing after resuming,
    # and the registry is still the new leader's (a write by the old one would have
    # fenced the new one at its next write: it writes at once, below).
    await wait_for(lambda: offers_by(recorder, new_id, offered) >= 2, 15,
                   "offers from the new leader")
    assert offers_by(recorder, old_id, offered) == 0
    writes_before = metrics(standby)["master/registry_writes"]
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{standby.url}/weights", json=[{"role": "fenced", "weight": 2.0}],
                            timeout=aiohttp.ClientTimeout(total=10)) as resp:
            assert resp.status < 300, await resp.text()
        await wait_for(lambda: metrics(standby)["master/registry_writes"] > writes_before, 10,
                       "the new leader's registry write")
        assert await leads(http, standby)
    assert http_get_json(f"{standby.url}/health", timeout=5)["healthy"] is True
    assert metrics(standby)["master/election/deletes_refused"] == 0
    state = cluster.state()
    assert len(state["agents"]) == 2 and state["recovering_agents"] == []
    assert not [s for s in recorder.statuses if s.state.is_terminal]
    assert old_writes >= 1


async def test_a_paused_process_still_accepts_and_a_dead_one_refuses(tmp_path: Path) -> None:
    """The second half of the proof (master/liveness.py's port check) against a
    real process: stopped, its kernel still completes connections to its ports,
    so no check can call it dead; killed, the same ports refuse."""
    ready = tmp_path / "port"
    child = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "s = socket.create_server(('127.0.0.1', 0))\n"
        f"open({str(ready)!r}, 'w').write(str(s.getsockname()[1]))\n"
        "time.sleep(300)\n")])
    try:
        port = int(await wait_for(lambda: ready.exists() and ready.read_text(), 10,
                                  "the listener"))
        child.send_signal(signal.SIGSTOP)
        refused, why = await try_connect(("127.0.0.1", port))
        assert not refused, why
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        refused, why = await try_connect(("127.0.0.1", port))
        assert refused, why
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


async def test_the_conditional_delete_touches_only_the_session_it_saw(
        zookeeper: ZooKeeperServer) -> None:
    """`ZkSession.delete_owned`: a znode owned by another session, or at another
    version, is refused; the one the standby saw is deleted; one already gone is
    an error, never a delete of something else."""
    leader, standby = ZkSession(zookeeper.hosts, 4.0), ZkSession(zookeeper.hosts, 4.0)
    await leader.start()
    await standby.start()
    try:
        await leader.ensure_path("/dyad")
        path = await leader.create("/dyad/json.info_", b"{}", ephemeral=True, sequence=True)
        owner = await standby.owner(path)
        assert owner == (leader.session_id, 0)
        with pytest.raises(VersionConflict):
            await standby.delete_owned(path, owner=standby.session_id or 0, version=0)
        with pytest.raises(VersionConflict):
            await standby.delete_owned(path, owner=owner[0], version=1)
        await standby.delete_owned(path, owner=owner[0], version=0)
        assert await standby.owner(path) is None
        with pytest.raises(ZkError):
            await standby.delete_owned(path, owner=owner[0], version=0)
    finally:
        await standby.close()
        await leader.close()
