"""The master's HTTP API (aiohttp): what operators, tools and detectors read.

`GET /master/info` returns the MasterInfo JSON that `dyad.detector` parses (the
same document a master writes into ZooKeeper), so its shape is fixed by
`dyad.codec.to_json`. `/state` (alias `/master/state`) is the Mesos-like state
document; `/metrics/snapshot` the flat metrics (`/metrics`: the same figures in
Prometheus text); `/events?since=N` the events log (master/events.py);
`POST /tasks/kill` an operator's kill; `/health` a liveness probe;
`/redirect` (alias `/master/redirect`) a 307 to the leading master.

A standby master (HA mode, not elected) answers `/health`, `/state` (which says it
is not the leader and who is), `/metrics/snapshot` and `/redirect` itself, and
redirects every other call to the leader with a 307 and `Location`, so a client
pointed at any master reaches the leader (aiohttp and curl -L follow it). With no
leader elected yet, those calls get a 503. Errors are JSON too, so scripts never
have to parse HTML.
"""

from __future__ import annotations

import asyncio
import importlib.resources
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from dyad import prometheus
from dyad.codec import to_json
from dyad.messages import MasterInfo
from master.allocator import PolicyError, parse_quota, parse_weights
from master.state import Event, MasterState, OperatorKill


class MasterView(Protocol):
    """What the HTTP layer needs from the master; `MasterServer` provides it."""

    @property
    def info(self) -> MasterInfo:
        """This master's own MasterInfo."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader(self) -> MasterInfo | None:
        """The leading master as last seen (itself when leading), None if unknown."""

    def snapshot(self) -> dict[str, Any]: ...

    def metrics(self) -> dict[str, float]: ...

    def submit(self, event: Event) -> None:
        """Hand an operator event to the leader's core, in turn with the rest."""

    @property
    def state(self) -> MasterState:
        """The leader's core; operator calls (`/weights`, `/quota`) change it."""


MASTER = web.AppKey("master", MasterView)

# What a standby answers itself; everything else needs the leader.
_STANDBY_PATHS = frozenset({"/health", "/state", "/master/state", "/metrics/snapshot",
                            "/metrics", "/redirect", "/master/redirect"})


async def _info(request: web.Request) -> web.Response:
    return web.json_response(to_json(request.app[MASTER].info))


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[MASTER].snapshot())


async def _health(request: web.Request) -> web.Response:
    master = request.app[MASTER]
    if master.is_leader:
        return web.json_response({"healthy": True, "leader": True})
    leader = master.leader
    return web.json_response({"healthy": True, "leader": False,
                              "leader_info": to_json(leader) if leader else None})


async def _metrics(request: web.Request) -> web.Response:
    return web.json_response(request.app[MASTER].metrics())


async def _prometheus(request: web.Request) -> web.Response:
    return web.Response(body=prometheus.render(request.app[MASTER].metrics()),
                        headers={"Content-Type": prometheus.CONTENT_TYPE})


