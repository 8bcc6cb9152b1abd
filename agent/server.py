"""The agent's asyncio shell: sockets, processes, timers, disks and HTTP around
`AgentState`.

Everything that happens -- a frame from the master or an executor, a process
start or exit, a timer, a usage sample, a health-check result, a detected master,
an operator's drain -- becomes an event on one queue; one task feeds the queue to
`AgentState.handle` and performs the effects in order. Decisions live in the core;
this file only translates. Work that takes time (fetching, launching, probing)
runs in tasks of its own and reports back as events, so one slow download never
holds up the agent.

On start, a checkpoint left under the work dir by a killed agent is taken back
(`agent.checkpoint`): the same executor port is bound so executors can reconnect,
surviving processes are adopted, and the core recovers before it looks for a
master. A graceful stop shuts every executor down and removes the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections import Counter
from typing import Any, Coroutine, Hashable

import attrs
import zmq
from aiohttp import web

import agent
from agent import access, api_v1, checkpoint, checkpoint_file, gc, volumes
from agent.checkpoint import CheckpointError, Recover, SavedAgent
from agent.containerizer import Containerizer, LaunchError, stop_unrecorded
from agent.containers_core import LaunchContainer, RemoveContainer
from agent.docker import DEFAULT_PULL_TIMEOUT, DEFAULT_SOCKET
from agent.docker_runner import DockerRunner, connect
from agent.fetcher import Fetcher, FetchError, FetcherCache
from agent.health import RunHealthCheck
from agent.http import make_app
from agent.isolation import Isolator, detect
from agent.persistent import CreateVolume, DestroyVolume, MountVolumes
from agent.model import (
    AgentConfig, Checkpoint, ConnectMaster, DetectMaster, Drain, ExecutorLaunchFailed,
    ExecutorMessage, ExecutorProcessExited, ExecutorStarted, Exit, InvalidFrame, KillExecutor,
    LaunchExecutor, MasterDetected, MasterMessage, RunKey, RunSample, Shutdown,
    UpdateLimits, UsageSampled,
)
from agent.probes import probe, probe_host
from agent.state import AgentState, Event
from agent.master_outbox import MasterOutbox
from agent.status_updates import SendMaster
from agent.unique_ids import UniqueIds
from dyad import security
from dyad.auth import (
    DYAD_CURVE_KEY, DYAD_MASTER_KEY, TOKEN_ENV, TOKEN_FILE_ENV, ClientCredentials,
    CredentialsError, HandshakeWatch,
)
from dyad.clock import Clock, SystemClock
from dyad.detector import Detector, LeaderFollower, make_detector
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.messages import Batch, MasterInfo, Reason, Rejected
from dyad.supervision import LogLimiter, Supervisor
from dyad.timers import TimerTable
from dyad.transport import Dealer, Inbound, Router

log = logging.getLogger(__name__)

FAREWELL_LINGER_MS = 1000
LOOP_RESTART_DELAY = 0.5
ERROR_LOG_INTERVAL = 60.0  # seconds: one line per failing peer or loop per minute
CORE_BATCH = 256  # events handled before their effects are performed (`_run_core`)


@attrs.frozen(kw_only=True)
class AgentOptions:
    """How the shell looks after processes and disks (the core never sees these)."""

    cgroups_root: str = "dyad"
    usage_interval: float = 1.0  # sampling, memory enforcement (posix), log rotation
    disk_watch_interval: float = 60.0
    gc_delay: float = 7 * 24 * 3600.0
    gc_disk_headroom: float = 0.1
    log_max_size: int = 10 * 1024 * 1024
    log_keep: int = 3
    fetcher_cache_dir: str = ""  # default: WORK_DIR/cache
    fetcher_cache_size: int = 2 * 1024 * 1024 * 1024
    fetch_timeout: float = 600.0
    fetcher_allowed_paths: tuple[str, ...] = ()  # local URIs only from beneath these
    # Resource kinds the agent measured itself (not given by --resources): on a
    # restart they are taken from the checkpoint, not measured again.
    detected_resources: frozenset[str] = frozenset()
    # None: docker too when an engine answers on `docker_socket` (docs/containers.md)
    containerizers: tuple[str, ...] | None = None
    docker_socket: str = DEFAULT_SOCKET
    docker_pull_timeout: float = DEFAULT_PULL_TIMEOUT
    switch_user: bool = False  # run tasks as the users they name (agent/users.py)


def executor_base_env() -> dict[str, str]:
    """The agent's environment, with this source tree first on PYTHONPATH: the
    command executor (`python -m frameworks.executors.command`) runs in its sandbox
    and must import the same code the agent runs, installed or not."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(agent.__file__)))
    # The agent's own credentials are not its tasks' (runs get keys of their own).
    env = {name: value for name, value in os.environ.items()
           if name not in (DYAD_CURVE_KEY, DYAD_MASTER_KEY, TOKEN_ENV, TOKEN_FILE_ENV)}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    return env


