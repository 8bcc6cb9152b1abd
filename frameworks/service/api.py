"""Marathon's REST API for the service framework (aiohttp).

Routes are matched on the request path with runs of slashes collapsed, so
``//v2/apps//web`` is ``/v2/apps/web`` (app ids are paths and clients glue them
carelessly). Status codes follow Marathon: 201 created, 404 unknown app, task or
deployment, 409 an app is locked by a deployment (override with ``?force=true``),
422 an invalid definition with ``details``, 400 for a body that is not JSON or a
bad query parameter (bodies are parsed by `dyad.bounded_json` within `BODY_LIMITS`).
Every error body is JSON with a ``message``; every 4xx/5xx is counted in
``GET /metrics``. A standby instance answers 503 and names the leader. Reasons go
in the JSON body only: the status line keeps aiohttp's standard reason phrase, so
no user text (a ``\n`` in an id, say) ever reaches a header.

Nothing here decides anything: handlers parse, call `ServiceRuntime.execute`, and
render with `views`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dyad import bounded_json
from frameworks.service import marathon_events, marathon_shape, views
from frameworks.service.appdef import AppInvalid, normalize_app_id, parse_app
from frameworks.service.events_stream import EventStream
from frameworks.service.core import (
    CancelDeployment, Conflict, DeleteApp, KillTasks, NotFound, PutApp, ResetDelay,
    RestartApp, ServiceError)
from frameworks.service.rightsizing import recommendation_json
from frameworks.service.runtime import ServiceRuntime
from frameworks.service.store import StoreError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
BODY_LIMITS = bounded_json.JsonLimits(max_bytes=MAX_BODY_BYTES, max_depth=16)
"""An app definition nests a few levels (healthChecks, portDefinitions, labels);
deeper bodies, numbers longer than 40 characters, infinities and lone surrogates
are refused with 400 before any handler sees them."""
VERSION = "0.1.0"

Handler = Callable[[web.Request, dict[str, str]], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    """The request itself is malformed (400)."""


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"message": message, **extra}, status=status)


def _flag(request: web.Request, name: str) -> bool:
    """A boolean query parameter (``?force``, ``?force=true``, ``?scale=false``)."""
    if name not in request.query:
        return False
    value = request.query[name].lower()
    if value in ("", "true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise BadRequest(f"query parameter {name} must be true or false, not {value!r}")


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return bounded_json.loads(raw, BODY_LIMITS)
    except bounded_json.JsonInputError as exc:
        raise BadRequest(f"Invalid JSON: {exc.reason}") from None


def _dyad(request: web.Request) -> bool:
    """``?dyad=true``: answer with Dyad's extra fields (frameworks/service/marathon_shape.py)."""
    return _flag(request, "dyad")


Shape = Callable[[dict[str, Any]], dict[str, Any]]


def _as_is(body: dict[str, Any]) -> dict[str, Any]:
    return body


def _shape(request: web.Request, marathon: Shape) -> Shape:
    """How to render one object: Marathon's shape, or with ``?dyad=true`` as is."""
    return _as_is if _dyad(request) else marathon


def _deployment_answer(outcome: Any, status: int = 200) -> web.Response:
    return web.json_response({"version": outcome.version, "deploymentId": outcome.deployment_id},
                             status=status, headers={"Marathon-Deployment-Id": outcome.deployment_id or ""})


