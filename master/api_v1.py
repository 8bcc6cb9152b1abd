"""The Mesos v1 scheduler API: `POST /api/v1/scheduler` (and `GET /version`).

An HTTP framework meets the same master core as a ZMQ one. The core addresses
peers by an id and returns `Send(to, message)`; every SUBSCRIBE gets a fresh
peer id (`PEER_PREFIX` + its `Mesos-Stream-Id`, never valid hex, so it cannot
clash with a ZMQ identity), and the master shell hands Sends to such peers to
`SchedulerStreams.deliver`, which queues them for that subscriber's RecordIO
stream. Calls become the same `Received(peer, message)` events ZMQ frames
become (conversions in dyad/mesos_calls.py), so validation, filters, rescinds
and at-least-once updates hold the same on both paths.

Liveness follows the connection, as in Mesos: each heartbeat the core sends a
subscriber is answered with a `SchedulerHeartbeat` while the stream is open, and
when the stream ends (the client went away, the master stepped down or stops)
the framework is disconnected with an `Unsubscribe`, so its tasks keep running
for its `failover_timeout` and it may subscribe again with its id.

Answers: SUBSCRIBE 200 with a chunked stream of `<length>\\n<json>` records; other
calls 202 once queued for the core. Bad input is a 4xx with a plain-text reason
(as Mesos answers): 400 for a body that does not parse or convert (the reason
names the JSON path) and for a missing, stale or foreign stream id, 415/406 for
protobuf, 503 when the core does not take a SUBSCRIBE in time. A standby
answers 307 to the leader (master/http.py's middleware). Refusals the core
sends later (`Rejected`) are not events in Mesos' vocabulary: they are counted
(`master/v1/rejected`) and logged.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Protocol

from aiohttp import web

from dyad.auth import request_principal
from dyad.mesos_calls import SUBSCRIBE, ShutdownExecutorCall, V1Call, call_from_mesos
from dyad.mesos_calls import event_to_mesos
from dyad.mesos_http import Refused, read_json, record
from dyad.mesos_json import MESOS_VERSION, MesosJsonError
from dyad.messages import (
    Error, Heartbeat, Kill, Message, Rejected, SchedulerHeartbeat, Subscribed, Teardown,
    Unsubscribe,
)
from master.model import VERSION, Event, Received
from master.state import MasterState

log = logging.getLogger(__name__)

PEER_PREFIX = "v1:"
STREAM_ID = "Mesos-Stream-Id"
SUBSCRIBE_TIMEOUT = 10.0
"""Seconds a SUBSCRIBE waits for the core's answer (a leader whose lease is
unconfirmed handles nothing); then 503, which Mesos clients retry."""
POLL = 1.0
"""Seconds between checks that the client is still there and this master leads."""
MAX_QUEUED = 10_000
"""Events queued for one subscriber that is not reading; beyond it the stream is
closed (the framework is disconnected and may subscribe again)."""
_END = object()  # queued to end a stream


class V1Master(Protocol):
    """What the v1 API needs from the master shell (`MasterServer`)."""

    v1_streams: SchedulerStreams

    @property
    def is_leader(self) -> bool: ...

    @property
    def state(self) -> MasterState: ...

    def submit(self, event: Event) -> None: ...


class _Stream:
    def __init__(self) -> None:
        self.stream_id = str(uuid.uuid4())
        self.peer = PEER_PREFIX + self.stream_id
        self.framework_id: str | None = None
        self.principal: str | None = None  # who subscribed (HTTP authentication)
        self.queue: asyncio.Queue[Message | object] = asyncio.Queue()


class SchedulerStreams:
    """The open v1 subscriptions, by peer id and by stream id."""

    def __init__(self) -> None:
        self._by_peer: dict[str, _Stream] = {}
        self._by_id: dict[str, _Stream] = {}
        self.counts = {"subscribes": 0, "calls": 0, "calls_invalid": 0, "events": 0,
                       "rejected": 0, "dropped": 0, "overflows": 0}

    def deliver(self, peer: str, message: Message) -> bool:
        """Queue `message` for the subscriber `peer`. False: `peer` is not a v1
        peer (the caller sends it over ZMQ); a v1 peer whose stream has ended
        loses it, as a ZMQ peer that went away would."""
        if not peer.startswith(PEER_PREFIX):
            return False
        stream = self._by_peer.get(peer)
        if stream is None:
            self.counts["dropped"] += 1
        elif stream.queue.qsize() >= MAX_QUEUED:
            self.counts["overflows"] += 1
            self._end(stream)
        else:
            stream.queue.put_nowait(message)
        return True

    def metrics(self) -> dict[str, float]:
        result: dict[str, float] = {f"master/v1/{key}": value
                                    for key, value in self.counts.items()}
        result["master/v1/streams"] = len(self._by_id)
        return result

    def open(self) -> _Stream:
        stream = _Stream()
        self._by_peer[stream.peer] = stream
        self._by_id[stream.stream_id] = stream
        return stream

    def close(self, stream: _Stream) -> None:
        self._by_peer.pop(stream.peer, None)
        self._by_id.pop(stream.stream_id, None)

    def get(self, stream_id: str) -> _Stream | None:
        return self._by_id.get(stream_id)

    def end_all(self) -> None:
        for stream in list(self._by_id.values()):
            self._end(stream)

    def _end(self, stream: _Stream) -> None:
        self.close(stream)
        stream.queue.put_nowait(_END)


V1 = web.AppKey("v1_master", V1Master)


def add_routes(app: web.Application, master: V1Master) -> None:
    app[V1] = master
    app.router.add_post("/api/v1/scheduler", _scheduler)
    app.router.add_get("/version", _version)

    async def end_streams(app: web.Application) -> None:
        master.v1_streams.end_all()  # before aiohttp waits for handlers to finish

    app.on_shutdown.append(end_streams)


async def _version(request: web.Request) -> web.Response:
    """Mesos' `/version`: clients choose features by the Mesos version they see."""
    return web.json_response({"version": MESOS_VERSION, "build_date": "", "build_time": 0,
                              "build_user": "", "git_sha": "", "dyad_version": VERSION})


