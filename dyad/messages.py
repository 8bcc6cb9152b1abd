"""Every message that crosses a Dyad socket (the data types inside them live in
`dyad.wire_types` and are re-exported here).

The wire form of a message is one JSON object per ZMQ frame:
``{"type": "<name>", "v": 1, "body": {...fields...}}``. `encode` and `decode` are
the only way messages become bytes and back; `decode` validates everything (type
name, version, every field's type, unknown fields, frame size) and raises
`MessageError` with a reason the receiver can send back. It never raises anything
else on bad input, so shells can catch exactly one exception.

Who sends what (see DESIGN.md §3):
- scheduler driver -> master: Subscribe, Accept, Decline, Revive, Suppress,
  RequestResources, Kill, Acknowledge, Acknowledgements, Reconcile,
  FrameworkToExecutor, Teardown, Unsubscribe, SchedulerHeartbeat, Preempt
- master -> scheduler driver: MasterCapabilities, Subscribed, Offers, Rescind, Update,
  ExecutorToFramework, Failure, Error, Heartbeat, Rejected
- agent -> master: RegisterAgent, StatusUpdate, ExecutorToFramework,
  ExecutorExited, Pong, UsageReport, DrainAgent
- master -> agent: AgentRegistered, Ping, RunTask, KillTask, StatusUpdateAck,
  StatusUpdateAcks, FrameworkToExecutor, ShutdownFramework, CheckpointResources, Rejected
- executor -> agent: RegisterExecutor, ReregisterExecutor, StatusUpdate,
  ExecutorToFramework
- agent -> executor: ExecutorRegistered, LaunchTask, KillTask, StatusUpdateAck,
  FrameworkToExecutor, ShutdownExecutor, Rejected
"""

from __future__ import annotations

import json
import typing
from typing import Any, Callable, ClassVar, TypeVar

import attrs
import msgspec

from dyad import bounded_json
from dyad.codec import CodecError, dumps, from_json, typed_decoder
from dyad.resources import Resources
from dyad.volumes import DynamicResources
from dyad.wire_types import (  # noqa: F401 (re-exported: messages carry them)
    TaskState, TERMINAL_STATES, Source, Reason, Address, MasterInfo, FrameworkInfo,
    URI, CommandInfo, HealthCheckType, HealthCheck, ExecutorInfo, TaskInfo, TaskStatus,
    Filters, Offer, OperationType, Operation, AgentInfo, Task, ReconcileTask,
    ExecutorUsage, nonnegative, priority_field,
)

WIRE_VERSION = 1
MAX_FRAME_BYTES = 4 * 1024 * 1024
# What a frame may hold (docs/protocol.md, "Bad frames"). The deepest valid message
# nests 8 levels; strings are bounded only by the frame (framework messages carry
# their data base64-encoded in one string).
WIRE_LIMITS = bounded_json.JsonLimits(max_bytes=MAX_FRAME_BYTES, max_depth=32,
                                      max_number_chars=40, max_string_chars=MAX_FRAME_BYTES)
MAX_REASON_CHARS = 500
MAX_TYPE_ECHO = 64


class MessageError(ValueError):
    """A frame that is not a valid Dyad message. `reason` is safe to send back: it
    is clipped to `MAX_REASON_CHARS`, since it may quote what the sender sent."""

    def __init__(self, reason: str, type_name: str = "") -> None:
        reason = _clip(reason, MAX_REASON_CHARS)
        super().__init__(reason)
        self.reason = reason
        self.type_name = _clip(type_name, MAX_TYPE_ECHO)


# ------------------------------------------------------------------------- messages

MESSAGE_TYPES: dict[str, type] = {}
_M = TypeVar("_M", bound="Message")


@typing.dataclass_transform(kw_only_default=True, frozen_default=True,
                            field_specifiers=(attrs.field, attrs.Factory))
def message(name: str) -> Callable[[type[_M]], type[_M]]:
    """Class decorator: a frozen attrs message registered under a wire type name."""

    def register(cls: type[_M]) -> type[_M]:
        cls = attrs.frozen(kw_only=True)(cls)
        cls.TYPE = name
        if name in MESSAGE_TYPES:
            raise RuntimeError(f"duplicate message type {name}")
        MESSAGE_TYPES[name] = cls
        return cls

    return register


