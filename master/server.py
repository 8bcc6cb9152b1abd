"""The master's asyncio shell: sockets, timers, election and registry around the
pure `MasterState`.

One task receives frames from the ZMQ ROUTER and turns them into events; timer
callbacks turn due timers into events; one task takes events off a queue in
order, hands each to `MasterState.handle` and performs the effects. Because a
single task does all the handling, the core never sees concurrency.

Leadership. Standalone (no ZooKeeper), the master leads from the start and keeps
its registry in a file under the work dir. With ZooKeeper it starts as a
*standby*: it binds its ports, serves `/health` and `/state` (saying who leads),
enters the election (`dyad.zk`; who leads, and when a dead leader is proven dead,
is decided in `master.election`, its shell is `master.liveness`) and drops every
frame until it is elected. Once elected it recovers the registry (which fences the
previous leader), builds a fresh `MasterState` from it, and acts only while its
`Lease` on its contender znode is valid; after proving a leader dead it handles
at once but sends nothing until that leader's lease is over. A leader that cannot
confirm its lease stops handling events at once, and gives up for good (`lost`
resolves, `dyad-master` exits non-zero for a supervisor to restart it, as Mesos
does) when the session is LOST, when its contender znode is gone, when the lease
stays unconfirmed past one session timeout, or when a registry write is fenced.
Two masters therefore never both make offers.

This is the only place where an unexpected exception is caught wholesale: it is
logged, counted (`master/internal_errors`) and the master keeps serving.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import socket
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any, cast

import attrs
import zmq
import zmq.asyncio
from aiohttp import web

from dyad import security
from dyad.clock import Clock, SystemClock
from dyad.codec import to_json
from dyad.effects import Send, TimerFired
from dyad.ids import IdGenerator
from dyad.timers import TimerTable
from dyad.messages import BATCH_CAPABILITY, Address, Batch, MasterInfo, RegisterAgent, encode
from dyad.supervision import LogLimiter, Supervisor
from dyad.transport import Router, Undecoded
from dyad.zk import (
    CONNECTED, LOST, SUSPENDED, LeaderWatch, Lease, SessionState, ZkAddress, ZkError,
    ZkSession, create_contender, lease_term,
)
from master.api_v1 import SchedulerStreams, add_routes as add_v1_routes
from master.http import make_app
from master.registry import (
    FileRegistry, Registry, RegistryData, RegistryError, ZooKeeperRegistry, snapshot_of,
)
from master.restore import restore
from master.shard_link import ShardLink
from master.inflow import Inflow
from master.liveness import Campaign, LivenessListener, publish
from master.outflow import Outflow
from master.metrics import LATENCY_BOUNDS, Histogram
from master.operator import INTERNAL, OperatorCall, Reply, Request
from master.model import (
    VERSION, Allocate, AllocationTimed, Effect, Event, InvalidFrame, MasterConfig,
    PersistRegistry, Received,
)
from master.state import MasterState
from master.usage import StoreConfig
from master.usage_api import UsageService
from master.usage_rows import RecordUsage

log = logging.getLogger(__name__)

EARLY_FRAMES_WINDOW = 2.0
"""Seconds. Agents and drivers learn of a new leader from ZooKeeper at the same
moment it does, so their first frames can reach it while it is still reading the
registry, or even before its own watch has fired. A standby keeps what it
received this recently (at most `EARLY_FRAMES_MAX` frames) and handles it once
elected, instead of making every peer wait for its retry."""
EARLY_FRAMES_MAX = 20_000

REGISTRY_BATCH = 0.1
"""Seconds a registry write waits for more changes: every write is the whole
registry, so a burst of a thousand new agents must not become a thousand writes."""

OPERATOR_CALL_TIMEOUT = 10.0
"""Seconds an operator call waits for the core's answer: a leader whose lease is
unconfirmed handles nothing, and the caller must hear so rather than hang."""

RECEIVE_BATCH = 1024
"""Frames taken from the socket per wake-up of the receive loop (at most). They
are decoded later, in turn (master/inflow.py), so reading one costs microseconds."""
PROCESS_BATCH = 256
"""Events handled between two yields to the event loop: few enough that HTTP and
the lease renewals are never starved (256 events take some 10-15 ms), many enough
that a burst does not pay the loop's round trip for every event, and that what
goes to one peer in that time leaves as one frame (master/outflow.py): under a
flood at 10,000 agents, 1.5 frames sent per task against 1.8 with 64."""
SEND_QUEUE = 50_000
"""Frames queued for one peer before a send to it fails (counted in
`master/dropped_sends`, never silently). ZMQ's default (1,000) is below what a
busy framework, reading at its own pace, has in flight."""

MAX_REMEMBERED_PEERS = 200_000
"""Peers whose taste for `Batch` frames is remembered (beyond it, re-learnt)."""

ELECTION_COUNTERS = ("proven_dead", "fast_failovers", "deletes_refused", "watch_retries",
                     "unwatchable")
"""What `master.liveness.Campaign` counts, reported as master/election/<name>."""

DEFAULT_ZK_SESSION_TIMEOUT = 4.0
"""Seconds. ZooKeeper's own minimum with its stock tickTime (2 s): the shortest
timeout a stock server grants, and what bounds how fast a dead leader is replaced."""


class MasterServer:
    """A running master: ZMQ ROUTER on `zmq_port`, HTTP on `port` (0 = any free
    port; `info` reports the real ones once `start()` returns).

    `work_dir` keeps the standalone registry (None: nothing persists, for tests);
    `zk` makes this master a contender in that ZooKeeper election instead."""

    def __init__(self, *, ip: str = "127.0.0.1", hostname: str | None = None,
                 port: int = 5050, zmq_port: int = 5055, config: MasterConfig | None = None,
                 clock: Clock | None = None, ids: IdGenerator | None = None,
                 context: zmq.asyncio.Context | None = None, work_dir: Path | None = None,
                 zk: ZkAddress | None = None,
                 zk_session_timeout: float = DEFAULT_ZK_SESSION_TIMEOUT,
                 usage: StoreConfig | None = None, usage_memory_limit: str = "1GB",
                 secure: security.ServerSecurity | None = None,
                 shard_port: int | None = None, shard_ip: str = "127.0.0.1",
                 shard_principals: frozenset[str] = frozenset()) -> None:
        self.ip = ip
        self.hostname = hostname or socket.gethostname()
        # The core builds usage rows exactly when there is a store to take them.
        self.config = attrs.evolve(config or MasterConfig(), record_usage=usage is not None)
        self._usage_config = usage
        self._usage_memory_limit = usage_memory_limit
        self.usage: UsageService | None = None
        self._port = port
        self._zmq_port = zmq_port
        self._clock = clock or SystemClock()
        self._ids = ids or IdGenerator()
        self._context = context
        self._work_dir = work_dir
        self._zk = zk
        self._zk_session_timeout = zk_session_timeout
        self.security = secure or security.ServerSecurity()
        self._refusals = security.Refusals("master", log)
        self._zap: security.Zap | None = None
        self._info: MasterInfo | None = None
        self._state: MasterState | None = None
        self._router: Router | None = None
        # Link shards (master/link_shard.py): their own port, off unless asked for.
        self._shard_address = None if shard_port is None else (shard_ip, shard_port)
        self._shard_principals = shard_principals
        self._shards: ShardLink | None = None
        self.shard_port: int | None = None
        self._runner: web.AppRunner | None = None
        # Every event for the core waits in `_inflow` (its lanes and its bound on
        # frames: master/inflow.py); `_work` is set while it holds any.
        self._inflow = Inflow()
        # Taken from the inflow and not yet handled: kept here, not in the loop's
        # locals, so a loop that dies and is restarted loses none of them.
        self._batch: collections.deque[object] = collections.deque()
        self._work = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._timers = TimerTable(self._clock.now, self._fire)
        self._internal_errors = 0
        self._supervisor = Supervisor(self._give_up, self._count_internal_error, logger=log)
        self._log_limiter = LogLimiter(log)
        self._dropped_sends = 0
        self._frames_sent = 0
        # Sends to peers that take batches wait here for the end of the processing
        # batch (master/outflow.py); `_batching` remembers which peers those are.
        self._outflow = Outflow()
        self._batching: dict[str, bool] = {}
        self.v1_streams = SchedulerStreams()  # Mesos v1 HTTP subscribers (master/api_v1.py)
        # Election and registry.
        self.leader: MasterInfo | None = None
        self._session: ZkSession | None = None
        self._contender: str | None = None
        self._watch: LeaderWatch | None = None
        self._lease: Lease | None = None
        self._liveness: LivenessListener | None = None
        self._campaigning: Campaign | None = None
        self._electing = False
        self._registry: Registry | None = None
        self._registry_dirty = asyncio.Event()
        self._calls: dict[int, asyncio.Future[Reply]] = {}
        self._registry_seconds = Histogram(LATENCY_BOUNDS)
        self._last_call_id = 0
        self._counts = {"registry_writes": 0, "received_as_standby": 0, "paused": 0}
        self._lost: asyncio.Future[str] | None = None
        self._elected = asyncio.Event()
        # Elected after proving a leader dead: the core handles events at once, but
        # what it sends waits in `_held` until that leader's lease is over.
        self._acting = asyncio.Event()
        self._held: collections.deque[Send] = collections.deque()
        self._early: collections.deque[tuple[float, Received | InvalidFrame]] = collections.deque(
            maxlen=EARLY_FRAMES_MAX)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Bind and serve. Standalone: also recover the registry and lead, so a
        `RegistryError` (another master holds the work dir) is raised from here.
        With ZooKeeper: enter the election and return as a standby."""
        self._lost = asyncio.get_running_loop().create_future()
        if self.security.curve is not None and self.security.credentials is not None:
            self._zap = security.Zap(self.security.credentials, self._refusals)
        router = Router(self._zap.context if self._zap else self._context,
                        curve=self.security.curve, send_queue=SEND_QUEUE)
        if self._zap is not None:
            self._zap.watch(router.socket)
        try:
            zmq_port = router.bind(self.ip, self._zmq_port)
            self._bind_shards()
            http_socket = socket.create_server((self.ip, self._port))
        except (OSError, zmq.ZMQError, ValueError):
            router.close()
            if self._shards is not None:
                self._shards.close()
            raise
        port = http_socket.getsockname()[1]
        self._info = MasterInfo(
            id=self._ids.prefix, hostname=self.hostname, ip=self.ip, port=port,
            zmq_port=zmq_port, version=VERSION,
            address=Address(hostname=self.hostname, ip=self.ip, port=port),
            curve_key=self.security.curve.public.decode() if self.security.curve else "")
        self._router = router
        if self._usage_config is not None:
            self.usage = UsageService(self._usage_config, self._usage_memory_limit,
                                      self._clock.now)
            self.usage.start()
        app = make_app(self)
        add_v1_routes(app, self)
        security.protect(app, self.security, self._refusals)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, http_socket, ssl_context=self.security.tls).start()
        self._supervisor.loop("master-receive", functools.partial(self._receive, direct=True))
        if self._shards is not None:
            self._supervisor.loop("master-shards", functools.partial(self._receive, direct=False))
        if self._zk is None:
            registry = FileRegistry(self._work_dir) if self._work_dir is not None else None
            try:
                await self._lead(registry)
            except BaseException:
                await self.stop()
                raise
        else:
            self._supervisor.once("master-campaign", self._campaign(self._zk))
        log.info("master %s up: http %s, zmq %s", self.info.id, self.info.http_url,
                 self.info.zmq_endpoint)

    def _bind_shards(self) -> None:
        """Bind the port for link shards, if asked for (docs/security.md: only
        trusted shards may reach it; with CURVE, only `shard_principals`)."""
        if self._shard_address is None:
            return
        self._shards = ShardLink(self._zap.context if self._zap else self._context,
                                 curve=self.security.curve,
                                 shard_principals=self._shard_principals)
        if self._zap is not None:
            self._zap.watch(self._shards.socket)
        self.shard_port = self._shards.bind(*self._shard_address)

    async def stop(self) -> None:
        """Stop acting, then end the ZooKeeper session: that deletes our contender
        znode at once, so a clean stop is an instant failover."""
        await self._supervisor.stop()
        self._timers.cancel_all()
        if self._lease is not None:
            self._lease.stop()
        if self._watch is not None:
            self._watch.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._close_sockets()
        if self.usage is not None:
            await self.usage.close()
            self.usage = None
        if self._zap is not None:
            await self._zap.stop()
            self._zap = None
        if self._registry is not None:
            await self._registry.close()
        if self._campaigning is not None:
            await self._campaigning.hold()  # a leader we deleted may hold a lease still
            await self._campaigning.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._liveness is not None:  # after the session: a clean stop is no death
            await self._liveness.close()

    def _close_sockets(self) -> None:
        if self._router is not None:
            self._router.close()
            self._router = None
        if self._shards is not None:
            self._shards.close()
            self._shards = None

    @property
    def lost(self) -> asyncio.Future[str]:
        """Resolves (with the reason) when this master must stop for good."""
        if self._lost is None:
            raise RuntimeError("the master has not started")
        return self._lost

    async def elected(self) -> None:
        """Wait until this master leads."""
        await self._elected.wait()

    def _count_internal_error(self) -> None:
        self._internal_errors += 1

    def count_internal_error(self) -> None:
        """A bug outside the core (an HTTP handler raised); it has been logged."""
        self._count_internal_error()

    def problems(self) -> list[str]:
        """Why this master is unhealthy (empty: healthy): a loop not running, or
        having stepped down (the process is about to exit)."""
        found = [f"loop {name} is not running" for name in self._supervisor.down()]
        if self._lost is not None and self._lost.done():
            found.append(f"stepped down: {self._lost.result()}")
        return found

    def _log_limited(self, key: str, level: int, text: str, *args: Any,
                     exc_info: bool = False) -> None:
        """Log at most once per `key` (a peer) per interval."""
        self._log_limiter.log(key, level, text, *args, exc_info=exc_info)

    # --------------------------------------------------------------- HTTP view

    @property
    def state(self) -> MasterState:
        if self._state is None:
            raise RuntimeError("this master is not leading")
        return self._state

    @property
    def info(self) -> MasterInfo:
        """This master's own MasterInfo (whether or not it leads)."""
        if self._info is None:
            raise RuntimeError("the master has not started")
        return self._info

    @property
    def is_leader(self) -> bool:
        """Leading and not done: a leader whose lease lapsed longer ago than it may
        wait for it (resumed after a pause) is done even before it notices."""
        return (self._state is not None and self._acting.is_set() and not self.lost.done()
                and not (self._lease is not None and self._lease.dead()))

    def snapshot(self) -> dict[str, Any]:
        if self.is_leader:
            return {**self.state.snapshot(), "elected": True}
        leader = self.leader
        return {
            "id": self.info.id, "pid": f"master@{self.info.ip}:{self.info.zmq_port}",
            "hostname": self.info.hostname, "version": self.info.version, "elected": False,
            "leader": f"master@{leader.ip}:{leader.zmq_port}" if leader else "",
            "leader_info": to_json(leader) if leader else None,
            "leader_url": leader.http_url if leader else None,
        }

    def submit(self, event: Event) -> None:
        """Queue an event for the core, in turn with the messages and timers."""
        self._inflow.put(event)
        self._work.set()

    async def call(self, request: Request, timeout: float = OPERATOR_CALL_TIMEOUT,
                   principal: str | None = None) -> Reply:
        """Hand an operator request to the core through the event queue and wait
        for its `Reply`. `asyncio.TimeoutError` if the core does not answer in
        `timeout` seconds (its lease is unconfirmed, or it is stepping down)."""
        self._last_call_id += 1
        call_id = self._last_call_id
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            self.submit(OperatorCall(call_id, request, principal))
            return await asyncio.wait_for(future, timeout)
        finally:
            self._calls.pop(call_id, None)

    def metrics(self) -> dict[str, float]:
        result: dict[str, float] = self.state.metrics() if self.is_leader else {}
        result["master/elected"] = 1 if self.is_leader else 0
        result["master/internal_errors"] = self._internal_errors
        result["master/dropped_sends"] = self._dropped_sends
        result["master/frames_sent"] = self._frames_sent
        result["master/inbound_queued"] = len(self._inflow)
        result["master/inbound_queued_most"] = self._inflow.most
        result["master/inbound_full"] = self._inflow.full
        result["master/resends_coalesced"] = self._inflow.coalesced
        result["master/batch_frames_sent"] = self._outflow.batches
        result["master/messages_sent_batched"] = self._outflow.batched
        if self._router is not None:
            result["master/sends_full"] = self._router.sends_full
            result["master/sends_unroutable"] = self._router.sends_unroutable
        result["master/registry_writes"] = self._counts["registry_writes"]
        result["master/messages_received_as_standby"] = self._counts["received_as_standby"]
        result["master/leadership_pauses"] = self._counts["paused"]
        if self._campaigning is not None:
            for name in ELECTION_COUNTERS:
                result[f"master/election/{name}"] = self._campaigning.counts[name]
            result["master/election/watching"] = int(self._campaigning.watching)
        result["master/loop_restarts"] = self._supervisor.restarts
        if self.usage is not None:
            result.update(self.usage.metrics())
        result.update(self.v1_streams.metrics())
        for key, count in self._refusals.counts.items():  # the core counts forbidden too
            result[key] = result.get(key, 0) + count
        if self._shards is not None:
            result.update(self._shards.metrics())
        if self._router is not None and self._router.principal_changes:
            result["master/auth_failures/principal_changed"] = self._router.principal_changes
        return result

    def histograms(self) -> dict[str, Histogram]:
        result = self.state.histograms() if self.is_leader else {}
        result["master/registry_write_seconds"] = self._registry_seconds
        return result

    # --------------------------------------------------------------- election

    async def _campaign(self, zk: ZkAddress) -> None:
        """Enter the election and follow it; `_leader_changed` takes over from here."""
        self._session = ZkSession(zk.hosts, self._zk_session_timeout, self._session_state,
                                  digest=self.security.zk_digest, leader_root=zk.root)
        try:
            self._liveness = LivenessListener(self.ip)
            await self._liveness.start()
            await self._session.start()
            lease = lease_term(self._zk_session_timeout)
            await publish(self._session, zk, self.ip, self._liveness.port, lease)
            self._contender = await create_contender(self._session, zk.root, self.info)
            log.info("contending for leadership as %s", self._contender)
            self._watch = LeaderWatch(self._session, zk.root, self._leader_changed)
            await self._watch.start()
            self._campaigning = Campaign(self._session, zk, self._contender, lease,
                                         on_lead=self._elected_now, on_stand_down=self._give_up)
            await self._campaigning.start()
        except (ZkError, OSError) as exc:
            self._give_up(f"cannot enter the election under {zk.url}: {exc}")

    def _leader_changed(self, path: str | None, info: MasterInfo | None) -> None:
        self.leader = info
        if info is not None:
            log.info("leading master: %s (%s)", info.id, info.http_url)

    def _elected_now(self, not_before: float) -> None:
        """Our znode is the lowest (master/election.py); act from `not_before`
        (monotonic) on, once a leader we proved dead can no longer act."""
        if self._state is None and not self._electing and not self.lost.done():
            self._electing = True
            self._supervisor.once("master-take-over", self._take_over(not_before))

    async def _take_over(self, not_before: float) -> None:
        assert self._session is not None and self._contender is not None
        assert self._zk is not None
        self._lease = Lease(self._session, self._contender, grace=self._zk_session_timeout,
                            on_expired=self._give_up)
        await self._lease.renew()
        self._lease.start()
        registry = ZooKeeperRegistry(self._session, self._zk.registry_path, self._contender)
        try:
            await self._lead(registry, not_before)
        except RegistryError as exc:
            self._give_up(f"cannot take over the registry: {exc}")

    async def _lead(self, registry: Registry | None, not_before: float = 0.0) -> None:
        """Recover the registry and start acting as leader (not before `not_before`)."""
        started = time.perf_counter()
        data = await registry.recover() if registry is not None else RegistryData()
        fence = max(0.0, not_before - time.monotonic())
        if fence == 0:
            self._acting.set()
        now = self._clock.now()
        state = MasterState(self.config, self.info, self._ids, start_time=now + fence)
        effects = restore(state, data, now)
        self._registry = registry
        self._state = state  # from here on `_receive` queues frames for handling
        cutoff = time.monotonic() - EARLY_FRAMES_WINDOW
        for received, event in self._early:  # ahead of them, in arrival order
            if received >= cutoff:
                self._inflow.put(event)
                self._work.set()
        self._early.clear()
        self.leader = self.info
        for effect in effects:
            self._perform(effect)
        self._flush_sends()
        self._supervisor.loop("master-process", self._process)
        if registry is not None:
            self._supervisor.loop("master-registry", self._write_registry)
        if fence > 0:
            log.info("handling, sending nothing for %.2fs: until the lease of the leader "
                     "we proved dead is over", fence)
            await asyncio.sleep(fence)
            await self._release_held()
        self._elected.set()
        log.info("leading: recovered %d agents and %d unreachable ones from the registry "
                 "in %.0f ms", len(data.agents), len(data.unreachable),
                 (time.perf_counter() - started) * 1000)

    async def _release_held(self) -> None:
        """Send what the fence held, in order; sends made meanwhile queue behind."""
        while self._held:
            self._send(self._held.popleft())
        self._flush_sends()
        self._acting.set()

    def _session_state(self, state: SessionState) -> None:
        if state == SUSPENDED:
            log.warning("ZooKeeper connection suspended; not acting as leader until it "
                        "is confirmed")
            if self._lease is not None:
                self._lease.revoke()
        elif state == LOST:
            self._give_up("the ZooKeeper session expired")
        elif state == CONNECTED:
            log.info("ZooKeeper connection (re-)established")

    def _give_up(self, reason: str) -> None:
        """Stop acting as leader at once and for good: nothing more is handled or
        sent. `lost` tells the owner, who exits so a supervisor restarts us."""
        if self.lost.done():
            return
        log.error("stepping down: %s", reason)
        self._supervisor.cancel("master-process", "master-registry")
        self._timers.cancel_all()
        self._close_sockets()  # drops anything still queued
        self.lost.set_result(reason)

    def _lease_lapsed(self) -> bool:
        """Is the lease on the ZooKeeper session unconfirmed (asked before every
        event: a core must never act on one without it)?"""
        lease = self._lease
        return lease is not None and not lease.valid()

    async def _may_act(self) -> None:
        """Wait while the lease on the ZooKeeper session is not confirmed."""
        lease = self._lease
        if lease is None or lease.valid():
            return
        self._counts["paused"] += 1
        log.warning("paused: the ZooKeeper session is not confirmed")
        while not lease.valid():
            lease.renewed.clear()
            await lease.renewed.wait()
        log.info("resumed: the ZooKeeper session is confirmed")

    async def _write_registry(self) -> None:
        """Write the registry after the core asked to (`PersistRegistry`), waiting
        `REGISTRY_BATCH` first so a burst of changes (a thousand new agents)
        becomes a few writes; each write is the state as it is when it starts."""
        assert self._registry is not None
        while True:
            await self._registry_dirty.wait()
            await asyncio.sleep(REGISTRY_BATCH)
            await self._acting.wait()
            self._registry_dirty.clear()
            started = time.perf_counter()
            try:
                await self._registry.store(snapshot_of(self.state))
            except RegistryError as exc:
                self._give_up(f"registry write failed: {exc}")
                return
            self._registry_seconds.add(time.perf_counter() - started)
            self._counts["registry_writes"] += 1

    # ----------------------------------------------------------------- loops

    async def _receive(self, direct: bool) -> None:
        """Frames -> `Inflow`, undecoded, read only while it has room; beyond
        that they wait in ZMQ, which pushes back to senders. One frame never
        ends the loop: whatever queueing it raises is counted, logged (at most
        once per peer per interval) and the next frame is read. `direct`: from
        the master's own socket, else from link shards (master/shard_link.py)."""
        while (source := self._router if direct else self._shards) is not None:
            room = self._inflow.room()
            if room == 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                batch = await source.recv_undecoded(min(room, RECEIVE_BATCH))
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ENOTSOCK, zmq.ETERM):
                    return  # the socket is gone: we are stopping
                self._internal_errors += 1
                self._log_limited("receive", logging.ERROR, "master receive failed: %s", exc)
                continue
            shards = self._shards if direct else None
            for raw in batch:
                try:
                    if shards is not None:  # it came itself: answer it directly
                        shards.routes.forget(raw.identity)
                    self._take(raw)
                except Exception:
                    self._internal_errors += 1
                    self._log_limited(raw.identity.hex()[:64], logging.ERROR,
                                      "failed to take a frame from %s",
                                      raw.identity.hex()[:64], exc_info=True)
            await asyncio.sleep(0)  # see _process

    def _take(self, raw: Undecoded) -> None:
        """Queue one frame for the core, undecoded (or keep it decoded, as a
        standby)."""
        if self._state is not None:
            frame = raw.frames[0] if len(raw.frames) == 1 else None
            self._inflow.put_frame(raw, raw.identity, frame)
            self._work.set()
            return
        event = self._decoded(raw)
        if event is not None:
            # A standby acts on nothing (as Mesos' do); it keeps the last few
            # seconds' frames in case it is about to lead (EARLY_FRAMES_WINDOW).
            self._counts["received_as_standby"] += 1
            now = time.monotonic()
            while self._early and self._early[0][0] < now - EARLY_FRAMES_WINDOW:
                self._early.popleft()
            self._early.append((now, event))

    def _decoded(self, raw: Undecoded) -> Received | InvalidFrame | None:
        inbound = raw.decode()
        peer = inbound.identity.hex()
        if inbound.message is not None:
            return Received(peer, inbound.message, inbound.principal)
        if inbound.error is not None:
            self._log_limited(peer, logging.INFO, "bad frame from %s: %s", peer,
                              inbound.error.reason)
            return InvalidFrame(peer, inbound.error)
        return None

    async def _process(self) -> None:
        while True:
            if not self._batch:
                if not self._inflow:
                    self._work.clear()
                    await self._work.wait()
                self._batch.extend(self._next_batch())
            while self._batch:
                if self._lease_lapsed():
                    await self._may_act()
                self._handle(self._batch.popleft())
            self._flush_sends()
            # Awaiting a ready queue or socket does not yield: without this, a
            # burst (a thousand agents re-registering) would starve HTTP and the
            # lease renewals until it is all handled.
            await asyncio.sleep(0)

    def _next_batch(self) -> list[object]:
        """Events and frames in the order `Inflow` gives them; reading resumes
        once there is room."""
        batch: list[object] = []
        while len(batch) < PROCESS_BATCH and (item := self._inflow.take()) is not None:
            batch.append(item)
        if self._inflow.room():
            self._room.set()
        return batch

    def _handle(self, item: object) -> None:
        """Decode (a frame) and hand to the core; a bug is logged and counted.
        Plain calls down to the socket (no coroutine per message or effect:
        nothing on the way waits), so the lease is checked per event by
        `_process` alone."""
        event: Event | None = None
        try:
            event = self._decoded(item) if isinstance(item, Undecoded) else cast(Event, item)
            if isinstance(event, Received) and isinstance(event.message, Batch):
                for message in event.message.messages:  # as if each had come alone
                    self._step(Received(event.peer, message, event.principal))
            elif event is not None:
                self._step(event)
        except Exception:
            self._internal_errors += 1
            key = (event.peer if isinstance(event, (Received, InvalidFrame))
                   else type(event or item).__name__)
            self._log_limited(key, logging.ERROR, "master failed to handle %.300r", event,
                              exc_info=True)
            if isinstance(event, OperatorCall):  # its caller must not wait in vain
                self._answer(Reply(event.call_id, refusal=INTERNAL,
                                   error="the master failed to handle this call"))

    def _step(self, event: Event) -> None:
        if isinstance(event, Received) and isinstance(event.message, RegisterAgent):
            # An agent says whether it takes batches each time it registers.
            self._batching[event.peer] = BATCH_CAPABILITY in event.message.capabilities
        timed = isinstance(event, TimerFired) and isinstance(event.key, Allocate)
        started = time.perf_counter() if timed else 0.0
        effects = self.state.handle(event, self._clock.now())
        if timed:
            self.submit(AllocationTimed(time.perf_counter() - started))
        for effect in effects:
            self._perform(effect)

    def _perform(self, effect: Effect) -> None:
        # Sends first: under a flood they are nearly every effect.
        if isinstance(effect, Send):
            if self._acting.is_set():
                self._send(effect)
            else:
                self._held.append(effect)
        elif isinstance(effect, RecordUsage):
            if self.usage is not None:  # None only while stopping
                self.usage.store.submit(effect.samples, effect.events, effect.rows)
        elif isinstance(effect, PersistRegistry):
            self._registry_dirty.set()  # no registry (tests): nothing persists
        elif isinstance(effect, Reply):
            self._answer(effect)
        else:
            self._timers.perform(effect)

    def _send(self, effect: Send) -> None:
        if self.v1_streams.deliver(effect.to, effect.message):
            return  # an HTTP subscriber's: queued for its event stream
        frame = encode(effect.message)
        if self._batches_to(effect.to):
            for peer, ready in self._outflow.add(effect.to, frame):
                self._send_frame(peer, ready)
        else:
            self._send_frame(effect.to, frame)

    def _send_frame(self, peer: str, frame: bytes) -> None:
        sent = False
        identity = bytes.fromhex(peer)
        shards = self._shards
        if shards is not None and shards.send_frame(identity, frame):
            sent = True  # a shard reaches it: queued until `_flush_sends`
        elif self._router is not None:
            try:
                sent = self._router.send_frame(identity, frame)
            except zmq.ZMQError as exc:
                log.warning("send to %s failed: %s", peer, exc)
        if sent:
            self._frames_sent += 1
        else:
            self._dropped_sends += 1

    def _flush_sends(self) -> None:
        for peer, frame in self._outflow.flush():
            self._send_frame(peer, frame)
        if self._shards is not None:
            self._shards.flush()

    def _batches_to(self, peer: str) -> bool:
        """Does `peer` take `Batch` frames? Frameworks and agents that say so (a
        capability; an agent's is learnt as it registers, in `_step`) do; other
        agents and peers not known yet do not (the latter are not remembered)."""
        known = self._batching.get(peer)
        if known is not None:
            return known
        state = self._state
        if state is None:
            return False
        if len(self._batching) >= MAX_REMEMBERED_PEERS:
            self._batching.clear()  # re-learnt, one scan per peer
        if peer in state.agent_by_peer:
            self._batching[peer] = False
            return False
        for framework in state.frameworks.values():
            if framework.peer == peer:
                known = BATCH_CAPABILITY in framework.info.capabilities
                self._batching[peer] = known
                return known
        return False

    def _answer(self, reply: Reply) -> None:
        future = self._calls.get(reply.call_id)
        if future is not None and not future.done():  # else its caller gave up
            future.set_result(reply)

    def _fire(self, key: Hashable) -> None:
        self.submit(TimerFired(key))
