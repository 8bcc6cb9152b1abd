"""Mesos v1 scheduler calls and events as Dyad messages -- pure.

`call_from_mesos(body)` turns one `POST /api/v1/scheduler` body into a `V1Call`:
the Dyad message the master core receives for it (the same one Dyad's own driver
sends over ZMQ), or none for the calls Dyad answers without the core. It raises
`MesosJsonError` with the JSON path of what is wrong. `event_to_mesos(message)`
renders what the core sends a framework as one Mesos `Event` for the RecordIO
stream, or None for the few messages that are not events (`Rejected`).
"""

from __future__ import annotations

from typing import Any

import attrs

from dyad.messages import (
    Accept, Acknowledge, Decline, Error, ExecutorToFramework, Failure, FrameworkToExecutor,
    Heartbeat, Kill, Message, Offers, Operation, OperationType, Reconcile, ReconcileTask,
    Filters, Rescind, Revive, Subscribe, Subscribed, Suppress, Teardown, Update,
)
from dyad.mesos_json import (
    MesosJsonError, b64, b64_text, boolean, build, field, filters_from_mesos, framework_info_from_mesos,
    id_value, items, join, kill_grace, master_info_to_mesos, mesos_id, obj, offer_to_mesos,
    required, resources_from_mesos, string, task_info_from_mesos, task_status_to_mesos, to_b64,
)

SUBSCRIBE = "SUBSCRIBE"

NO_OPS = frozenset({"REQUEST", "ACCEPT_INVERSE_OFFERS", "DECLINE_INVERSE_OFFERS"})
"""Calls answered 202 that change nothing: Mesos itself ignores REQUEST, and Dyad
never makes inverse offers, so there is none to accept or decline (as with an
unknown offer id in DECLINE)."""

REFUSED = {
    "ACKNOWLEDGE_OPERATION_STATUS": "Dyad applies operations at once and sends no "
                                    "operation status updates",
    "RECONCILE_OPERATIONS": "Dyad applies operations at once and sends no operation "
                            "status updates",
    "UPDATE_FRAMEWORK": "UPDATE_FRAMEWORK is not supported; subscribe again with the "
                        "changed FrameworkInfo",
}

_OPERATIONS = {"LAUNCH": "launch", "RESERVE": "reserve", "UNRESERVE": "unreserve"}


@attrs.frozen
class ShutdownExecutorCall:
    """SHUTDOWN of one executor: Dyad's wire has no such message, so the shell
    kills the executor's live tasks (which ends a command executor)."""

    framework_id: str
    agent_id: str
    executor_id: str


@attrs.frozen
class V1Call:
    """One decoded call: its Mesos `type`, the framework it names (None only for a
    first SUBSCRIBE), and what the core receives (None: nothing to do)."""

    kind: str
    framework_id: str | None
    message: Message | ShutdownExecutorCall | None


def call_from_mesos(body: Any) -> V1Call:
    data = obj(body, "")
    kind = required(data, "type", "", string)
    framework_id = field(data, "framework_id", "", id_value, None)
    if kind == SUBSCRIBE:
        return V1Call(kind, framework_id, _subscribe(data, framework_id))
    if kind in REFUSED:
        raise MesosJsonError("type", REFUSED[kind])
    if framework_id is None:
        raise MesosJsonError("framework_id", f"is required in a {kind[:40]} call")
    if kind in NO_OPS:
        return V1Call(kind, framework_id, None)
    reader = _CALLS.get(kind)
    if reader is None:
        raise MesosJsonError("type", f"unknown call type {kind[:40]!r}")
    return V1Call(kind, framework_id, reader(data, framework_id))


def _subscribe(data: dict[str, Any], framework_id: str | None) -> Subscribe:
    call = required(data, "subscribe", "", obj)
    info = required(call, "framework_info", "subscribe", framework_info_from_mesos)
    if info.id is not None and framework_id is not None and info.id != framework_id:
        raise MesosJsonError("subscribe.framework_info.id", f"{info.id!r} differs from "
                                                            f"framework_id {framework_id!r}")
    if framework_id is not None and info.id is None:
        info = attrs.evolve(info, id=framework_id)
    return Subscribe(framework=info, force=field(call, "force", "subscribe", boolean, False))


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    return required(data, key, "", obj)


def _offer_ids(section: dict[str, Any], path: str) -> list[str]:
    return required(section, "offer_ids", path, lambda v, p: items(v, p, id_value))


def _filters(section: dict[str, Any], path: str) -> Filters:
    return field(section, "filters", path, filters_from_mesos, Filters())


def _accept(data: dict[str, Any], framework_id: str) -> Accept:
    section = _section(data, "accept")
    operations = field(section, "operations", "accept",
                       lambda v, p: items(v, p, _operation), [])
    return Accept(framework_id=framework_id, offer_ids=_offer_ids(section, "accept"),
                  operations=operations, filters=_filters(section, "accept"))


