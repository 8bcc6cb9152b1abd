"""The agent's asyncio shell: sockets, processes, timers and HTTP around `AgentState`.

Everything that happens -- a frame from the master or an executor, a process exit,
a timer, a detected master -- becomes an event on one queue; one task feeds the
queue to `AgentState.handle` and performs the effects in order. Decisions live in
the core; this file only translates.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Hashable

import attrs
from aiohttp import web

import agent
from agent.containerizer import Containerizer, LaunchError
from agent.http import make_app
from agent.state import (
    AgentConfig, AgentState, ConnectMaster, DetectMaster, Event, ExecutorLaunchFailed,
    ExecutorMessage, ExecutorProcessExited, Exit, Invalid, KillExecutor, LaunchExecutor,
    MasterDetected, MasterMessage, SendMaster, Shutdown,
)
from dyad.clock import Clock, SystemClock
from dyad.detector import Detector, make_detector
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.transport import Dealer, Inbound, Router

log = logging.getLogger(__name__)

FAREWELL_LINGER_MS = 1000


def executor_base_env() -> dict[str, str]:
    """The agent's environment, with this source tree first on PYTHONPATH: the
    command executor (`python -m frameworks.executors.command`) runs in its sandbox
    and must import the same code the agent runs, installed or not."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(agent.__file__)))
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    return env


class AgentServer:
    """One agent. `config.port`/`config.executor_port` may be 0 (any free port);
    after `start()`, `self.config` holds the bound ones. `master` is the master's
    HTTP address (`host:5050`), unless a `detector` is given."""

    def __init__(self, config: AgentConfig, master: str = "", *,
                 detector: Detector | None = None, clock: Clock | None = None) -> None:
        if detector is None and not master:
            raise ValueError("need a master address or a detector")
        self.config = config
        self._detector = detector or make_detector(master)
        self._clock = clock or SystemClock()
        self.state = AgentState(config)
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._detecting: asyncio.Task[None] | None = None
        self._router: Router | None = None
        self._dealer: Dealer | None = None
        self._runner: web.AppRunner | None = None
        self._containerizer = Containerizer(self._on_process_exit, executor_base_env())
        self._exited = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping: asyncio.Future[None] | None = None

    @property
    def http_url(self) -> str:
        return f"http://{self.config.ip}:{self.config.port}"

    @property
    def executor_endpoint(self) -> str:
        return self.config.executor_endpoint

    @property
    def executor_pids(self) -> list[int]:
        return self._containerizer.pids

    async def start(self) -> None:
        os.makedirs(self.config.work_dir, exist_ok=True)
        self._router = Router()
        executor_port = self._router.bind(self.config.ip, self.config.executor_port)
        self._runner = web.AppRunner(make_app(self, self.config.work_dir),
                                     access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.ip, self.config.port).start()
        http_port = self._runner.addresses[0][1]
        self.config = attrs.evolve(self.config, port=http_port, executor_port=executor_port)
        self.state = AgentState(self.config)
        self._dealer = Dealer()
        self._tasks = [asyncio.create_task(self._run_core(), name="agent-core"),
                       asyncio.create_task(self._receive(self._dealer, "master")),
                       asyncio.create_task(self._receive(self._router, "executor"))]
        self._detect()
        log.info("agent on %s, executors at %s", self.http_url, self.executor_endpoint)

    async def stop(self) -> None:
        """Shut down every executor (grace, SIGTERM, SIGKILL), then close. Idempotent."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _stop(self) -> None:
        if self._tasks:
            self._events.put_nowait(Shutdown())
            c = self.config
            patience = c.executor_shutdown_grace_period + c.executor_kill_delay + c.shutdown_slack
            try:
                await asyncio.wait_for(self._exited.wait(), patience + 5)
            except asyncio.TimeoutError:
                log.error("executors did not stop in time; killing what is left")
        self._containerizer.kill_all()
        try:
            await asyncio.wait_for(self._containerizer.wait_all(), 5)
        except asyncio.TimeoutError:
            log.error("executor processes %s did not die", self._containerizer.pids)
        tasks = [*self._tasks, *filter(None, [self._detecting])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._router is not None:
            self._router.close()
        if self._dealer is not None:
            # The last ExecutorExited and status updates may still be queued.
            self._dealer.close(linger_ms=FAREWELL_LINGER_MS)
        await self._detector.close()
        self._stopped.set()

    # ------------------------------------------------------------------- events

    async def _run_core(self) -> None:
        while True:
            event = await self._events.get()
            try:
                effects = self.state.handle(event, self._clock.now())
            except Exception:  # a core bug must not take the agent down; it is counted
                self.state.counters["handler_errors"] += 1
                log.exception("agent core failed on %r", event)
                continue
            for effect in effects:
                try:
                    await self._perform(effect)
                except Exception:
                    self.state.counters["effect_errors"] += 1
                    log.exception("performing %r failed", effect)

    async def _receive(self, sock: Dealer | Router, source: str) -> None:
        while True:
            inbound: Inbound = await sock.recv()
            peer = inbound.identity.hex()
            if inbound.message is not None:
                self._events.put_nowait(MasterMessage(inbound.message) if source == "master"
                                        else ExecutorMessage(peer, inbound.message))
            else:
                assert inbound.error is not None
                self._events.put_nowait(Invalid(source, peer, inbound.error))

    def _on_process_exit(self, framework_id: str, executor_id: str, run_id: str,
                         status: int) -> None:
        self._events.put_nowait(ExecutorProcessExited(framework_id, executor_id, run_id, status))

    def _detect(self) -> None:
        if self._detecting is not None and not self._detecting.done():
            return
        self._detecting = asyncio.create_task(self._detect_once())

    async def _detect_once(self) -> None:
        info = await self._detector.detect()
        log.info("master detected at %s", info.zmq_endpoint)
        self._events.put_nowait(MasterDetected(info))

    def _timer_due(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self._events.put_nowait(TimerFired(key))

    # ------------------------------------------------------------------ effects

    async def _perform(self, effect: object) -> None:
        assert self._dealer is not None and self._router is not None
        if isinstance(effect, SendMaster):
            await self._dealer.send(effect.message)
        elif isinstance(effect, Send):
            await self._router.send(bytes.fromhex(effect.to), effect.message)
        elif isinstance(effect, ArmTimer):
            old = self._timers.pop(effect.key, None)
            if old is not None:
                old.cancel()
            delay = max(0.0, effect.at - self._clock.now())
            self._timers[effect.key] = asyncio.get_running_loop().call_later(
                delay, self._timer_due, effect.key)
        elif isinstance(effect, CancelTimer):
            handle = self._timers.pop(effect.key, None)
            if handle is not None:
                handle.cancel()
        elif isinstance(effect, LaunchExecutor):
            try:
                await self._containerizer.launch(effect)
            except LaunchError as exc:
                log.warning("could not launch executor %s: %s", effect.executor_id, exc)
                self._events.put_nowait(ExecutorLaunchFailed(
                    effect.framework_id, effect.executor_id, effect.run_id, str(exc)))
        elif isinstance(effect, KillExecutor):
            self._containerizer.kill(effect.framework_id, effect.executor_id, effect.run_id,
                                     effect.signal)
        elif isinstance(effect, ConnectMaster):
            self._dealer.connect(effect.endpoint)
        elif isinstance(effect, DetectMaster):
            self._detect()
        elif isinstance(effect, Exit):
            self._exited.set()
        else:
            raise TypeError(f"unknown effect {effect!r}")
