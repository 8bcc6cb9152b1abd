"""The Mesos v1 executor API: `POST /api/v1/executor` -- the aiohttp shell.

Decisions are `agent.executor_api_core.ExecutorApi`'s; this file reads bodies,
keeps one queue per open stream, writes RecordIO records (`<length>\\n<json>`),
and hands what the core decides to the agent's event queue (as the
`ExecutorMessage` a ZMQ frame from an executor becomes). The agent shell calls
`deliver` for every message its core sends an executor; those for v1 peers come
here instead of going to the ZMQ socket.

Bad input is a 4xx with a plain-text reason (as Mesos answers), never a 5xx.
While the agent authenticates its executors (CURVE keys), this API, which has no
authentication of its own, is refused (403) rather than opened to anyone who
can reach the agent's HTTP port.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Callable

from aiohttp import web

from agent.executor_api_core import (
    PEER_PREFIX, Answer, Call, Closed, Effect, End, ExecutorApi, FromAgent, Subscribe,
    ToAgent, Write,
)
from agent.model import ExecutorMessage
from agent.state import AgentState, Event
from dyad.mesos_http import Refused, read_json, record
from dyad.messages import Message, TaskInfo

log = logging.getLogger(__name__)

POLL = 1.0
"""Seconds between checks that a subscriber's connection is still open."""
READY_TIMEOUT = 10.0
"""Seconds a SUBSCRIBE waits for the agent to know its executors (a restarted
agent recovering its checkpoint); then 503, and the executor subscribes again."""
READY_POLL = 0.05
MAX_QUEUED = 10_000
"""Events queued for an executor that does not read; beyond them its stream ends
(it subscribes again, as after any lost connection)."""
_END = object()


class ExecutorStreams:
    """The open v1 executor streams of one agent."""

    def __init__(self, submit: Callable[[Event], None], state: Callable[[], AgentState],
                 *, refused: str = "") -> None:
        self.core = ExecutorApi()
        self._submit = submit
        self._state = state
        self._queues: dict[str, asyncio.Queue[dict[str, Any] | object]] = {}
        self.refused = refused  # why the API is off (empty: it is on)
        self.overflows = 0
        self.unread = 0  # bodies refused before the core saw them (the shell's count)

    def deliver(self, peer: str, message: Message) -> bool:
        """Take `message` for `peer` if `peer` is a v1 executor (False: send it over
        ZMQ)."""
        if not peer.startswith(PEER_PREFIX):
            return False
        self._perform(self.core.handle(FromAgent(peer, message)))
        return True

    def metrics(self) -> dict[str, float]:
        counts = {**self.core.counts,
                  "calls_invalid": self.core.counts["calls_invalid"] + self.unread}
        return {**{f"agent/v1/{key}": value for key, value in counts.items()},
                "agent/v1/streams": self.core.streams, "agent/v1/overflows": self.overflows}

    def end_all(self) -> None:
        for stream in list(self._queues):
            self._end(stream)

    async def wait_ready(self) -> bool:
        """Whether the agent core knows its executors, waiting up to READY_TIMEOUT."""
        for _ in range(round(READY_TIMEOUT / READY_POLL)):
            if self._state().agent_id is not None:
                return True
            await asyncio.sleep(READY_POLL)
        return self._state().agent_id is not None

    def launched(self, body: Any) -> tuple[TaskInfo, ...]:
        """The tasks the agent launched on the executor `body` subscribes as."""
        try:
            framework_id = body["framework_id"]["value"]
            executor_id = body["executor_id"]["value"]
            executor = self._state().records.executor(framework_id, executor_id)
        except (KeyError, TypeError):
            return ()  # the core says what is wrong with the body
        if executor is None:
            return ()
        return tuple(task.info for task in executor.launched.values())

    def open(self) -> tuple[str, asyncio.Queue[dict[str, Any] | object]]:
        stream = str(uuid.uuid4())
        queue: asyncio.Queue[dict[str, Any] | object] = asyncio.Queue()
        self._queues[stream] = queue
        return stream, queue

    def close(self, stream: str) -> None:
        self._queues.pop(stream, None)
        self.core.handle(Closed(stream))

    def handle(self, event: Subscribe | Call) -> Answer:
        """Hand a request to the core; its answer to the caller."""
        effects = self.core.handle(event)
        self._perform(effects)
        (answer,) = (effect for effect in effects if isinstance(effect, Answer))
        return answer

    def _perform(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ToAgent):
                self._submit(ExecutorMessage(effect.peer, effect.message))
            elif isinstance(effect, Write):
                queue = self._queues.get(effect.stream)
                if queue is None:
                    continue
                if queue.qsize() >= MAX_QUEUED:
                    self.overflows += 1
                    self._end(effect.stream)
                else:
                    queue.put_nowait(effect.event)
            elif isinstance(effect, End):
                self._end(effect.stream)

    def _end(self, stream: str) -> None:
        queue = self._queues.pop(stream, None)
        self.core.handle(Closed(stream))
        if queue is not None:
            queue.put_nowait(_END)


STREAMS = web.AppKey("v1_executor_streams", ExecutorStreams)


def add_routes(app: web.Application, streams: ExecutorStreams) -> None:
    app[STREAMS] = streams
    app.router.add_post("/api/v1/executor", _executor)

    async def end_streams(app: web.Application) -> None:
        streams.end_all()  # before aiohttp waits for handlers to finish

    app.on_shutdown.append(end_streams)


async def _executor(request: web.Request) -> web.StreamResponse:
    streams = request.app[STREAMS]
    try:
        if streams.refused:
            raise Refused(403, streams.refused)
        body = await read_json(request, "agent")
    except Refused as refused:
        streams.unread += 1
        return web.Response(status=refused.status, text=refused.reason)
    if isinstance(body, dict) and body.get("type") == "SUBSCRIBE":
        return await _subscribe(request, streams, body)
    answer = streams.handle(Call(body))
    return web.Response(status=answer.status, text=answer.reason or None)


async def _subscribe(request: web.Request, streams: ExecutorStreams,
                     body: Any) -> web.StreamResponse:
    stream, queue = streams.open()
    try:
        ready = await streams.wait_ready()
        answer = streams.handle(Subscribe(stream, body, streams.launched(body), ready))
        if answer.status != 200:
            return web.Response(status=answer.status, text=answer.reason)
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "application/json", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        while True:
            item = await _next(request, queue)
            if item is _END:
                return response
            try:
                await response.write(record(item))
            except (ConnectionError, RuntimeError):  # the executor is gone
                return response
    finally:
        streams.close(stream)


async def _next(request: web.Request, queue: asyncio.Queue[Any]) -> Any:
    while True:
        try:
            return await asyncio.wait_for(queue.get(), POLL)
        except asyncio.TimeoutError:
            transport = request.transport
            if transport is None or transport.is_closing():
                return _END