class Message:
    """Marker base for wire messages; `TYPE` is the wire name."""

    TYPE: ClassVar[str] = ""


# scheduler -> master ----------------------------------------------------------------

@attrs.frozen(kw_only=True)
class ResourceRequest:
    """`count` tasks of shape `resources` (Mesos' Request, with a count so that a
    job of thousands of like tasks is one entry)."""

    resources: Resources
    count: int = attrs.field(default=1, validator=nonnegative)


@message("subscribe")
class Subscribe(Message):
    framework: FrameworkInfo
    force: bool = False
    # Demand declared with the subscription (as `RequestResources`), so that the
    # pass the subscription triggers is bounded by it too.
    requests: list[ResourceRequest] = attrs.field(factory=list)


@message("unsubscribe")
class Unsubscribe(Message):
    """The driver is going away but its framework stays (failover): stop offers."""

    framework_id: str


@message("teardown")
class Teardown(Message):
    framework_id: str


@message("accept")
class Accept(Message):
    framework_id: str
    offer_ids: list[str]
    operations: list[Operation]
    filters: Filters = attrs.field(factory=Filters)


@message("decline")
class Decline(Message):
    framework_id: str
    offer_ids: list[str]
    filters: Filters = attrs.field(factory=Filters)


@message("revive")
class Revive(Message):
    framework_id: str


@message("suppress")
class Suppress(Message):
    framework_id: str


@message("request")
class RequestResources(Message):
    """What the framework wants now (Mesos' REQUEST call, which Dyad's allocator
    honours): offers to it stop once they cover this with headroom. Replaces
    what it declared before; empty clears it (docs/protocol.md)."""

    framework_id: str
    requests: list[ResourceRequest] = attrs.field(factory=list)


@message("kill")
class Kill(Message):
    framework_id: str
    task_id: str
    agent_id: str | None = None
    kill_grace_period: float | None = attrs.field(default=None, validator=nonnegative)


@message("acknowledge")
class Acknowledge(Message):
    framework_id: str
    agent_id: str
    task_id: str
    uuid: str


ACK_BATCH_CAPABILITY = "ACKNOWLEDGEMENT_BATCHES"
"""Acknowledgements carried together (docs/protocol.md, "Acknowledgements
together"). A framework (`FrameworkInfo.capabilities`) with it is told by a master
that honours it, in `MasterCapabilities`, and may then send `Acknowledgements`;
an agent (`RegisterAgent.capabilities`) with it may be sent `StatusUpdateAcks`.
A peer that does not say so sees only `Acknowledge` and `StatusUpdateAck`."""


@attrs.frozen(kw_only=True)
class AckedUpdate:
    """One status update a framework acknowledges (an `Acknowledge` without its
    framework id)."""

    agent_id: str
    task_id: str
    uuid: str


@message("acknowledgements")
class Acknowledgements(Message):
    """Several `Acknowledge`s of one framework in one message, handled in order
    exactly as if each had come alone (each refused or forwarded on its own)."""

    framework_id: str
    acks: list[AckedUpdate]

    def each(self) -> list[Acknowledge]:
        """The acknowledgements as the single messages they stand for."""
        return [Acknowledge(framework_id=self.framework_id, agent_id=ack.agent_id,
                            task_id=ack.task_id, uuid=ack.uuid) for ack in self.acks]


@message("reconcile")
class Reconcile(Message):
    framework_id: str
    tasks: list[ReconcileTask] = attrs.field(factory=list)


@message("scheduler_heartbeat")
class SchedulerHeartbeat(Message):
    framework_id: str


PREEMPTION_CAPABILITY = "PREEMPTION"
"""A framework (`FrameworkInfo.capabilities`) with it may ask for preemption
(`Preempt`) whether or not its roles are below their guarantees."""


@message("preempt")
class Preempt(Message):
    """A task of `priority` needing `resources` on one agent cannot be placed:
    free room by preempting strictly lower-priority tasks. Honoured only when the
    master runs with preemption on, and the framework has the PREEMPTION
    capability or its role's quota guarantee is unmet (docs/oversubscription.md)."""

    framework_id: str
    resources: Resources
    priority: int = attrs.field(validator=priority_field)


