"""The Mesos v1 executor API's decisions -- pure.

An executor written against Mesos' v1 executor API (pymesos' `MesosExecutorDriver`,
...) subscribes with `POST /api/v1/executor` and reads a RecordIO stream of events;
its other calls (`UPDATE`, `MESSAGE`) are separate POSTs. To the agent core such an
executor is one more peer: a subscription becomes the `RegisterExecutor` (or
`ReregisterExecutor`) a Dyad executor sends over ZMQ, each call the message a Dyad
executor would send, and what the core sends that peer (`ExecutorRegistered`,
`LaunchTask`, `KillTask`, `StatusUpdateAck`, `FrameworkToExecutor`,
`ShutdownExecutor`, `Rejected`) becomes one Mesos event. So every rule of the core
(who may register, deduplication, at-least-once forwarding) holds for both kinds.

The peer id of an executor is a function of its ids (`peer_of`), never valid hex, so
it cannot clash with a ZMQ identity; it stays the same when the executor subscribes
again on a new connection (the core tells a second peer claiming a running executor
to go away). One way in: `ExecutorApi.handle(event) -> effects`; the aiohttp shell
(agent/api_v1.py) does the I/O.

Status uuids: a v1 executor stamps each update with a 16-byte UUID, the bytes
`ACKNOWLEDGED` must carry back. Dyad's uuids are text, so the executor's is kept in
its canonical text form (`8-4-4-4-12` hex) and turned back into its bytes for the
acknowledgement.
"""

from __future__ import annotations

import binascii
from collections import Counter
from typing import Any

import attrs

from dyad.mesos_json import (
    MesosJsonError, b64, duration, executor_to_mesos, field, framework_info_to_mesos, id_value, items,
    join, mesos_id, obj, required, resources_to_mesos, string, task_info_from_mesos,
    task_info_to_mesos, task_status_from_mesos, to_b64,
)
from dyad.messages import (
    AgentInfo, ExecutorRegistered, ExecutorToFramework, FrameworkToExecutor, KillTask,
    LaunchTask, Message, RegisterExecutor, Rejected, ReregisterExecutor, ShutdownExecutor,
    Source, StatusUpdate, StatusUpdateAck, TaskInfo, TaskState,
)

PEER_PREFIX = "v1x:"

# ------------------------------------------------------------------------ events


@attrs.frozen
class Subscribe:
    """A SUBSCRIBE call opened connection `stream` (a token the shell chose).
    `launched`: the tasks the agent has launched on that executor, which it keeps
    (Mesos' agent trusts its own record of them; see `_subscription`). `ready`:
    the agent core knows its executors (it has an id: registered, or recovered
    from its checkpoint); until then `launched` would be empty for want of
    knowing, not because nothing runs."""

    stream: str
    body: Any
    launched: tuple[TaskInfo, ...] = ()
    ready: bool = True


@attrs.frozen
class Call:
    """Any other call (`UPDATE`, `MESSAGE`), on a connection of its own."""

    body: Any


@attrs.frozen
class FromAgent:
    """The agent core sent `message` to the v1 executor `peer`."""

    peer: str
    message: Message


@attrs.frozen
class Closed:
    """Connection `stream` ended (the executor went away or the agent stops)."""

    stream: str


Event = Subscribe | Call | FromAgent | Closed

# ----------------------------------------------------------------------- effects


@attrs.frozen
class Answer:
    """Answer the request being handled: 200 opens the stream (SUBSCRIBE), 202
    takes a call, 4xx refuses with `reason` (plain text, as Mesos answers)."""

    status: int
    reason: str = ""


@attrs.frozen
class ToAgent:
    """Hand the agent core `message` from the executor `peer`."""

    peer: str
    message: Message


@attrs.frozen
class Write:
    """Write one event (a Mesos `Event` as JSON) on `stream`."""

    stream: str
    event: dict[str, Any]


@attrs.frozen
class End:
    """End `stream` (a newer subscription of the same executor replaced it)."""

    stream: str


Effect = Answer | ToAgent | Write | End


def peer_of(framework_id: str, executor_id: str) -> str:
    """The agent core's peer id of a v1 executor: its ids, the first length-
    prefixed so that no two pairs of ids give the same peer."""
    return f"{PEER_PREFIX}{len(framework_id)}:{framework_id}{executor_id}"


