"""A thin asyncio client for the Docker Engine API on its unix socket.

It speaks the Engine's HTTP API (pinned at version `API_VERSION`, which every
engine since Docker 20.10 serves) with aiohttp over a `UnixConnector`, rather than
through the `docker` SDK: the SDK blocks, so every pull, log stream and wait --
one of each per running container -- would hold a thread of a small agent for the
container's whole life, while here they are ordinary coroutines on the agent's
loop; and aiohttp is already a dependency (docs/containers.md).

Every call that fails raises a `DockerError` subclass carrying the engine's own
message (`NotFound`, `Conflict`, `NotRunning`, `PullError`, `PullTimeout`,
`EngineUnavailable`), so the agent can put the engine's words in a task's status.
What to run is decided elsewhere (`agent/container_spec.py`); the byte formats are
read by `agent/docker_wire.py`.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import attrs

from agent.docker_wire import (
    STDERR, STDOUT, ContainerState, ContainerUsage, LogDemuxer, PullProgress, WireError,
    since_argument, split_timestamp,
)

log = logging.getLogger(__name__)

API_VERSION = "1.41"
DEFAULT_SOCKET = "/var/run/docker.sock"
REQUEST_TIMEOUT = 30.0  # one plain call; pulls, waits and logs have their own
DEFAULT_PULL_TIMEOUT = 600.0
STOP_SLACK = 30.0  # beyond the grace: how long the engine may take to SIGKILL
MAX_JSON_LINE = 1024 * 1024  # a progress line is ~200 bytes
# For streams that last as long as a container (wait, logs): only connecting is timed.
UNLIMITED = aiohttp.ClientTimeout(total=None, sock_connect=10)


class DockerError(Exception):
    """The engine refused or failed `operation`; `message` is the engine's word."""

    def __init__(self, operation: str, message: str, status: int = 0) -> None:
        super().__init__(f"{operation}: {message}")
        self.operation = operation
        self.message = message
        self.status = status


class EngineUnavailable(DockerError):
    """Nothing answers on the socket (no engine, engine down, no permission)."""


class NotFound(DockerError):
    """No such container, image or exec (HTTP 404)."""


class Conflict(DockerError):
    """The engine's state forbids it: a name in use, a running container (409)."""


class NotRunning(Conflict):
    """The container is not running (kill, exec)."""


class PullError(DockerError):
    """The image could not be pulled (unknown image, registry unreachable, ...)."""


class PullTimeout(PullError):
    """The pull took longer than its own timeout; the message says how far it got."""


@attrs.frozen
class EngineVersion:
    version: str
    api_version: str
    min_api_version: str
    os: str
    arch: str
    kernel: str


@attrs.frozen
class ContainerSummary:
    """One line of `GET /containers/json`."""

    id: str
    names: tuple[str, ...]
    image: str
    state: str
    status: str
    labels: dict[str, str]


@attrs.frozen
class ExecResult:
    exit_code: int
    output: bytes  # stdout and stderr interleaved as they came