class AgentServer:
    """One agent. `config.port`/`config.executor_port` may be 0 (any free port, or
    the checkpointed ones after a restart); after `start()`, `self.config` holds the
    bound ones. `master` is the master's HTTP address (`host:5050`), unless a
    `detector` is given. `isolator` defaults to what `config.isolation` names."""

    def __init__(self, config: AgentConfig, master: str = "", *,
                 detector: Detector | None = None, clock: Clock | None = None,
                 isolator: Isolator | None = None,
                 options: AgentOptions | None = None,
                 secure: security.ServerSecurity | None = None,
                 client: ClientCredentials | None = None) -> None:
        if detector is None and not master:
            raise ValueError("need a master address or a detector")
        self.config = config
        self.options = options or AgentOptions()
        # `secure`: this agent's HTTP API; `client`: how it reaches the master (and
        # its CURVE keys, with which it also serves its executors).
        self.security = secure or security.ServerSecurity()
        self.client = client or ClientCredentials()
        self.refusals = security.Refusals("agent", log)
        server_keys = self.security.curve or self.client.keys
        self._executor_keys = access.ExecutorKeys(server_keys) if server_keys else None
        self._zap: security.Zap | None = None
        self._master_watch: HandshakeWatch | None = None
        self._detector = detector or make_detector(master, self.client)
        self._clock = clock or SystemClock()
        self._new_id = UniqueIds()
        self.state = AgentState(config, self._new_id)
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._timers = TimerTable(self._clock.now, self._timer_due)
        self.shell_counters: Counter[str] = Counter({
            "agent/sandboxes_removed": 0, "agent/logs_rotated": 0,
            "agent/checkpoints_written": 0, "agent/receive_errors": 0,
            "agent/loop_errors": 0, "agent/loop_crashes": 0, "agent/http_errors": 0,
            "agent/volume_errors": 0, "agent/handler_errors": 0, "agent/effect_errors": 0})
        self._failed = asyncio.Event()
        self._loops = Supervisor(self._give_up, lambda: self.count("agent/loop_crashes"),
                                 logger=log, restart_delay=LOOP_RESTART_DELAY)
        self._errors = LogLimiter(log, interval=ERROR_LOG_INTERVAL)
        self._started = False
        self._jobs: set[asyncio.Task[Any]] = set()  # launches and health checks
        self._fetching: dict[RunKey, asyncio.Task[None]] = {}
        # Follows the leader: a failover reaches the core as MasterDetected as soon
        # as ZooKeeper names the successor, not after 3 missed pings.
        self._leaders = LeaderFollower(self._detector, self._master_detected)
        self._router: Router | None = None
        self._dealer: Dealer | None = None
        self._outbox: MasterOutbox | None = None  # sends to the master, batched
        self._runner: web.AppRunner | None = None
        self._base_env = executor_base_env()
        self.v1_executors = api_v1.ExecutorStreams(
            self._events.put_nowait, lambda: self.state, refused="" if self._executor_keys is None
            else "the v1 executor API has no authentication: off while executors must")
        self._checkpoints = checkpoint_file.Writer(config.work_dir)
        isolator = isolator or detect(config.isolation, self.options.cgroups_root)
        self._containerizer = Containerizer(self._on_process_exit, self._base_env, isolator,
                                            self.options.switch_user, config.work_dir)
        cache_dir = self.options.fetcher_cache_dir or os.path.join(config.work_dir, "cache")
        self.fetcher = Fetcher(FetcherCache(cache_dir, self.options.fetcher_cache_size),
                               self.options.fetch_timeout, self.options.fetcher_allowed_paths)
        self.docker: DockerRunner | None = None
        self._exited = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping: asyncio.Future[None] | None = None

    @property
    def http_url(self) -> str:
        return f"{self.security.scheme}://{self.config.ip}:{self.config.port}"

    @property
    def executor_endpoint(self) -> str:
        return self.config.executor_endpoint

    @property
    def executor_pids(self) -> list[int]:
        return self._containerizer.pids

    @property
    def isolator(self) -> Isolator:
        return self._containerizer.isolator

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Bind, recover, and look for the master. Raises `CheckpointError` when the
        checkpoint cannot be taken over, `OSError`/`zmq.ZMQError` when ports are
        taken."""
        os.makedirs(self.config.work_dir, exist_ok=True)
        saved = await asyncio.to_thread(checkpoint_file.load, self.config.work_dir)
        if saved is not None:
            self.config = checkpoint.with_detected(saved, self.config,
                                                   self.options.detected_resources)
            problem = checkpoint.incompatibility(saved, self.config)
            if problem:
                raise CheckpointError(problem)
        await self._bind(saved)
        await self._connect_docker()
        self.state = AgentState(self.config, self._new_id)
        await asyncio.to_thread(self.fetcher.cache.load)
        pinned = self.client.master_keys[0] if self.client.master_keys else None
        self._dealer = Dealer(curve=self.client.keys, server_key=pinned)
        self._outbox = MasterOutbox(self._dealer.send_frame)
        if self.client.keys is not None:  # say why the master does not answer, if it refuses us
            self._master_watch = HandshakeWatch(
                self._dealer.socket, lambda where, why: self.refusals("by_master", where, why))
        assert self._router is not None
        dealer, router = self._dealer, self._router
        self._loops.loop("core", self._run_core)
        self._loops.loop("master-socket", lambda: self._receive(dealer, "master"))
        self._loops.loop("usage", self._watch_usage)
        self._loops.loop("disk", self._watch_disk)
        self._loops.loop("detector", self._leaders.run)
        self._started = True
        if self.config.command_tasks == "direct":  # its holder, before any task
            await self._containerizer.connect_holder()
        if saved is not None:
            await self._recover(saved)
        # Executors are heard only once `Recover` is queued: a surviving executor's
        # re-registration must reach a core that knows it, not be told to shut down.
        self._loops.loop("executor-socket", lambda: self._receive(router, "executor"))
        self._detect()
        log.info("agent on %s, executors at %s, isolation %s", self.http_url,
                 self.executor_endpoint, self.isolator.name)

    async def _bind(self, saved: SavedAgent | None) -> None:
        """Bind the executor socket and HTTP. Unless pinned, the executor port is a
        free one on a first start and the checkpointed one after a restart, which
        it must be while executors live (they reconnect to it); the HTTP port is
        reused when the operator left it to us, so the master's link to our /files
        holds."""
        executor_port, http_port = self.config.executor_port, self.config.port
        if saved is not None:
            if executor_port == 0:
                executor_port = saved.executor_port
            elif executor_port != saved.executor_port and saved.executors:
                raise CheckpointError(
                    f"executors of agent {saved.agent_id} reconnect to port "
                    f"{saved.executor_port}, not {executor_port}; restart with "
                    f"--executor-port {saved.executor_port}")
            http_port = http_port or saved.port
        self._router = self._executor_router()
        try:
            executor_port = self._router.bind(self.config.ip, executor_port)
        except zmq.ZMQError as exc:
            self._router.close()
            if saved is None or self.config.executor_port:
                raise  # a port the operator chose, or no free port at all
            if saved.executors:
                raise CheckpointError(
                    f"executor port {executor_port} of agent {saved.agent_id} is taken "
                    f"({exc}); its running executors reconnect only there: free it, or "
                    f"remove {checkpoint.meta_dir(self.config.work_dir)} to start afresh"
                ) from None
            log.warning("executor port %d of the last run is taken; using a free one",
                        executor_port)
            self._router = self._executor_router()
            executor_port = self._router.bind(self.config.ip, 0)
        app = make_app(self, self.config.work_dir)
        api_v1.add_routes(app, self.v1_executors)
        security.protect(app, self.security, self.refusals, access.HttpAccess(
            self.security.acls, self.config.work_dir, self.config.hostname,
            lambda: self.state.records))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        tls = self.security.tls
        try:
            await web.TCPSite(self._runner, self.config.ip, http_port, ssl_context=tls).start()
        except OSError:
            if saved is None or self.config.port:
                raise
            log.warning("HTTP port %d of the last run is taken; using a free one", http_port)
            await web.TCPSite(self._runner, self.config.ip, 0, ssl_context=tls).start()
        bound = self._runner.addresses[-1][1]
        self.config = attrs.evolve(self.config, port=bound, executor_port=executor_port,
                                   pid=os.getpid())

    def _executor_router(self) -> Router:
        """With CURVE keys, executors connect with the per-run keys we give them."""
        if self._executor_keys is None:
            return Router()
        if self._zap is None:
            self._zap = security.Zap(self._executor_keys, self.refusals)
        router = Router(self._zap.context, curve=self._executor_keys.agent_keys)
        self._zap.watch(router.socket)
        return router

    async def _connect_docker(self) -> None:
        """Decide the containerizers (raises `EngineUnavailable` when docker is
        asked for and no engine answers)."""
        client, containerizers = await connect(self.options.docker_socket,
                                               self.options.containerizers)
        self.config = attrs.evolve(self.config, containerizers=containerizers)
        if client is not None:
            self.docker = DockerRunner(client, self.config.docker, self.fetcher,
                                       self._events.put_nowait,
                                       self.options.docker_pull_timeout)

    async def _recover(self, saved: SavedAgent) -> None:
        keys = [(e.framework_id, e.info.executor_id, e.run_id) for e in saved.executors]
        await self._containerizer.connect_holder()  # what it knows of direct runs
        alive = frozenset(
            key for key, e in zip(keys, saved.executors)
            if e.pid is not None and e.started is not None
            and self._containerizer.adopt(key, e.pid, e.started, e.host_direct))
        # A direct run that ended while we were away: its holder knows how.
        exits: dict[RunKey, ExecutorProcessExited] = {}
        for key, e in zip(keys, saved.executors):
            if key not in alive and e.host_direct and e.pid is not None \
                    and (found := self._containerizer.ended(key)):
                exits[key] = ExecutorProcessExited(*key, *found)
        # We died as we started these: nobody knows them, so they must go.
        unrecorded = [e.directory for e in saved.executors if e.host_direct and e.pid is None]
        await asyncio.to_thread(stop_unrecorded, unrecorded)
        if self._executor_keys is not None:
            for key, e in zip(keys, saved.executors):
                if key in alive:
                    await asyncio.to_thread(self._executor_keys.recover, key, e.directory)
        for key in set(keys) - alive:  # ended while we were away: nobody removed its cgroup
            await asyncio.to_thread(self.isolator.cleanup, key)
        containers: dict[RunKey, str] = {}
        if self.docker is not None:
            found, containers = await self.docker.recover(saved)
            alive |= found
        log.info("recovering agent %s: %d of %d executors still running", saved.agent_id,
                 len(alive), len(saved.executors))
        self._events.put_nowait(Recover(saved, alive, containers, exits))

    async def stop(self) -> None:
        """Shut down every executor (grace, SIGTERM, SIGKILL), then close. Idempotent."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def drain(self) -> None:
        """Operator call (`POST /drain`): see `AgentState`'s drain."""
        self._events.put_nowait(Drain())

    async def _stop(self) -> None:
        if self._started and "core" not in self._loops.down():
            self._events.put_nowait(Shutdown())
            await self._wait_exited()
        for job in [*self._jobs, *self._fetching.values()]:
            job.cancel()
        self._containerizer.kill_all()
        if self.docker is not None:
            await self.docker.kill_all()
            await self.docker.close()
        try:
            await asyncio.wait_for(self._containerizer.wait_all(), 5)
        except asyncio.TimeoutError:
            log.error("executor processes %s did not die", self._containerizer.pids)
        self._containerizer.close()
        tasks = [*self._loops.tasks, *self._jobs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timers.cancel_all()
        if self._started:  # every executor is gone: a later start is a new agent
            await asyncio.to_thread(checkpoint_file.remove, self.config.work_dir)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._router is not None:
            self._router.close()
        if self._master_watch is not None:
            await self._master_watch.stop()
        if self._dealer is not None:
            # The last ExecutorExited and status updates may still be queued.
            self._dealer.close(linger_ms=FAREWELL_LINGER_MS)
        if self._zap is not None:
            await self._zap.stop()
        await self._detector.close()
        self._stopped.set()

    async def _wait_exited(self) -> None:
        """Wait for the core's `Exit`: its own deadline (the executors' grace periods,
        known once it handled the Shutdown) plus a little, then give up."""
        c = self.config
        fallback = (self._clock.now() + c.executor_shutdown_grace_period
                    + c.executor_kill_delay + c.shutdown_slack)
        while not self._exited.is_set():
            left = (self.state.exit_deadline or fallback) + 5 - self._clock.now()
            if left <= 0:
                log.error("executors did not stop in time; killing what is left")
                return
            try:
                await asyncio.wait_for(self._exited.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                continue

    # ------------------------------------------------------------------- events

    async def _run_core(self) -> None:
        """Handle what is queued in one batch (up to `CORE_BATCH` events), then
        perform the batch's effects in order after a single checkpoint, if any
        event asked for one. A group commit: every effect still follows a written
        state at least as new as the one it depends on, and a flood of events (500
        tasks launched at once) costs a checkpoint per batch, not one per event."""
        while True:
            events = [await self._events.get()]
            while len(events) < CORE_BATCH and not self._events.empty():
                events.append(self._events.get_nowait())
            effects: list[Any] = []
            for event in events:
                try:
                    effects += self.state.handle(event, self._clock.now())
                except Exception:  # a core bug must not take the agent down; it is counted
                    self.shell_counters["agent/handler_errors"] += 1
                    self._errors.exception(("core", type(event)), "agent core failed on %r",
                                           event)
            if any(isinstance(effect, Checkpoint) for effect in effects):
                effects = [Checkpoint(), *(e for e in effects if not isinstance(e, Checkpoint))]
            for effect in effects:
                try:
                    if isinstance(effect, ConnectMaster | DetectMaster | Exit):
                        self._flush_master_sends()  # to the master they were meant for
                    await self._perform(effect)
                except Exception:
                    self.shell_counters["agent/effect_errors"] += 1
                    self._errors.exception(("effect", type(effect)), "performing %r failed",
                                           effect)
            self._flush_master_sends()

    def _flush_master_sends(self) -> None:
        """The batch's sends to the master, in `Batch` frames (`agent.master_outbox`)."""
        try:
            if self._outbox is not None:
                self._outbox.flush()
        except Exception:
            self.shell_counters["agent/effect_errors"] += 1
            self._errors.exception("flush", "sending to the master failed")

    async def _receive(self, sock: Dealer | Router, source: str) -> None:
        """One frame at a time; whatever one frame throws (a decoder that raises
        something other than `MessageError`) costs that frame only: counted,
        logged once a minute per socket, and the loop goes on. The frame was
        consumed by the failed receive, so it cannot come round again."""
        while True:
            try:
                # Awaiting a socket that is ready does not suspend: without this a
                # burst of frames is read whole into the event queue before the
                # core handles one (a fuzz batch grew the agent by 20 MiB that way).
                await asyncio.sleep(0)
                inbound: Inbound = await sock.recv()
                peer = inbound.identity.hex()
                if inbound.message is not None and source == "executor" \
                        and self._executor_keys is not None:
                    refusal = access.registration_refusal(inbound.principal, inbound.message,
                                                          self.state.records)
                    if refusal is not None:
                        self.refusals("forbidden", peer, refusal)
                        await sock.send(inbound.identity, Rejected(
                            reason=refusal, message_type=inbound.message.TYPE))
                        continue
                if source == "master" and isinstance(inbound.message, Batch):
                    if self._outbox is not None:
                        self._outbox.batching = True  # it takes batches: it sends them
                    for message in inbound.message.messages:  # as if each came alone
                        self._events.put_nowait(MasterMessage(message))
                elif inbound.message is not None:
                    self._events.put_nowait(MasterMessage(inbound.message)
                                            if source == "master"
                                            else ExecutorMessage(peer, inbound.message))
                else:
                    assert inbound.error is not None
                    self._events.put_nowait(InvalidFrame(source, peer, inbound.error))
            except zmq.ZMQError:
                raise  # the socket itself is broken: the supervisor restarts the loop
            except Exception:
                self.shell_counters["agent/receive_errors"] += 1
                self._errors.exception(("receive", source),
                                       "a frame on the %s socket could not be received", source)

    def _on_process_exit(self, key: RunKey, status: int, final: RunSample | None,
                         description: str) -> None:
        if final is not None and final.oom:  # the kernel ended it: say why first
            self._events.put_nowait(UsageSampled((final,), tuple(self.fetcher.cache.uris)))
        if self._executor_keys is not None:
            self._executor_keys.forget(key)
        self._events.put_nowait(ExecutorProcessExited(*key, status, description))

    def _detect(self) -> None:
        self._leaders.detect_again()

    def _master_detected(self, info: MasterInfo) -> None:
        log.info("master detected at %s", info.zmq_endpoint)
        if self._outbox is not None:
            self._outbox.new_master()
        if self._dealer is not None and self._dealer.curve:
            try:  # the advertised key, if we pin none or pin it (docs/security.md)
                self._dealer.set_server_key(self.client.master_key(info.curve_key.encode() or None))
            except CredentialsError as exc:
                self.refusals("master_key", info.zmq_endpoint, str(exc))
                return
        self._events.put_nowait(MasterDetected(info))

    def _timer_due(self, key: Hashable) -> None:
        self._events.put_nowait(TimerFired(key))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        job = asyncio.create_task(coroutine)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return job

    # -------------------------------------------------------------- background

    async def _watch_usage(self) -> None:
        """Sample every run (the core enforces memory under posix and reports usage)
        and rotate the logs of live runs."""
        while True:
            await asyncio.sleep(self.options.usage_interval)
            try:
                await self._sample_and_rotate()
            except Exception:  # one bad round (a full disk, a vanished cgroup) only
                self.shell_counters["agent/loop_errors"] += 1
                self._errors.exception("usage", "sampling usage failed")

    async def _sample_and_rotate(self) -> None:
        samples = await self._containerizer.sample_all()
        if self.docker is not None:
            samples += await self.docker.sample_all()
        self._events.put_nowait(UsageSampled(tuple(samples), tuple(self.fetcher.cache.uris)))
        live = [e.directory for f in self.state.frameworks.values()
                for e in f.executors.values()]
        self.shell_counters["agent/logs_rotated"] += await asyncio.to_thread(
            gc.rotate_logs, live, self.options.log_max_size, self.options.log_keep)

    async def _watch_disk(self) -> None:
        while True:
            try:
                await self.collect_garbage()
            except Exception:
                self.shell_counters["agent/loop_errors"] += 1
                self._errors.exception("disk", "collecting garbage failed")
            await asyncio.sleep(self.options.disk_watch_interval)

    async def collect_garbage(self) -> int:
        """Remove finished sandboxes that are due (see `agent.gc`); how many went."""
        work_dir = self.config.work_dir
        sandboxes = await asyncio.to_thread(gc.scan, work_dir)
        disk = await asyncio.to_thread(shutil.disk_usage, work_dir)
        live = {e.directory for f in self.state.frameworks.values() for e in f.executors.values()}
        due = gc.plan(sandboxes, live, self._clock.now(), self.options.gc_delay,
                      disk.used / disk.total, self.options.gc_disk_headroom)
        removed = await asyncio.to_thread(gc.remove, due, work_dir)
        self.shell_counters["agent/sandboxes_removed"] += removed
        return removed

    async def _launch(self, effect: LaunchExecutor) -> None:
        key = (effect.framework_id, effect.executor_id, effect.run_id)
        try:
            # A direct run with nothing to fetch skips a trip to a thread: the
            # containerizer makes its sandbox as it starts it.
            if effect.uris or not effect.held:
                await self.fetcher.fetch(effect.uris, effect.sandbox_dir)
        except FetchError as exc:
            log.warning("executor %s: %s", effect.executor_id, exc)
            self._events.put_nowait(ExecutorLaunchFailed(*key, str(exc), Reason.FETCH_FAILED))
            return
        except asyncio.CancelledError:
            self._events.put_nowait(ExecutorLaunchFailed(*key, "killed while fetching"))
            return
        finally:
            self._fetching.pop(key, None)
        # A direct run (held) has no executor to connect: no keys to hand out.
        if self._executor_keys is not None and not effect.held:
            try:
                env = await asyncio.to_thread(self._executor_keys.issue, key, effect.sandbox_dir)
            except OSError as exc:
                self._events.put_nowait(ExecutorLaunchFailed(
                    *key, f"cannot write the run's CURVE keys: {exc}"))
                return
            effect = attrs.evolve(effect, env={**effect.env, **env})
        try:
            pid, started = await self._containerizer.launch(effect)
        except LaunchError as exc:
            log.warning("could not launch executor %s: %s", effect.executor_id, exc)
            self._events.put_nowait(ExecutorLaunchFailed(*key, str(exc)))
            return
        self._events.put_nowait(ExecutorStarted(*key, pid, started))

    async def _check(self, effect: RunHealthCheck) -> None:
        result = None
        found = self.state.records.find(effect.key.framework_id, effect.key.task_id)
        if self.docker is not None and found is not None:
            result = await self.docker.probe(found[0].key, effect)
        if result is None:
            result = await probe(effect, self._base_env, probe_host(self.config.ip),
                                 self.options.switch_user)
        self._events.put_nowait(result)

    # ------------------------------------------------------------------ effects

    async def _perform(self, effect: object) -> None:
        assert self._dealer is not None and self._router is not None
        if isinstance(effect, SendMaster):
            assert self._outbox is not None
            self._outbox.send(effect.message)
        elif isinstance(effect, Send):
            if not self.v1_executors.deliver(effect.to, effect.message):
                await self._router.send(bytes.fromhex(effect.to), effect.message)
        elif isinstance(effect, Checkpoint):
            saved = self.state.saved()
            await asyncio.to_thread(self._checkpoints.write, saved)
            self._containerizer.checkpointed(saved.executors)
            self.shell_counters["agent/checkpoints_written"] += 1
        elif isinstance(effect, ArmTimer | CancelTimer):
            self._timers.perform(effect)
        elif isinstance(effect, LaunchExecutor):
            key = (effect.framework_id, effect.executor_id, effect.run_id)
            self._fetching[key] = self._spawn(self._launch(effect))
        elif isinstance(effect, KillExecutor):
            key = (effect.framework_id, effect.executor_id, effect.run_id)
            fetching = self._fetching.get(key)
            if fetching is not None:
                fetching.cancel()
            elif self.docker is None or not self.docker.kill(key, effect.signal):
                self._containerizer.kill(key, effect.signal)
        elif isinstance(effect, LaunchContainer | RemoveContainer):
            self._perform_container(effect)
        elif isinstance(effect, UpdateLimits):
            self._containerizer.update(
                (effect.framework_id, effect.executor_id, effect.run_id), effect.limits)
        elif isinstance(effect, RunHealthCheck):
            self._spawn(self._check(effect))
        elif isinstance(effect, ConnectMaster):
            self._dealer.connect(effect.endpoint)
        elif isinstance(effect, DetectMaster):
            self._detect()
        elif isinstance(effect, Exit):
            self._exited.set()
        elif isinstance(effect, CreateVolume | DestroyVolume | MountVolumes):
            await self._volume(effect)
        else:
            raise TypeError(f"unknown effect {effect!r}")

    async def _volume(self, effect: CreateVolume | DestroyVolume | MountVolumes) -> None:
        do = (volumes.create if isinstance(effect, CreateVolume)
              else volumes.destroy if isinstance(effect, DestroyVolume) else volumes.mount)
        try:
            await asyncio.to_thread(do, effect)  # type: ignore[arg-type]
        except volumes.VolumeError as exc:
            self.shell_counters["agent/volume_errors"] += 1
            log.warning("%s", exc)

    def _perform_container(self, effect: LaunchContainer | RemoveContainer) -> None:
        if self.docker is None:  # the core launches containers only with docker on
            log.error("no Docker containerizer for %r", effect)
        elif isinstance(effect, LaunchContainer):
            self.docker.launch(effect)
        else:
            self.docker.remove((effect.framework_id, effect.executor_id, effect.run_id))

    # ------------------------------------------------------------- observation

    def metrics(self) -> dict[str, float]:
        principal_changes = {"agent/auth_failures/principal_changed":
                             self._router.principal_changes} if self._router else {}
        batches = {} if self._outbox is None else {
            "agent/batch_frames_sent": self._outbox.batch_frames_sent,
            "agent/messages_sent_batched": self._outbox.messages_sent_batched}
        return {**self.state.metrics(), **self.fetcher.metrics(), **self.shell_counters,
                **batches,
                **self.v1_executors.metrics(),
                **self.refusals.counts, **principal_changes}

    def dead_loops(self) -> list[str]:
        """The agent's loops not running now (`/health` is 503 while any is)."""
        return self._loops.down()

    def count(self, counter: str) -> None:
        self.shell_counters[counter] += 1

    async def wait_failed(self) -> None:
        """Returns when a loop died too often to restart: the process should exit."""
        await self._failed.wait()

    def _give_up(self, reason: str) -> None:
        log.critical("agent giving up: %s", reason)
        self._failed.set()
