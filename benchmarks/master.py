"""One real master under a launch flood: how many tasks a second it carries.

    python -m benchmarks.master [--agents 1000] [--frameworks 1] [--tasks N]
                                [--workers 2] [--quick] [--pace TASKS_PER_S]
                                [--single-frames] [--ping-all] [--single-acks]
                                [--executor-exits] [--full-decode] [--link-shards N]

Starts one real `dyad-master` (standalone), `--agents` simulated agents spread
over `--workers` processes (`benchmarks/sim_agents.py`: one loop a process for
all its agents), and `--frameworks` frameworks on the public
`SchedulerDriver` in this process. Each simulated agent speaks the real agent
protocol on its own ZMQ connection: it registers, answers pings, and for every
`RunTask` queues TASK_RUNNING then TASK_FINISHED on the real status-update
manager (`agent.status_updates`, the agent's retry schedule and all: each update
is sent when the one before it is acknowledged). Like the real agent it keeps a
command task's executor to itself (`--executor-exits`: it reports each one gone,
as the agent did before), takes acknowledgements together (`StatusUpdateAcks`;
`--single-acks`: neither it nor the drivers carry them together), and declares
that any frame from the master proves the master alive, so the master skips the
pings of agents it is busy talking to (`--ping-all`: it does not, and is pinged
every interval).
It reads of each frame the fields it uses (`--full-decode`: it decodes every
frame into the full message, as the real agent does).
Each framework launches everything it is offered (as many tasks as fit in each
offer) until it has launched its share of `--tasks`, and acknowledges every update.
With `--pace`, the frameworks instead hold their offers and launch from them at
that rate in all: the paced run a flood should be no slower than (issue 19).

Printed: tasks/s from the first accept to the last TASK_FINISHED; p50 and p99 of
accept -> TASK_RUNNING as the framework sees it; tasks lost (never finished, or
ended in another state) and duplicate launches (a `RunTask` an agent already ran),
both must be 0; master frames per task, status updates resent, driver sends that
waited for room, and the master's messages a task by type, as its peers counted
them. The reference, measured in the same run before the cluster
starts: round trips per second of bare pyzmq DEALER <-> ROUTER (one process each,
64 in flight) with frames the size of a status update; the ratio tasks/s over
round trips/s says how close the whole stack gets to its transport.

With `--link-shards N` the agents connect to N `dyad-link-shard` processes
(master/link_shard.py), spread evenly, instead of to the master: the master
then holds N connections, not one per agent, so more agents than the
descriptor limit can run (issue 19's 50,000).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections import Counter, deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

from benchmarks.sim_agents import AGENT_RESOURCES, SimAgent, agent_worker  # noqa: F401
from dyad import gc_pauses
from dyad.ids import new_uuid
from dyad.local import LocalCluster, http_get_json
from dyad.messages import (
    ACK_BATCH_CAPABILITY, BATCH_CAPABILITY, LIVENESS_CAPABILITY, MasterCapabilities, Message,
    Source, StatusUpdate, TaskState, TaskStatus, encode)
from dyad.resources import Resources
from frameworks import CommandInfo, Filters, FrameworkInfo, Scheduler, SchedulerDriver, TaskInfo

TASK = Resources.parse("cpus:1;mem:1024")  # four fill an agent: no crumbs to decline
SLOTS_PER_AGENT = 4
WINDOW = 64  # reference round trips in flight


# simulated agents: benchmarks/sim_agents.py


# ------------------------------------------------------------------ frameworks


class CountingDriver(SchedulerDriver):
    """The public driver, counting the messages it receives by wire type (what it
    sends its outbox counts); with `single_acks` it never hears that the master
    takes `Acknowledgements`, so it acknowledges one update a message, as before."""

    def __init__(self, *args: Any, single_acks: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.single_acks = single_acks
        self.received: Counter[str] = Counter()

    def _received(self, message: Message) -> None:
        self.received[message.TYPE] += 1
        if not (self.single_acks and isinstance(message, MasterCapabilities)):
            super()._received(message)


HOLD_SECONDS = 5.0  # how long a paced framework keeps an offer before giving it back


class Launcher(Scheduler):
    """Launches everything it is offered until it has launched `budget` tasks; with a
    `pace` (tasks/s), it holds its offers and launches from them at that rate."""

    def __init__(self, name: str, budget: int, pace: float = 0.0) -> None:
        self.name = name
        self.pace = pace
        self.held: deque[tuple[float, Any]] = deque()  # (received at, offer)
        self.driver: SchedulerDriver | None = None
        self.remaining = budget
        self.launched = 0
        self.accepted_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.finished_at: dict[str, float] = {}
        self.failed: list[TaskStatus] = []
        self.suppressed = False
        self.disconnections = 0  # the driver called the master lost (and re-subscribed)

    def resource_offers(self, driver: SchedulerDriver, offers: list[Any]) -> None:
        if self.pace:
            self.driver = driver
            now = time.perf_counter()
            self.held.extend((now, offer) for offer in offers)
            return
        self._launch(driver, offers, self.remaining)

    async def paced(self) -> None:
        """Every 10 ms, launch from held offers what the pace allows by now."""
        started = time.perf_counter()
        while self.remaining:
            await asyncio.sleep(0.01)
            allowed = int(self.pace * (time.perf_counter() - started)) - self.launched
            while self.driver is not None and allowed > 0 and self.held:
                _, offer = self.held.popleft()
                allowed -= self._launch(self.driver, [offer], min(allowed, self.remaining))
            # Give back what was held too long, long before the master's offer
            # timeout could rescind it under a launch: it comes back as a fresh offer.
            stale = time.perf_counter() - HOLD_SECONDS
            while self.driver is not None and self.held and self.held[0][0] < stale:
                self.driver.decline_offer(self.held.popleft()[1].id, Filters(refuse_seconds=0))

    def offer_rescinded(self, driver: SchedulerDriver, offer_id: str) -> None:
        self.held = deque(item for item in self.held if item[1].id != offer_id)

    def _launch(self, driver: SchedulerDriver, offers: list[Any], allowed: int) -> int:
        """Launch up to `allowed` tasks from `offers`, declining what goes unused;
        how many were launched."""
        launched = self.launched
        now = time.perf_counter()
        for offer in offers:
            fit = int(min(offer.resources.get("cpus") // TASK.get("cpus"),
                          offer.resources.get("mem") // TASK.get("mem")))
            count = min(fit, allowed)
            if count == 0:  # crumbs, or everything is launched
                driver.decline_offer(offer.id, Filters(
                    refuse_seconds=3600 if self.remaining == 0 else 1))
                continue
            tasks = []
            for _ in range(count):
                task_id = f"{self.name}-{self.launched}"
                self.launched += 1
                self.accepted_at[task_id] = now
                tasks.append(TaskInfo(task_id=task_id, name="bench", agent_id=offer.agent_id,
                                      resources=TASK, command=CommandInfo(shell="true")))
            self.remaining -= count
            allowed -= count
            driver.launch_tasks([offer.id], tasks, Filters(refuse_seconds=0))
        if self.remaining == 0 and not self.suppressed:
            self.suppressed = True
            driver.suppress_offers()
        return self.launched - launched

    def disconnected(self, driver: SchedulerDriver) -> None:
        self.disconnections += 1
        # Why: was the driver itself not reading, or its loop stalled?
        outbox, dealer = driver._outbox, driver._dealer
        waiting = dealer is not None and bool(dealer._now.get(zmq.EVENTS) & zmq.POLLIN)
        print(f"{self.name} lost the master at {time.perf_counter():.1f}: outbox "
              f"{len(outbox)} (reading paused: {len(outbox) >= outbox.limit}), "
              f"frames waiting unread: {waiting}, sends waited {driver.send_waits}, "
              f"loop lag so far {LAG.most:.1f} s", flush=True)

    def status_update(self, driver: SchedulerDriver, status: TaskStatus) -> None:
        now = time.perf_counter()
        if status.state == TaskState.TASK_RUNNING:
            self.running_at.setdefault(status.task_id, now)
        elif status.state == TaskState.TASK_FINISHED:
            self.finished_at.setdefault(status.task_id, now)
        elif status.state.is_terminal:
            self.failed.append(status)


# ------------------------------------------------------------------- reference


def echo_router(port_conn: Connection) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port_conn.send(sock.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        frames = sock.recv_multipart()
        if frames[1] == b"stop":
            break
        sock.send_multipart(frames)
    sock.close(linger=0)
    ctx.term()


def reference_round_trips(size: int, seconds: float) -> float:
    """Round trips per second of bare pyzmq between two processes, `WINDOW` in flight."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    router = ctx.Process(target=echo_router, args=(child,), daemon=True)
    router.start()
    port = parent.recv()
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    frame = b"x" * size
    for _ in range(WINDOW):
        sock.send(frame)
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        sock.recv()
        done += 1
        sock.send(frame)
    elapsed = time.perf_counter() - started
    sock.send(b"stop")
    router.join(10)
    sock.close(linger=0)
    zctx.term()
    return done / elapsed


