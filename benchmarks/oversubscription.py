"""Oversubscription off vs on, through the real master core, on a virtual clock.

    python -m benchmarks.oversubscription [--agents 20] [--hours 3] [--overdeclare 3]
    python -m benchmarks.oversubscription --real [--agents 2] [--maps 12] [--quick]

`--real` runs the same comparison on a real local cluster instead
(benchmarks/oversubscription_real.py); without it, the stand-in cell below.

A stop-gap until the simulator (sim/) takes these switches: the real
`MasterState` (allocator, revocable offers) and the real estimator and QoS
controller (agent/reclaim.py, agent/qos.py) run in one process on a virtual
clock; agents and frameworks are small stand-ins that speak the real messages.

The cell: `--agents` agents of cpus:16;mem:65536. A service framework fills 75%
of the cell with production tasks (cpus:2;mem:8192) that use 1/`--overdeclare`
of what they declare, wobbling +-20%, and for `--surge` seconds in the middle
grow to 80% of it over two minutes (owners taking their room back). A batch framework has an
endless backlog of batch tasks (cpus:1;mem:2048, 10 minutes, using 90% of what
they declare); with oversubscription on it opts in (REVOCABLE_RESOURCES) and
runs its tasks on revocable resources when the non-revocable ones run out.
Evicted tasks go back to the backlog.

Printed, for off and on, from the same run: utilization by allocation
(non-revocable allocated / capacity) and by measured usage (usage / capacity),
both for memory, averaged over the run; the share of usage running on revocable
resources; batch tasks finished; evictions; and agent-minutes where measured
memory exceeded the agent (would have OOMed: must be 0).
"""

from __future__ import annotations

import argparse
import heapq
import math
import zlib
from collections.abc import Hashable
from typing import Any

import attrs

from agent.qos import Lent, QosConfig, corrections
from agent.reclaim import ZERO, Amount, ReclaimConfig, ReclaimEstimator, RunSample
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.ids import IdGenerator
from dyad.messages import (
    Accept,
    Address,
    AgentInfo,
    AgentRegistered,
    CommandInfo,
    Decline,
    Filters,
    FrameworkInfo,
    Heartbeat,
    KillTask,
    MasterInfo,
    Message,
    Offers,
    Operation,
    Ping,
    Pong,
    Reason,
    RegisterAgent,
    RunTask,
    SchedulerHeartbeat,
    StatusUpdate,
    Subscribe,
    Subscribed,
    TaskInfo,
    TaskState,
    TaskStatus,
    UsageReport,
)
from dyad.resources import Resources
from master.model import MasterConfig, Received
from master.state import MasterState

AGENT = Resources.parse("cpus:16;mem:65536")
SERVICE = Resources.parse("cpus:2;mem:8192")
BATCH = Resources.parse("cpus:1;mem:2048")
BATCH_SECONDS = 600.0
REPORT = 5.0
RAMP = 120.0
SAMPLE = 60.0
INFO = MasterInfo(id="m", hostname="m", ip="127.0.0.1", port=5050, zmq_port=5055,
                  version="bench", address=Address(hostname="m", ip="127.0.0.1", port=5050))
CMD = CommandInfo(shell="true")


@attrs.define
class Running:
    framework_id: str
    info: TaskInfo
    started: float
    usage_fraction: float  # of its allocation, before wobble and surge
    service: bool


