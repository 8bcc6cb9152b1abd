"""Counters, a sliding-window percentile and histograms, kept by the master's
pure core, and the catalogue saying what each master figure measures.

Counters only go up (operators compute rates from them); gauges are not stored at
all -- `MasterState.metrics()` derives them from its records at read time, so they
can never drift from the truth. The window keeps the last N samples of something
timed (an allocation run) and answers percentiles by nearest rank, which is exact
for the samples it holds and cheap enough to compute on every `/metrics/snapshot`.
"""

from __future__ import annotations

import math
from collections import Counter, deque

from dyad.resources import SHARE_KINDS


class Counters:
    """Named monotonic counters; unknown names read as 0."""

    def __init__(self) -> None:
        self._values: Counter[str] = Counter()

    def inc(self, name: str, amount: int = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._values[name] += amount

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def items(self) -> dict[str, int]:
        return dict(self._values)


class Window:
    """The last `size` samples of a measurement, with its percentiles."""

    def __init__(self, size: int = 1000) -> None:
        if size <= 0:
            raise ValueError("window size must be positive")
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self._samples.append(value)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def last(self) -> float:
        return self._samples[-1] if self._samples else 0.0

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile (0 < p <= 100); 0.0 when there are no samples."""
        if not 0 < p <= 100:
            raise ValueError("percentile must be in (0, 100]")
        if not self._samples:
            return 0.0
        ordered = sorted(self._samples)
        rank = math.ceil(p / 100 * len(ordered))
        return ordered[rank - 1]


class Histogram:
    """Samples counted per upper bound (`bounds`, increasing), plus their sum:
    what a Prometheus histogram exposes. Unlike `Window` it forgets nothing, so
    rates and quantiles over any range come out right in PromQL."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be distinct and increasing")
        self.bounds = bounds
        self._counts = [0] * len(bounds)
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self._counts[i] += 1
                break

    def cumulative(self) -> list[tuple[float, int]]:
        """(bound, samples at or below it) for each bound; +Inf is `count`."""
        running = 0
        out = []
        for bound, count in zip(self.bounds, self._counts):
            running += count
            out.append((bound, running))
        return out


LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0, 10.0)
"""Seconds: from a pass over a handful of agents to a registry write that waits
on a slow ZooKeeper."""

# What every master figure measures, by `/metrics/snapshot` key. `/metrics` types
# and describes them from here (counters become `<name>_total`); a test checks
# that every key the master reports is listed.
COUNTERS = {
    "master/messages_received": "Frames received from agents and schedulers while leading, valid or not.",
    "master/messages_invalid": "Frames or messages refused: undecodable, or not acceptable from that peer.",
    "master/messages_rejected": "Rejected replies sent to peers.",
    "master/status_updates": "Task status updates received from agents.",
    "master/offers_sent": "Resource offers sent to frameworks.",
    "master/offers_declined": "Offers declined by frameworks.",
    "master/offers_rescinded": "Offers taken back (timeout, agent lost, framework gone).",
    "master/offers_accepted": "Offers accepted by frameworks.",
    "master/operations_reserve": "RESERVE operations applied (dynamic reservations made).",
    "master/operations_unreserve": "UNRESERVE operations applied.",
    "master/operator_kills": "Tasks killed by an operator (POST /tasks/kill).",
    "master/operator_drains": "Agents drained by an operator (POST /machine/drain).",
    "master/operator_teardowns": "Frameworks torn down by an operator (POST /teardown).",
    "master/operator_calls_invalid": "Operator calls refused for a bad body or value.",
    "master/weights_updates": "Successful role weight changes (PUT /weights).",
    "master/quota_updates": "Successful role quota changes (PUT /quota).",
    "master/agents_drained": "Agents that reported they are draining.",
    "master/agent_removals_deferred": "Agent removals queued by the removal rate limit.",
    "master/agent_removals_cancelled": "Queued agent removals cancelled because the agent answered.",
    "master/recovery_agents_unreachable": "Registry agents that did not re-register in time after a failover.",
    "master/tasks_finished": "Tasks that ended TASK_FINISHED.",
    "master/tasks_failed": "Tasks that ended TASK_FAILED.",
    "master/tasks_killed": "Tasks that ended TASK_KILLED.",
    "master/tasks_lost": "Tasks that ended TASK_LOST.",
    "master/tasks_error": "Tasks that ended TASK_ERROR (invalid launches).",
    "master/tasks_dropped": "Tasks that ended TASK_DROPPED (never launched).",
    "master/tasks_gone": "Tasks that ended TASK_GONE.",
    "master/tasks_unknown": "Tasks that ended TASK_UNKNOWN (the master never ends a task so; kept for dashboards).",
    "allocator/allocation_runs": "Allocation passes run.",
    # Kept by the shell (master/server.py).
    "master/internal_errors": "Events or frames that raised inside the master (bugs); each is logged.",
    "master/dropped_sends": "Messages the master could not send (peer gone, socket closed).",
    "master/registry_writes": "Registry writes completed.",
    "master/messages_received_as_standby": "Frames received while not leading (kept briefly, then dropped).",
    "master/leadership_pauses": "Times the leader paused because its ZooKeeper session was unconfirmed.",
    "master/loop_restarts": "Times a loop of the master shell died (a bug, logged) and was restarted.",
}
GAUGES = {
    "master/elected": "1 if this master is the leader, else 0.",
    "master/tasks_staging": "Live tasks in TASK_STAGING.",
    "master/tasks_starting": "Live tasks in TASK_STARTING.",
    "master/tasks_running": "Live tasks in TASK_RUNNING.",
    "master/tasks_killing": "Live tasks in TASK_KILLING.",
    "master/tasks_unreachable": "Tasks of partition-aware frameworks on unreachable agents.",
    "master/agents_active": "Registered agents.",
    "master/agents_unreachable": "Agents remembered as unreachable.",
    "master/agents_recovering": "Registry agents not yet re-registered after a failover.",
    "master/frameworks_active": "Frameworks with a connected scheduler.",
    "master/frameworks_connected": "Frameworks with a connected scheduler.",
    "master/frameworks_disconnected": "Frameworks whose scheduler is away (within its failover timeout).",
    "master/frameworks_completed": "Removed frameworks still remembered.",
    "master/outstanding_offers": "Offers sent and not yet answered.",
    "allocator/agents_considered": "Agents the last allocation pass looked at.",
    "allocator/allocation_run_ms": "Duration of the last allocation pass, in milliseconds.",
    "allocator/allocation_run_ms_p50": "Median allocation pass duration over the last 1000 passes, ms.",
    "allocator/allocation_run_ms_p99": "99th percentile allocation pass duration over the last 1000 passes, ms.",
    **{f"master/{kind}_{what}": f"{kind} {meaning} over registered agents."
       for kind in SHARE_KINDS
       for what, meaning in (("total", "in total"), ("used", "used by tasks and executors"),
                             ("offered", "held by outstanding offers"))},
}
HISTOGRAMS = {
    "allocator/allocation_run_seconds": "Duration of allocation passes, in seconds.",
    "master/registry_write_seconds": "Duration of registry writes, in seconds.",
}