# ------------------------------------------------------------------------- run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_shards(count: int, master_port: int,
                 shards: list[tuple[subprocess.Popen[str], str]]) -> None:
    """Start `count` link shards forwarding to the master's shard port, into
    `shards` (process, the endpoint agents connect to) once each says it listens."""
    for _ in range(count):
        process = subprocess.Popen(
            [sys.executable, "-m", "master.link_shard", "--listen", "127.0.0.1:0",
             "--master", f"tcp://127.0.0.1:{master_port}", "--log-level", "warning"],
            stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        line = process.stdout.readline()  # dyad-link-shard listening on tcp://H:P master=...
        shards.append((process, line.split()[3] if line.startswith("dyad-link-shard") else ""))
        if not shards[-1][1]:
            raise RuntimeError(f"a link shard did not start (exit {process.wait()})")


def master_metrics(url: str) -> dict[str, float]:
    # A master that has just sent 50,000 agents' offers can take seconds to answer.
    return http_get_json(f"{url}/metrics/snapshot", timeout=120)  # type: ignore[no-any-return]


def store_ready(url: str) -> None:
    """Wait until the master's usage store answers (its process imports DuckDB
    and NumPy, ~0.7 CPU s, after the master starts): a flood begun before would
    time the store's start, not its ingestion, and at 200 agents the whole flood
    is shorter than that start. A master started with the store off answers 404."""
    try:
        http_get_json(f"{url}/usage/tables", timeout=120)
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(p) for p in group) for name, group in pids.items()}