class ExecutorApi:
    """Which connection is which executor's, what each call means to the agent
    core, and what each message of the core means to the executor."""

    def __init__(self) -> None:
        self._streams: dict[str, str] = {}  # peer -> its open stream
        self._peers: dict[str, str] = {}  # stream -> its peer
        self.counts: Counter[str] = Counter({
            "subscribes": 0, "calls": 0, "calls_invalid": 0, "events": 0,
            "events_dropped": 0, "replaced": 0})

    @property
    def streams(self) -> int:
        return len(self._peers)

    def handle(self, event: Event) -> list[Effect]:
        match event:
            case Subscribe():
                return self._subscribe(event)
            case Call(body):
                return self._call(body)
            case FromAgent(peer, message):
                return self._from_agent(peer, message)
            case Closed(stream):
                peer = self._peers.pop(stream, None)
                if peer is not None and self._streams.get(peer) == stream:
                    del self._streams[peer]
                return []
            case _:
                raise TypeError(f"ExecutorApi cannot handle {event!r}")

    def _subscribe(self, event: Subscribe) -> list[Effect]:
        try:
            framework_id, executor_id = _ids(event.body)
            message = _subscription(event.body, framework_id, executor_id, event.launched)
        except MesosJsonError as exc:
            self.counts["calls_invalid"] += 1
            return [Answer(400, f"invalid call: {exc}")]
        if not event.ready:
            return [Answer(503, "the agent is not ready (it is recovering, or has not "
                                "registered yet): subscribe again")]
        self.counts["subscribes"] += 1
        peer = peer_of(framework_id, executor_id)
        effects: list[Effect] = []
        old = self._streams.get(peer)
        if old is not None:  # as in Mesos, the newest subscription wins
            self.counts["replaced"] += 1
            self._peers.pop(old, None)
            effects.append(End(old))
        self._streams[peer] = event.stream
        self._peers[event.stream] = peer
        return [*effects, Answer(200), ToAgent(peer, message)]

    def _call(self, body: Any) -> list[Effect]:
        try:
            kind = required(obj(body, ""), "type", "", string)
            if kind == "SUBSCRIBE":
                raise MesosJsonError("type", "SUBSCRIBE opens a stream: send it alone, "
                                             "not as a call on a subscription")
            reader = _CALLS.get(kind)
            if reader is None:
                raise MesosJsonError("type", f"unknown call type {kind[:40]!r} (supported: "
                                             f"SUBSCRIBE, {', '.join(_CALLS)})")
            framework_id, executor_id = _ids(body)
            message = reader(body, framework_id, executor_id)
        except MesosJsonError as exc:
            self.counts["calls_invalid"] += 1
            return [Answer(400, f"invalid call: {exc}")]
        peer = peer_of(framework_id, executor_id)
        if peer not in self._streams:
            self.counts["calls_invalid"] += 1
            return [Answer(400, f"executor {executor_id[:80]!r} of framework "
                                f"{framework_id[:80]!r} is not subscribed: SUBSCRIBE first")]
        self.counts["calls"] += 1
        return [Answer(202), ToAgent(peer, message)]

    def _from_agent(self, peer: str, message: Message) -> list[Effect]:
        stream = self._streams.get(peer)
        event = event_to_mesos(message)
        if stream is None or event is None:
            self.counts["events_dropped"] += 1  # as to a ZMQ executor that went away
            return []
        self.counts["events"] += 1
        return [Write(stream, event)]


# ------------------------------------------------------------------------- calls


def _ids(body: Any) -> tuple[str, str]:
    data = obj(body, "")
    return (required(data, "framework_id", "", id_value),
            required(data, "executor_id", "", id_value))


def _subscription(body: Any, framework_id: str, executor_id: str,
                  launched: tuple[TaskInfo, ...]) -> RegisterExecutor | ReregisterExecutor:
    """The executor's unacknowledged tasks and updates (sent after a reconnection)
    join the tasks the agent launched on it: the agent counts as lost only tasks
    neither knows, as Mesos' agent does."""
    section = field(obj(body, ""), "subscribe", "", obj, {})
    tasks = field(section, "unacknowledged_tasks", "subscribe",
                  lambda v, p: items(v, p, task_info_from_mesos), [])
    updates = field(section, "unacknowledged_updates", "subscribe",
                    lambda v, p: items(v, p, lambda u, q: _update(
                        obj(u, q), q, framework_id, executor_id)), [])
    if not tasks and not updates and not launched:
        return RegisterExecutor(framework_id=framework_id, executor_id=executor_id)
    known = {task.task_id for task in tasks}
    tasks += [task for task in launched if task.task_id not in known]
    return ReregisterExecutor(framework_id=framework_id, executor_id=executor_id,
                              tasks=tasks, updates=updates)


