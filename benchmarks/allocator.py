"""Allocator cost at scale, in the shape of Mesos' DeclineOffers benchmark.

    python -m benchmarks.allocator [--quick] [--sizes 1000x100,10000x1000] [--no-reference]

Agents of ``cpus:2;mem:1024;disk:4096;ports:[31000-32000]``; frameworks in role
``*`` with a target number of tasks (``cpus:1;mem:512``, two per agent) that sum to
the cluster's capacity less 10 tasks. A framework launches from each offer until
it reaches its target and declines everything else with ``refuse_seconds`` of
10^9 (the benchmark plays the master: it keeps the books and answers offers).
Per size (agents x frameworks) it prints, for the hierarchical allocator:

- **first pass**: the first full allocation pass (every agent offered);
- **decline round**: every framework declines every first-pass offer for good,
  then one pass re-offers every agent to another framework -- the round Mesos'
  benchmark times (about 1.06 s at 10,000 x 1,000 in C++, 2018);
- **converge**: passes until no offer is made, and the slowest of them;
- **steady pass**: a pass after convergence with no event since the last one;
- **incremental pass**: 1% of the tasks finish, one pass relaunches them;
- **peak RSS** of the process (VmHWM) after the size ran.

The reference, measured in the same run, is a textbook progressive-filling
allocator written below: every pass looks at every agent and, for each, at every
framework's dominant share. It runs the first pass and the decline round itself;
for the steady pass it is loaded with the same converged books (tasks, filters).
Ratios are reference time / ours. Passes are timed with the garbage collector
off (as `timeit` does); a master's passes also pay for collections.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

from dyad.resources import SHARE_KINDS, Resources
from master.allocator import HierarchicalAllocator

AGENT = Resources.parse("cpus:2;mem:1024;disk:4096;ports:[31000-32000]")
TASK = Resources.parse("cpus:1;mem:512")
MIN = {"cpus": 0.01, "mem": 32}
FOREVER = 1e9
SPARE_TASKS = 10
QUICK = [(1_000, 100), (10_000, 100)]
FULL = [(1_000, 100), (1_000, 1_000), (10_000, 100), (10_000, 1_000),
        (50_000, 100), (50_000, 1_000)]


class ReferenceAllocator:
    """Textbook DRF by progressive filling, no cleverness: per pass, for every
    agent with something worth offering, compute every framework's dominant share
    and offer all that is free to the lowest eligible one (then fewer offers, then
    id), until nobody eligible is left for that agent."""

    def __init__(self) -> None:
        self.free: dict[str, Resources] = {}
        self.total: dict[str, int] = dict.fromkeys(SHARE_KINDS, 0)
        self.held: dict[str, dict[str, int]] = {}  # framework -> kind -> milli
        self.shares: dict[str, float] = {}  # kept current as `held` changes
        self.count: dict[str, int] = {}
        self.filters: dict[tuple[str, str], float] = {}
        self.offered: set[tuple[str, str]] = set()

    def add_agent(self, agent_id: str, total: Resources) -> None:
        self.free[agent_id] = total
        for kind, milli in total.scalar_items().items():
            self.total[kind] = self.total.get(kind, 0) + milli

    def add_framework(self, framework_id: str, roles: list[str]) -> None:
        self.held[framework_id] = {}
        self.shares[framework_id] = 0.0
        self.count[framework_id] = 0

    def add_filter(self, framework_id: str, agent_id: str, until: float) -> None:
        self.filters[(framework_id, agent_id)] = until

    def update_used(self, agent_id: str, framework_id: str, used: Resources) -> None:
        self.free[agent_id] = self.free[agent_id] - used
        self._hold(framework_id, used, 1)

    def close_offer(self, framework_id: str, agent_id: str, returned: Resources) -> None:
        self.offered.discard((framework_id, agent_id))
        self.free[agent_id] = self.free[agent_id] + returned
        self._hold(framework_id, returned, -1)

    def _hold(self, framework_id: str, resources: Resources, sign: int) -> None:
        held = self.held[framework_id]
        for kind, milli in resources.scalar_items().items():
            held[kind] = held.get(kind, 0) + sign * milli
        self.shares[framework_id] = max(held.get(k, 0) / t for k, t in self.total.items() if t)

    def allocate(self, now: float) -> list[tuple[str, str, Resources]]:
        offers = []
        for agent_id, free in self.free.items():
            while free.get("cpus") >= MIN["cpus"] or free.get("mem") >= MIN["mem"]:
                best = None
                for framework_id in self.held:
                    if (framework_id, agent_id) in self.offered:
                        continue
                    if self.filters.get((framework_id, agent_id), now) > now:
                        continue
                    key = (self.shares[framework_id], self.count[framework_id], framework_id)
                    if best is None or key < best:
                        best = key
                if best is None:
                    break
                framework_id = best[2]
                self.offered.add((framework_id, agent_id))
                self.count[framework_id] += 1
                self._hold(framework_id, free, 1)
                offers.append((framework_id, agent_id, free))
                free = self.free[agent_id] = Resources()
        return offers


class Cluster:
    """The benchmark's master: agents, frameworks with targets, and the books
    (tasks, filters) every allocator call is checked against."""

    def __init__(self, allocator: Any, agents: int, frameworks: int) -> None:
        self.allocator = allocator
        self.now = 0.0
        self.framework_ids = [f"fw{i:05d}" for i in range(frameworks)]
        self.agent_ids = [f"agent{i:06d}" for i in range(agents)]
        wanted = 2 * agents - SPARE_TASKS
        base, extra = divmod(wanted, frameworks)
        self.target = {fid: base + (i < extra) for i, fid in enumerate(self.framework_ids)}
        self.launched = dict.fromkeys(self.framework_ids, 0)
        self.tasks: list[tuple[str, str]] = []  # (framework, agent), one per task
        self.filters: list[tuple[str, str]] = []
        for fid in self.framework_ids:
            allocator.add_framework(fid, ["*"])
        for agent_id in self.agent_ids:
            allocator.add_agent(agent_id, AGENT)

    def timed_pass(self) -> tuple[float, list[Any]]:
        self.now += 1.0
        return timed(lambda: self.allocator.allocate(self.now))

    def decline_all(self, offers: list[Any]) -> None:
        for framework_id, agent_id, resources in offers:
            self.allocator.close_offer(framework_id, agent_id, resources)
            self.allocator.add_filter(framework_id, agent_id, self.now + FOREVER)
            self.filters.append((framework_id, agent_id))

    def answer(self, offers: list[Any]) -> None:
        """Launch until the target, decline the rest for good."""
        for framework_id, agent_id, resources in offers:
            left = resources
            while self.launched[framework_id] < self.target[framework_id] and TASK <= left:
                left = left - TASK
                self.launched[framework_id] += 1
                self.tasks.append((framework_id, agent_id))
            self.allocator.close_offer(framework_id, agent_id, left)
            if self.launched[framework_id] >= self.target[framework_id]:
                self.allocator.add_filter(framework_id, agent_id, self.now + FOREVER)
                self.filters.append((framework_id, agent_id))

    def finish(self, fraction: float) -> None:
        """Every 1/fraction-th task ends; its framework wants a replacement."""
        step = max(1, round(1 / fraction))
        ended = self.tasks[::step]
        self.tasks = [t for i, t in enumerate(self.tasks) if i % step]
        for framework_id, agent_id in ended:
            self.allocator.release(agent_id, framework_id, TASK)
            self.launched[framework_id] -= 1

    def load_into(self, reference: ReferenceAllocator) -> None:
        """Give the reference this cluster's books (tasks and filters)."""
        for framework_id, agent_id in self.tasks:
            reference.update_used(agent_id, framework_id, TASK)
        for framework_id, agent_id in self.filters:
            reference.add_filter(framework_id, agent_id, self.now + FOREVER)


def peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_size(agents: int, frameworks: int, reference: bool) -> dict[str, float]:
    figures: dict[str, float] = {}
    ours: Callable[[], Any] = lambda: HierarchicalAllocator(MIN)

    cluster = Cluster(ours(), agents, frameworks)
    figures["first"], offers = cluster.timed_pass()
    cluster.decline_all(offers)
    figures["decline"], offers = cluster.timed_pass()
    figures["decline_offers"] = len(offers)

    cluster = Cluster(ours(), agents, frameworks)
    seconds, offers = cluster.timed_pass()
    passes, slowest = 1, seconds
    while offers:
        cluster.answer(offers)
        seconds, offers = cluster.timed_pass()
        passes += 1
        slowest = max(slowest, seconds)
    figures["converge_passes"], figures["converge_slowest"] = passes, slowest
    figures["tasks"] = len(cluster.tasks)
    figures["steady"], offers = cluster.timed_pass()
    assert not offers
    if reference:
        figures["ref_steady"] = reference_steady_pass(cluster)
    cluster.finish(0.01)
    figures["incremental"], offers = cluster.timed_pass()
    figures["incremental_offers"] = len(offers)
    figures["rss_mb"] = peak_rss_mb()

    if reference:
        ref = Cluster(ReferenceAllocator(), agents, frameworks)
        figures["ref_first"], offers = ref.timed_pass()
        ref.decline_all(offers)
        figures["ref_decline"], _ = ref.timed_pass()
    return figures