# master -> scheduler ----------------------------------------------------------------

@message("subscribed")
class Subscribed(Message):
    framework_id: str
    heartbeat_interval: float
    master_info: MasterInfo
    reregistered: bool = False


@message("offers")
class Offers(Message):
    offers: list[Offer]


@message("rescind")
class Rescind(Message):
    offer_id: str


@message("update")
class Update(Message):
    status: TaskStatus


@message("master_capabilities")
class MasterCapabilities(Message):
    """Master -> a framework that listed capabilities this master honours beyond
    the protocol's first version (today only `ACK_BATCH_CAPABILITY`): which, sent
    just before each `Subscribed`. `master_id` names the master that honours them,
    so a word from a master the driver has left changes nothing."""

    master_id: str
    capabilities: list[str]


@message("failure")
class Failure(Message):
    """An agent (executor_id None) or an executor was lost."""

    agent_id: str
    executor_id: str | None = None
    status: int | None = None


@message("error")
class Error(Message):
    """Fatal for the framework (e.g. it was torn down); the driver stops."""

    message: str


@message("heartbeat")
class Heartbeat(Message):
    pass


@message("rejected")
class Rejected(Message):
    """Answer to a frame the receiver could not accept; the sender may fix and retry."""

    reason: str
    message_type: str = ""


# framework messages, forwarded hop by hop ---------------------------------------------

@message("framework_to_executor")
class FrameworkToExecutor(Message):
    framework_id: str
    agent_id: str
    executor_id: str
    data: bytes


@message("executor_to_framework")
class ExecutorToFramework(Message):
    framework_id: str
    agent_id: str
    executor_id: str
    data: bytes


# agent <-> master --------------------------------------------------------------------

LIVENESS_CAPABILITY = "ANY_FRAME_LIVENESS"
"""An agent (`RegisterAgent.capabilities`) with this capability counts any frame
from the master it is registered with as proof of life (its silence timer), so the
master may skip the ping of an agent it has both heard from and sent to since the
last one (docs/protocol.md, "Liveness"); an agent without it is pinged as ever."""


@message("register_agent")
class RegisterAgent(Message):
    """First registration (agent.id None) or re-registration with what is running."""

    agent: AgentInfo
    version: str = ""
    tasks: list[Task] = attrs.field(factory=list)
    executors: list[ExecutorInfo] = attrs.field(factory=list)
    frameworks: list[FrameworkInfo] = attrs.field(factory=list)
    dynamic: DynamicResources | None = None  # its checkpointed reservations and volumes
    # BATCH_FRAMES: it takes `Batch`; ANY_FRAME_LIVENESS: any frame from the master
    # it is registered with proves the master alive to it, not only a `Ping`;
    # ACKNOWLEDGEMENT_BATCHES: it takes `StatusUpdateAcks`.
    capabilities: list[str] = attrs.field(factory=list)


@message("agent_registered")
class AgentRegistered(Message):
    agent_id: str
    master_info: MasterInfo
    ping_interval: float = 15.0


@message("checkpoint_resources")
class CheckpointResources(Message):
    """The agent's reservations and volumes changed (or differ from the master's
    record): keep `resources`, make the volumes it adds, remove those it drops."""

    agent_id: str
    resources: DynamicResources


@message("ping")
class Ping(Message):
    agent_id: str


@message("pong")
class Pong(Message):
    agent_id: str


@message("run_task")
class RunTask(Message):
    framework: FrameworkInfo
    task: TaskInfo


@message("kill_task")
class KillTask(Message):
    framework_id: str
    task_id: str
    kill_grace_period: float | None = attrs.field(default=None, validator=nonnegative)
    # Set when the master preempts: the task ends TASK_KILLED with this reason.
    reason: str = ""
    message: str = ""


@message("status_update")
class StatusUpdate(Message):
    """A task status on its way to the framework (executor -> agent -> master)."""

    framework_id: str
    status: TaskStatus


@message("status_update_ack")
class StatusUpdateAck(Message):
    agent_id: str
    framework_id: str
    task_id: str
    uuid: str


@attrs.frozen(kw_only=True)
class AgentAck:
    """One acknowledged update in `StatusUpdateAcks` (a `StatusUpdateAck` without
    its agent id)."""

    framework_id: str
    task_id: str
    uuid: str


