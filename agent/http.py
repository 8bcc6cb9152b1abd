"""The agent's HTTP API: `/state`, `/health`, `/metrics/snapshot` (and the same
figures as Prometheus text at `/metrics`),
`/monitor/statistics` (what each executor uses), `POST /drain`, and the sandbox
file API (`/files/browse`, `/files/read`, `/files/download`) with Mesos' shapes,
so a framework can tail a task's `stdout` or fetch shuffle output by the absolute
path `/state` shows as an executor's `directory` -- also after the task ended,
until the sandbox is garbage-collected.

Only files under the sandboxes are served (`agent.files.resolve`): 403 outside,
404 missing, 400 for bad parameters, always with a JSON `{"error": reason}`. File
system work runs in a thread so a slow disk never stalls the agent's event loop.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import stat
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from agent import files
from dyad import prometheus
from agent.state import AgentState

READ_LIMIT = 1024 * 1024  # /files/read returns at most 1 MiB per call, like Mesos


class StateSource(Protocol):
    """Whatever holds the live AgentState (the AgentServer); read on each request."""

    @property
    def state(self) -> AgentState: ...

    def metrics(self) -> dict[str, float]: ...

    def drain(self) -> None: ...


SOURCE = web.AppKey("state_source", StateSource)
WORK_DIR = web.AppKey("work_dir", str)


class BadRequest(Exception):
    """A parameter the caller got wrong: HTTP 400."""


def make_app(source: StateSource, work_dir: str) -> web.Application:
    app = web.Application(middlewares=[_cors, _errors_as_json])
    app[SOURCE] = source
    app[WORK_DIR] = work_dir
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


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return _error(400, str(exc))
    except files.InvalidPath as exc:
        return _error(400, str(exc))
    except (files.OutsideSandbox, PermissionError) as exc:
        return _error(403, str(exc))
    except FileNotFoundError as exc:
        return _error(404, f"no such file: {exc}")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[SOURCE].state.snapshot())


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"healthy": True})


async def _metrics(request: web.Request) -> web.Response:
    return web.json_response(request.app[SOURCE].metrics())


async def _prometheus(request: web.Request) -> web.Response:
    return web.Response(body=prometheus.render(request.app[SOURCE].metrics()),
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
    return files.resolve(request.app[WORK_DIR], path)


def _int(request: web.Request, name: str, default: int | None) -> int | None:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"parameter {name!r} must be an integer, got {text!r}") from None


async def _browse(request: web.Request) -> web.Response:
    directory = _path(request)
    return web.json_response(await asyncio.to_thread(_list, directory))


def _list(directory: str) -> list[dict[str, Any]]:
    if not os.path.isdir(directory):
        raise BadRequest(f"{directory} is not a directory")
    entries = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # removed while we listed
        entries.append({"path": path, "size": info.st_size, "mode": stat.filemode(info.st_mode),
                        "mtime": info.st_mtime, "nlink": info.st_nlink,
                        "uid": _user(info.st_uid), "gid": _group(info.st_gid)})
    return entries


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


async def _read(request: web.Request) -> web.Response:
    path = _path(request)
    offset = _int(request, "offset", 0)
    length = _int(request, "length", None)
    assert offset is not None
    if offset < -1:
        raise BadRequest(f"offset must be >= 0 (or -1 for the size), got {offset}")
    if length is not None and length < 0:
        raise BadRequest(f"length must be >= 0, got {length}")
    data, at = await asyncio.to_thread(_read_chunk, path, offset, length)
    return web.json_response({"data": data, "offset": at})


def _read_chunk(path: str, offset: int, length: int | None) -> tuple[str, int]:
    """Mesos semantics: offset -1 asks for the size (empty data, offset = size);
    otherwise up to `length` bytes (default: the rest) capped at 1 MiB."""
    if os.path.isdir(path):
        raise BadRequest(f"{path} is a directory")
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if offset == -1:
            return "", size
        if offset > size:
            raise BadRequest(f"offset {offset} is beyond the end of the file ({size} bytes)")
        handle.seek(offset)
        chunk = handle.read(min(READ_LIMIT, size - offset if length is None else length))
    return chunk.decode("utf-8", errors="replace"), offset


async def _download(request: web.Request) -> web.StreamResponse:
    path = _path(request)
    if await asyncio.to_thread(os.path.isdir, path):
        raise BadRequest(f"{path} is a directory")
    return web.FileResponse(path)