def children_of(pid: int) -> list[int]:
    """The processes `pid` started (the master's usage store runs in one)."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


class LoopLag:
    """How late this process's event loop runs a 0.1 s sleep (the drivers' loop)."""

    def __init__(self) -> None:
        self.most = 0.0

    async def watch(self) -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(0.1)
            self.most = max(self.most, time.monotonic() - started - 0.1)


LAG = LoopLag()


async def launch_all(address: str, launchers: list[Launcher], total: int,
                     deadline: float, single_acks: bool = False
                     ) -> tuple[list[CountingDriver], float]:
    lag = asyncio.ensure_future(LAG.watch())
    drivers = [CountingDriver(l, FrameworkInfo(name=l.name), master=address,
                              single_acks=single_acks) for l in launchers]
    running = [asyncio.ensure_future(d.run_async()) for d in drivers]
    pacers = [asyncio.ensure_future(l.paced()) for l in launchers if l.pace]
    while sum(len(l.finished_at) + len(l.failed) for l in launchers) < total:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    ended = time.perf_counter()
    for pacer in pacers:
        pacer.cancel()
    for driver in drivers:
        driver.stop()
    await asyncio.wait(running, timeout=30)
    lag.cancel()
    return drivers, ended


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def arguments() -> argparse.ArgumentParser:
    """The benchmark's flags (also how `benchmarks.usage_store` builds a run)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--frameworks", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=None,
                        help=f"tasks in all (default {SLOTS_PER_AGENT} x 3 per agent: "
                             "three waves; --quick: one)")
    parser.add_argument("--workers", type=int, default=2, help="processes of simulated agents")
    parser.add_argument("--quick", action="store_true", help="one wave, a short reference")
    parser.add_argument("--pace", type=float, default=0.0, metavar="TASKS_PER_S",
                        help="launch at this rate in all (offers held and used as the "
                             "pace allows) instead of everything offered at once")
    parser.add_argument("--single-frames", action="store_true",
                        help="simulated agents neither take nor send Batch frames (as "
                             "the real agent does today)")
    parser.add_argument("--ping-all", action="store_true",
                        help="simulated agents do not declare ANY_FRAME_LIVENESS, so the "
                             "master pings every one every interval (as before it could "
                             "skip the pings of busy agents)")
    parser.add_argument("--single-acks", action="store_true",
                        help="acknowledgements one a message both ways (drivers send "
                             "Acknowledge, agents get StatusUpdateAck), as before "
                             "ACKNOWLEDGEMENT_BATCHES")
    parser.add_argument("--executor-exits", action="store_true",
                        help="simulated agents report each command task's executor gone "
                             "(ExecutorExited), as the agent did before")
    parser.add_argument("--full-decode", action="store_true",
                        help="simulated agents decode every frame into the full message "
                             "(dyad.messages.decode), as the real agent does, instead of "
                             "reading only the fields they use")
    parser.add_argument("--link-shards", type=int, default=0, metavar="N",
                        help="agents connect through N link shards (dyad-link-shard) "
                             "instead of to the master itself")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--master-arg", action="append", default=[], metavar="ARG",
                        help="passed to dyad-master (repeat: --master-arg=--usage-store "
                             "--master-arg=off)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    gc_pauses.install()  # the drivers' process holds every task's times
    # Each simulated agent is a connection of its own: the master holds one
    # descriptor per agent, a worker two (its socket's TCP and mailbox).
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    held = math.ceil(args.agents / max(args.link_shards, 1))  # by the master, or a shard
    if held + 200 > limit:
        print(f"cannot run {args.agents} agents: the master (or a link shard) would need "
              f"more than {held} file descriptors and the hard limit here is {limit} "
              f"(try --link-shards {math.ceil(args.agents / (limit - 200))})",
              file=sys.stderr)
        return 2
    args.workers = max(args.workers, math.ceil(2 * args.agents / (limit - 200)))
    waves = 1 if args.quick else 3
    total = args.tasks or args.agents * SLOTS_PER_AGENT * waves
    size = len(encode(StatusUpdate(framework_id="F-" + new_uuid(), status=TaskStatus(
        task_id=f"fw0-{total}", state=TaskState.TASK_RUNNING, source=Source.EXECUTOR,
        agent_id="A-" + new_uuid(), executor_id=f"fw0-{total}", uuid=new_uuid(),
        timestamp=time.time()))))
    print(f"reference: bare pyzmq DEALER<->ROUTER, {size} B frames, {WINDOW} in flight ...",
          flush=True)
    reference = reference_round_trips(size, 1.0 if args.quick else 3.0)
    print(f"reference: {reference:,.0f} round trips/s", flush=True)

    return report(args, total, reference, *measure(args, total, tuple(args.master_arg)))