@message("status_update_acks")
class StatusUpdateAcks(Message):
    """Master -> an agent with `ACK_BATCH_CAPABILITY`: several `StatusUpdateAck`s
    for it, handled in order exactly as if each had come alone."""

    agent_id: str
    acks: list[AgentAck]

    def each(self) -> list[StatusUpdateAck]:
        """The acknowledgements as the single messages they stand for."""
        return [StatusUpdateAck(agent_id=self.agent_id, framework_id=ack.framework_id,
                                task_id=ack.task_id, uuid=ack.uuid) for ack in self.acks]


@message("executor_exited")
class ExecutorExited(Message):
    agent_id: str
    framework_id: str
    executor_id: str
    status: int


@message("shutdown_framework")
class ShutdownFramework(Message):
    framework_id: str


@message("usage_report")
class UsageReport(Message):
    """Agent -> master, periodically: what each executor uses, and which URIs the
    agent's fetcher cache holds (a full list each time, so a lost report or a
    new master costs nothing)."""

    agent_id: str
    executors: list[ExecutorUsage] = attrs.field(factory=list)
    cached_uris: list[str] = attrs.field(factory=list)
    # Oversubscription (agent/reclaim.py): what the agent can lend now, and the
    # sum of its tasks' estimated reservations.
    revocable: Resources = attrs.field(factory=Resources)
    reservation: Resources = attrs.field(factory=Resources)


@message("drain_agent")
class DrainAgent(Message):
    """Agent -> master: this agent is draining; offer nothing more from it."""

    agent_id: str


# agent <-> executor ------------------------------------------------------------------

@message("register_executor")
class RegisterExecutor(Message):
    framework_id: str
    executor_id: str


@message("reregister_executor")
class ReregisterExecutor(Message):
    """After an agent restart: what the executor still runs and has not had acked."""

    framework_id: str
    executor_id: str
    tasks: list[TaskInfo] = attrs.field(factory=list)
    updates: list[StatusUpdate] = attrs.field(factory=list)


@message("executor_registered")
class ExecutorRegistered(Message):
    executor: ExecutorInfo
    framework: FrameworkInfo
    agent: AgentInfo
    # The agent's process id: an executor that outlived one agent watches the next
    # one by pid (it is no longer that agent's child). 0 = unknown.
    agent_pid: int = 0


@message("launch_task")
class LaunchTask(Message):
    framework: FrameworkInfo
    task: TaskInfo


@message("shutdown_executor")
class ShutdownExecutor(Message):
    grace_period: float = 3.0


# ---------------------------------------------------------------------------- codec


def encode(msg: Message) -> bytes:
    """Serialise a message to one frame."""
    if isinstance(msg, Batch):
        return encode_batch([encode(m) for m in msg.messages])
    return dumps({"type": msg.TYPE, "v": WIRE_VERSION, "body": msg})


def decode(frame: bytes) -> Message:
    """Parse and validate one frame, or raise `MessageError` saying why not.

    Parsing is bounded (`WIRE_LIMITS`): nesting depth, number literals, strings
    and the frame itself; the version must be the integer 1 (not `true`, not
    `1.0`). The reason never quotes more than a little of what was sent."""
    if len(frame) > MAX_FRAME_BYTES:
        raise MessageError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    if type(frame) is bytes and bounded_json.within_text_limits(frame, WIRE_LIMITS):
        try:
            return _decode_typed(frame)
        except Exception:  # the careful path decides, and says why
            pass
    try:
        envelope = bounded_json.loads(frame, WIRE_LIMITS)
    except bounded_json.JsonInputError as exc:
        raise MessageError(f"not JSON within limits: {exc.reason}") from None
    return _from_envelope(envelope)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """A frame as msgspec reads it, its body left for the message's own decoder."""

    type: str
    v: int
    body: msgspec.Raw = msgspec.Raw(b"{}")


class _BatchBody(msgspec.Struct, forbid_unknown_fields=True):
    messages: list[_Envelope]


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_BATCH_BODY = msgspec.json.Decoder(_BatchBody)