class DockerClient:
    """One connection pool to one engine. Use as `async with DockerClient(path)`."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DockerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ----------------------------------------------------------------- engine

    async def ping(self) -> None:
        """Return if an engine answers; raise `EngineUnavailable` if not."""
        await self._call("GET", "/_ping", "ping", expect_json=False)

    async def version(self) -> EngineVersion:
        data = await self._call("GET", "/version", "version")
        return EngineVersion(
            version=str(data.get("Version", "")), api_version=str(data.get("ApiVersion", "")),
            min_api_version=str(data.get("MinAPIVersion", "")), os=str(data.get("Os", "")),
            arch=str(data.get("Arch", "")), kernel=str(data.get("KernelVersion", "")))

    # ----------------------------------------------------------------- images

    async def inspect_image(self, image: str) -> dict[str, Any]:
        """The engine's document for a local image; `NotFound` if absent."""
        return await self._call("GET", f"/images/{image}/json", f"inspect image {image}")

    async def has_image(self, image: str) -> bool:
        try:
            await self.inspect_image(image)
        except NotFound:
            return False
        return True

    async def pull(self, image: str, on_progress: Callable[[PullProgress], None] | None = None,
                   timeout: float = DEFAULT_PULL_TIMEOUT) -> PullProgress:
        """Pull `image` (default tag `latest`), calling `on_progress` after every
        progress line. Raises `PullError` with the engine's reason, or
        `PullTimeout` after `timeout` seconds whatever the engine is doing."""
        name, tag = split_reference(image)
        progress = PullProgress(image)
        operation = f"pull {image}"
        try:
            async with asyncio.timeout(timeout):
                async with self._stream("POST", "/images/create", operation,
                                        params={"fromImage": name, "tag": tag},
                                        timeout=UNLIMITED) as response:
                    async for line in _json_lines(response, operation):
                        _parse(progress.feed, line, operation)
                        if on_progress is not None:
                            on_progress(progress)
        except TimeoutError:
            raise PullTimeout(operation, f"no image after {timeout:g}s "
                              f"({progress.summary()})") from None
        except EngineUnavailable:
            raise
        except DockerError as exc:  # the engine refused at once: unknown image, ...
            raise PullError(operation, exc.message, exc.status) from None
        if progress.error:
            raise PullError(operation, progress.error)
        return progress

    async def import_image(self, tarball: bytes, repository: str, tag: str = "latest") -> None:
        """Make image `repository:tag` from a root filesystem tarball (what
        `docker import` does): images without a registry, for tests and benchmarks."""
        operation = f"import {repository}:{tag}"
        progress = PullProgress(f"{repository}:{tag}")  # the same lines as a pull
        async with self._stream("POST", "/images/create", operation,
                                params={"fromSrc": "-", "repo": repository, "tag": tag},
                                data=io.BytesIO(tarball),
                                headers={"Content-Type": "application/x-tar"},
                                timeout=aiohttp.ClientTimeout(total=300)) as response:
            async for line in _json_lines(response, operation):
                _parse(progress.feed, line, operation)
        if progress.error:
            raise DockerError(operation, progress.error)

    async def remove_image(self, image: str, force: bool = False) -> None:
        await self._call("DELETE", f"/images/{image}", f"remove image {image}",
                         params={"force": _flag(force)})

    # ------------------------------------------------------------- containers

    async def create(self, body: dict[str, Any], name: str = "") -> str:
        """Create a container from an engine create request; return its id."""
        params = {"name": name} if name else None
        data = await self._call("POST", "/containers/create", f"create {name or 'container'}",
                                params=params, body=body)
        container = _field(data, "Id", "create")
        for warning in data.get("Warnings") or []:
            log.warning("engine on creating %s: %s", name or container, warning)
        return container

    async def start(self, container: str) -> None:
        """Start it; starting a running container is not an error (304)."""
        await self._call("POST", f"/containers/{container}/start", f"start {container}",
                         expect_json=False)

    async def inspect(self, container: str) -> ContainerState:
        data = await self._call("GET", f"/containers/{container}/json", f"inspect {container}")
        return _parse(ContainerState.from_inspect, data, f"inspect {container}")

    async def wait(self, container: str) -> ContainerState:
        """Block until the container is not running; its final state (exit code,
        whether the kernel killed it for memory). No timeout: it lasts as long as
        the container does."""
        operation = f"wait {container}"
        data = await self._call("POST", f"/containers/{container}/wait", operation,
                                params={"condition": "not-running"}, timeout=UNLIMITED)
        try:
            return await self.inspect(container)
        except NotFound:  # removed at once (by someone else): the wait's code is all
            error = data.get("Error") if isinstance(data, dict) else None
            return ContainerState(id=container, status="removed", running=False,
                                  exit_code=int(_field(data, "StatusCode", operation)),
                                  oom_killed=False, labels={}, pid=0,
                                  error=str(error.get("Message", "")) if isinstance(error, dict)
                                  else "")

    async def stop(self, container: str, grace: float) -> None:
        """Ask the container to stop (its stop signal, SIGTERM by default) and
        SIGKILL it after `grace` seconds (the engine counts whole seconds, so the
        grace is rounded up). A stopped container is not an error."""
        seconds = max(0, math.ceil(grace))
        operation = f"stop {container}"
        try:
            await self._call("POST", f"/containers/{container}/stop", operation,
                             params={"t": str(seconds)}, expect_json=False,
                             timeout=aiohttp.ClientTimeout(total=seconds + STOP_SLACK))
        except TimeoutError:
            log.warning("engine did not stop %s within %ss; killing it", container,
                        seconds + STOP_SLACK)
            try:
                await self.kill(container, "KILL")
            except NotRunning:
                pass

    async def kill(self, container: str, signal: str = "KILL") -> None:
        """Send `signal` (a name such as TERM or KILL) to the container's first
        process. Raises `NotRunning` if it is not running."""
        await self._call("POST", f"/containers/{container}/kill", f"kill {container}",
                         params={"signal": signal}, expect_json=False)

    async def remove(self, container: str, force: bool = False) -> None:
        """Remove it and its anonymous volumes; `force` kills it first."""
        await self._call("DELETE", f"/containers/{container}", f"remove {container}",
                         params={"force": _flag(force), "v": "1"}, expect_json=False)

    async def list(self, labels: dict[str, str] | None = None,
                   include_stopped: bool = True) -> list[ContainerSummary]:
        """Containers carrying every label in `labels`."""
        params = {"all": _flag(include_stopped)}
        if labels:
            params["filters"] = json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})
        data = await self._call("GET", "/containers/json", "list containers", params=params)
        return [ContainerSummary(
            id=str(c.get("Id", "")), names=tuple(n.lstrip("/") for n in c.get("Names") or ()),
            image=str(c.get("Image", "")), state=str(c.get("State", "")),
            status=str(c.get("Status", "")),
            labels={str(k): str(v) for k, v in (c.get("Labels") or {}).items()})
            for c in data if isinstance(c, dict)]

    async def stats(self, container: str) -> ContainerUsage:
        """One sample of its usage, at once (`one-shot`: no second sample)."""
        operation = f"stats {container}"
        data = await self._call("GET", f"/containers/{container}/stats", operation,
                                params={"stream": "0", "one-shot": "1"})
        return _parse(ContainerUsage.from_stats, data, operation)

    async def logs(self, container: str, follow: bool = True,
                   since_nanos: int = 0) -> AsyncIterator[tuple[int, int, bytes]]:
        """(stream, nanoseconds, bytes) for each log frame, oldest first; with
        `follow`, until the container stops. Frames at or before `since_nanos`
        are skipped (they were seen before)."""
        operation = f"logs {container}"
        params = {"follow": _flag(follow), "stdout": "1", "stderr": "1", "timestamps": "1"}
        if since_nanos:
            params["since"] = since_argument(since_nanos)
        async with self._stream("GET", f"/containers/{container}/logs", operation,
                                params=params, timeout=UNLIMITED) as response:
            demuxer = LogDemuxer()
            async for chunk in _chunks(response, operation):
                for stream, payload in _parse(demuxer.feed, chunk, operation):
                    nanos, data = _parse(split_timestamp, payload, operation)
                    if nanos > since_nanos:
                        yield stream, nanos, data

    async def exec(self, container: str, argv: list[str], timeout: float) -> ExecResult:
        """Run `argv` inside the running container (a COMMAND health check);
        its exit code and output. `asyncio.TimeoutError` after `timeout`."""
        operation = f"exec in {container}"
        created = await self._call("POST", f"/containers/{container}/exec", operation, body={
            "AttachStdout": True, "AttachStderr": True, "Tty": False, "Cmd": argv})
        exec_id = _field(created, "Id", operation)
        output = bytearray()
        async with asyncio.timeout(timeout):
            async with self._stream("POST", f"/exec/{exec_id}/start", operation,
                                    body={"Detach": False, "Tty": False},
                                    timeout=UNLIMITED) as response:
                demuxer = LogDemuxer()
                async for chunk in _chunks(response, operation):
                    for _, payload in _parse(demuxer.feed, chunk, operation):
                        output += payload
            done = await self._call("GET", f"/exec/{exec_id}/json", operation)
        return ExecResult(exit_code=int(_field(done, "ExitCode", operation)),
                          output=bytes(output))

    # --------------------------------------------------------------- plumbing

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_path),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout))
        return self._session

    async def _call(self, method: str, path: str, operation: str, *,
                    params: dict[str, str] | None = None, body: Any = None,
                    expect_json: bool = True,
                    timeout: aiohttp.ClientTimeout | None = None) -> Any:
        async with self._stream(method, path, operation, params=params, body=body,
                                timeout=timeout) as response:
            if response.status == 304 or not expect_json:
                await response.read()
                return None
            try:
                return await response.json(content_type=None)
            except (ValueError, aiohttp.ContentTypeError) as exc:
                raise DockerError(operation, f"engine sent no JSON: {exc}") from None

    def _stream(self, method: str, path: str, operation: str, *,
                params: dict[str, str] | None = None, body: Any = None, data: Any = None,
                headers: dict[str, str] | None = None,
                timeout: aiohttp.ClientTimeout | None = None) -> _Response:
        return _Response(self, method, path, operation, params, body, data, headers, timeout)


