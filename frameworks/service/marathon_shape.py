"""Marathon's exact shapes for the REST answers, so Marathon's own clients parse them.

`views` renders the service's state with some fields Marathon does not have
(`waitingReason`, `autopilot`, a task's `agentId` and `killing`, a deployment's `kind`,
`startedAt`, `autoRollback`, `progress`, `rollbackAt`, `lastTaskFailure.reason`,
`/v2/info`'s `connected`). Strict clients (the `marathon` Python package builds
its models with keyword arguments) refuse unknown keys, so by default the API
answers in Marathon's shape: these functions drop what Marathon lacks and add
what it always has (a task's `servicePorts`, `/v2/info`'s configuration
sections). Callers that want Dyad's extra fields ask with ``?dyad=true``
(frameworks/service/api.py), and get the `views` documents unchanged.

Why an app waits is still there for Marathon clients, in Marathon's own fields:
`/v2/queue`'s `processedOffersSummary` (and `lastUnusedOffers` when asked for).
"""

from __future__ import annotations

from typing import Any

APP_EXTRAS = frozenset({"waitingReason", "autopilot", "priority"})
TASK_EXTRAS = frozenset({"agentId", "killing"})
FAILURE_EXTRAS = frozenset({"reason"})
DEPLOYMENT_EXTRAS = frozenset({"kind", "startedAt", "autoRollback", "progress", "rollbackAt"})
QUEUE_ITEM_EXTRAS = frozenset({"waitingReason"})
INFO_EXTRAS = frozenset({"connected"})


def _without(body: dict[str, Any], extras: frozenset[str]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in extras}


def task(body: dict[str, Any]) -> dict[str, Any]:
    # Dyad has no service ports (no load balancer of its own): Marathon always
    # sends the list, empty when the app defines none.
    return {**_without(body, TASK_EXTRAS), "servicePorts": body.get("servicePorts", [])}


def app(body: dict[str, Any]) -> dict[str, Any]:
    out = _without(body, APP_EXTRAS)
    if "lastTaskFailure" in out:
        out["lastTaskFailure"] = _without(out["lastTaskFailure"], FAILURE_EXTRAS)
    if "tasks" in out:
        out["tasks"] = [task(t) for t in out["tasks"]]
    return out


def deployment(body: dict[str, Any]) -> dict[str, Any]:
    return _without(body, DEPLOYMENT_EXTRAS)


def queue(body: dict[str, Any], embed_unused_offers: bool) -> dict[str, Any]:
    items = []
    for item in body["queue"]:
        out = _without(item, QUEUE_ITEM_EXTRAS)
        out["overdue"] = item["delay"]["overdue"]
        if embed_unused_offers:
            # Dyad keeps counts per reason, not the offers themselves.
            out["lastUnusedOffers"] = []
        items.append(out)
    return {"queue": items}


def info(body: dict[str, Any], *, master: str = "", framework_name: str = "",
         hostname: str = "", http_port: int = 0, zk: str | None = None,
         failover_timeout: float = 0.0) -> dict[str, Any]:
    """`/v2/info` with Marathon's configuration sections (snake_case keys, as
    Marathon writes them), from the options this instance runs with."""
    out = _without(body, INFO_EXTRAS)
    out["marathon_config"] = {
        "master": master, "framework_name": framework_name, "hostname": hostname,
        "failover_timeout": int(failover_timeout), "checkpoint": True, "ha": zk is not None,
        "mesos_role": None, "webui_url": None}
    out["zookeeper_config"] = {"zk": zk}
    out["http_config"] = {"http_port": http_port, "https_port": None}
    out["event_subscriber"] = None
    return out