def _operation(value: Any, path: str) -> Operation:
    data = obj(value, path)
    kind = required(data, "type", path, string)
    key = _OPERATIONS.get(kind)
    if key is None:
        raise MesosJsonError(join(path, "type"), f"operation {kind[:40]} is not supported "
                             f"by Dyad (supported: {', '.join(_OPERATIONS)})")
    section = required(data, key, path, obj)
    where = join(path, key)
    if kind == OperationType.LAUNCH:
        tasks = required(section, "task_infos", where,
                         lambda v, p: items(v, p, task_info_from_mesos))
        return Operation(type=kind, tasks=tasks)
    resources = required(section, "resources", where, resources_from_mesos)
    return build(path, lambda: Operation(type=kind, resources=resources))


def _decline(data: dict[str, Any], framework_id: str) -> Decline:
    section = _section(data, "decline")
    return Decline(framework_id=framework_id, offer_ids=_offer_ids(section, "decline"),
                   filters=_filters(section, "decline"))


def _kill(data: dict[str, Any], framework_id: str) -> Kill:
    section = _section(data, "kill")
    return build("kill", lambda: Kill(
        framework_id=framework_id, task_id=required(section, "task_id", "kill", id_value),
        agent_id=field(section, "agent_id", "kill", id_value, None),
        kill_grace_period=field(section, "kill_policy", "kill", kill_grace, None)))


def _shutdown(data: dict[str, Any], framework_id: str) -> ShutdownExecutorCall:
    section = _section(data, "shutdown")
    return ShutdownExecutorCall(
        framework_id=framework_id,
        agent_id=required(section, "agent_id", "shutdown", id_value),
        executor_id=required(section, "executor_id", "shutdown", id_value))


def _acknowledge(data: dict[str, Any], framework_id: str) -> Acknowledge:
    section = _section(data, "acknowledge")
    return Acknowledge(framework_id=framework_id,
                       agent_id=required(section, "agent_id", "acknowledge", id_value),
                       task_id=required(section, "task_id", "acknowledge", id_value),
                       uuid=required(section, "uuid", "acknowledge", b64_text))


def _reconcile(data: dict[str, Any], framework_id: str) -> Reconcile:
    section = field(data, "reconcile", "", obj, {})
    tasks = field(section, "tasks", "reconcile", lambda v, p: items(v, p, _reconcile_task), [])
    return Reconcile(framework_id=framework_id, tasks=tasks)


def _reconcile_task(value: Any, path: str) -> ReconcileTask:
    data = obj(value, path)
    return ReconcileTask(task_id=required(data, "task_id", path, id_value),
                         agent_id=field(data, "agent_id", path, id_value, None))


def _message(data: dict[str, Any], framework_id: str) -> FrameworkToExecutor:
    section = _section(data, "message")
    return FrameworkToExecutor(
        framework_id=framework_id,
        agent_id=required(section, "agent_id", "message", id_value),
        executor_id=required(section, "executor_id", "message", id_value),
        data=required(section, "data", "message", b64))


_CALLS: dict[str, Any] = {
    "TEARDOWN": lambda data, fid: Teardown(framework_id=fid),
    "ACCEPT": _accept,
    "DECLINE": _decline,
    # Dyad revives and suppresses a framework in all its roles; `roles` is ignored.
    "REVIVE": lambda data, fid: Revive(framework_id=fid),
    "SUPPRESS": lambda data, fid: Suppress(framework_id=fid),
    "KILL": _kill,
    "SHUTDOWN": _shutdown,
    "ACKNOWLEDGE": _acknowledge,
    "RECONCILE": _reconcile,
    "MESSAGE": _message,
}


# --------------------------------------------------------------------------- events


def event_to_mesos(message: Message) -> dict[str, Any] | None:
    """The Mesos `Event` for a message the core sends a framework (None: it is no
    event, e.g. `Rejected`, which the shell counts instead)."""
    match message:
        case Subscribed():
            return {"type": "SUBSCRIBED", "subscribed": {
                "framework_id": mesos_id(message.framework_id),
                "heartbeat_interval_seconds": message.heartbeat_interval,
                "master_info": master_info_to_mesos(message.master_info)}}
        case Offers():
            return {"type": "OFFERS", "offers": {
                "offers": [offer_to_mesos(offer) for offer in message.offers]}}
        case Rescind():
            return {"type": "RESCIND", "rescind": {"offer_id": mesos_id(message.offer_id)}}
        case Update():
            return {"type": "UPDATE", "update": {"status": task_status_to_mesos(message.status)}}
        case ExecutorToFramework():
            return {"type": "MESSAGE", "message": {
                "agent_id": mesos_id(message.agent_id),
                "executor_id": mesos_id(message.executor_id), "data": to_b64(message.data)}}
        case Failure():
            failure: dict[str, Any] = {"agent_id": mesos_id(message.agent_id)}
            if message.executor_id is not None:
                failure["executor_id"] = mesos_id(message.executor_id)
                if message.status is not None:
                    failure["status"] = message.status
            return {"type": "FAILURE", "failure": failure}
        case Error():
            return {"type": "ERROR", "error": {"message": message.message}}
        case Heartbeat():
            return {"type": "HEARTBEAT"}
    return None