class _Response:
    """`async with`: the response once its status says success, else the error."""

    def __init__(self, client: DockerClient, method: str, path: str, operation: str,
                 params: dict[str, str] | None, body: Any, data: Any,
                 headers: dict[str, str] | None, timeout: aiohttp.ClientTimeout | None) -> None:
        self._args = (client, method, path, operation, params, body, data, headers, timeout)
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        client, method, path, operation, params, body, data, headers, timeout = self._args
        url = f"http://docker/v{API_VERSION}{path}"
        kwargs: dict[str, Any] = {"params": params, "headers": headers}
        if body is not None:
            kwargs["json"] = body
        elif data is not None:
            kwargs["data"] = data
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            response = await client._client().request(method, url, **kwargs)
        except (aiohttp.ClientConnectorError, FileNotFoundError, PermissionError,
                ConnectionError) as exc:
            raise EngineUnavailable(operation, f"no Docker Engine answers on "
                                    f"{client.socket_path}: {exc}") from None
        except asyncio.TimeoutError:
            raise TimeoutError(f"{operation}: the engine did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise DockerError(operation, f"the engine's connection failed: {exc}") from None
        if response.status >= 400:
            message = await _error_message(response)
            response.release()
            raise _error(operation, response.status, message)
        self._response = response
        return response

    async def __aexit__(self, *exc: object) -> None:
        if self._response is not None:
            self._response.release()


async def _error_message(response: aiohttp.ClientResponse) -> str:
    text = (await response.read()).decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except ValueError:
        return text.strip() or response.reason or f"HTTP {response.status}"
    if isinstance(document, dict) and document.get("message"):
        return str(document["message"])
    return text.strip()


def _error(operation: str, status: int, message: str) -> DockerError:
    if status == 404:
        return NotFound(operation, message, status)
    if status == 409:
        kind = NotRunning if "not running" in message.lower() else Conflict
        return kind(operation, message, status)
    return DockerError(operation, message, status)


async def _chunks(response: aiohttp.ClientResponse, operation: str) -> AsyncIterator[bytes]:
    """The body as it arrives; a connection lost midway is a `DockerError`."""
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    except aiohttp.ClientError as exc:
        raise DockerError(operation, f"the engine's stream broke off: {exc}") from None


async def _json_lines(response: aiohttp.ClientResponse, operation: str) -> AsyncIterator[Any]:
    buffer = b""
    async for chunk in _chunks(response, operation):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        if len(buffer) > MAX_JSON_LINE:
            raise DockerError(operation, f"engine sent a line longer than {MAX_JSON_LINE} bytes")
        for line in lines:
            if line.strip():
                yield _json_line(line.strip(), operation)
    if buffer.strip():
        yield _json_line(buffer.strip(), operation)


def _json_line(line: bytes, operation: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        raise DockerError(operation, f"engine sent a line that is not JSON: "
                          f"{line[:80]!r}") from None


def _parse(read: Callable[[Any], Any], data: Any, operation: str) -> Any:
    try:
        return read(data)
    except WireError as exc:
        raise DockerError(operation, f"engine sent what its API does not: {exc}") from None


def _field(data: Any, key: str, operation: str) -> str:
    """`data[key]` of an engine answer, as text; its absence is a `DockerError`."""
    if not isinstance(data, dict) or data.get(key) is None:
        raise DockerError(operation, f"engine answer lacks {key}: {str(data)[:80]}")
    return str(data[key])


def _flag(value: bool) -> str:
    return "1" if value else "0"


def split_reference(image: str) -> tuple[str, str]:
    """('registry/name', 'tag or digest') of an image reference; tag `latest` when
    none is given (an empty tag would make the engine pull every tag)."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:  # a colon before the last slash is a registry's port
        return image[:colon], image[colon + 1:]
    return image, "latest"


class LogCopier:
    """Copies a container's stdout and stderr into two files (the sandbox's)
    until the container stops. `last_nanos` is the time of the last frame
    written: checkpoint it, and a copier started again after an agent restart
    with `since_nanos=last_nanos` neither loses nor repeats what the engine kept."""

    def __init__(self, client: DockerClient, container: str, stdout_path: str,
                 stderr_path: str, since_nanos: int = 0) -> None:
        self.client = client
        self.container = container
        self.paths = {STDOUT: stdout_path, STDERR: stderr_path}
        self.last_nanos = since_nanos
        self.bytes_written = 0

    async def run(self) -> None:
        with open(self.paths[STDOUT], "ab") as out, open(self.paths[STDERR], "ab") as err:
            files = {STDOUT: out, STDERR: err}
            async for stream, nanos, data in self.client.logs(
                    self.container, follow=True, since_nanos=self.last_nanos):
                target = files.get(stream)
                if target is None:
                    continue
                # Appends to local files: small and buffered by the kernel, so
                # written on the loop; flushed at once so /files shows them.
                target.write(data)
                target.flush()
                self.bytes_written += len(data)
                self.last_nanos = nanos