class Cell:
    """The master, the stand-in agents and frameworks, and one event heap."""

    def __init__(self, agents: int, overdeclare: float, surge: tuple[float, float],
                 oversubscription: bool) -> None:
        self.master = MasterState(MasterConfig(allocation_interval=1.0,
                                               oversubscription=oversubscription),
                                  INFO, IdGenerator("m"))
        self.oversubscription = oversubscription
        self.overdeclare = overdeclare
        self.surge = surge
        self.now = 0.0
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._timers: dict[Hashable, float] = {}
        self.agent_ids: dict[str, str] = {}  # peer -> agent id
        self.tasks: dict[str, dict[str, Running]] = {}  # agent peer -> task id -> running
        self.estimators = {f"a{i}": ReclaimEstimator(ReclaimConfig()) for i in range(agents)}
        self.framework_ids: dict[str, str] = {}
        self.service_target = int(0.75 * agents * AGENT.get("mem") / SERVICE.get("mem"))
        self.service_launched = 0
        self.batch_serial = 0
        self.batch_finished = 0
        self.evictions = 0
        self.oom_minutes = 0
        self.samples: list[tuple[float, float, float]] = []  # alloc, usage, revocable usage
        for i in range(agents):
            self._deliver(f"a{i}", RegisterAgent(agent=AgentInfo(
                hostname=f"h{i}", port=5051, resources=AGENT)))
        self._deliver("service", Subscribe(framework=FrameworkInfo(name="service")))
        caps = ["REVOCABLE_RESOURCES"] if oversubscription else []
        self._deliver("batch", Subscribe(framework=FrameworkInfo(name="batch",
                                                                 capabilities=caps)))
        self._at(REPORT, "report", None)
        self._at(SAMPLE, "sample", None)

    # ------------------------------------------------------------------ loop

    def run(self, until: float) -> None:
        while self._heap and self._heap[0][0] <= until:
            at, _, kind, payload = heapq.heappop(self._heap)
            self.now = at
            if kind == "timer":
                if self._timers.get(payload) == at:
                    del self._timers[payload]
                    self._apply(self.master.handle(TimerFired(payload), at))
            elif kind == "report":
                self._report()
                self._at(at + REPORT, "report", None)
            elif kind == "sample":
                self._sample()
                self._at(at + SAMPLE, "sample", None)
            elif kind == "finish":
                self._finish(*payload)

    def _at(self, at: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))

    def _deliver(self, peer: str, message: Message) -> None:
        self._apply(self.master.handle(Received(peer, message), self.now))

    def _apply(self, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, ArmTimer):
                self._timers[effect.key] = effect.at
                self._at(effect.at, "timer", effect.key)
            elif isinstance(effect, CancelTimer):
                self._timers.pop(effect.key, None)
            elif isinstance(effect, Send):
                self._to(effect.to, effect.message)

    # ---------------------------------------------------------------- agents

    def _to(self, peer: str, message: Message) -> None:
        if peer.startswith("a"):
            self._agent(peer, message)
        else:
            self._framework(peer, message)

    def _agent(self, peer: str, message: Message) -> None:
        if isinstance(message, AgentRegistered):
            self.agent_ids[peer] = message.agent_id
            self.tasks[peer] = {}
        elif isinstance(message, Ping):
            self._deliver(peer, Pong(agent_id=message.agent_id))
        elif isinstance(message, RunTask):
            info = message.task
            service = info.priority >= 200
            fraction = 1 / self.overdeclare if service else 0.9
            self.tasks[peer][info.task_id] = Running(message.framework.id or "", info,
                                                     self.now, fraction, service)
            self._status(peer, message.framework.id or "", info.task_id, TaskState.TASK_RUNNING)
            if not service:
                self._at(self.now + BATCH_SECONDS, "finish", (peer, info.task_id))
        elif isinstance(message, KillTask):
            self._end(peer, message.task_id, TaskState.TASK_KILLED, message.reason)

    def _status(self, peer: str, framework_id: str, task_id: str, state: TaskState,
                reason: str = "") -> None:
        self._deliver(peer, StatusUpdate(framework_id=framework_id, status=TaskStatus(
            task_id=task_id, state=state, reason=reason, agent_id=self.agent_ids[peer],
            timestamp=self.now)))

    def _end(self, peer: str, task_id: str, state: TaskState, reason: str = "") -> None:
        task = self.tasks[peer].pop(task_id, None)
        if task is not None:
            self._status(peer, task.framework_id, task_id, state, reason)

    def _finish(self, peer: str, task_id: str) -> None:
        if task_id in self.tasks[peer]:
            self.batch_finished += 1
            self._end(peer, task_id, TaskState.TASK_FINISHED)

    def _usage(self, task: Running) -> Amount:
        fraction = task.usage_fraction
        if task.service:
            phase = zlib.crc32(task.info.task_id.encode()) % 7  # a stable phase per task
            fraction *= 1 + 0.2 * math.sin(self.now / 900 + phase)
            start, length = self.surge
            if start <= self.now < start + length:  # owners grow back over RAMP seconds
                fraction += (0.8 - fraction) * min(1.0, (self.now - start) / RAMP)
        alloc = task.info.resources
        return Amount(alloc.get("cpus") * fraction, alloc.get("mem") * fraction)

    def _report(self) -> None:
        for peer, tasks in self.tasks.items():
            owners = {tid: RunSample(Amount(t.info.resources.get("cpus"),
                                            t.info.resources.get("mem")), self._usage(t))
                      for tid, t in tasks.items() if not t.info.revocable}
            estimate = self.estimators[peer].update(owners, self.now)
            lent = [Lent((t.framework_id, tid), t.info.priority, t.started,
                         Amount(t.info.resources.get("cpus"), t.info.resources.get("mem")),
                         self._usage(t)) for tid, t in tasks.items() if t.info.revocable]
            owners_used = sum((s.usage for s in owners.values() if s.usage), ZERO)
            for eviction in corrections(QosConfig(), capacity=Amount(16, 65536),
                                        revocable=estimate.revocable, lent=lent,
                                        owners_used=owners_used):
                self.evictions += 1
                self._end(peer, eviction.key[1], TaskState.TASK_KILLED,
                          Reason.CONTAINER_PREEMPTED)
            revocable = estimate.revocable.rounded()
            self._deliver(peer, UsageReport(
                agent_id=self.agent_ids[peer],
                revocable=Resources.of(cpus=revocable.cpus, mem=revocable.mem)))

    def _sample(self) -> None:
        alloc = used = lent_used = 0.0
        for tasks in self.tasks.values():
            here = 0.0
            for task in tasks.values():
                mem = self._usage(task).mem
                here += mem
                if task.info.revocable:
                    lent_used += mem
                else:
                    alloc += task.info.resources.get("mem")
            used += here
            if here > AGENT.get("mem"):
                self.oom_minutes += 1
        capacity = AGENT.get("mem") * len(self.tasks)
        self.samples.append((alloc / capacity, used / capacity, lent_used / capacity))

    # ------------------------------------------------------------ frameworks

    def _framework(self, peer: str, message: Message) -> None:
        if isinstance(message, Subscribed):
            self.framework_ids[peer] = message.framework_id
        elif isinstance(message, Heartbeat):
            self._deliver(peer, SchedulerHeartbeat(framework_id=self.framework_ids[peer]))
        elif isinstance(message, Offers):
            for offer in message.offers:
                self._answer(peer, offer)

    def _answer(self, peer: str, offer: Any) -> None:
        fid = self.framework_ids[peer]
        tasks: list[TaskInfo] = []
        if peer == "service":
            left = offer.resources
            while self.service_launched < self.service_target and SERVICE <= left:
                self.service_launched += 1
                tasks.append(TaskInfo(task_id=f"svc{self.service_launched}", name="svc",
                                      agent_id=offer.agent_id, resources=SERVICE,
                                      command=CMD, priority=200))
                left = left - SERVICE
        else:
            for pool, revocable in ((offer.resources, False), (offer.revocable, True)):
                left = pool
                while BATCH <= left:
                    self.batch_serial += 1
                    tasks.append(TaskInfo(task_id=f"b{self.batch_serial}", name="b",
                                          agent_id=offer.agent_id, resources=BATCH,
                                          command=CMD, priority=100, revocable=revocable))
                    left = left - BATCH
        if tasks:
            self._deliver(peer, Accept(framework_id=fid, offer_ids=[offer.id],
                                       operations=[Operation(type="LAUNCH", tasks=tasks)],
                                       filters=Filters(refuse_seconds=1.0)))
        else:
            self._deliver(peer, Decline(framework_id=fid, offer_ids=[offer.id],
                                        filters=Filters(refuse_seconds=5.0)))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def measure(agents: int, hours: float, overdeclare: float, surge: float,
            oversubscription: bool) -> dict[str, float]:
    span = hours * 3600
    cell = Cell(agents, overdeclare, (span / 2, surge), oversubscription)
    cell.run(span)
    settled = cell.samples[len(cell.samples) // 6:]  # past the reclaim window
    return {"alloc": _mean([s[0] for s in settled]), "usage": _mean([s[1] for s in settled]),
            "lent": _mean([s[2] for s in settled]), "batch": cell.batch_finished,
            "evictions": cell.evictions, "oom": cell.oom_minutes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=None,
                        help="agents (default 20 stand-ins, or 2 real ones with --real)")
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--overdeclare", type=float, default=3.0)
    parser.add_argument("--surge", type=float, default=None,
                        help="seconds owners surge (default 600 simulated, 4 real)")
    real = parser.add_argument_group("a real local cluster")
    real.add_argument("--real", action="store_true",
                      help="real master, agents and processes (oversubscription_real.py)")
    real.add_argument("--maps", type=int, default=12)
    real.add_argument("--map-seconds", type=float, default=3.0)
    real.add_argument("--owner-mb", type=int, default=160, help="what each owner holds")
    real.add_argument("--surge-at", type=float, default=4.0, help="seconds into the job")
    real.add_argument("--quick", action="store_true", help="6 maps of 2 s")
    args = parser.parse_args(argv)
    if args.real:
        from benchmarks import oversubscription_real

        return oversubscription_real.main(oversubscription_real.Settings(
            agents=args.agents or 2, maps=6 if args.quick else args.maps,
            map_seconds=2.0 if args.quick else args.map_seconds, owner_mb=args.owner_mb,
            surge_at=args.surge_at, surge=4.0 if args.surge is None else args.surge))
    args.agents = args.agents or 20
    args.surge = 600.0 if args.surge is None else args.surge
    rows = {name: measure(args.agents, args.hours, args.overdeclare, args.surge, on)
            for name, on in (("off", False), ("on", True))}
    print(f"{args.agents} agents x cpus:16;mem:65536, services at 75% declaring "
          f"{args.overdeclare:g}x their use, {args.hours:g} h simulated, memory figures")
    print(f"{'':4} {'alloc util':>10} {'usage util':>10} {'on revocable':>12} "
          f"{'batch done':>10} {'evictions':>9} {'OOM agent-min':>13}")
    for name, row in rows.items():
        print(f"{name:4} {row['alloc']:>10.1%} {row['usage']:>10.1%} "
              f"{row['lent'] / row['usage'] if row['usage'] else 0:>12.1%} "
              f"{row['batch']:>10.0f} {row['evictions']:>9.0f} {row['oom']:>13.0f}")
    off, on = rows["off"], rows["on"]
    print(f"usage utilization on/off: {on['usage'] / off['usage']:.2f}x; "
          f"batch throughput on/off: {on['batch'] / max(off['batch'], 1):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