async def _scheduler(request: web.Request) -> web.StreamResponse:
    master = request.app[V1]
    streams = master.v1_streams
    try:
        call = await _read_call(request)
        if call.kind == SUBSCRIBE:
            return await _subscribe(request, master, call)
        streams.counts["calls"] += 1
        _perform(master, _caller(request, streams, call), call)
    except Refused as refused:
        streams.counts["calls_invalid"] += 1
        return web.Response(status=refused.status, text=refused.reason)
    return web.Response(status=202)


async def _read_call(request: web.Request) -> V1Call:
    body = await read_json(request, "master")
    try:
        return call_from_mesos(body)
    except MesosJsonError as exc:
        raise Refused(400, f"invalid call: {exc}") from None


def _caller(request: web.Request, streams: SchedulerStreams, call: V1Call) -> _Stream:
    """The subscription a call comes from: its stream id must be open here and
    belong to the framework the call names."""
    stream_id = request.headers.get(STREAM_ID, "")
    if not stream_id:
        raise Refused(400, f"a {call.kind} call needs the {STREAM_ID} header of its "
                            "subscription")
    stream = streams.get(stream_id)
    if stream is None or stream.framework_id is None:
        raise Refused(400, f"stream {stream_id[:64]!r} is not open on this master; "
                            "subscribe again")
    if stream.framework_id != call.framework_id:
        raise Refused(400, f"stream {stream_id} belongs to framework {stream.framework_id}, "
                            f"not {call.framework_id}")
    if request_principal(request) != stream.principal:
        raise Refused(403, f"stream {stream_id} was opened by another principal")
    return stream


def _perform(master: V1Master, stream: _Stream, call: V1Call) -> None:
    message = call.message
    if isinstance(message, ShutdownExecutorCall):
        # No wire message shuts down one executor: kill its live tasks instead.
        framework = master.state.frameworks.get(message.framework_id)
        for task in list(framework.tasks.values()) if framework is not None else []:
            if (task.agent_id, task.executor_id) == (message.agent_id, message.executor_id):
                master.submit(Received(stream.peer, Kill(
                    framework_id=message.framework_id, task_id=task.task_id,
                    agent_id=task.agent_id), stream.principal))
    elif message is not None:
        master.submit(Received(stream.peer, message, stream.principal))
    if isinstance(message, Teardown):  # the framework is gone: so is its stream
        master.v1_streams.close(stream)
        stream.queue.put_nowait(_END)


async def _subscribe(request: web.Request, master: V1Master,
                     call: V1Call) -> web.StreamResponse:
    if request.headers.get(STREAM_ID):
        raise Refused(400, f"a SUBSCRIBE call must not carry a {STREAM_ID} header")
    assert call.message is not None and not isinstance(call.message, ShutdownExecutorCall)
    streams = master.v1_streams
    streams.counts["subscribes"] += 1
    stream = streams.open()
    stream.principal = request_principal(request)
    try:
        master.submit(Received(stream.peer, call.message, stream.principal))
        try:
            first = await asyncio.wait_for(stream.queue.get(), SUBSCRIBE_TIMEOUT)
        except asyncio.TimeoutError:
            return web.Response(status=503, text="the master did not take the subscription "
                                                 "in time; retry")
        if isinstance(first, Rejected):
            return web.Response(status=400, text=f"subscription refused: {first.reason}")
        if first is _END:
            return web.Response(status=503, text="the master is stopping; retry")
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "application/json", STREAM_ID: stream.stream_id,
            "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await _pump(request, response, master, stream, first)
        return response
    finally:
        streams.close(stream)
        if stream.framework_id is not None:
            master.submit(Received(stream.peer, Unsubscribe(framework_id=stream.framework_id),
                                   stream.principal))


async def _pump(request: web.Request, response: web.StreamResponse, master: V1Master,
                stream: _Stream, first: Message | object) -> None:
    """Write the subscriber's events until it goes away, the framework is told an
    ERROR (Mesos ends the stream after one), or this master stops leading."""
    item = first
    while isinstance(item, Message):
        if isinstance(item, Subscribed):
            stream.framework_id = item.framework_id
        elif isinstance(item, Heartbeat) and stream.framework_id is not None:
            master.submit(Received(stream.peer, SchedulerHeartbeat(
                framework_id=stream.framework_id), stream.principal))
        event = event_to_mesos(item)
        if event is None:
            master.v1_streams.counts["rejected"] += 1
            if isinstance(item, Rejected):
                log.info("v1 framework %s: %s refused: %s", stream.framework_id,
                         item.message_type, item.reason)
        else:
            try:
                await response.write(record(event))
            except (ConnectionError, RuntimeError):  # the client is gone
                return
            master.v1_streams.counts["events"] += 1
        if isinstance(item, Error):
            return
        item = await _next(request, master, stream)


async def _next(request: web.Request, master: V1Master, stream: _Stream) -> Message | object:
    while True:
        try:
            return await asyncio.wait_for(stream.queue.get(), POLL)
        except asyncio.TimeoutError:
            transport = request.transport
            if transport is None or transport.is_closing() or not master.is_leader:
                return _END
