"""The master's asyncio shell: sockets and timers around the pure `MasterState`.

One task receives frames from the ZMQ ROUTER and turns them into events; timer
callbacks turn due timers into events; one task takes events off a queue in
order, hands each to `MasterState.handle` and performs the effects. Because a
single task does all the handling, the core never sees concurrency.

This is the only place where an unexpected exception is caught wholesale: it is
logged, counted (`master/internal_errors`) and the master keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Hashable
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import web

from dyad.clock import Clock, SystemClock
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.ids import IdGenerator
from dyad.messages import Address, MasterInfo
from dyad.transport import Router
from master.http import make_app
from master.state import (
    ALLOCATE, VERSION, AllocationTimed, Event, Invalid, MasterConfig, MasterState, Received,
)

log = logging.getLogger(__name__)


class MasterServer:
    """A running master: ZMQ ROUTER on `zmq_port`, HTTP on `port` (0 = any free
    port; `info` reports the real ones once `start()` returns)."""

    def __init__(self, *, ip: str = "127.0.0.1", hostname: str | None = None,
                 port: int = 5050, zmq_port: int = 5055, config: MasterConfig | None = None,
                 clock: Clock | None = None, ids: IdGenerator | None = None,
                 context: zmq.asyncio.Context | None = None) -> None:
        self.ip = ip
        self.hostname = hostname or socket.gethostname()
        self.config = config or MasterConfig()
        self._port = port
        self._zmq_port = zmq_port
        self._clock = clock or SystemClock()
        self._ids = ids or IdGenerator()
        self._context = context
        self._state: MasterState | None = None
        self._router: Router | None = None
        self._runner: web.AppRunner | None = None
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._internal_errors = 0
        self._dropped_sends = 0

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        router = Router(self._context)
        try:
            zmq_port = router.bind(self.ip, self._zmq_port)
            http_socket = socket.create_server((self.ip, self._port))
        except (OSError, zmq.ZMQError):
            router.close()
            raise
        port = http_socket.getsockname()[1]
        info = MasterInfo(id=self._ids.prefix, hostname=self.hostname, ip=self.ip, port=port,
                          zmq_port=zmq_port, version=VERSION,
                          address=Address(hostname=self.hostname, ip=self.ip, port=port))
        self._router = router
        self._state = MasterState(self.config, info, self._ids, start_time=self._clock.now())
        self._runner = web.AppRunner(make_app(self), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, http_socket).start()
        self._tasks = [asyncio.create_task(self._receive(), name="master-receive"),
                       asyncio.create_task(self._process(), name="master-process")]
        log.info("master %s up: http %s, zmq %s", info.id, info.http_url, info.zmq_endpoint)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._router is not None:
            self._router.close()
            self._router = None

    # --------------------------------------------------------------- HTTP view

    @property
    def state(self) -> MasterState:
        if self._state is None:
            raise RuntimeError("the master has not started")
        return self._state

    @property
    def info(self) -> MasterInfo:
        return self.state.info

    def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()

    def metrics(self) -> dict[str, float]:
        result = self.state.metrics()
        result["master/internal_errors"] = self._internal_errors
        result["master/dropped_sends"] = self._dropped_sends
        return result

    # ----------------------------------------------------------------- loops

    async def _receive(self) -> None:
        assert self._router is not None
        while True:
            try:
                inbound = await self._router.recv()
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ENOTSOCK, zmq.ETERM):
                    return  # the socket is gone: we are stopping
                log.error("master receive failed: %s", exc)
                self._internal_errors += 1
                continue
            peer = inbound.identity.hex()
            if inbound.message is not None:
                self._events.put_nowait(Received(peer, inbound.message))
            elif inbound.error is not None:
                log.debug("bad frame from %s: %s", peer, inbound.error.reason)
                self._events.put_nowait(Invalid(peer, inbound.error))

    async def _process(self) -> None:
        while True:
            event = await self._events.get()
            try:
                await self._step(event)
            except Exception:
                log.exception("master failed to handle %r", event)
                self._internal_errors += 1

    async def _step(self, event: Event) -> None:
        started = time.perf_counter()
        effects = self.state.handle(event, self._clock.now())
        if isinstance(event, TimerFired) and event.key == ALLOCATE:
            self._events.put_nowait(AllocationTimed(time.perf_counter() - started))
        for effect in effects:
            await self._perform(effect)

    async def _perform(self, effect: Send | ArmTimer | CancelTimer) -> None:
        if isinstance(effect, Send):
            assert self._router is not None
            try:
                sent = await self._router.send(bytes.fromhex(effect.to), effect.message)
            except zmq.ZMQError as exc:
                log.warning("send of %s to %s failed: %s", effect.message.TYPE, effect.to, exc)
                sent = False
            if not sent:
                self._dropped_sends += 1
        elif isinstance(effect, ArmTimer):
            self._cancel_timer(effect.key)
            loop = asyncio.get_running_loop()
            # Clock time -> loop time: only the distance from now matters.
            delay = max(0.0, effect.at - self._clock.now())
            self._timers[effect.key] = loop.call_later(delay, self._fire, effect.key)
        else:
            self._cancel_timer(effect.key)

    def _cancel_timer(self, key: Hashable) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self._events.put_nowait(TimerFired(key))