class ServiceApi:
    """The aiohttp application. ``runtime`` is None while this instance stands by;
    ``leader`` names the leading instance's address."""

    def __init__(self, leader: Callable[[], Awaitable[str | None]],
                 name: str = "dyad-service") -> None:
        self.events = EventStream()  # GET /v2/events; app versions
        self._leading: ServiceRuntime | None = None
        self.leader = leader
        self.advertised: str | None = None  # this instance's address, once bound
        self.name = name
        self.counters: Counter[str] = Counter()
        self.settings: dict[str, Any] = {}  # options /v2/info reports (set by main)
        self.app = web.Application(client_max_size=MAX_BODY_BYTES)
        # Every path, even one with a newline in it (`.` would not match that), gets
        # our JSON answers rather than aiohttp's plain-text 404.
        self.app.router.add_route("*", r"/{path:[\s\S]*}", self._dispatch)
        self.app.on_shutdown.append(lambda app: self._end_events())
        a = r"(?P<app>/.+?)"
        self._routes: list[tuple[str, re.Pattern[str], Handler, bool]] = [
            (method, re.compile(pattern), handler, leader_only)
            for method, pattern, handler, leader_only in [
                ("GET", "/ping", self._ping, False),
                ("GET", "/v2/info", self._info, False),
                ("GET", "/v2/leader", self._leader, False),
                ("GET", "/metrics", self._metrics, False),
                ("GET", "/v2/apps", self._list_apps, True),
                ("POST", "/v2/apps", self._create_app, True),
                ("GET", f"/v2/apps{a}/tasks", self._app_tasks, True),
                ("DELETE", f"/v2/apps{a}/tasks", self._kill_app_tasks, True),
                ("DELETE", f"/v2/apps{a}/tasks/(?P<task>[^/]+)", self._kill_task, True),
                ("POST", f"/v2/apps{a}/restart", self._restart_app, True),
                ("GET", f"/v2/apps{a}/recommendation", self._recommendation, True),
                ("GET", f"/v2/apps{a}/versions", self._versions, True),
                ("GET", f"/v2/apps{a}/versions/(?P<version>[^/]+)", self._version, True),
                ("GET", "/v2/events", self._events, True),
                ("GET", "/v2/groups", self._groups, True),
                ("GET", "/v2/groups(?P<group>/.+)", self._groups, True),
                ("GET", f"/v2/apps{a}", self._show_app, True),
                ("PUT", f"/v2/apps{a}", self._update_app, True),
                ("DELETE", f"/v2/apps{a}", self._delete_app, True),
                ("GET", "/v2/tasks", self._all_tasks, True),
                ("POST", "/v2/tasks/delete", self._delete_tasks, True),
                ("GET", "/v2/deployments", self._deployments, True),
                ("DELETE", "/v2/deployments/(?P<id>[^/]+)", self._cancel_deployment, True),
                ("GET", "/v2/queue", self._queue, True),
                ("DELETE", f"/v2/queue{a}/delay", self._reset_delay, True),
            ]]

    @property
    def runtime(self) -> ServiceRuntime | None:
        return self._leading

    @runtime.setter
    def runtime(self, runtime: ServiceRuntime | None) -> None:
        self._leading = runtime
        self.events.attach(runtime)  # /v2/events follows the runtime we lead with

    async def _end_events(self) -> None:
        self.events.end_all()  # before aiohttp waits for the streams' handlers

    # ------------------------------------------------------------- dispatch

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.counters["http_requests"] += 1
        response = await self._route(request)
        if response.status >= 500:
            self.counters["http_responses_5xx"] += 1
        elif response.status >= 400:
            self.counters["http_responses_4xx"] += 1
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = re.sub("/+", "/", request.path)
        if len(path) > 1:
            path = path.rstrip("/")
        allowed = []
        for method, pattern, handler, leader_only in self._routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            if method != request.method:
                allowed.append(method)
                continue
            if leader_only and self.runtime is None:
                leader = await self.leader()
                if leader is not None and leader == self.advertised:
                    return _error(503, "this instance leads but is still loading its state; "
                                  "retry in a moment", leader=leader)
                return _error(503, f"this instance is a standby; the leader is {leader or 'not elected yet'}",
                              leader=leader)
            try:
                return await handler(request, match.groupdict())
            except BadRequest as exc:
                return _error(400, str(exc))
            except AppInvalid as exc:
                self.counters["invalid_app_definitions"] += 1
                return _error(422, "Object is not valid", details=[
                    {"path": p, "errors": [m]} for p, m in exc.details])
            except NotFound as exc:
                return _error(404, exc.message)
            except Conflict as exc:
                return _error(409, exc.message,
                              deployments=[{"id": d} for d in exc.deployment_ids])
            except ServiceError as exc:
                return _error(400, exc.message)
            except StoreError as exc:
                return _error(503, f"state could not be persisted: {exc}")
            except web.HTTPException as exc:  # e.g. 413 from aiohttp for a huge body
                return _error(exc.status, exc.reason)
            except Exception:  # the shell boundary: log, count, answer, carry on
                log.exception("%s %s failed", request.method, request.path)
                return _error(500, "internal error; see the service log")
        if allowed:
            return _error(405, f"{request.method} is not allowed here (allowed: "
                               f"{', '.join(sorted(set(allowed)))})")
        return _error(404, f"no such resource: {path}")

    def _runtime(self) -> ServiceRuntime:
        assert self.runtime is not None
        return self.runtime

    def _app_id(self, raw: str) -> str:
        """An app id from the URL; one that cannot be valid cannot exist either."""
        try:
            return normalize_app_id(raw)
        except AppInvalid:
            raise NotFound(f"App '{raw}' does not exist") from None

    # --------------------------------------------------------------- general

    async def _ping(self, request: web.Request, match: dict[str, str]) -> web.Response:
        return web.Response(text="pong\n")

    async def _info(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self.runtime
        body = {
            "name": self.name, "version": VERSION, "elected": runtime is not None,
            "leader": await self.leader(),
            "frameworkId": runtime.core.framework_id if runtime else None,
            "connected": runtime.core.connected if runtime else False}
        if _dyad(request):
            return web.json_response(body)
        return web.json_response(marathon_shape.info(body, **self.settings))

    async def _leader(self, request: web.Request, match: dict[str, str]) -> web.Response:
        leader = await self.leader()
        if leader is None:
            return _error(404, "there is no leader")
        return web.json_response({"leader": leader})

    async def _metrics(self, request: web.Request, match: dict[str, str]) -> web.Response:
        counters = dict(self.counters)
        gauges = {"leader": 0}
        if self.runtime is not None:
            core = self.runtime.core
            counters.update(core.counters)
            counters.update(self.runtime.rightsizing.counters)
            gauges = {"leader": 1, "apps": len(core.apps), "tasks": len(core.tasks),
                      "deployments": len(core.deployments),
                      "connected": int(core.connected)}
        return web.json_response({"counters": counters, "gauges": gauges})

    # ------------------------------------------------------------------ apps

    async def _list_apps(self, request: web.Request, match: dict[str, str]) -> web.Response:
        core, now = self._runtime().core, self._runtime().clock.now()
        # Marathon reads `apps.tasks`; its clients also send `app.tasks`.
        embed = bool({"apps.tasks", "app.tasks"} & set(request.query.getall("embed", [])))
        shape = _shape(request, marathon_shape.app)
        return web.json_response({"apps": [shape(views.app_json(core, core.apps[a], now, embed))
                                           for a in sorted(core.apps)]})

    async def _show_app(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        app_id = self._app_id(match["app"])
        app = runtime.core.apps.get(app_id)
        if app is None:
            raise NotFound(f"App '{app_id}' does not exist")
        return web.json_response({"app": _shape(request, marathon_shape.app)(views.app_json(
            runtime.core, app, runtime.clock.now(), embed_tasks=True))})

    async def _create_app(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        app = parse_app(await _json_body(request))
        outcome = runtime.execute(PutApp(app, force=_flag(request, "force"), create_only=True))
        created = runtime.core.apps[app.id]
        shape = _shape(request, marathon_shape.app)
        return web.json_response(
            shape(views.app_json(runtime.core, created, runtime.clock.now())), status=201,
            headers={"Location": f"/v2/apps{app.id}",
                     "Marathon-Deployment-Id": outcome.deployment_id or ""})

    async def _update_app(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        app_id = normalize_app_id(match["app"])
        body = await _json_body(request)
        existing = runtime.core.apps.get(app_id)
        app = parse_app(body, app_id=app_id, base=existing)
        outcome = runtime.execute(PutApp(app, force=_flag(request, "force")))
        return _deployment_answer(outcome, 200 if existing is not None else 201)

    async def _delete_app(self, request: web.Request, match: dict[str, str]) -> web.Response:
        outcome = self._runtime().execute(DeleteApp(self._app_id(match["app"]),
                                                    force=_flag(request, "force")))
        return _deployment_answer(outcome)

    async def _restart_app(self, request: web.Request, match: dict[str, str]) -> web.Response:
        outcome = self._runtime().execute(RestartApp(self._app_id(match["app"]),
                                                     force=_flag(request, "force")))
        return _deployment_answer(outcome)

    async def _recommendation(self, request: web.Request,
                              match: dict[str, str]) -> web.Response:
        """The autopilot's current recommendation for the app (null when its
        autopilot is off), with the evidence and reasons (docs/autopilot.md)."""
        runtime = self._runtime()
        app_id = self._app_id(match["app"])
        app = runtime.core.apps.get(app_id)
        if app is None:
            raise NotFound(f"App '{app_id}' does not exist")
        return web.json_response(recommendation_json(
            app, runtime.rightsizing.pilot.recommendation(app_id)))

    # ------------------------------------------- versions, groups and events

    async def _versions(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        app_id = self._app_id(match["app"])
        versions = self.events.feed.versions(runtime.core, app_id)
        if not versions:
            raise NotFound(f"App '{app_id}' does not exist")
        return web.json_response({"versions": versions})

    async def _version(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        app_id = self._app_id(match["app"])
        app = self.events.feed.version(runtime.core, app_id, match["version"])
        if app is None:
            raise NotFound(f"App '{app_id}' has no version {match['version']!r} known here")
        return web.json_response(marathon_events.definition(app))

    async def _groups(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        group_id = match.get("group") or "/"
        group = marathon_events.group_tree(runtime.core, runtime.clock.now(), group_id)
        if group is None:
            raise NotFound(f"Group '{group_id}' does not exist")
        return web.json_response(group)

    async def _events(self, request: web.Request, match: dict[str, str]) -> web.StreamResponse:
        return await self.events.serve(request, self._runtime().clock.now())

    # ----------------------------------------------------------------- tasks

    async def _app_tasks(self, request: web.Request, match: dict[str, str]) -> web.Response:
        core = self._runtime().core
        app_id = self._app_id(match["app"])
        if app_id not in core.apps:
            raise NotFound(f"App '{app_id}' does not exist")
        shape = _shape(request, marathon_shape.task)
        return web.json_response({"tasks": [shape(views.task_json(t))
                                            for t in core.tasks_of(app_id)]})

    async def _all_tasks(self, request: web.Request, match: dict[str, str]) -> web.Response:
        core = self._runtime().core
        fmt = request.query.get("format", "json")
        if fmt == "txt":
            return web.Response(text=views.tasks_txt(core), content_type="text/plain")
        if fmt != "json":
            raise BadRequest(f"format must be json or txt, not {fmt!r}")
        tasks = sorted(core.tasks.values(), key=lambda t: (t.app_id, t.staged_at, t.task_id))
        shape = _shape(request, marathon_shape.task)
        return web.json_response({"tasks": [shape(views.task_json(t)) for t in tasks]})

    async def _delete_tasks(self, request: web.Request, match: dict[str, str]) -> web.Response:
        """Marathon's ``POST /v2/tasks/delete`` with ``{"ids": [...]}``: the tasks
        are killed app by app (with ``?scale=true`` each app shrinks by them)."""
        body = await _json_body(request)
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadRequest('the body must be {"ids": ["<task id>", ...]}')
        core = self._runtime().core
        by_app: dict[str, list[str]] = {}
        for task_id in dict.fromkeys(ids):
            task = core.tasks.get(task_id)
            if task is None:
                raise NotFound(f"Task '{task_id}' does not exist")
            by_app.setdefault(task.app_id, []).append(task_id)
        outcomes = [self._runtime().execute(KillTasks(
            app_id, tuple(task_ids), scale=_flag(request, "scale"),
            force=_flag(request, "force"))) for app_id, task_ids in sorted(by_app.items())]
        if _flag(request, "scale"):
            return _deployment_answer(outcomes[-1]) if outcomes else web.json_response({})
        return web.json_response({})

    async def _kill_task(self, request: web.Request, match: dict[str, str]) -> web.Response:
        return await self._kill(request, self._app_id(match["app"]), [match["task"]],
                                single=True)

    async def _kill_app_tasks(self, request: web.Request, match: dict[str, str]) -> web.Response:
        core = self._runtime().core
        app_id = self._app_id(match["app"])
        host = request.query.get("host")
        task_ids = [t.task_id for t in core.tasks_of(app_id) if host in (None, t.hostname)]
        return await self._kill(request, app_id, task_ids, single=False)

    async def _kill(self, request: web.Request, app_id: str, task_ids: list[str],
                    single: bool) -> web.Response:
        runtime = self._runtime()
        scale = _flag(request, "scale")
        tasks = [runtime.core.tasks[t] for t in task_ids if t in runtime.core.tasks]
        outcome = runtime.execute(KillTasks(app_id, tuple(task_ids), scale=scale,
                                            force=_flag(request, "force")))
        if scale:
            return _deployment_answer(outcome)
        shape = _shape(request, marathon_shape.task)
        if single:
            return web.json_response({"task": shape(views.task_json(tasks[0]))})
        return web.json_response({"tasks": [shape(views.task_json(t)) for t in tasks]})

    # ----------------------------------------------------------- deployments

    async def _deployments(self, request: web.Request, match: dict[str, str]) -> web.Response:
        core = self._runtime().core
        shape = _shape(request, marathon_shape.deployment)
        return web.json_response([shape(views.deployment_json(core, d))
                                  for d in sorted(core.deployments.values(),
                                                  key=lambda d: (d.started_at, d.id))])

    async def _cancel_deployment(self, request: web.Request, match: dict[str, str]) -> web.Response:
        force = _flag(request, "force")
        outcome = self._runtime().execute(CancelDeployment(match["id"], force=force))
        if force:
            return web.json_response({}, status=202)
        return _deployment_answer(outcome)

    async def _queue(self, request: web.Request, match: dict[str, str]) -> web.Response:
        runtime = self._runtime()
        body = views.queue_json(runtime.core, runtime.clock.now())
        if _dyad(request):
            return web.json_response(body)
        unused = "lastUnusedOffers" in request.query.getall("embed", [])
        return web.json_response(marathon_shape.queue(body, embed_unused_offers=unused))

    async def _reset_delay(self, request: web.Request, match: dict[str, str]) -> web.Response:
        self._runtime().execute(ResetDelay(self._app_id(match["app"])))
        return web.Response(status=204)
