"""The master's HTTP API (aiohttp): what operators, tools and detectors read.

`GET /master/info` returns the MasterInfo JSON that `dyad.detector` parses (the
same document a master writes into ZooKeeper), so its shape is fixed by
`dyad.codec.to_json`. `/state` (alias `/master/state`) is the Mesos-like state
document; `/metrics/snapshot` the flat metrics; `/health` a liveness probe.
Errors are JSON too, so scripts never have to parse HTML.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from dyad.codec import to_json
from dyad.messages import MasterInfo


class MasterView(Protocol):
    """What the HTTP layer needs from the master; `MasterServer` provides it."""

    @property
    def info(self) -> MasterInfo: ...

    def snapshot(self) -> dict[str, Any]: ...

    def metrics(self) -> dict[str, float]: ...


MASTER = web.AppKey("master", MasterView)


async def _info(request: web.Request) -> web.Response:
    return web.json_response(to_json(request.app[MASTER].info))


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[MASTER].snapshot())


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"healthy": True, "leader": True})


async def _metrics(request: web.Request) -> web.Response:
    return web.json_response(request.app[MASTER].metrics())


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response({"error": exc.reason, "path": request.path},
                                 status=exc.status, headers=headers)


def make_app(master: MasterView) -> web.Application:
    app = web.Application(middlewares=[_json_errors])
    app[MASTER] = master
    app.router.add_get("/master/info", _info)
    app.router.add_get("/state", _state)
    app.router.add_get("/master/state", _state)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics/snapshot", _metrics)
    return app
