"""Master failover under load: real ZooKeeper, real masters, simulated and real agents.

    python -m benchmarks.failover [--agents 1000] [--real-agents 3] [--tasks 2000]
                                  [--masters 2] [--rounds 5] [--zk-session-timeout 4s]
                                  [--zk-tick-ms 2000]

Starts a ZooKeeper server and `--masters` real `dyad-master --zk` processes, then
`--agents` simulated agents in this process (each its own ZMQ connection speaking
the real agent protocol: register, answer pings, report TASK_RUNNING for what it
is asked to run, re-register with its tasks after a failover; they share one
ZooKeeper detector), `--real-agents` real `dyad-agent` processes (which find the
leader through ZooKeeper themselves and run their tasks under real command
executors), and a real `SchedulerDriver` that launches `--tasks` tasks spread
over all of them. Then, `--rounds` times: SIGKILL the leading master, and measure

- time until ZooKeeper names a new leader (the standby proved the dead leader's
  process gone and deleted its znode, or its session expired), as this process's
  detector sees it; how many rounds took the fast path (master/election.py) is
  printed too;
- time until the new leader leads (it has also read and fenced the registry) and
  until every agent has re-registered with it (so it knows every task again), by
  the new leader's own clock (`elected_time` and the agents' `reregistered_time`
  in its `/state`), so this process's load does not inflate them; an agent
  re-registered while the new leader was still fenced (handling, not yet
  sending) counts as back only at `elected_time`, when its answer goes out; the
  real agents' time is also printed on its own;
- tasks lost (terminal updates the framework received, plus tasks the new leader
  does not know) and duplicate launches (RunTask for a task an agent already runs):
  both must be 0;

then restart the killed master as a standby for the next round. A last round
stops the leader cleanly (SIGTERM: it closes its session, so ZooKeeper deletes its
znode at once, and nobody needs a proof or a fence): the in-run reference, the
best failover ZooKeeper gives, whose agents-back time is mostly the new leader
handling a thousand re-registrations on this machine as loaded as it is. The
published references printed beside the figures: Mesos' paper measured 4-8 s mean
recovery, Borg quotes about 10 s. Without the fast path a dead leader is replaced only once ZooKeeper
expires its session, between the session timeout and one `tickTime` later
(ZooKeeper expires sessions on tick boundaries); with it, the new leader acts one
lease (0.5 s) after the proof. `--zk-tick-ms` is the server's tickTime (2000 is
ZooKeeper's stock value).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import zmq
import zmq.asyncio

from dyad.detector import ZooKeeperDetector
from dyad.ids import new_uuid
from dyad.local import Child, LocalCluster
from dyad.messages import (
    AgentInfo, AgentRegistered, FrameworkInfo, KillTask, MasterInfo, Ping, Pong,
    RegisterAgent, RunTask, Source, StatusUpdate, StatusUpdateAck, Task, TaskState,
    TaskStatus,
)
from dyad.resources import Resources
from dyad.transport import Dealer
from dyad.units import parse_duration
from frameworks import Filters, Scheduler, SchedulerDriver, TaskInfo
from frameworks import CommandInfo
from tests.integration.zookeeper import ZooKeeperServer

AGENT_RESOURCES = Resources.parse("cpus:8;mem:16384;disk:100000")
TASK = Resources.parse("cpus:0.1;mem:32")
REGISTER_BACKOFF = (1.0, 30.0)  # the real agent's: first retry after 1 s, doubling
REFERENCES = (("Mesos paper (mean recovery)", 4.0, 8.0), ("Borg (quoted)", 10.0, 10.0))


class SimAgent:
    """A stand-in agent: the real wire protocol, no processes."""

    def __init__(self, index: int) -> None:
        self.sock = Dealer()
        self.info = AgentInfo(hostname=f"sim{index}", port=20000 + index, ip="127.0.0.1",
                              resources=AGENT_RESOURCES)
        self.agent_id: str | None = None
        self.master: MasterInfo | None = None
        self.registered_with: str | None = None
        self.tasks: dict[str, Task] = {}
        self.frameworks: dict[str, FrameworkInfo] = {}
        self.unacked: dict[str, StatusUpdate] = {}
        self.runs: Counter[str] = Counter()
        self.kills = 0
        self.registrations_sent = 0
        self._registering: asyncio.Task[None] | None = None

    def follow(self, master: MasterInfo) -> None:
        """A new leader: connect and register until it answers."""
        self.master = master
        self.sock.connect(master.zmq_endpoint)
        if self._registering is not None:
            self._registering.cancel()
        self._registering = asyncio.ensure_future(self._register(master))

    async def _register(self, master: MasterInfo) -> None:
        backoff, most = REGISTER_BACKOFF
        while self.registered_with != master.id:
            info = attrs.evolve(self.info, id=self.agent_id)
            self.registrations_sent += 1
            await self.sock.send(RegisterAgent(
                agent=info, tasks=list(self.tasks.values()),
                frameworks=list(self.frameworks.values())))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, most)

    async def serve(self) -> None:
        while True:
            inbound = await self.sock.recv()
            message = inbound.message
            if isinstance(message, Ping):
                await self.sock.send(Pong(agent_id=message.agent_id))
            elif isinstance(message, AgentRegistered):
                self._registered(message)
                for update in list(self.unacked.values()):
                    await self.sock.send(update)
            elif isinstance(message, RunTask):
                await self._run(message)
            elif isinstance(message, StatusUpdateAck):
                pending = self.unacked.get(message.task_id)
                if pending is not None and pending.status.uuid == message.uuid:
                    del self.unacked[message.task_id]
            elif isinstance(message, KillTask):
                self.kills += 1

    def _registered(self, message: AgentRegistered) -> None:
        if self.master is None or message.master_info.id != self.master.id:
            return  # an answer from a master we have left
        self.agent_id = message.agent_id
        self.registered_with = message.master_info.id

    async def _run(self, message: RunTask) -> None:
        task, framework = message.task, message.framework
        assert framework.id is not None and self.agent_id is not None
        self.runs[task.task_id] += 1
        self.frameworks[framework.id] = framework
        status = TaskStatus(task_id=task.task_id, state=TaskState.TASK_RUNNING,
                            source=Source.EXECUTOR, agent_id=self.agent_id,
                            executor_id=task.task_id, uuid=new_uuid(), timestamp=time.time())
        self.tasks[task.task_id] = Task(
            task_id=task.task_id, framework_id=framework.id, agent_id=self.agent_id,
            executor_id=task.task_id, name=task.name, state=TaskState.TASK_RUNNING,
            resources=task.resources, status_uuid=status.uuid)
        update = StatusUpdate(framework_id=framework.id, status=status)
        self.unacked[task.task_id] = update
        await self.sock.send(update)


class Filler(Scheduler):
    """Launches `per_agent` tasks on each agent once, then suppresses offers."""

    def __init__(self, agents: int, per_agent: int) -> None:
        self.wanted = agents * per_agent
        self.per_agent = per_agent
        self.used_agents: set[str] = set()
        self.running: set[str] = set()
        self.terminal: list[TaskStatus] = []
        self.reregistrations = 0

    def resource_offers(self, driver: SchedulerDriver, offers: list[Any]) -> None:
        for offer in offers:
            if offer.agent_id in self.used_agents or len(self.used_agents) * self.per_agent >= self.wanted:
                driver.decline_offer(offer.id, Filters(refuse_seconds=3600))
                continue
            self.used_agents.add(offer.agent_id)
            tasks = [TaskInfo(task_id=f"{offer.agent_id}-{i}", name="bench",
                              agent_id=offer.agent_id, resources=TASK,
                              command=CommandInfo(shell="sleep 3600"))
                     for i in range(self.per_agent)]
            driver.launch_tasks([offer.id], tasks, Filters(refuse_seconds=3600))
        if len(self.used_agents) * self.per_agent >= self.wanted:
            driver.suppress_offers()

    def reregistered(self, driver: SchedulerDriver, master_info: MasterInfo) -> None:
        self.reregistrations += 1

    def status_update(self, driver: SchedulerDriver, status: TaskStatus) -> None:
        if status.state == TaskState.TASK_RUNNING:
            self.running.add(status.task_id)
        elif status.state.is_terminal:
            self.terminal.append(status)


@attrs.define
class Round:
    znode: float
    elected: float
    agents_back: float
    real_back: float
    median_back: float
    last_handled: float  # the last re-registration the new leader handled, retries too
    registrations: int  # RegisterAgent frames the simulated agents sent this round
    lost: int
    duplicates: int
    fast: bool
    pauses: int
    clean: bool = False  # the reference: stopped with SIGTERM, not killed


async def wait_until(predicate: Any, timeout: float, what: str, poll: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(poll)


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return await resp.json() if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


async def first_registrations(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Hostname -> when the master at `url` first took the agent in (its events log)."""
    first: dict[str, float] = {}
    since = 0
    while True:
        page = await get_json(http, f"{url}/events?since={since}&limit=5000")
        if not page or not page["events"]:
            return first
        for entry in page["events"]:
            if entry["type"] == "agent_registered":
                first.setdefault(entry["hostname"], entry["time"])
        since = page["next"]