def measure(args: argparse.Namespace, total: int, master_args: tuple[str, ...] = ()
            ) -> tuple[list[Launcher], list[CountingDriver], list[dict[str, Any]],
                       dict[str, float], dict[str, float], dict[str, float]]:
    """One cluster: a master (with `master_args`), `args.agents` simulated agents in
    `args.workers` processes, `args.frameworks` frameworks launching `total` tasks."""
    ctx = multiprocessing.get_context("spawn")
    shard_port = free_port()
    if args.link_shards:
        master_args = ("--shard-port", str(shard_port), *master_args)
    with tempfile.TemporaryDirectory(prefix="dyad-master-bench-") as scratch:
        cluster = LocalCluster(work_dir=Path(scratch), agents=0,
                               master_args=["--log-level", "warning", *master_args])
        workers: list[tuple[Any, Connection]] = []
        shards: list[tuple[subprocess.Popen[str], str]] = []
        try:
            cluster.start()
            assert cluster.master is not None
            endpoint, url = cluster.master.zmq, cluster.master.url
            start_shards(args.link_shards, shard_port, shards)
            endpoints = [e for _, e in shards] or endpoint
            names = [f"sim{i:05d}" for i in range(args.agents)]
            capabilities = tuple(
                ([] if args.single_frames else [BATCH_CAPABILITY])
                + ([] if args.ping_all else [LIVENESS_CAPABILITY])
                + ([] if args.single_acks else [ACK_BATCH_CAPABILITY]))
            for w in range(args.workers):
                parent, child = ctx.Pipe()
                process = ctx.Process(target=agent_worker, daemon=True,
                                      args=(endpoints, names[w::args.workers], child,
                                            capabilities, args.executor_exits,
                                            args.full_decode))
                process.start()
                workers.append((process, parent))
            started = time.monotonic()
            for _, conn in workers:
                conn.recv()
            print(f"{args.agents} agents registered in {time.monotonic() - started:.1f} s; "
                  f"{args.frameworks} framework(s) launch {total} tasks", flush=True)
            store_ready(url)
            before = master_metrics(url)
            master_pid = cluster.master.process.pid
            pids = {"master": [master_pid], "master's children": children_of(master_pid),
                    "frameworks": [os.getpid()], "agents": [p.pid for p, _ in workers]}
            if shards:
                pids["link shards"] = [p.pid for p, _ in shards]
            cpu_before = cpu_of(pids)
            per = [total // args.frameworks + (i < total % args.frameworks)
                   for i in range(args.frameworks)]
            launchers = [Launcher(f"fw{i}", n, args.pace / args.frameworks)
                         for i, n in enumerate(per)]
            drivers, _ = asyncio.run(launch_all(cluster.master_address, launchers, total,
                                                time.monotonic() + args.timeout,
                                                args.single_acks))
            after = master_metrics(url)
            cpu = {k: v - cpu_before[k] for k, v in cpu_of(pids).items()}
            reports = []
            for _, conn in workers:
                conn.send("stop")
                reports.append(conn.recv())
        finally:
            for process, _ in workers:
                process.kill()
            for shard, _ in shards:
                shard.kill()
                shard.wait()
                if shard.stdout is not None:
                    shard.stdout.close()
            cluster.stop()
    return launchers, drivers, reports, before, after, cpu