def _update(section: dict[str, Any], path: str, framework_id: str,
            executor_id: str) -> StatusUpdate:
    where = join(path, "status")
    data = required(section, "status", path, obj)
    raw = required(data, "uuid", where, b64)
    if len(raw) != 16:
        raise MesosJsonError(join(where, "uuid"), f"must be a 16-byte UUID, got {len(raw)} "
                                                  "bytes")
    status = task_status_from_mesos({k: v for k, v in data.items() if k != "uuid"}, where)
    if status.executor_id and status.executor_id != executor_id:
        raise MesosJsonError(join(where, "executor_id"), f"{status.executor_id[:80]!r} is not "
                                                         f"the calling executor")
    if status.source not in ("", Source.EXECUTOR):
        raise MesosJsonError(join(where, "source"), "an executor's updates have source "
                                                    "SOURCE_EXECUTOR")
    if status.state == TaskState.TASK_STAGING:
        raise MesosJsonError(join(where, "state"), "an executor may not send TASK_STAGING")
    return StatusUpdate(framework_id=framework_id, status=attrs.evolve(
        status, uuid=uuid_text(raw), source=Source.EXECUTOR, executor_id=executor_id))


def _message(body: Any, framework_id: str, executor_id: str) -> ExecutorToFramework:
    section = required(obj(body, ""), "message", "", obj)
    # The agent core fills in its own id.
    return ExecutorToFramework(framework_id=framework_id, agent_id="", executor_id=executor_id,
                               data=required(section, "data", "message", b64))


_CALLS: dict[str, Any] = {
    "UPDATE": lambda body, fid, eid: _update(required(obj(body, ""), "update", "", obj),
                                             "update", fid, eid),
    "MESSAGE": _message,
}


def uuid_text(raw: bytes) -> str:
    """A 16-byte UUID in its canonical text form."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid_bytes(text: str) -> bytes:
    """Back from `uuid_text`; a uuid of another form is sent as its UTF-8 bytes."""
    try:
        raw = binascii.unhexlify(text.replace("-", ""))
    except (binascii.Error, ValueError):
        return text.encode("utf-8")
    return raw if len(raw) == 16 and uuid_text(raw) == text else text.encode("utf-8")


# ------------------------------------------------------------------------ events


def agent_info_to_mesos(agent: AgentInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"hostname": agent.hostname, "port": agent.port,
                           "resources": resources_to_mesos(agent.resources),
                           "attributes": [{"name": name, "type": "TEXT", "text": {"value": text}}
                                          for name, text in sorted(agent.attributes.items())]}
    if agent.id is not None:
        out["id"] = mesos_id(agent.id)
    return out


def event_to_mesos(message: Message) -> dict[str, Any] | None:
    """The Mesos executor `Event` for what the agent core sends an executor (None:
    nothing a v1 executor is told)."""
    match message:
        case ExecutorRegistered():
            framework = framework_info_to_mesos(message.framework)
            framework["id"] = mesos_id(message.executor.framework_id or message.framework.id or "")
            executor = executor_to_mesos(message.executor)
            return {"type": "SUBSCRIBED", "subscribed": {
                "executor_info": executor, "framework_info": framework,
                "agent_info": agent_info_to_mesos(message.agent)}}
        case LaunchTask():
            return {"type": "LAUNCH", "launch": {"task": task_info_to_mesos(message.task)}}
        case KillTask():
            kill: dict[str, Any] = {"task_id": mesos_id(message.task_id)}
            if message.kill_grace_period is not None:
                kill["kill_policy"] = {"grace_period": duration(message.kill_grace_period)}
            return {"type": "KILL", "kill": kill}
        case StatusUpdateAck():
            return {"type": "ACKNOWLEDGED", "acknowledged": {
                "task_id": mesos_id(message.task_id),
                "uuid": to_b64(uuid_bytes(message.uuid))}}
        case FrameworkToExecutor():
            return {"type": "MESSAGE", "message": {"data": to_b64(message.data)}}
        case ShutdownExecutor():
            return {"type": "SHUTDOWN"}
        case Rejected():
            what = message.message_type or "a call"
            return {"type": "ERROR", "error": {"message": f"agent refused {what}: "
                                                          f"{message.reason}"}}
    return None
