"""Oversubscription off vs on on a real local cluster.

    python -m benchmarks.oversubscription --real [--agents 2] [--maps 12] [--quick]

Everything is real: `dyad-master` and `dyad-agent` processes (LocalCluster, as
`dyad local` runs them), owner processes holding real memory, a real `dyad-batch`
job whose maps are real processes. Per mode (off, then on) a fresh cluster:

- every agent (cpus:2;mem:1024) runs one *owner* (priority 200) declaring
  cpus:1.2;mem:768 and holding `--owner-mb` (160 MB, about a fifth);
- a batch job of `--maps` streaming maps (cpus:0.4;mem:160 each, each holding
  128 MB for `--map-seconds`) and one reduce. With oversubscription on, the job
  runs with `revocable=True` (dyad-batch --revocable); off, it is the same job
  on a cluster whose agents lend nothing. The ordinary room left beside the
  owner fits the executor and one map per agent; what the owner leaves idle
  fits two more, lent;
- `--surge-at` seconds into the job the owners grow to 80% of what they
  declared for `--surge` seconds, then shrink back: the agents' QoS controllers
  must evict lent maps before any owner suffers (the batch job retries them).

Printed per mode, sampled from the master's /state every 0.5 s while the job
runs: memory utilization by allocation (non-revocable allocated / capacity) and
by measured usage (what the agents last measured / capacity), the share of usage
on revocable resources; the job's time; evictions (maps preempted); owner tasks
that ended (killed, OOM or otherwise: must be 0). Then the on/off ratios. The
machine is shared and the cluster small, so absolute times are noisy: compare
the ratios.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from dyad.local import LocalCluster, http_get_json
from dyad.messages import CommandInfo, Filters, FrameworkInfo, TaskInfo, TaskStatus
from dyad.resources import Resources
from frameworks import Scheduler, SchedulerDriver
from frameworks.batch import BatchCore, Job, run_job_async

AGENT = "cpus:2;mem:1024;disk:4000"
OWNER = Resources.parse("cpus:1.2;mem:768")
SURGE_SHARE = 0.8
MAP_CPUS, MAP_MEM, MAP_HOLD_MB = 0.4, 160.0, 128
MASTER_ARGS = ["--allocation-interval", "0.2s", "--offer-timeout", "30s"]
AGENT_ARGS = ["--isolation", "posix", "--usage-interval", "0.25s",
              "--usage-report-interval", "0.5s", "--reclaim-window", "3s"]
SAMPLE = 0.5

# The owner: holds OWNER_MB, or SURGE_MB while the surge file exists.
OWNER_SCRIPT = """\
import os, sys, time
idle, surge, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
held = b""
while True:
    want = surge if os.path.exists(flag) else idle
    if len(held) != want << 20:
        held = b""
        held = b"x" * (want << 20)
    time.sleep(0.1)
"""

# A streaming map: holds MB for SECONDS (in steps, so a kill lands at once), then
# emits each input line with a count.
MAP_SCRIPT = """\
import sys, time
mb, seconds = int(sys.argv[1]), float(sys.argv[2])
held = b"x" * (mb << 20)
end = time.monotonic() + seconds
while time.monotonic() < end:
    time.sleep(0.05)
for line in sys.stdin:
    print(line.strip() + "\\t1")