def report(args: argparse.Namespace, total: int, reference: float, launchers: list[Launcher],
           drivers: list[CountingDriver], reports: list[dict[str, Any]],
           before: dict[str, float], after: dict[str, float], cpu: dict[str, float]) -> int:
    accepted = [t for l in launchers for t in l.accepted_at.values()]
    finished = [t for l in launchers for t in l.finished_at.values()]
    latencies = [(l.running_at[t] - l.accepted_at[t]) * 1000
                 for l in launchers for t in l.running_at if t in l.accepted_at]
    done = len(finished)
    span = max(finished) - min(accepted) if finished and accepted else float("nan")
    rate = done / span if span else float("nan")
    lost = total - done
    duplicates = sum(r["duplicates"] for r in reports)
    frames = after["master/messages_received"] - before["master/messages_received"]
    offers_frames = after.get("master/offers_frames", 0) - before.get("master/offers_frames", 0)
    skipped = (after.get("master/agent_pings_skipped", 0)
               - before.get("master/agent_pings_skipped", 0))
    print()
    print(f"agents={args.agents} frameworks={args.frameworks} tasks={total} "
          f"workers={args.workers} link shards={args.link_shards} agent frames={'single' if args.single_frames else 'batch'}"
          f"{' pinged every interval' if args.ping_all else ''}"
          f"{f' pace={args.pace:g}/s' if args.pace else ''}")
    print(f"tasks/s, first accept -> last TASK_FINISHED: {rate:,.0f} "
          f"({done} tasks in {span:.2f} s)")
    print(f"accept -> TASK_RUNNING: p50 {percentile(latencies, 0.5):.0f} ms, "
          f"p90 {percentile(latencies, 0.9):.0f} ms, p99 {percentile(latencies, 0.99):.0f} ms,"
          f" most {max(latencies, default=float('nan')):.0f} ms")
    ordered = [lat for _, lat in sorted(
        (l.accepted_at[t], (l.running_at[t] - l.accepted_at[t]) * 1000)
        for l in launchers for t in l.running_at if t in l.accepted_at)]
    tenths = [ordered[len(ordered) * i // 10:len(ordered) * (i + 1) // 10] for i in range(10)]
    print("p99 by tenth of the launches, in accept order (ms): "
          + " ".join(f"{percentile(part, 0.99):.0f}" for part in tenths))
    print(f"admission: offers held {after.get('master/offers_held', 0):.0f}, tasks allowed in"
          f" flight at the end {after.get('master/admission_allowed', 0):.0f}, cuts "
          f"{after.get('master/admission_cuts', 0):.0f}; offers declined "
          f"{after.get('master/offers_declined', 0):.0f}")
    print(f"usage store: task events made {after.get('master/usage_events', 0):.0f}, "
          f"written by the end {after.get('usage/events', 0):.0f}, dropped "
          f"{after.get('usage/dropped', 0):.0f} (the store writes behind the flood)")
    print(f"frameworks that got offers and launched: "
          f"{sum(1 for l in launchers if l.launched)} of {len(launchers)}")
    print(f"lost: {lost} (must be 0), of them ended otherwise: "
          f"{sum(len(l.failed) for l in launchers)}; duplicate launches: {duplicates} "
          f"(must be 0)")
    print(f"master frames received per task: {frames / max(done, 1):.1f}; "
          f"status updates resent: {sum(r['retried'] for r in reports)}; "
          f"agent sends refused: {sum(r['send_failures'] for r in reports)}; "
          f"frames agents could not read: {sum(r.get('bad_frames', 0) for r in reports)}; "
          f"driver sends that waited: {sum(d.send_waits for d in drivers)}; "
          f"master dropped sends: {after.get('master/dropped_sends', 0):.0f} "
          f"(to a full queue {after.get('master/sends_full', 0):.0f}, to a peer gone "
          f"{after.get('master/sends_unroutable', 0):.0f}); resends coalesced by the master: "
          f"{after.get('master/resends_coalesced', 0):.0f}; "
          f"offers frames: {offers_frames:.0f}; agent pings skipped: {skipped:.0f}")
    sent = after.get("master/frames_sent", 0) - before.get("master/frames_sent", 0)
    print(f"frames: master sent {sent / max(done, 1):.1f} per task; master batches sent "
          f"{after.get('master/batch_frames_sent', 0):.0f} "
          f"holding {after.get('master/messages_sent_batched', 0):.0f} messages, drivers' "
          f"{sum(d.batches_sent for d in drivers)}; master inflow most "
          f"{after.get('master/inbound_queued_most', 0):.0f} (full "
          f"{after.get('master/inbound_full', 0):.0f} times); driver outbox most "
          f"{max(d._outbox.most for d in drivers)}; drivers that lost the master: "
          f"{sum(l.disconnections for l in launchers)} times; the drivers' loop ran "
          f"up to {LAG.most:.2f} s late")
    runs = after["allocator/allocation_runs"] - before["allocator/allocation_runs"]
    print("CPU per task (ms): " + ", ".join(f"{k} {v * 1000 / max(done, 1):.2f}"
                                            for k, v in cpu.items())
          + f" (sum {sum(cpu.values()) * 1000 / max(done, 1):.2f})"
          + f"; allocation passes {runs:.0f}, p50 {after['allocator/allocation_run_ms_p50']:.1f}"
          f" ms, p99 {after['allocator/allocation_run_ms_p99']:.1f} ms")
    print_messages(reports, drivers, done)
    print(f"reference: {reference:,.0f} bare pyzmq round trips/s; "
          f"dyad tasks/s / reference: {rate / reference:.3f}")
    return 0 if lost == 0 and duplicates == 0 else 1


def print_messages(reports: list[dict[str, Any]], drivers: list[CountingDriver],
                   done: int) -> None:
    """The master's messages a task by wire type, as its peers counted them: what
    the agents and drivers sent it, and what they received from it (messages,
    not frames: a batch's elements count one by one, the batch not at all)."""
    received = sum((r["sent"] for r in reports), Counter())
    received += sum((d._outbox.framed for d in drivers), Counter())
    sent = sum((r["received"] for r in reports), Counter())
    sent += sum((d.received for d in drivers), Counter())
    for what, counts in (("received", received), ("sent", sent)):
        total = sum(counts.values()) / max(done, 1)
        print(f"master messages {what} per task: {total:.2f} ("
              + ", ".join(f"{name} {n / max(done, 1):.2f}" for name, n in counts.most_common())
              + ")")


if __name__ == "__main__":
    sys.exit(main())