def reference_steady_pass(cluster: Cluster) -> float:
    """One reference pass over the converged cluster's books."""
    steady = ReferenceAllocator()
    for framework_id in cluster.framework_ids:
        steady.add_framework(framework_id, ["*"])
    for agent_id in cluster.agent_ids:
        steady.add_agent(agent_id, AGENT)
    cluster.load_into(steady)
    seconds, offers = timed(lambda: steady.allocate(cluster.now))
    assert not offers, "the reference sees the same steady cluster"
    return seconds


def timed(run: Callable[[], list[Any]]) -> tuple[float, list[Any]]:
    """Time `run` with the garbage collector off, as `timeit` does: a full
    collection over a 50,000-agent heap would land in whichever pass triggers it."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        result = run()
        return time.perf_counter() - started, result
    finally:
        gc.enable()


def calibration() -> float:
    """How fast this machine runs plain Python right now (shared CI machines vary)."""
    started = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - started


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:9.3f} ms"


def report(agents: int, frameworks: int, f: dict[str, float]) -> None:
    print(f"\n== {agents:,} agents x {frameworks:,} frameworks "
          f"(peak RSS {f['rss_mb']:.0f} MB)")
    rows = [("first pass", "first", "ref_first"),
            (f"decline round ({int(f['decline_offers']):,} offers)", "decline", "ref_decline"),
            ("steady pass", "steady", "ref_steady")]
    for label, mine, theirs in rows:
        line = f"  {label:34s} ours {_ms(f[mine])}"
        if theirs in f:
            ratio = f[theirs] / f[mine] if f[mine] else float("inf")
            line += f"   reference {_ms(f[theirs])}   ratio {ratio:10.1f}x"
        print(line)
    print(f"  {'converge':34s} {int(f['converge_passes'])} passes to {int(f['tasks']):,} "
          f"tasks, slowest {_ms(f['converge_slowest'])}")
    print(f"  {'incremental pass (1% tasks ended)':34s} ours {_ms(f['incremental'])} "
          f"({int(f['incremental_offers']):,} offers)")
    print(f"  {'first pass / steady pass':34s} {f['first'] / max(f['steady'], 1e-9):,.0f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(f'{a}x{f}' for a, f in QUICK)}")
    parser.add_argument("--sizes", help="comma-separated AGENTSxFRAMEWORKS, e.g. 1000x100")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the reference allocator (it is slow at 50,000 x 1,000)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.sizes:
        try:
            sizes = [(int(a), int(f)) for a, f in (s.split("x") for s in args.sizes.split(","))]
        except ValueError:
            parser.error(f"--sizes: expected AGENTSxFRAMEWORKS[,...], got {args.sizes!r}")
    print(f"calibration: 10,000,000 Python integer additions take {calibration():.2f} s "
          "here (about 0.4 s on an idle modern core; scale the figures below by it)")
    for agents, frameworks in sizes:
        if 2 * agents <= SPARE_TASKS + frameworks:
            parser.error(f"{agents}x{frameworks}: too few agents for the frameworks")
        report(agents, frameworks, run_size(agents, frameworks, not args.no_reference))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
