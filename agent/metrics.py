"""What every agent figure measures, by `/metrics/snapshot` key.

`/metrics` types and describes the figures from here (`dyad.prometheus`):
counters become Prometheus' ``<name>_total``, gauges stay gauges, and each HELP
line says what is measured. A test checks that every key a running agent
reports is listed, so a new figure cannot reach Prometheus untyped.
"""

from __future__ import annotations

from dyad.messages import TaskState

_ENDED = {state: f"Tasks that ended {state.name} on this agent."
          for state in TaskState if state.is_terminal}

COUNTERS = {
    # Kept by the core (`AgentState`).
    "agent/messages_received": "Frames received from the master and from executors, valid or not.",
    "agent/messages_invalid": "Frames refused: undecodable, or not acceptable from that sender.",
    "agent/messages_dropped": "Messages the agent could not deliver (executor gone, no master).",
    "agent/rejected_by_master": "Rejected replies received from the master.",
    "agent/status_updates_dropped": "Status updates given up on (their framework or task is gone).",
    "agent/status_updates_sent": "Status updates sent to the master, retries included.",
    "agent/status_updates_retried": "Status updates sent again because no acknowledgement came.",
    "agent/status_updates_acked": "Status updates acknowledged by their framework.",
    "agent/status_updates_stale_acks": "Acknowledgements for updates no longer pending.",
    "agent/executors_memory_limited": "Executors killed for going over their memory limit.",
    "agent/health_checks_run": "Task health checks run.",
    "agent/health_checks_failed": "Task health checks that failed.",
    "agent/health_changes": "Times a task's health changed (healthy <-> unhealthy).",
    "agent/tasks_killed_unhealthy": "Tasks killed for failing their health checks.",
    "agent/handler_errors": "Events the agent core raised on (bugs); each is logged.",
    "agent/effect_errors": "Effects the agent shell failed to perform (bugs); each is logged.",
    **{f"agent/tasks_{state.name.removeprefix('TASK_').lower()}": text
       for state, text in _ENDED.items()},
    # Kept by the shell (`agent.server`, `agent.http`).
    "agent/sandboxes_removed": "Finished sandboxes removed by garbage collection.",
    "agent/volume_errors": "Persistent volume directories or links that could not be made or removed.",
    "agent/logs_rotated": "Task stdout/stderr files rotated for size.",
    "agent/checkpoints_written": "Checkpoints written to the work dir.",
    "agent/batch_frames_sent": "Batch frames sent to the master (the sends of one core batch).",
    "agent/messages_sent_batched": "Messages sent to the master inside batch frames.",
    "agent/receive_errors": "Frames that broke a receive loop's handling (bugs); the loop went on.",
    "agent/loop_errors": "Rounds of the usage or disk watcher that failed; the watcher went on.",
    "agent/loop_crashes": "Deaths of an agent loop (bugs, logged); each was restarted or fatal.",
    "agent/http_errors": "HTTP requests a handler failed on unexpectedly (answered 400, logged).",
    # Security (`dyad.security.Refusals`, `agent.access`; docs/security.md).
    "agent/auth_failures/curve": "Executor CURVE handshakes refused (a key the agent did not give).",
    "agent/auth_failures/handshake": "Executor handshakes that failed before a key was shown.",
    "agent/auth_failures/http_unauthenticated": "HTTP requests refused for missing or wrong credentials (401).",
    "agent/auth_failures/http_cross_origin": "HTTP writes refused for coming from another site (403).",
    "agent/auth_failures/forbidden": "Requests and registrations refused: the principal may not (403, Rejected).",
    "agent/auth_failures/principal_changed": "Executor frames dropped: their identity came with another principal before.",
    "agent/auth_failures/by_master": "Handshakes with the master that failed (it refused our key, or is not the master we trust).",
    # The Mesos v1 executor API (`agent.api_v1`; docs/mesos-compat.md).
    "agent/v1/subscribes": "SUBSCRIBE calls to /api/v1/executor that converted.",
    "agent/v1/calls": "Other calls to /api/v1/executor taken (202).",
    "agent/v1/calls_invalid": "Calls to /api/v1/executor refused with a 4xx.",
    "agent/v1/events": "Events written to v1 executors' streams.",
    "agent/v1/events_dropped": "Messages for v1 executors without an open stream (or no Mesos event).",
    "agent/v1/replaced": "v1 executor streams ended because the executor subscribed again.",
    "agent/v1/overflows": "v1 executor streams ended because their executor stopped reading.",
    # Kept by the fetcher.
    "fetcher/cache_hits": "URI fetches served from the fetcher cache.",
    "fetcher/cache_misses": "Cached URI fetches that had to get the file first.",
    "fetcher/downloads": "HTTP(S) downloads completed.",
    "fetcher/failures": "URI fetches that failed (the task failed with REASON_FETCH_FAILED).",
    "fetcher/bytes_downloaded": "Bytes downloaded over HTTP(S).",
    "fetcher/cache_evictions": "Files evicted from the fetcher cache to make room.",
}
GAUGES = {
    "agent/registered": "1 if the agent is registered with a master, else 0.",
    "agent/draining": "1 if the agent is draining, else 0.",
    "agent/executors_running": "Executors not yet terminated.",
    "agent/tasks_running": "Tasks in TASK_RUNNING.",
    "agent/status_updates_pending": "Status updates waiting for an acknowledgement.",
    "agent/v1/streams": "Open Mesos v1 executor event streams.",
    "fetcher/cache_bytes": "Bytes held in the fetcher cache.",
    "fetcher/cache_entries": "Files held in the fetcher cache.",
}