async def leading(http: aiohttp.ClientSession, masters: list[Child]) -> Child | None:
    for child in masters:
        if child.process.poll() is None:
            health = await get_json(http, f"{child.url}/health")
            if health and health.get("leader"):
                return child
    return None


def running_tasks(state: Any) -> int:
    return sum(1 for f in state["frameworks"] for t in f["tasks"] if t["state"] == "TASK_RUNNING")


async def follow_leaders(detector: ZooKeeperDetector, agents: list[SimAgent],
                         changes: list[float]) -> None:
    """Every agent follows the leader the detector reports; `changes` gets the
    time of each report."""
    master = await detector.detect()
    while True:
        changes.append(time.monotonic())
        for agent in agents:
            agent.follow(master)
        master = await detector.next_leader(master)


async def run(args: argparse.Namespace, cluster: LocalCluster, zk_url: str) -> list[Round]:
    """Set up agents and the framework, then fail over `args.rounds` times."""
    per_agent = max(1, args.tasks // args.agents)
    total = per_agent * (args.agents + args.real_agents)
    agents = [SimAgent(i) for i in range(args.agents)]
    detector = ZooKeeperDetector(zk_url)
    background = [asyncio.ensure_future(agent.serve()) for agent in agents]
    changes: list[float] = []
    background.append(asyncio.ensure_future(follow_leaders(detector, agents, changes)))
    filler = Filler(args.agents + args.real_agents, per_agent)
    driver = SchedulerDriver(filler, FrameworkInfo(name="failover-bench", failover_timeout=3600),
                             master=zk_url)
    driving = asyncio.ensure_future(driver.run_async())
    rounds: list[Round] = []
    try:
        async with aiohttp.ClientSession() as http:
            async def all_registered() -> bool:
                return all(a.registered_with is not None for a in agents)
            await wait_until(all_registered, 120, "agents to register", poll=0.1)

            async def all_running() -> bool:
                return len(filler.running) >= total and not any(a.unacked for a in agents)
            await wait_until(all_running, 300, f"{total} running tasks", poll=0.1)
            print(f"{args.agents} simulated and {args.real_agents} real agents registered, "
                  f"{total} tasks running; "
                  f"failing over {args.rounds} times", flush=True)
            for number in range(args.rounds):
                rounds.append(await one_round(http, cluster, agents, filler, total, changes))
                r = rounds[-1]
                print(f"round {number + 1}: named by ZooKeeper {r.znode:.2f} s, "
                      f"leading {r.elected:.2f} s, all agents back and every task "
                      f"known {r.agents_back:.2f} s (real agents {r.real_back:.2f} s, "
                      f"median simulated {r.median_back:.2f} s, {r.registrations} "
                      f"registrations for {len(agents)}), "
                      f"lost {r.lost}, duplicates {r.duplicates}, "
                      f"{'fast path' if r.fast else 'session expiry'}", flush=True)
            reference = await one_round(http, cluster, agents, filler, total, changes,
                                        how=signal.SIGTERM)
            print(f"reference, a clean stop (SIGTERM: the leader closes its session, "
                  f"ZooKeeper deletes its znode at once): named {reference.znode:.2f} s, "
                  f"leading {reference.elected:.2f} s, all agents back "
                  f"{reference.agents_back:.2f} s (median simulated "
                  f"{reference.median_back:.2f} s), lost {reference.lost}, "
                  f"duplicates {reference.duplicates}", flush=True)
            rounds.append(reference)
            print(f"the framework re-registered {filler.reregistrations} times")
    finally:
        driver.stop(failover=True)
        await asyncio.wait_for(driving, 30)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await detector.close()
        for agent in agents:
            agent.sock.close()
    return rounds


async def one_round(http: aiohttp.ClientSession, cluster: LocalCluster, agents: list[SimAgent],
                    filler: Filler, total: int, changes: list[float],
                    how: signal.Signals = signal.SIGKILL) -> Round:
    async def all_contending() -> bool:
        """Every master is in the election: the leader, and standbys that know it
        and (the next in line) hold their connection to its liveness listener. A
        leader killed before its restarted standby connected is replaced only by
        session expiry: a refused first connect proves nothing (master/election.py)."""
        watching = 0
        for child in cluster.master_children:
            health = await get_json(http, f"{child.url}/health")
            if not health or not (health["leader"] or health.get("leader_info")):
                return False
            if not health["leader"]:
                metrics = await get_json(http, f"{child.url}/metrics/snapshot")
                watching += int(bool(metrics and metrics.get("master/election/watching")))
        return watching >= 1 or len(cluster.master_children) < 2
    await wait_until(all_contending, 60, "every master to contend")
    old = await leading(http, cluster.master_children)
    assert old is not None, "no leader before the kill"
    index = cluster.master_children.index(old)
    sent = sum(a.registrations_sent for a in agents)
    killed_at, killed_wall = time.monotonic(), time.time()
    old.process.send_signal(how)
    new: list[Child] = []

    async def elected() -> bool:
        leader = await leading(http, cluster.master_children)
        if leader is not None and leader is not old:
            new.append(leader)
        return bool(new)
    await wait_until(elected, 60, "a new leader")
    async def agents_back() -> bool:
        # The cheap metrics, not /state: polling a big /state would slow the master.
        metrics = await get_json(http, f"{new[0].url}/metrics/snapshot")
        return metrics is not None and metrics.get("master/agents_active", 0) >= (
            len(agents) + len(cluster.agent_children))
    await wait_until(agents_back, 120, "agents to re-register", poll=0.5)
    state = await get_json(http, f"{new[0].url}/state")
    figures = await get_json(http, f"{new[0].url}/metrics/snapshot")
    elected = state["elected_time"]
    # By the new leader's clock: when it first handled each agent's report (its
    # events log; a retry handled again moves `reregistered_time` on), but not
    # before it could answer (`elected_time`: the fence of master/election.py).
    first = await first_registrations(http, new[0].url)
    back = {a["hostname"]: max(first.get(a["hostname"]) or a["reregistered_time"]
                               or a["registered_time"], elected) - killed_wall
            for a in state["agents"]}
    sim = sorted(t for name, t in back.items() if name.startswith("sim"))
    real_back = max((t for name, t in back.items() if not name.startswith("sim")),
                    default=float("nan"))
    back_in = max(back.values())
    last_handled = max(max(a["reregistered_time"] or a["registered_time"], elected)
                       for a in state["agents"]) - killed_wall
    missing = total - running_tasks(state)
    duplicates = sum(n - 1 for a in agents for n in a.runs.values())  # simulated agents
    lost = len(filler.terminal) + max(0, missing) + sum(a.kills for a in agents)
    named_in = changes[-1] - killed_at
    old.process.wait()
    await asyncio.to_thread(cluster.start_master, 30.0, index)
    return Round(named_in, elected - killed_wall, back_in, real_back, sim[len(sim) // 2]
                 if sim else float("nan"), last_handled, sum(a.registrations_sent for a in agents) - sent,
                 lost, duplicates,
                 fast=bool(figures and figures.get("master/election/fast_failovers")),
                 pauses=int(figures.get("master/leadership_pauses", 0) if figures else 0),
                 clean=how is signal.SIGTERM)


def summarize(args: argparse.Namespace, rounds: list[Round]) -> None:
    def stats(values: list[float]) -> str:
        return (f"mean {statistics.mean(values):.2f} s, min {min(values):.2f} s, "
                f"max {max(values):.2f} s")
    references = [r for r in rounds if r.clean]
    rounds = [r for r in rounds if not r.clean]
    elected = [r.elected for r in rounds]
    back = [r.agents_back for r in rounds]
    print()
    print(f"agents={args.agents} real agents={args.real_agents} tasks={args.tasks} "
          f"masters={args.masters} "
          f"rounds={len(rounds)} zk-session-timeout={args.zk_session_timeout:g}s "
          f"zk tickTime={args.zk_tick_ms} ms")
    print(f"new leader named by ZooKeeper: {stats([r.znode for r in rounds])} "
          f"(fast path in {sum(r.fast for r in rounds)} of {len(rounds)} rounds)")
    print(f"new leader leading:            {stats(elected)}")
    print(f"all agents back, tasks known:  {stats(back)}")
    if args.real_agents:
        print(f"real agents back:              {stats([r.real_back for r in rounds])}")
    print(f"leadership pauses of the new leaders (lease unconfirmed for a moment): "
          f"{sum(r.pauses for r in rounds)}")
    everything = [*rounds, *references]
    print(f"tasks lost: {sum(r.lost for r in everything)} (must be 0); "
          f"duplicate launches: {sum(r.duplicates for r in everything)} (must be 0)")
    print(f"median simulated agent back:   {stats([r.median_back for r in rounds])}")
    print(f"last re-registration handled:  {stats([r.last_handled for r in rounds])} "
          "(retries included)")
    for ref in references:
        print(f"in-run reference, clean stop (SIGTERM): all agents back "
              f"{ref.agents_back:.2f} s (median {ref.median_back:.2f} s); "
              f"kill/clean stop (agents back, mean): "
              f"{statistics.mean(back) / ref.agents_back:.2f}")
    for name, low, high in REFERENCES:
        print(f"reference {name}: {low:g}-{high:g} s; dyad/reference (agents back, mean): "
              f"{statistics.mean(back) / ((low + high) / 2):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--real-agents", type=int, default=3,
                        help="real dyad-agent processes beside the simulated ones")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--masters", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--zk-session-timeout", type=parse_duration, default="4s")
    parser.add_argument("--zk-tick-ms", type=int, default=2000,
                        help="the ZooKeeper server's tickTime (2000 is its stock value)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep ZooKeeper's and the masters' logs in this directory")
    args = parser.parse_args(argv)
    # One process holds every simulated agent's socket, and one ZMQ I/O thread
    # serves them all: without a reconnect backoff, their attempts to reach the
    # dead leader (each every 100 ms) would starve their connections to the new
    # one. Real agents, one per machine, do not share a thread like this.
    context = zmq.asyncio.Context.instance()
    context.set(zmq.MAX_SOCKETS, args.agents + 100)
    context.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    with tempfile.TemporaryDirectory(prefix="dyad-failover-") as scratch:
        work = args.keep or Path(scratch)
        zookeeper = ZooKeeperServer(Path(work) / "zookeeper", tick_ms=args.zk_tick_ms)
        zookeeper.start()
        cluster = LocalCluster(
            work_dir=Path(work), agents=args.real_agents, masters=args.masters,
            zk=zookeeper.url(),
            master_args=["--zk-session-timeout", f"{args.zk_session_timeout}s",
                         "--log-level", "info"])
        try:
            cluster.start()
            rounds = asyncio.run(run(args, cluster, zookeeper.url()))
        finally:
            cluster.stop()
            zookeeper.stop()
    summarize(args, rounds)
    return 0 if sum(r.lost + r.duplicates for r in rounds) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