"""


@attrs.frozen
class Settings:
    """The knobs `--real` takes (the module docstring says what each does)."""

    agents: int = 2
    maps: int = 12
    map_seconds: float = 3.0
    owner_mb: int = 160
    surge_at: float = 4.0
    surge: float = 4.0


class Owners(Scheduler):
    """Launches one owner on every agent, then declines everything."""

    def __init__(self, agents: int, command: Callable[[int], str]) -> None:
        self.agents = agents
        self.command = command
        self.placed: set[str] = set()
        self.statuses: list[TaskStatus] = []

    def resource_offers(self, driver: Any, offers: list[Any]) -> None:
        for offer in offers:
            if offer.agent_id in self.placed or not OWNER <= offer.resources:
                driver.decline_offer(offer.id, Filters(refuse_seconds=3600))
                continue
            self.placed.add(offer.agent_id)
            n = len(self.placed)
            driver.launch_tasks([offer.id], [TaskInfo(
                task_id=f"owner{n}", name="owner", agent_id=offer.agent_id, priority=200,
                resources=OWNER, command=CommandInfo(shell=self.command(n)))])
        if len(self.placed) == self.agents:
            driver.suppress_offers()

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        self.statuses.append(status)

    def running(self) -> int:
        latest = {s.task_id: s.state.name for s in self.statuses}
        return sum(1 for state in latest.values() if state == "TASK_RUNNING")

    def ended(self) -> list[TaskStatus]:
        return [s for s in self.statuses if s.state.is_terminal]


async def _until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def _sample(cluster: LocalCluster) -> tuple[float, float, float]:
    """(allocated, measured, measured on revocable) memory, MB, over the cluster."""
    state = cluster.state()
    alloc = sum(a["used_resources"]["mem"] for a in state["agents"])
    used = sum(a["measured_usage"]["mem"] for a in state["agents"])
    # Tasks of one executor share its measurement: a revocable task's part of it
    # is its share of the executor's tasks by allocation, as the agent's QoS
    # counts it.
    runs: dict[tuple[str, str], list[tuple[float, bool, float]]] = {}
    for framework in state["frameworks"]:
        for task in framework["tasks"]:
            usage = task.get("usage")
            if usage and task["state"] == "TASK_RUNNING":
                runs.setdefault((framework["id"], usage["executor_id"]), []).append(
                    (task["resources"]["mem"], task["revocable"], usage["mem_rss_mb"]))
    lent = 0.0
    for tasks in runs.values():
        declared = sum(mem for mem, _, _ in tasks)
        if declared:
            lent += tasks[0][2] * sum(mem for mem, revocable, _ in tasks if revocable) / declared
    return alloc, used, lent


async def measure(settings: Settings, on: bool, work: Path) -> dict[str, float]:
    """One mode on a fresh cluster; see the module docstring."""
    work.mkdir(parents=True)
    mode = "on" if on else "off"
    cluster = LocalCluster(work_dir=work / "cluster", agents=settings.agents, resources=AGENT,
                           master_args=[*MASTER_ARGS, "--oversubscription", mode],
                           agent_args=[*AGENT_ARGS, "--oversubscription", mode])
    (work / "owner.py").write_text(OWNER_SCRIPT)
    (work / "map.py").write_text(MAP_SCRIPT)
    surge_flag = work / "surge"
    surge_mb = int(OWNER.get("mem") * SURGE_SHARE)
    owners = Owners(settings.agents, lambda n: f"{sys.executable} {work / 'owner.py'} "
                                               f"{settings.owner_mb} {surge_mb} {surge_flag}")
    cluster.start()
    driver = SchedulerDriver(owners, FrameworkInfo(name="owners"),
                             master=cluster.master_address)
    running = asyncio.ensure_future(driver.run_async())
    try:
        await _until(lambda: owners.running() == settings.agents, 60, "the owners running")
        # Let the agents' estimates settle (one reclaim window and a few reports),
        # the same wait in both modes.
        await asyncio.sleep(5.0)
        return await _run_job(settings, on, work, cluster, owners, surge_flag)
    finally:
        driver.stop()
        await asyncio.wait([running], timeout=10)
        cluster.stop()


async def _run_job(settings: Settings, on: bool, work: Path, cluster: LocalCluster,
                   owners: Owners, surge_flag: Path) -> dict[str, float]:
    inputs = []
    for number in range(settings.maps):
        path = work / f"input-{number:03d}"
        path.write_text(f"split{number}\n")
        inputs.append(str(path))
    job = Job(inputs=inputs, output=str(work / "out"), reducers=1,
              map_command=f"{sys.executable} {work / 'map.py'} {MAP_HOLD_MB} "
                          f"{settings.map_seconds}",
              reduce_command="cat", map_cpus=MAP_CPUS, map_mem=MAP_MEM, reduce_cpus=MAP_CPUS,
              reduce_mem=MAP_MEM, locality_wait=0.0, revocable=on, name="oversub")
    cores: list[BatchCore] = []
    started = time.monotonic()
    job_run = asyncio.ensure_future(run_job_async(job, cluster.master_address, timeout=600,
                                                  core_hook=cores.append))
    samples: list[tuple[float, float, float]] = []
    while not job_run.done():
        elapsed = time.monotonic() - started
        surging = settings.surge_at <= elapsed < settings.surge_at + settings.surge
        if surging and not surge_flag.exists():
            surge_flag.write_text("1")
        elif not surging and surge_flag.exists():
            surge_flag.unlink()
        samples.append(await asyncio.to_thread(_sample, cluster))
        await asyncio.sleep(SAMPLE)
    result = job_run.result()
    elapsed = time.monotonic() - started
    if surge_flag.exists():
        surge_flag.unlink()
    if not result.succeeded:
        raise RuntimeError(f"the batch job failed: {result.error}")
    capacity = settings.agents * Resources.parse(AGENT).get("mem")
    evicted = sum(http_get_json(f"{a['url']}/state")["oversubscription"]["evicted"]
                  for a in cluster.state()["agents"])
    return {"alloc": statistics.fmean(s[0] for s in samples) / capacity,
            "usage": statistics.fmean(s[1] for s in samples) / capacity,
            "lent": statistics.fmean(s[2] for s in samples) / capacity,
            "seconds": elapsed, "evictions": evicted,
            "preempted": result.progress.preempted_attempts,
            "on_revocable": result.progress.revocable_launches,
            "owners_ended": len(owners.ended())}


def main(settings: Settings) -> int:
    with tempfile.TemporaryDirectory(prefix="dyad-oversub-") as tmp:
        rows = {name: asyncio.run(measure(settings, on, Path(tmp) / name))
                for name, on in (("off", False), ("on", True))}
    print(f"real cluster: {settings.agents} agents x {AGENT}, one owner each declaring "
          f"{OWNER} and holding {settings.owner_mb} MB; {settings.maps} maps of "
          f"cpus:{MAP_CPUS};mem:{MAP_MEM:g} holding {MAP_HOLD_MB} MB for "
          f"{settings.map_seconds:g}s; owners surge to {SURGE_SHARE:.0%} at "
          f"{settings.surge_at:g}s for {settings.surge:g}s; memory figures, shared machine")
    print(f"{'':4} {'alloc util':>10} {'usage util':>10} {'on revocable':>12} "
          f"{'job time':>9} {'maps lent':>9} {'evictions':>9} {'owners ended':>12}")
    for name, row in rows.items():
        print(f"{name:4} {row['alloc']:>10.1%} {row['usage']:>10.1%} "
              f"{row['lent'] / row['usage'] if row['usage'] else 0:>12.1%} "
              f"{row['seconds']:>8.1f}s {row['on_revocable']:>9.0f} {row['evictions']:>9.0f} "
              f"{row['owners_ended']:>12.0f}")
    off, on = rows["off"], rows["on"]
    print(f"usage utilization on/off: {on['usage'] / off['usage']:.2f}x; "
          f"batch throughput on/off (job time off/on): {off['seconds'] / on['seconds']:.2f}x")
    return 0 if off["owners_ended"] == on["owners_ended"] == 0 else 1
