"""`agent.docker` against a fake engine on a unix socket: how engine answers --
good, refused, malformed, broken off -- become results or precise exceptions.
The real engine's behaviour is in tests/integration/test_docker_engine.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from agent.docker import (
    API_VERSION, Conflict, DockerClient, DockerError, EngineUnavailable, NotFound, NotRunning,
    PullError,
)
from agent.docker_wire import PullProgress

Handler = Callable[[web.Request], web.StreamResponse]


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Callable[[str, str, Handler], None]]:
    """Routes added by the test, served on a unix socket; yields `route`."""
    app = web.Application()
    routes: dict[tuple[str, str], Handler] = {}

    async def dispatch(request: web.Request) -> web.StreamResponse:
        handler = routes.get((request.method, request.path))
        if handler is None:
            return web.json_response({"message": f"page not found: {request.path}"}, status=404)
        return await handler(request)

    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.UnixSite(runner, str(tmp_path / "engine.sock"))
    await site.start()

    def route(method: str, path: str, handler: Handler) -> None:
        routes[(method, f"/v{API_VERSION}{path}")] = handler

    yield route
    await runner.cleanup()


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[DockerClient]:
    async with DockerClient(str(tmp_path / "engine.sock"), request_timeout=5) as c:
        yield c


def answer(status: int, body: object) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)
    return handler


async def test_no_engine_is_engine_unavailable(tmp_path: Path) -> None:
    async with DockerClient(str(tmp_path / "nothing.sock")) as client:
        with pytest.raises(EngineUnavailable, match="no Docker Engine answers on .*nothing.sock"):
            await client.ping()


@pytest.mark.parametrize("status, body, kind, message", [
    (404, {"message": "No such container: c1"}, NotFound, "No such container: c1"),
    (409, {"message": "Container c1 is not running"}, NotRunning, "Container c1 is not running"),
    (409, {"message": "name in use"}, Conflict, "name in use"),
    (500, {"message": "driver failed"}, DockerError, "driver failed"),
    (500, "plain words", DockerError, '"plain words"'),
])
async def test_engine_refusals_carry_the_engines_message(
        engine: Callable, client: DockerClient, status: int, body: object,
        kind: type[DockerError], message: str) -> None:
    engine("POST", "/containers/c1/kill", answer(status, body))
    with pytest.raises(kind) as raised:
        await client.kill("c1")
    assert type(raised.value) is kind
    assert (raised.value.message, raised.value.status) == (message, status)
    assert str(raised.value) == f"kill c1: {message}"


async def test_a_refused_pull_is_a_pull_error(engine: Callable, client: DockerClient) -> None:
    engine("POST", "/images/create", answer(404, {"message": "pull access denied for x"}))
    with pytest.raises(PullError, match="pull x: pull access denied for x"):
        await client.pull("x")


async def test_an_error_inside_a_pull_stream_is_a_pull_error(engine: Callable,
                                                             client: DockerClient) -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        assert (request.query["fromImage"], request.query["tag"]) == ("app", "latest")
        response = web.StreamResponse()
        await response.prepare(request)
        for line in [{"status": "Pulling fs layer", "progressDetail": {}, "id": "a1"},
                     {"errorDetail": {"message": "unexpected EOF"}, "error": "unexpected EOF"}]:
            await response.write(json.dumps(line).encode() + b"\r\n")
        return response

    engine("POST", "/images/create", stream)
    seen: list[str] = []

    def on_progress(progress: PullProgress) -> None:
        seen.append(progress.summary())

    with pytest.raises(PullError, match="pull app: unexpected EOF"):
        await client.pull("app", on_progress=on_progress)
    assert seen == ["pulling app: 0/1 layers", "pulling app failed: unexpected EOF"]


async def test_a_line_that_is_not_json_is_a_docker_error(engine: Callable,
                                                         client: DockerClient) -> None:
    async def garbage(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"{\"status\": \"ok\"}\n<html>oops</html>\n")

    engine("POST", "/images/create", garbage)
    with pytest.raises(PullError, match="not JSON: b'<html>oops</html>'"):
        await client.pull("app")


async def test_a_malformed_log_stream_is_a_docker_error(engine: Callable,
                                                        client: DockerClient) -> None:
    engine("GET", "/containers/c1/logs",
           lambda request: _body(b"\x09\x00\x00\x00\x00\x00\x00\x01x"))
    with pytest.raises(DockerError, match="logs c1: engine sent what its API does not: "
                                          "log frame for unknown stream 9"):
        async for _ in client.logs("c1"):
            pass


async def test_list_sends_label_filters_and_reads_summaries(engine: Callable,
                                                            client: DockerClient) -> None:
    async def listing(request: web.Request) -> web.StreamResponse:
        assert json.loads(request.query["filters"]) == {"label": ["dyad.agent_id=A1"]}
        assert request.query["all"] == "1"
        return web.json_response([{"Id": "c1", "Names": ["/dyad-A1-R1"], "Image": "i",
                                   "State": "running", "Status": "Up 1 second",
                                   "Labels": {"dyad.agent_id": "A1"}}])

    engine("GET", "/containers/json", listing)
    [found] = await client.list(labels={"dyad.agent_id": "A1"})
    assert (found.id, found.names, found.state, found.labels) == (
        "c1", ("dyad-A1-R1",), "running", {"dyad.agent_id": "A1"})


async def test_an_answer_without_what_it_must_carry_is_a_docker_error(
        engine: Callable, client: DockerClient) -> None:
    engine("POST", "/containers/create", answer(201, {"Warnings": []}))
    with pytest.raises(DockerError, match="create: engine answer lacks Id"):
        await client.create({"Image": "i"}, name="n")


async def _body(data: bytes) -> web.Response:
    return web.Response(body=data)
