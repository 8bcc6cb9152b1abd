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
from collections import deque

from dyad.resources import SHARE_KINDS


class Counters:
    """Named monotonic counters; unknown names read as 0."""

    def __init__(self) -> None:
        # A plain dict, not a `Counter`: the interpreter's fast paths for reading
        # and storing items are for exact dicts, and the core counts several
        # things per message (issue 19).
        self._values: dict[str, int] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        values = self._values
        values[name] = values.get(name, 0) + amount

    def __getitem__(self, name: str) -> int:
        return self._values.get(name, 0)

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
    "master/offers_held": "Offers that did not go out when made: admission held them "
                          "(master/admission.py).",
    "master/admission_cuts": "Times admission cut the tasks allowed in flight: a launch "
                             "took longer than its target (master/admission.py).",
    "master/offers_rescinded": "Offers taken back (timeout, agent lost, framework gone).",
    "master/offers_accepted": "Offers accepted by frameworks.",
    "master/offers_frames": "Offers frames sent (a pass's offers to a framework are split to fit the frame budget).",
    "master/offers_too_large": "Offers no frame could hold; returned to the allocator, never sent.",
    "master/offers_refused": "Offers returned at once because their framework refused an offers frame.",
    "master/rejections_received": "Rejected replies received from peers (never answered).",
    "master/operations_reserve": "RESERVE operations applied (dynamic reservations made).",
    "master/operations_unreserve": "UNRESERVE operations applied.",
    "master/operations_create": "CREATE operations applied (persistent volumes made).",
    "master/operations_destroy": "DESTROY operations applied (persistent volumes removed).",
    "master/agent_dynamic_reports_ignored":
        "Re-registrations whose reservations and volumes did not fit the agent (ignored).",
    "master/operator_kills": "Tasks killed by an operator (POST /tasks/kill).",
    "master/operator_drains": "Agents drained by an operator (POST /machine/drain).",
    "master/operator_teardowns": "Frameworks torn down by an operator (POST /teardown).",
    "master/operator_calls_invalid": "Operator calls refused for a bad body or value.",
    "master/weights_updates": "Successful role weight changes (PUT /weights).",
    "master/quota_updates": "Successful role quota changes (PUT /quota).",
    "master/agents_drained": "Agents that reported they are draining.",
    "master/agent_removals_deferred": "Agent removals queued by the removal rate limit.",
    "master/agent_removals_cancelled": "Queued agent removals cancelled because the agent answered.",
    "master/agent_pings_skipped": "Pings not sent: the agent (ANY_FRAME_LIVENESS) and the master "
                                  "had both spoken since its last tick (master/agents.py).",
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
    "master/usage_samples": "Usage samples handed to the usage store (one per executor per report).",
    "master/usage_samples_unmatched": "Executor samples skipped: no live task of theirs is known.",
    "master/usage_samples_rejected": "Executor samples skipped: numbers the usage store refuses.",
    "master/usage_events": "Task state changes handed to the usage store.",
    "master/revocable_offers_sent": "Offers that carried revocable resources.",
    "master/preemptions": "Tasks the master preempted (killed for higher-priority work).",
    "master/preemptions_refused": "Preempt requests refused (preemption off, not allowed, or nothing to free).",
    "master/preemptions_rate_limited": "Preemptions put off by --max-preemptions-per-minute.",
    # Kept by the shell (master/server.py).
    "master/internal_errors": "Events or frames that raised inside the master (bugs); each is logged.",
    "master/dropped_sends": "Messages the master could not send (peer gone, socket closed).",
    "master/inbound_full": "Times the master stopped reading its socket because its inbound "
                           "queue was full (ZMQ's queues then push back on senders).",
    "master/resends_coalesced": "Frames dropped as exact copies of one still waiting to be "
                                "handled (a status update or registration sent again).",
    "master/batch_frames_sent": "Batch frames sent (several messages for one framework "
                                "in one frame, docs/protocol.md).",
    "master/messages_sent_batched": "Messages sent inside batch frames.",
    "master/frames_sent": "Frames handed to the socket (a batch frame counts once).",
    "master/sends_full": "Sends refused because the peer's outgoing queue was full.",
    "master/sends_unroutable": "Sends to a peer that is gone (no connection with that identity).",
    "master/registry_writes": "Registry writes completed.",
    "master/messages_received_as_standby": "Frames received while not leading (kept briefly, then dropped).",
    "master/leadership_pauses": "Times the leader paused because its ZooKeeper session was unconfirmed.",
    "master/election/proven_dead": "Leaders this standby proved dead (connection closed by them, every port refused).",
    "master/election/fast_failovers": "Dead leaders' znodes this standby deleted, not waiting for their session to expire.",
    "master/election/deletes_refused": "Conditional deletes of a dead leader's znode that did not happen (gone, or not the session seen).",
    "master/election/watch_retries": "Times this standby could not watch the leader's liveness listener, or saw no proof, and tried again.",
    "master/election/unwatchable": "Leaders without a liveness record of their own session (their death waits for ZooKeeper).",
    "master/auth_failures/forbidden": "Messages and calls refused because their principal may not (ACLs, ids of others).",
    "master/auth_failures/curve": "CURVE handshakes refused (unknown client key).",
    "master/auth_failures/handshake": "CURVE handshakes that failed before a key was shown (no CURVE, wrong server key).",
    "master/auth_failures/http_unauthenticated": "HTTP requests refused for missing or wrong credentials (401).",
    "master/auth_failures/http_cross_origin": "HTTP writes refused for coming from another site (403).",
    "master/auth_failures/principal_changed": "Frames dropped: their ZMQ identity came with another principal before.",
    "master/loop_restarts": "Times a loop of the master shell died (a bug, logged) and was restarted.",
    # Kept by the usage store (master/usage_api.py), reported when it is on.
    "usage/samples": "Usage samples written to the usage store.",
    "usage/events": "Task events written to the usage store.",
    "usage/sampled_out": "Usage samples left out by --usage-sample-rate.",
    "usage/dropped": "Rows dropped because the usage store's buffer was full.",
    "usage/write_errors": "Batches the usage store failed to write (logged).",
    "usage/expired": "Rows the usage store deleted for age or --usage-max-rows.",
    "usage/expire_errors": "Expiry passes of the usage store that failed (logged).",
    "usage/bad_requests": "POST /usage/query bodies refused before running (not JSON, no sql).",
    "usage/queries": "Usage queries answered.",
    "usage/query_errors": "Usage queries refused or failed (bad SQL, not read-only).",
    "usage/query_timeouts": "Usage queries stopped at their time limit.",
    "usage/query_busy": "Usage queries refused because too many were waiting.",
    # Kept by the Mesos v1 scheduler API (master/api_v1.py).
    "master/v1/subscribes": "SUBSCRIBE calls to /api/v1/scheduler.",
    "master/v1/calls": "Other calls to /api/v1/scheduler that passed conversion.",
    "master/v1/calls_invalid": "Calls to /api/v1/scheduler refused with a 4xx.",
    "master/v1/events": "Events written to v1 subscribers' streams.",
    "master/v1/rejected": "Refusals the core sent v1 subscribers (not Mesos events: logged).",
    "master/v1/dropped": "Messages for v1 subscribers whose stream had ended.",
    "master/v1/overflows": "v1 streams closed because their subscriber stopped reading.",
}
GAUGES = {
    "master/inbound_queued": "Frames read from the socket and not yet handled.",
    "master/inbound_queued_most": "The most frames ever waiting to be handled at once.",
    "master/elected": "1 if this master is the leader, else 0.",
    "master/election/watching": "1 while this standby, next in line, holds a connection to the leader's liveness listener.",
    "master/v1/streams": "Open Mesos v1 scheduler event streams.",
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
    "master/outstanding_offers": "Offers made and not yet answered (waiting ones too).",
    "master/offers_waiting": "Offers made and waiting to go out (master/admission.py).",
    "master/admission_allowed": "Tasks allowed in flight now (master/admission.py).",
    "master/admission_in_flight": "Tasks launched and not yet heard of, plus the tasks "
                                  "offers out are expected to become (master/admission.py).",
    "allocator/agents_considered": "Agents the last allocation pass looked at.",
    "allocator/allocation_run_ms": "Duration of the last allocation pass, in milliseconds.",
    "allocator/allocation_run_ms_p50": "Median allocation pass duration over the last 1000 passes, ms.",
    "allocator/allocation_run_ms_p99": "99th percentile allocation pass duration over the last 1000 passes, ms.",
    **{f"master/{kind}_{what}": f"{kind} {meaning} over registered agents."
       for kind in SHARE_KINDS
       for what, meaning in (("total", "in total"), ("used", "used by tasks and executors"),
                             ("offered", "held by outstanding offers"))},
    **{f"master/{kind}_{what}": f"{kind} {meaning} over registered agents (revocable)."
       for kind in ("cpus", "mem")
       for what, meaning in (("revocable", "agents lend"),
                             ("revocable_offered", "lent and held by outstanding offers"),
                             ("revocable_used", "lent and held by revocable tasks"))},
}
HISTOGRAMS = {
    "allocator/allocation_run_seconds": "Duration of allocation passes, in seconds.",
    "master/registry_write_seconds": "Duration of registry writes, in seconds.",
}
