"""`GET /v2/events`: Marathon's event bus as server-sent events -- the shell.

`EventStream` watches the leading `ServiceRuntime` (it is one of its
`watchers`), has `MarathonEvents` (frameworks/service/marathon_events.py) say
what happened in Marathon's words, and writes each event to every open stream as

    event: <eventType>
    data: <json>

(a blank line after each), which is what Marathon sends and what marathon-lb, the
`marathon` client's `event_stream()` and other followers read. A stream opens with
`event_stream_attached`; `?event_type=a&event_type=b` keeps only those types. A
comment line every `KEEPALIVE` seconds keeps idle connections open through
proxies. A follower that stops reading while `MAX_QUEUED` events wait for it loses
its stream (it reconnects, as after any drop). Streams end when this instance
stops leading or stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from frameworks.service.core import Command, Event, ServiceCore
from frameworks.service.marathon_events import MarathonEvents
from frameworks.service.records import iso_time
from frameworks.service.runtime import ServiceRuntime

log = logging.getLogger(__name__)

KEEPALIVE = 15.0
MAX_QUEUED = 1000
_END = object()


class EventStream:
    """The open `/v2/events` streams, fed from the runtime this instance leads with."""

    def __init__(self) -> None:
        self.feed = MarathonEvents()
        self._queues: set[asyncio.Queue[Any]] = set()
        self.counts = {"events_streamed": 0, "event_streams_dropped": 0}

    @property
    def open_streams(self) -> int:
        return len(self._queues)

    def attach(self, runtime: ServiceRuntime | None) -> None:
        """Follow `runtime` (None: this instance no longer leads; streams end)."""
        if runtime is None:
            self.end_all()
            return
        self.feed.prime(runtime.core)
        if self not in runtime.watchers:
            runtime.watchers.append(self)

    # ServiceRuntime's watcher calls
    def before(self, core: ServiceCore, event: Event, now: float) -> None:
        self._publish(self.feed.before(core, event, now))

    def after(self, core: ServiceCore, command: Command | None, now: float) -> None:
        self._publish(self.feed.after(core, command, now))

    def _publish(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            for queue in list(self._queues):
                if queue.qsize() >= MAX_QUEUED:
                    self.counts["event_streams_dropped"] += 1
                    self._queues.discard(queue)
                    queue.put_nowait(_END)
                else:
                    queue.put_nowait(event)

    def end_all(self) -> None:
        for queue in list(self._queues):
            queue.put_nowait(_END)
        self._queues.clear()

    async def serve(self, request: web.Request, now: float) -> web.StreamResponse:
        wanted = set(request.query.getall("event_type", []))
        queue: asyncio.Queue[Any] = asyncio.Queue()
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        self._queues.add(queue)
        try:
            item: Any = {"eventType": "event_stream_attached", "timestamp": iso_time(now),
                         "remoteAddress": request.remote or ""}
            while item is not _END:
                if item is None:
                    await response.write(b":\n\n")  # a comment: keeps the connection open
                elif not wanted or item["eventType"] in wanted:
                    await response.write(_sse(item))
                    self.counts["events_streamed"] += 1
                try:
                    item = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except asyncio.TimeoutError:
                    item = None
        except (ConnectionError, RuntimeError):  # the follower went away
            pass
        finally:
            self._queues.discard(queue)
        return response


def _sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['eventType']}\ndata: {data}\n\n".encode("utf-8")
