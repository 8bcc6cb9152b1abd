"""The agent's HTTP API: `/state`, `/health`, `/metrics/snapshot` (and the same
figures as Prometheus text at `/metrics`),
`/monitor/statistics` (what each executor uses), `POST /drain`, and the sandbox
file API (`/files/browse`, `/files/read`, `/files/download`) with Mesos' shapes,
so a framework can tail a task's `stdout` or fetch shuffle output by the absolute
path `/state` shows as an executor's `directory` -- also after the task ended,
until the sandbox is garbage-collected.

Only regular files and directories under the sandboxes are served
(`agent.files`): 403 outside, 404 missing, 400 for bad parameters and for FIFOs,
devices, sockets and symlink loops, 429 when too many `/files` requests wait,
always with a JSON `{"error": reason}`. File system work runs on a small pool of
its own, so a slow disk never stalls the agent's event loop or its other threads.

Bad input is never a 5xx: anything a handler did not expect is logged (at most
once a minute per route), counted in `agent/http_errors`, and answered 400 with a
reason. The reason is always in the JSON body, never in the status line, so no
text from a request can reach a header.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from agent import files
from agent.metrics import COUNTERS, GAUGES
from dyad import prometheus
from dyad.supervision import LogLimiter
from agent.state import AgentState

log = logging.getLogger(__name__)

_INTEGER = re.compile(r"-?[0-9]{1,18}")  # offsets and lengths; no file is 10**18 bytes


class StateSource(Protocol):
    """Whatever holds the live AgentState (the AgentServer); read on each request."""

    @property
    def state(self) -> AgentState: ...

    def metrics(self) -> dict[str, float]: ...

    def drain(self) -> None: ...

    def dead_loops(self) -> list[str]:
        """Names of the agent's long-running loops that are not running now."""
        ...

    def count(self, counter: str) -> None: ...


SOURCE = web.AppKey("state_source", StateSource)
WORK_DIR = web.AppKey("work_dir", str)
POOL = web.AppKey("files_pool", files.FilesPool)
ERROR_LOG = web.AppKey("error_log", LogLimiter)


class BadRequest(Exception):
    """A parameter the caller got wrong: HTTP 400."""


def make_app(source: StateSource, work_dir: str) -> web.Application:
    app = web.Application(middlewares=[_cors, _errors_as_json])
    app[SOURCE] = source
    app[WORK_DIR] = work_dir
    app[POOL] = files.FilesPool()
    app[ERROR_LOG] = LogLimiter(log, interval=60.0)
    app.on_cleanup.append(_shutdown_pool)
    app.router.add_get("/state", _state)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics/snapshot", _metrics)
    app.router.add_get("/metrics", _prometheus)
    app.router.add_get("/monitor/statistics", _statistics)
    app.router.add_get("/monitor/statistics.json", _statistics)
    app.router.add_post("/drain", _drain)
    app.router.add_get("/files/browse", _browse)
    app.router.add_get("/files/read", _read)
    app.router.add_get("/files/download", _download)
    return app


# Read-only endpoints any web page may read: the master's web UI is served from
# another origin (the master's port) and tails task logs straight from the agent.
# Nothing that changes state (`POST /drain`) and no downloads are opened up.
CORS_PATHS = frozenset({"/state", "/health", "/monitor/statistics", "/monitor/statistics.json",
                        "/files/browse", "/files/read"})


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`Access-Control-Allow-Origin: *` on GETs of `CORS_PATHS`, errors included,
    so the browser shows the agent's JSON reason instead of an opaque failure."""
    response = await handler(request)
    if request.method == "GET" and request.path in CORS_PATHS:
        response.headers["Access-Control-Allow-Origin"] = "*"
    return response


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


async def _shutdown_pool(app: web.Application) -> None:
    app[POOL].shutdown()


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return _error(400, str(exc))
    except files.FilesError as exc:
        return _error(exc.status, str(exc))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise
    except Exception:  # a bug, or input nobody foresaw: still the caller's 4xx
        request.app[SOURCE].count("agent/http_errors")
        route = getattr(request.match_info.handler, "__name__", "unmatched")
        request.app[ERROR_LOG].exception(route, "%s %s failed", request.method, route)
        return _error(400, "the agent could not handle this request")


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[SOURCE].state.snapshot())


async def _health(request: web.Request) -> web.Response:
    """503 while any of the agent's loops is not running (a supervisor should
    look), else 200."""
    dead = request.app[SOURCE].dead_loops()
    if dead:
        return web.json_response({"healthy": False, "dead_loops": dead}, status=503)
    return web.json_response({"healthy": True})


async def _metrics(request: web.Request) -> web.Response:
    return web.json_response(request.app[SOURCE].metrics())


_CATALOGUE = prometheus.catalogue(COUNTERS, GAUGES)


async def _prometheus(request: web.Request) -> web.Response:
    return web.Response(body=prometheus.render(request.app[SOURCE].metrics(), _CATALOGUE),
                        headers={"Content-Type": prometheus.CONTENT_TYPE})


async def _statistics(request: web.Request) -> web.Response:
    return web.json_response(request.app[SOURCE].state.statistics())


async def _drain(request: web.Request) -> web.Response:
    """Start draining (idempotent). 202: the drain goes on after the answer; watch
    `drain_state` in `/state` go from DRAINING to DRAINED."""
    source = request.app[SOURCE]
    source.drain()
    return web.json_response({"draining": True, "agent_id": source.state.agent_id},
                             status=202)


def _path(request: web.Request) -> str:
    path = request.query.get("path")
    if not path:
        raise BadRequest("missing parameter 'path'")
    return path


def _int(request: web.Request, name: str, default: int | None) -> int | None:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    if not _INTEGER.fullmatch(text):
        raise BadRequest(f"parameter {name!r} must be an integer of at most 18 digits")
    return int(text)


async def _browse(request: web.Request) -> web.Response:
    listing = await request.app[POOL].run(files.browse, request.app[WORK_DIR], _path(request))
    return web.json_response(listing)


async def _read(request: web.Request) -> web.Response:
    path = _path(request)
    offset = _int(request, "offset", 0)
    length = _int(request, "length", None)
    assert offset is not None
    if offset < -1:
        raise BadRequest(f"offset must be >= 0 (or -1 for the size), got {offset}")
    if length is not None and length < 0:
        raise BadRequest(f"length must be >= 0, got {length}")
    data, at = await request.app[POOL].run(files.read, request.app[WORK_DIR], path, offset,
                                           length)
    return web.json_response({"data": data, "offset": at})


async def _download(request: web.Request) -> web.StreamResponse:
    pool = request.app[POOL]
    fd, size = await pool.run(files.open_download, request.app[WORK_DIR], _path(request))
    try:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = size
        await response.prepare(request)
        offset = 0
        while offset < size:
            chunk = await pool.run(files.read_at, fd, offset)
            if not chunk:
                break  # truncated while we sent it: the client sees a short body
            await response.write(chunk)
            offset += len(chunk)
        await response.write_eof()
        return response
    finally:
        os.close(fd)
