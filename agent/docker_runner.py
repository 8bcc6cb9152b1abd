"""The Docker containerizer's shell: the agent's runs from images on a real engine.

`DockerRunner` carries out the container effects of the core
(`agent.containers_core`) and turns what the engine does into its events: a
launch fetches the run's URIs, pulls the image when it is missing (or
`force_pull`) under its own timeout, reporting progress at most every
`PROGRESS_INTERVAL`, creates and starts the container (`agent.container_spec`);
a watcher then copies the container's stdout and stderr into the sandbox
(`LogCopier`) and waits for its end. Kills are signals through the engine
(the core times SIGTERM -> SIGKILL), usage is `stats`, COMMAND health checks run
inside the container with `exec`. After an agent restart `recover` finds the
agent's containers by their labels, reattaches to the ones it knows and removes
the rest.

Everything that can fail here is reported as an event with the engine's words;
nothing raises into the agent's loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import attrs

from agent.checkpoint import SavedAgent
from agent.container_runs import Listed, recover
from agent.container_spec import (
    AGENT_LABEL,
    ContainerSpecError,
    DockerConfig,
    container_name,
    create_request,
)
from agent.containers_core import (
    ContainerExited,
    ContainerLaunchFailed,
    ContainerLogPosition,
    ContainerStarted,
    ImagePullProgress,
    LaunchContainer,
)
from agent.docker import DockerClient, DockerError, LogCopier, NotFound, NotRunning
from agent.docker_wire import ContainerState, PullProgress
from agent.fetcher import Fetcher, FetchError
from agent.health import HealthCheckResult, RunHealthCheck
from agent.model import RunKey, RunSample
from dyad.messages import HealthCheckType, Reason

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 2.0  # at most one TASK_STARTING about a pull this often
LOG_DRAIN_TIMEOUT = 5.0  # after the exit: how long the last log lines may take
RETRY_DELAY = 1.0  # the engine's connection broke: wait, then look again


@attrs.define
class _Container:
    id: str
    copier: LogCopier
    watcher: asyncio.Task[None] | None = None
    reported_nanos: int = 0


class DockerRunner:
    """The runs of one agent on one engine; `report(event)` hands events to the core."""

    def __init__(self, client: DockerClient, config: DockerConfig, fetcher: Fetcher,
                 report: Callable[[Any], None], pull_timeout: float) -> None:
        self.client = client
        self.config = config
        self.fetcher = fetcher
        self.pull_timeout = pull_timeout
        self._report = report
        self._runs: dict[RunKey, _Container] = {}
        self._launching: dict[RunKey, asyncio.Task[None]] = {}
        self._jobs: set[asyncio.Task[Any]] = set()
        self._removals: set[asyncio.Task[Any]] = set()  # finished before closing

    def knows(self, key: RunKey) -> bool:
        return key in self._runs or key in self._launching

    def container_id(self, key: RunKey) -> str | None:
        run = self._runs.get(key)
        return run.id if run else None

    # ---------------------------------------------------------------- effects

    def launch(self, effect: LaunchContainer) -> None:
        run = effect.run
        key = (run.framework_id, run.executor_id, run.run_id)
        self._launching[key] = self._spawn(self._launch(key, effect))

    async def _launch(self, key: RunKey, effect: LaunchContainer) -> None:
        run = effect.run
        created: str | None = None
        try:
            try:
                await self.fetcher.fetch(effect.uris, run.sandbox_dir)
                await asyncio.to_thread(_touch_logs, run.sandbox_dir)
                body = create_request(run, self.config)
            except FetchError as exc:
                self._report(ContainerLaunchFailed(*key, str(exc), Reason.FETCH_FAILED))
                return
            except ContainerSpecError as exc:
                self._report(ContainerLaunchFailed(*key, str(exc), Reason.TASK_INVALID))
                return
            docker = run.container.docker
            assert docker is not None  # create_request refused it otherwise
            if docker.force_pull or not await self.client.has_image(docker.image):
                await self.client.pull(docker.image, self._progress(key),
                                       timeout=self.pull_timeout)
            created = await self.client.create(body, container_name(run.agent_id, run.run_id))
            await self.client.start(created)
        except asyncio.CancelledError:
            await self._discard(created)
            self._report(ContainerLaunchFailed(*key, "killed while launching"))
            return
        except DockerError as exc:
            log.warning("container for %s: %s", run.executor_id, exc)
            await self._discard(created)
            self._report(ContainerLaunchFailed(*key, str(exc)))
            return
        finally:
            self._launching.pop(key, None)
        self._attach(key, created, run.sandbox_dir, 0)
        log.info("started container %s for %s of framework %s", created[:12], run.executor_id,
                 run.framework_id)
        self._report(ContainerStarted(*key, created))

    def _progress(self, key: RunKey) -> Callable[[PullProgress], None]:
        last = [-PROGRESS_INTERVAL]

        def on_progress(progress: PullProgress) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL:
                last[0] = now
                self._report(ImagePullProgress(*key, progress.summary()))
        return on_progress

    def kill(self, key: RunKey, sig: str) -> bool:
        """Signal the run's container (or abandon its launch); False if the run
        is not one of ours."""
        launching = self._launching.get(key)
        if launching is not None:
            launching.cancel()
            return True
        run = self._runs.get(key)
        if run is None:
            return False
        self._spawn(self._signal(run.id, sig))
        return True

    async def _signal(self, container: str, sig: str) -> None:
        try:
            await self.client.kill(container, sig)
        except (NotRunning, NotFound):
            pass  # ending anyway: the watcher reports how
        except DockerError as exc:
            log.warning("could not send SIG%s to container %s: %s", sig, container[:12], exc)

    def remove(self, key: RunKey) -> None:
        run = self._runs.pop(key, None)
        if run is not None:
            removal = self._spawn(self._discard(run.id))
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)

    async def _discard(self, container: str | None) -> None:
        if container is None:
            return
        try:
            await self.client.remove(container, force=True)
        except NotFound:
            pass
        except DockerError as exc:
            log.warning("could not remove container %s: %s", container[:12], exc)

    # --------------------------------------------------------------- watching

    def _attach(self, key: RunKey, container: str, sandbox: str, since_nanos: int) -> None:
        copier = LogCopier(self.client, container, os.path.join(sandbox, "stdout"),
                           os.path.join(sandbox, "stderr"), since_nanos=since_nanos)
        run = self._runs[key] = _Container(container, copier, reported_nanos=since_nanos)
        run.watcher = self._spawn(self._watch(key, run))

    async def _watch(self, key: RunKey, run: _Container) -> None:
        copying = asyncio.create_task(self._copy(run))
        try:
            state = await self._wait(run.id)
            try:
                await asyncio.wait_for(asyncio.shield(copying), LOG_DRAIN_TIMEOUT)
            except TimeoutError:
                log.warning("logs of container %s still flowing %gs after its exit",
                            run.id[:12], LOG_DRAIN_TIMEOUT)
        finally:
            copying.cancel()
        self._report_position(key, run)
        self._report(ContainerExited(*key, state))

    async def _copy(self, run: _Container) -> None:
        """Follow the logs until the container stops; a broken stream resumes
        where it broke off."""
        while True:
            try:
                await run.copier.run()
                return
            except (DockerError, OSError) as exc:
                log.warning("copying logs of container %s: %s", run.id[:12], exc)
            await asyncio.sleep(RETRY_DELAY)

    async def _wait(self, container: str) -> ContainerState:
        while True:
            try:
                return await self.client.wait(container)
            except NotFound:
                return ContainerState(id=container, status="removed", running=False,
                                      exit_code=-1, oom_killed=False, pid=0, labels={},
                                      error="the container was removed behind the "
                                            "agent's back")
            except DockerError as exc:
                log.warning("waiting for container %s: %s", container[:12], exc)
            await asyncio.sleep(RETRY_DELAY)

    def _report_position(self, key: RunKey, run: _Container) -> None:
        if run.copier.last_nanos > run.reported_nanos:
            run.reported_nanos = run.copier.last_nanos
            self._report(ContainerLogPosition(*key, run.reported_nanos))

    # ------------------------------------------------------------ observation

    async def sample_all(self) -> list[RunSample]:
        """One usage sample per running container; log positions go to the core."""
        samples = []
        for key, run in list(self._runs.items()):
            self._report_position(key, run)
            try:
                usage = await self.client.stats(run.id)
            except DockerError:
                continue  # stopped or removed since: its exit is reported
            samples.append(RunSample(
                *key, timestamp=time.time(), cpus_user_time=usage.cpus_user_time,
                cpus_system_time=usage.cpus_system_time, mem_rss_bytes=usage.mem_bytes,
                processes=usage.processes, cpus_nr_throttled=usage.cpus_nr_throttled,
                cpus_throttled_time=usage.cpus_throttled_time,
                mem_peak_bytes=usage.mem_peak_bytes))
        return samples

    async def probe(self, key: RunKey, effect: RunHealthCheck) -> HealthCheckResult | None:
        """A COMMAND check of a container run, run inside it; None for a check
        that is not the container's to run (HTTP and TCP go to the host port)."""
        run = self._runs.get(key)
        command = effect.check.command
        if run is None or effect.check.type != HealthCheckType.COMMAND or command is None:
            return None
        argv = command.argv if command.argv is not None else ["/bin/sh", "-c",
                                                               command.shell or ""]
        timeout = effect.check.timeout or None
        try:
            result = await self.client.exec(run.id, argv, timeout=timeout or 1e9)
        except TimeoutError:
            return HealthCheckResult(effect.key, False, f"no answer within {timeout:g}s")
        except DockerError as exc:
            return HealthCheckResult(effect.key, False, f"cannot run in the container: {exc}")
        if result.exit_code == 0:
            return HealthCheckResult(effect.key, True, "exit status 0")
        last = result.output.decode(errors="replace").strip().splitlines()[-1:]
        return HealthCheckResult(effect.key, False, f"exit status {result.exit_code}"
                                 + (f": {last[0]}" if last else ""))

    # --------------------------------------------------------------- recovery

    async def recover(self, saved: SavedAgent) -> tuple[frozenset[RunKey], dict[RunKey, str]]:
        """Find the agent's containers again: reattach to those of known runs
        (running or stopped: a stopped one reports its exit at once), remove the
        others. The runs found and their containers."""
        agent_id = saved.agent_id or ""
        if not agent_id:
            return frozenset(), {}
        runs = {(e.framework_id, e.info.executor_id, e.run_id): e for e in saved.executors
                if e.info.container is not None}
        listed = [Listed(c.id, c.labels, c.state == "running")
                  for c in await self.client.list(labels={AGENT_LABEL: agent_id})]
        found = recover(agent_id, {key: e.container_id for key, e in runs.items()}, listed)
        for orphan in found.orphans:
            log.warning("removing container %s: no run of this agent knows it", orphan[:12])
            await self._discard(orphan)
        containers = dict((*found.adopt, *found.ended))
        for key, container in containers.items():
            self._attach(key, container, runs[key].directory, runs[key].log_since_nanos)
        log.info("containers: %d reattached, %d stopped while the agent was away, "
                 "%d vanished, %d orphans removed", len(found.adopt), len(found.ended),
                 len(found.vanished), len(found.orphans))
        return frozenset(containers), containers

    # -------------------------------------------------------------- lifecycle

    async def kill_all(self) -> None:
        """Last resort when the agent stops: SIGKILL every container."""
        for key in list(self._launching):
            self.kill(key, "KILL")
        await asyncio.gather(*(self._signal(run.id, "KILL") for run in self._runs.values()))

    async def close(self) -> None:
        """Stop watching (removals under way finish first) and disconnect."""
        if self._removals:
            await asyncio.wait(list(self._removals), timeout=10)
        jobs = list(self._jobs)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self.client.close()

    def _spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        job = asyncio.create_task(coroutine)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return job


def _touch_logs(sandbox: str) -> None:
    """The sandbox's stdout and stderr exist from the start, as for process tasks."""
    for name in ("stdout", "stderr"):
        with open(os.path.join(sandbox, name), "ab"):
            pass


async def connect(socket_path: str, asked: tuple[str, ...] | None) -> tuple[
        DockerClient | None, tuple[str, ...]]:
    """The engine client and the containerizers to use. `asked` None: docker too
    when an engine answers on `socket_path`, else process only (logged). Raises
    `EngineUnavailable` when docker is asked for and no engine answers."""
    if asked is not None and "docker" not in asked:
        return None, asked
    client = DockerClient(socket_path)
    try:
        await client.ping()
    except DockerError as exc:
        await client.close()
        if asked is not None:
            raise
        log.info("containerizers: process only (%s)", exc.message)
        return None, ("process",)
    version = await client.version()
    log.info("containerizers: process,docker (Docker Engine %s, API %s on %s)",
             version.version, version.api_version, socket_path)
    return client, tuple(asked or ("process", "docker"))