def _query_int(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise web.HTTPBadRequest(reason=f"{name} must be a whole number >= 0, got {text!r}")
    return value


async def _events(request: web.Request) -> web.Response:
    """``?since=N&limit=L``: up to L (default 1000) entries numbered above N
    (default 0), plus `first`/`last`/`next` (pass `next` as `since` to go on)."""
    since = _query_int(request, "since", 0)
    limit = _query_int(request, "limit", 1000)
    return web.json_response(request.app[MASTER].state.events.page(since, limit))


async def _kill_task(request: web.Request) -> web.Response:
    """Body ``{"task_id": "...", "framework_id": "..."}`` (framework_id needed only
    when two frameworks use the id). 202: the agent kills it; watch its state."""
    master = request.app[MASTER]
    state = master.state
    try:
        body = await request.json()
    except ValueError:
        body = None
    task_id = body.get("task_id") if isinstance(body, dict) else None
    framework_id = body.get("framework_id") if isinstance(body, dict) else None
    if not isinstance(task_id, str) or not task_id or \
            not isinstance(framework_id, (str, type(None))):
        state.count_invalid_operator_call()
        raise web.HTTPBadRequest(reason='the body must be {"task_id": "<id>"} '
                                        '(and "framework_id" if ambiguous)')
    owners = [f for f in state.live_task_frameworks(task_id)
              if framework_id in (None, f)]
    if not owners:
        raise web.HTTPNotFound(reason=f"no live task {task_id}"
                                      + (f" in framework {framework_id}" if framework_id else ""))
    if len(owners) > 1:
        raise web.HTTPConflict(reason=f"task id {task_id} is live in frameworks "
                                      f"{', '.join(owners)}; give framework_id")
    master.submit(OperatorKill(framework_id=owners[0], task_id=task_id))
    return web.json_response({"killing": True, "task_id": task_id,
                              "framework_id": owners[0]}, status=202)


def _leader_url(master: MasterView) -> str:
    leader = master.leader
    if leader is None:
        raise web.HTTPServiceUnavailable(reason="no master is elected yet; retry shortly")
    return leader.http_url


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPTemporaryRedirect(location=_leader_url(request.app[MASTER]))


async def _webui(request: web.Request) -> web.Response:
    """The web UI: one self-contained page shipped as package data (no build step).
    A standby never serves it: `_leader_only` sends the browser to the leader."""
    page = importlib.resources.files("master").joinpath("webui/index.html").read_text("utf-8")
    return web.Response(text=page, content_type="text/html", charset="utf-8")


async def _get_weights(request: web.Request) -> web.Response:
    state = request.app[MASTER].state
    return web.json_response([{"role": role, "weight": weight}
                              for role, weight in sorted(state.weights.items())])


async def _put_weights(request: web.Request) -> web.Response:
    """Body: ``[{"role": "eng", "weight": 2.0}, ...]``; weight 1.0 resets a role."""
    await _operator_call(request, lambda state, body: state.set_weights(parse_weights(body)))
    return await _get_weights(request)


async def _get_quota(request: web.Request) -> web.Response:
    state = request.app[MASTER].state
    return web.json_response({"quota": [
        {"role": role["name"], **role["quota"], "allocated": role["allocated"]}
        for role in state.roles_json() if role["name"] in state.quota]})


async def _put_quota(request: web.Request) -> web.Response:
    """Body: ``{"role": "eng", "guarantee": {"cpus": 2}, "limit": {"cpus": 8}}`` or a
    list of them; a role given with neither loses its quota. All or nothing."""
    await _operator_call(request, lambda state, body: state.set_quota(parse_quota(body)))
    return await _get_quota(request)


async def _operator_call(request: web.Request,
                         change: Callable[[MasterState, Any], None]) -> None:
    """Apply `change` with the JSON body; a bad body is a counted 400 that
    changes nothing."""
    state = request.app[MASTER].state
    try:
        try:
            body = await request.json()
        except ValueError:
            raise PolicyError("the body must be JSON") from None
        change(state, body)
    except PolicyError as exc:
        state.count_invalid_operator_call()
        raise web.HTTPBadRequest(reason=str(exc)) from None


async def _machine_drain(request: web.Request) -> web.Response:
    """Body ``{"agent_id": "..."}``: forwarded to that agent's ``POST /drain``. The
    agent kills its tasks (their kill policy applies; frameworks get TASK_KILLED
    with REASON_AGENT_DRAINING) and tells the master, which offers it nothing more."""
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(reason="the body must be JSON") from None
    agent_id = body.get("agent_id") if isinstance(body, dict) else None
    if not isinstance(agent_id, str) or not agent_id:
        raise web.HTTPBadRequest(reason='the body must be {"agent_id": "<id>"}')
    agents = request.app[MASTER].snapshot()["agents"]
    url = next((a["url"] for a in agents if a["id"] == agent_id), None)
    if url is None:
        raise web.HTTPNotFound(reason=f"agent {agent_id} is not registered")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
                session.post(f"{url}/drain") as response:
            answer = await response.json()
            ok = response.status < 300
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise web.HTTPBadGateway(reason=f"agent {agent_id} at {url} did not answer: "
                                        f"{exc or type(exc).__name__}") from None
    if not ok:
        raise web.HTTPBadGateway(reason=f"agent {agent_id} refused to drain: {answer}")
    return web.json_response(answer, status=202)


@web.middleware
async def _leader_only(request: web.Request, handler: Any) -> web.StreamResponse:
    master = request.app[MASTER]
    if master.is_leader or request.path in _STANDBY_PATHS:
        return await handler(request)
    raise web.HTTPTemporaryRedirect(location=_leader_url(master) + request.path_qs)


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
    app = web.Application(middlewares=[_json_errors, _leader_only])
    app[MASTER] = master
    app.router.add_get("/", _webui)
    app.router.add_get("/index.html", _webui)
    app.router.add_get("/master/info", _info)
    app.router.add_get("/state", _state)
    app.router.add_get("/master/state", _state)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics/snapshot", _metrics)
    app.router.add_get("/metrics", _prometheus)
    app.router.add_get("/events", _events)
    app.router.add_post("/tasks/kill", _kill_task)
    app.router.add_get("/redirect", _redirect)
    app.router.add_get("/master/redirect", _redirect)
    app.router.add_get("/weights", _get_weights)
    app.router.add_put("/weights", _put_weights)
    app.router.add_get("/quota", _get_quota)
    app.router.add_put("/quota", _put_quota)
    app.router.add_post("/machine/drain", _machine_drain)
    return app
