"""The master's HTTP API (aiohttp): what operators, tools and detectors read.

`GET /master/info` returns the MasterInfo JSON that `dyad.detector` parses (the
same document a master writes into ZooKeeper), so its shape is fixed by
`dyad.codec.to_json`. `/state` (alias `/master/state`) is the Mesos-like state
document; `/metrics/snapshot` the flat metrics (`/metrics`: the same figures in
Prometheus text); `/events?since=N` the events log (master/events.py);
`POST /tasks/kill`, `PUT /weights`, `PUT /quota`, `POST /machine/drain` and
`POST /teardown` operator calls (each an event for the core, master/operator.py);
`/health` a liveness probe (503 when a loop of the master is not running);
`POST /usage/query` and `GET /usage/tables` the usage store (master/usage_api.py);
`/redirect` (alias `/master/redirect`) a 307 to the leading master.

A standby master (HA mode, not elected) answers `/health`, `/state` (which says it
is not the leader and who is), `/metrics/snapshot` and `/redirect` itself, and
redirects every other call to the leader with a 307 and `Location`, so a client
pointed at any master reaches the leader (aiohttp and curl -L follow it). With no
leader elected yet, those calls get a 503. Errors are JSON too, so scripts never
have to parse HTML: ``{"error": "...", "path": ...}``, with the reason in the body
and never in the status line (which cannot carry arbitrary text). Bodies are
parsed by `dyad.bounded_json` (depth, size and number limits; lone surrogates
refused): anything it refuses is a counted 400 naming the limit.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from dyad import bounded_json, prometheus, security
from dyad.auth import ClientCredentials, request_principal
from dyad.codec import to_json
from dyad.messages import MasterInfo
from master.allocator import PolicyError, parse_quota, parse_weights
from master.metrics import COUNTERS, GAUGES, HISTOGRAMS, Histogram
from master.operator import (
    CONFLICT, FORBIDDEN, INTERNAL, INVALID, NOT_FOUND, DrainMachine, KillLiveTask, MalformedCall, Reply,
    Request, SetQuota, SetWeights, TeardownFramework,
)
from master.state import MasterState
from master.usage_api import UsageService, routes as usage_routes


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

    def histograms(self) -> dict[str, Histogram]:
        """Latency histograms by key (`master.metrics.HISTOGRAMS`)."""

    def problems(self) -> list[str]:
        """Why this master is unhealthy (a loop not running...); empty if healthy."""

    def count_internal_error(self) -> None:
        """Count a bug outside the core (a handler raised); it has been logged."""

    async def call(self, request: Request, principal: str | None = None) -> Reply:
        """Hand an operator request (made by `principal`) to the leader's core, in
        turn with every other event, and wait for its answer
        (`asyncio.TimeoutError` if none comes)."""

    @property
    def state(self) -> MasterState:
        """The leader's core, for reading views only: changes go through `call`."""

    @property
    def usage(self) -> UsageService | None:
        """The usage store (None: `--usage-store off`)."""