def _decode_typed(frame: bytes) -> Message:
    """A frame decoded by msgspec in C (`dyad.codec.typed_decoder`), about three
    times faster than parsing it and building its message (issue 19). Raises on
    anything `_from_envelope` could refuse, or any frame it is not sure of; an
    envelope with more than its three fields, for one."""
    envelope = _ENVELOPE.decode(frame)
    if envelope.type != BATCH_TYPE:
        return _typed_message(envelope)
    items = _BATCH_BODY.decode(envelope.body).messages
    if envelope.v != WIRE_VERSION or not items:
        raise ValueError("not a batch this decoder takes")
    return Batch(messages=[_typed_message(item) for item in items])


def _typed_message(envelope: _Envelope) -> Message:
    build = typed_decoder(MESSAGE_TYPES[envelope.type])  # KeyError for a batch in a batch
    if envelope.v != WIRE_VERSION or build is None:
        raise ValueError("not a message this decoder takes")
    return build(envelope.body)  # type: ignore[no-any-return]


def _from_envelope(envelope: Any) -> Message:
    """A parsed frame (or one message of a batch) as a message."""
    if not isinstance(envelope, dict):
        raise MessageError("frame must be a JSON object")
    type_name = envelope.get("type")
    if not isinstance(type_name, str):
        raise MessageError("missing message type")
    cls = MESSAGE_TYPES.get(type_name)
    if cls is None and type_name != BATCH_TYPE:
        raise MessageError(f"unknown message type {_clip(type_name, MAX_TYPE_ECHO)!r}",
                           type_name)
    version = envelope.get("v")
    if type(version) is not int or version != WIRE_VERSION:  # bool is an int in Python
        raise MessageError(f"unsupported version {_clip(json.dumps(version), MAX_TYPE_ECHO)}"
                           f" (this side speaks {WIRE_VERSION})", type_name)
    if cls is None:
        return _decode_batch(envelope.get("body", {}))
    try:
        return from_json(cls, envelope.get("body", {}))
    except CodecError as exc:
        raise MessageError(f"invalid {type_name}: {exc}", type_name) from None


# ----------------------------------------------------------------------- batches

BATCH_TYPE = "batch"
BATCH_CAPABILITY = "BATCH_FRAMES"
"""A framework (`FrameworkInfo.capabilities`) or an agent (`RegisterAgent.capabilities`)
with this capability may be sent `Batch` frames (docs/protocol.md)."""
MAX_BATCH_BYTES = 1024 * 1024
"""A sender closes a batch frame at about this size (well under `MAX_FRAME_BYTES`)."""
_BATCH_OPEN = b'{"type":"%s","v":%d,"body":{"messages":[' % (BATCH_TYPE.encode(), WIRE_VERSION)


@attrs.frozen
class Batch(Message):
    """Several messages for one peer in one frame, handled as if each had come
    alone, in order. Not in `MESSAGE_TYPES`: a batch is an envelope, never handed
    to a core, and it cannot hold another batch. Frames: `encode_batch`."""

    TYPE: ClassVar[str] = BATCH_TYPE
    messages: list[Message]


def encode_batch(frames: list[bytes]) -> bytes:
    """One frame holding the encoded messages `frames` (each from `encode`), in
    order: their bytes are joined, not encoded again."""
    return _BATCH_OPEN + b",".join(frames) + b"]}}"


def _decode_batch(body: Any) -> Batch:
    if not isinstance(body, dict) or set(body) != {"messages"}:
        raise MessageError("invalid batch: its body must be exactly {\"messages\": [...]}",
                           BATCH_TYPE)
    items = body["messages"]
    if not isinstance(items, list) or not items:
        raise MessageError("invalid batch: messages must be a non-empty list", BATCH_TYPE)
    messages = []
    for index, item in enumerate(items):
        try:
            message = _from_envelope(item)
        except MessageError as exc:
            raise MessageError(f"invalid batch: messages[{index}]: {exc.reason}",
                               BATCH_TYPE) from None
        if isinstance(message, Batch):
            raise MessageError(f"invalid batch: messages[{index}] is a batch itself",
                               BATCH_TYPE)
        messages.append(message)
    return Batch(messages=messages)


def _clip(text: str, limit: int) -> str:
    """`text`, or its start and how long it was, in at most `limit` characters."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters)"
    return text[:max(limit - len(tail), 0)] + tail