class ApiError(Exception):
    """An answer other than success: `status` and a message for the JSON body
    (never the reason phrase, which cannot carry arbitrary text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_REFUSAL_STATUS = {INVALID: 400, NOT_FOUND: 404, CONFLICT: 409, FORBIDDEN: 403,
                   INTERNAL: 500}
log = logging.getLogger(__name__)


MASTER = web.AppKey("master", MasterView)

# What a standby answers itself; everything else needs the leader.
_STANDBY_PATHS = frozenset({"/health", "/state", "/master/state", "/metrics/snapshot",
                            "/metrics", "/redirect", "/master/redirect"})


async def _info(request: web.Request) -> web.Response:
    return web.json_response(to_json(request.app[MASTER].info))


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[MASTER].snapshot())


async def _health(request: web.Request) -> web.Response:
    """200 while every loop of the master runs; 503 (the one 5xx on purpose, for
    load balancers and supervisors) naming what is wrong otherwise."""
    master = request.app[MASTER]
    problems = master.problems()
    body: dict[str, Any] = {"healthy": not problems, "leader": master.is_leader}
    if problems:
        body["problems"] = problems
    if not master.is_leader:
        leader = master.leader
        body["leader_info"] = to_json(leader) if leader else None
    return web.json_response(body, status=503 if problems else 200)


async def _metrics(request: web.Request) -> web.Response:
    return web.json_response(request.app[MASTER].metrics())


_CATALOGUE = prometheus.catalogue(COUNTERS, GAUGES)


async def _prometheus(request: web.Request) -> web.Response:
    master = request.app[MASTER]
    histograms = {key: prometheus.HistogramFigures(
        help=HISTOGRAMS[key], buckets=histogram.cumulative(), total=histogram.total,
        count=histogram.count) for key, histogram in master.histograms().items()}
    return web.Response(body=prometheus.render(master.metrics(), _CATALOGUE, histograms),
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
        raise ApiError(400, f"{name} must be a whole number >= 0, got {text!r}")
    return value


async def _events(request: web.Request) -> web.Response:
    """``?since=N&limit=L``: up to L (default 1000) entries numbered above N
    (default 0), plus `first`/`last`/`next` (pass `next` as `since` to go on)."""
    since = _query_int(request, "since", 0)
    limit = _query_int(request, "limit", 1000)
    return web.json_response(request.app[MASTER].state.events.page(since, limit))


async def _body(request: web.Request) -> Any:
    """The request's JSON body, parsed within `dyad.bounded_json`'s limits."""
    try:
        return bounded_json.loads(await request.read())
    except bounded_json.JsonInputError as exc:
        raise _Malformed(f"the body must be JSON: {exc.reason}") from None


class _Malformed(Exception):
    """A body the handler cannot turn into a request; counted by the core."""


async def _operator_call(request: web.Request, parse: Any) -> Reply:
    """Parse the body with `parse(body) -> Request` and have the core answer it.
    A body that does not parse still goes to the core (as `MalformedCall`), so
    refusals are counted in one place and respect the lease like the rest."""
    try:
        call: Request = parse(await _body(request))
    except (_Malformed, PolicyError) as exc:
        call = MalformedCall(str(exc))
    master = request.app[MASTER]
    principal = request_principal(request)
    try:
        reply = await (master.call(call) if principal is None
                       else master.call(call, principal=principal))
    except asyncio.TimeoutError:
        raise ApiError(503, "the master did not handle the call in time (is its "
                            "leadership being confirmed?); retry") from None
    if not reply.ok:
        raise ApiError(_REFUSAL_STATUS[reply.refusal], reply.error)
    return reply


def _string_field(body: Any, name: str, shape: str, optional: bool = False) -> str | None:
    value = body.get(name) if isinstance(body, dict) else None
    if (value is None and optional and isinstance(body, dict)) or \
            (isinstance(value, str) and value):
        return value
    raise _Malformed(f"the body must be {shape}")


def _kill_request(body: Any) -> KillLiveTask:
    shape = '{"task_id": "<id>"} (and "framework_id" if ambiguous)'
    task_id = _string_field(body, "task_id", shape)
    assert task_id is not None
    return KillLiveTask(task_id=task_id,
                        framework_id=_string_field(body, "framework_id", shape, optional=True))


async def _kill_task(request: web.Request) -> web.Response:
    """Body ``{"task_id": "...", "framework_id": "..."}`` (framework_id needed only
    when two frameworks use the id). 202: the agent kills it; watch its state."""
    reply = await _operator_call(request, _kill_request)
    return web.json_response(dict(reply.result), status=202)


def _teardown_request(body: Any) -> TeardownFramework:
    framework_id = _string_field(body, "framework_id", '{"framework_id": "<id>"}')
    assert framework_id is not None
    return TeardownFramework(framework_id)


async def _teardown(request: web.Request) -> web.Response:
    """Body ``{"framework_id": "..."}``: the framework is removed as if it had torn
    itself down (its tasks are killed, its executors shut down)."""
    reply = await _operator_call(request, _teardown_request)
    return web.json_response({"torn_down": True, **reply.result})


def _leader_url(master: MasterView, secure: bool = False) -> str:
    leader = master.leader
    if leader is None:
        raise ApiError(503, "no master is elected yet; retry shortly")
    # Masters of a cluster all speak TLS or none does; MasterInfo names no scheme.
    return leader.http_url.replace("http://", "https://", 1) if secure else leader.http_url


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPTemporaryRedirect(location=_leader_url(request.app[MASTER], request.secure))


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
    await _operator_call(request, lambda body: SetWeights(parse_weights(body)))
    return await _get_weights(request)


async def _get_quota(request: web.Request) -> web.Response:
    state = request.app[MASTER].state
    return web.json_response({"quota": [
        {"role": role["name"], **role["quota"], "allocated": role["allocated"]}
        for role in state.roles_json() if role["name"] in state.quota]})


async def _put_quota(request: web.Request) -> web.Response:
    """Body: ``{"role": "eng", "guarantee": {"cpus": 2}, "limit": {"cpus": 8}}`` or a
    list of them; a role given with neither loses its quota. All or nothing."""
    await _operator_call(request, lambda body: SetQuota(parse_quota(body)))
    return await _get_quota(request)


def _drain_request(body: Any) -> DrainMachine:
    agent_id = _string_field(body, "agent_id", '{"agent_id": "<id>"}')
    assert agent_id is not None
    return DrainMachine(agent_id)


async def _machine_drain(request: web.Request) -> web.Response:
    """Body ``{"agent_id": "..."}``: forwarded to that agent's ``POST /drain``. The
    agent kills its tasks (their kill policy applies; frameworks get TASK_KILLED
    with REASON_AGENT_DRAINING) and tells the master, which offers it nothing more."""
    reply = await _operator_call(request, _drain_request)
    agent_id = reply.result["agent_id"]
    # The master calls the agent as itself: its token, and TLS trusting only the CA.
    client = request.app.get(security.CLIENT) or ClientCredentials()
    url = client.base_url(reply.result["url"].removeprefix("http://"))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10),
                                         **security.client_session_options(client)
                                         ) as session, \
                session.post(f"{url}/drain") as response:
            answer = await response.json()
            ok = response.status < 300
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise ApiError(502, f"agent {agent_id} at {url} did not answer: "
                            f"{exc or type(exc).__name__}") from None
    if not ok:
        raise ApiError(502, f"agent {agent_id} refused to drain: {answer}")
    return web.json_response(answer, status=202)


@web.middleware
async def _leader_only(request: web.Request, handler: Any) -> web.StreamResponse:
    master = request.app[MASTER]
    if master.is_leader or request.path in _STANDBY_PATHS:
        return await handler(request)
    raise web.HTTPTemporaryRedirect(location=_leader_url(master, request.secure)
                                    + request.path_qs)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response({"error": exc.message, "path": request.path},
                                 status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response({"error": exc.reason, "path": request.path},
                                 status=exc.status, headers=headers)
    except Exception:  # a bug: logged and counted, and still a JSON answer
        log.exception("%s %s failed", request.method, request.path[:200])
        request.app[MASTER].count_internal_error()
        return web.json_response({"error": "internal error; the master logged it",
                                  "path": request.path}, status=500)


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
    app.router.add_post("/teardown", _teardown)
    app.router.add_post("/master/teardown", _teardown)
    app.add_routes(usage_routes(lambda request: request.app[MASTER].usage))
    return app
