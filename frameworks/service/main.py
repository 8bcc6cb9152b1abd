"""`dyad-service`: the service framework as a process.

    dyad-service --master HOST:5050 [--port 8080] [--work-dir DIR]
    dyad-service --master HOST:5050 --zk zk://HOST:2181/dyad-service   # HA pair

It serves the REST API at once. Without ``--zk`` it leads straight away and keeps
its state in ``--work-dir/state.json``; with ``--zk`` it queues for leadership and
keeps its state in ZooKeeper, while a standby answers 503 naming the leader. The
leader subscribes with the stored framework id (``--failover-timeout`` tells the
master how long to keep its tasks while no instance is connected).

SIGTERM/SIGINT: unsubscribe with failover (tasks keep running for the next
instance) and exit 0. With ZooKeeper, a leader whose session is lost (or
suspended too long) or whose store write fails steps down and stands by again.
Without it, a store failure exits 1; so does the master refusing the framework.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
import uuid
from pathlib import Path

from aiohttp import web
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from dyad import security, zk_acl
from dyad.clock import SystemClock
from dyad.messages import PREEMPTION_CAPABILITY, FrameworkInfo
from dyad import argtypes
from frameworks.autopilot import DEFAULT_MEMORY_VARIANTS, FLAT_FIRST_ROOM_VARIANTS
from frameworks.autopilot import Config as AutopilotConfig
from frameworks.autopilot.horizontal import HorizontalConfig
from frameworks.scheduler import SchedulerDriver
from frameworks.service.api import ServiceApi
from frameworks.service.core import Persist, ServiceConfig, ServiceCore
from frameworks.service.leader import Leadership, parse_service_zk_url
from frameworks.service.runtime import ServiceRuntime, ServiceScheduler
from frameworks.service.store import FileStore, Store, StoreError, ZkStore
from frameworks.service.usage_feed import UsageFeed

log = logging.getLogger("dyad-service")

RECONNECT = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0, "max_jitter": 0.2}

STEPPED_DOWN = -1
"""`Service._lead`'s answer when its term ended without being told to stop."""



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dyad-service", description=__doc__.split("\n\n")[0])
    p.add_argument("--master", required=True,
                   help="the master's HTTP address host:5050 (or zk://.../dyad)")
    p.add_argument("--ip", default="127.0.0.1", help="address the API binds and advertises")
    p.add_argument("--hostname", default=None,
                   help="name advertised to the master and other instances (default: --ip)")
    p.add_argument("--port", type=argtypes.port, default=8080, help="API port (0: any free port)")
    p.add_argument("--work-dir", type=Path, default=Path("./work-dir/service"),
                   help="state file without --zk")
    p.add_argument("--zk", metavar="URL", default=None,
                   help="zk://host:port[,host:port]/path (default path /dyad-service): "
                        "state and leader election")
    p.add_argument("--zk-session-timeout", type=argtypes.duration, default="10s")
    p.add_argument("--name", default="dyad-service", help="framework name")
    p.add_argument("--failover-timeout", type=argtypes.duration, default="7days",
                   help="how long the master keeps our tasks while we are away")
    p.add_argument("--deployment-timeout", type=argtypes.duration, default="5mins",
                   help="upgrades with no new task ready for this long roll back")
    p.add_argument("--preemption-ask-after", type=argtypes.duration, default="0s",
                   help="ask the master to preempt lower-priority tasks for an app whose "
                   "tasks have waited this long (needs dyad-master --preemption); 0: never")
    p.add_argument("--decline-refuse", type=argtypes.duration, default="30s",
                   help="filter on declined offers (new demand revives at once)")
    p.add_argument("--role", default="*",
                   help="the framework's role; apps with persistent volumes reserve to it")
    p.add_argument("--principal", default="", help="the framework's principal")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    pilot = p.add_argument_group("autopilot (apps with an \"autopilot\" block; "
                                 "docs/autopilot.md)")
    pilot.add_argument("--autopilot-step", type=argtypes.duration, default="5mins",
                       help="how often usage is read from the master and apps evaluated")
    pilot.add_argument("--autopilot-warmup", type=argtypes.duration, default="1h",
                       help="no recommendation before an app has samples this old")
    pilot.add_argument("--autopilot-min-samples", type=int, default=30,
                       help="no recommendation on fewer samples")
    pilot.add_argument("--autopilot-min-interval", type=argtypes.duration, default="1h",
                       help="an app's limits change at most this often (OOM raises excepted)")
    pilot.add_argument("--autopilot-history", type=argtypes.duration, default="24h",
                       help="on becoming leader, read back this much usage from the master's "
                       "store (as far as it holds), so evidence survives a failover; 0: none")
    pilot.add_argument("--autopilot-first-room", choices=["sized", "flat"], default="sized",
                       help="room for an app's first memory jump: priced by its size "
                       "(a kill costs an app, room costs bytes) or the same for all "
                       "(a large app's kill weighs more)")
    pilot.add_argument("--autopilot-scale-window", type=argtypes.duration, default="5mins",
                       help="horizontal sizing: the load is each task's mean CPU over this")
    pilot.add_argument("--autopilot-scale-stabilization", type=argtypes.duration,
                       default="5mins", help="horizontal sizing: fewer instances only to "
                       "the highest count wanted over this")
    pilot.add_argument("--autopilot-scale-interval", type=argtypes.duration, default="1min",
                       help="horizontal sizing: an app's count changes at most this often")
    security.add_flags(p)
    return p


def autopilot_config(args: argparse.Namespace) -> AutopilotConfig:
    memory = FLAT_FIRST_ROOM_VARIANTS if args.autopilot_first_room == "flat" \
        else DEFAULT_MEMORY_VARIANTS
    return AutopilotConfig(memory_variants=memory,
                           step=args.autopilot_step, warmup=args.autopilot_warmup,
                           min_samples=args.autopilot_min_samples,
                           min_interval=args.autopilot_min_interval,
                           horizontal=HorizontalConfig(
                               window=args.autopilot_scale_window,
                               stabilization=args.autopilot_scale_stabilization,
                               interval=args.autopilot_scale_interval))


class Service:
    """One `dyad-service` process: API, optional election, and (while leading) the
    runtime and driver."""

    def __init__(self, args: argparse.Namespace,
                 secure: security.ServerSecurity | None = None) -> None:
        self.args = args
        self.security = secure or security.ServerSecurity()
        self.advertised = ""
        self.stop = asyncio.Event()
        self.zk: KazooClient | None = None
        self.leadership: Leadership | None = None
        self.api = ServiceApi(self._leader, name=args.name)

    async def _leader(self) -> str | None:
        if self.args.zk is None:
            return self.advertised  # without ZooKeeper there is no other instance
        if self.leadership is None:
            return None  # still connecting to ZooKeeper: who leads is not known yet
        return await self.leadership.leader()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        security.protect(self.api.app, self.security, security.Refusals("service", log))
        runner = web.AppRunner(self.api.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.args.ip, self.args.port, ssl_context=self.security.tls)
        await site.start()
        port = runner.addresses[0][1]
        self.advertised = f"{self.args.hostname or self.args.ip}:{port}"
        self.api.advertised = self.advertised
        self.api.settings = {  # what /v2/info reports in Marathon's sections
            "master": self.args.master, "framework_name": self.args.name,
            "hostname": self.args.hostname or self.args.ip, "http_port": port,
            "zk": self.args.zk, "failover_timeout": self.args.failover_timeout}
        print(f"dyad-service listening on {self.security.scheme}://{self.args.ip}:{port}",
              flush=True)
        try:
            return await self._serve()
        except StoreError as exc:
            log.error("%s", exc)
            return 1
        finally:
            if self.leadership is not None:
                self.leadership.cancel()
            if self.zk is not None:
                await asyncio.to_thread(self.zk.stop)
                self.zk.close()
            await runner.cleanup()

    async def _serve(self) -> int:
        """Lead until told to stop. With ZooKeeper, a leader that loses its session
        or its store steps down and stands by again for another term."""
        if self.args.zk is None:
            store = FileStore(self.args.work_dir)
            try:
                code = await self._lead(store)
            finally:
                store.close()
            return 1 if code == STEPPED_DOWN else code
        hosts, root = parse_service_zk_url(self.args.zk)
        # Reconnect quickly and forever (kazoo's default backoff grows to an hour);
        # requests themselves still fail fast, so a store write never hangs the loop.
        self.zk = KazooClient(hosts=hosts, timeout=self.args.zk_session_timeout,
                              connection_retry=dict(RECONNECT),
                              **zk_acl.client_options(self.security.zk_digest))
        try:
            await asyncio.to_thread(self.zk.start, 15)
        except (KazooException, KazooTimeoutError) as exc:
            raise StoreError(f"cannot reach ZooKeeper at {hosts}: {exc!r}") from None
        # Half the session timeout: rides out a dropped connection that kazoo
        # re-establishes at once, and ends well before the server can expire us.
        self.leadership = Leadership(self.zk, root, self.advertised,
                                     grace=self.args.zk_session_timeout / 2)
        while True:
            if not await self._campaign(root):
                return 0
            code = await self._lead(ZkStore(self.zk, root, self.leadership.fence))
            if code != STEPPED_DOWN:
                return code
            await self.leadership.resign()
            print("dyad-service stepped down; standing by again", flush=True)

    async def _campaign(self, root: str) -> bool:
        """Wait for leadership; False if told to stop first."""
        assert self.leadership is not None
        print(f"dyad-service standing by for leadership at {root}/leader", flush=True)
        while not self.stop.is_set():
            campaign = asyncio.create_task(self.leadership.campaign())
            stopped = asyncio.create_task(self.stop.wait())
            await asyncio.wait([campaign, stopped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not campaign.done():
                self.leadership.cancel()
                await asyncio.gather(campaign, return_exceptions=True)
                return False
            try:
                campaign.result()
                return True
            except KazooException as exc:
                log.warning("campaign interrupted (%r); trying again", exc)
                await asyncio.sleep(1.0)
        return False

    async def _lead(self, store: Store) -> int:
        """One term: load the state, run the driver and serve the API until the
        process is told to stop (0), the master ends the framework (1), or the
        term ends with a lost session or a failed store write (`STEPPED_DOWN`)."""
        failed = asyncio.Event()
        try:
            snapshot = await asyncio.to_thread(store.load)
        except StoreError as exc:
            log.error("%s", exc)
            return STEPPED_DOWN
        ask_after = self.args.preemption_ask_after or None
        config = ServiceConfig(deployment_timeout=self.args.deployment_timeout,
                               refuse_seconds=self.args.decline_refuse,
                               role=self.args.role, principal=self.args.principal,
                               preemption_ask_after=ask_after)
        core = ServiceCore(config, lambda: uuid.uuid4().hex, snapshot)
        runtime = ServiceRuntime(core, store, SystemClock(), on_fatal=lambda _: failed.set(),
                                 autopilot=autopilot_config(self.args))
        info = FrameworkInfo(name=self.args.name, id=snapshot.framework_id,
                             failover_timeout=self.args.failover_timeout, checkpoint=True,
                             roles=[self.args.role], principal=self.args.principal,
                             hostname=self.args.hostname or socket.gethostname(),
                             webui_url=f"http://{self.advertised}",
                             capabilities=[] if ask_after is None else [PREEMPTION_CAPABILITY])
        scheduler = ServiceScheduler(runtime)
        try:
            driver = SchedulerDriver(scheduler, info, master=self.args.master)
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        runtime.driver = driver
        self.api.runtime = runtime
        print(f"dyad-service leading with {len(core.apps)} app(s), {len(core.tasks)} "
              f"task(s); framework id {snapshot.framework_id or '(new)'}", flush=True)
        driving = asyncio.create_task(driver.run_async())
        feeding = asyncio.create_task(UsageFeed(runtime, self.args.autopilot_step,
                                                self.args.autopilot_history).run())
        waits = [driving, asyncio.create_task(self.stop.wait()),
                 asyncio.create_task(failed.wait())]
        if self.leadership is not None:
            waits.append(asyncio.create_task(self.leadership.lost.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiter in [*waits[1:], feeding]:
            waiter.cancel()
        self.api.runtime = None
        runtime.close()
        if driving.done():
            log.error("the driver ended (%s): %s", driving.result(),
                      scheduler.last_error or "no reason given")
            if "torn down" in scheduler.last_error:
                # Our tasks died with the old framework id: register anew next time
                # (reconciliation then reports the stored tasks lost).
                store.apply([Persist("framework", "id", None)])
            return 1
        lost = self.leadership is not None and self.leadership.lost.is_set()
        if self.stop.is_set() and not failed.is_set() and not lost:
            driver.stop(failover=True)
            await driving
            log.info("stopped; tasks keep running for the next instance")
            return 0
        driver.abort()  # the next leader subscribes with our framework id
        await driving
        return STEPPED_DOWN


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s dyad-service %(levelname)s %(name)s: %(message)s")
    try:
        autopilot_config(args)
    except ValueError as exc:
        print(f"dyad-service: autopilot: {exc}", file=sys.stderr)
        return 2
    if args.zk is not None:
        try:
            parse_service_zk_url(args.zk)
        except ValueError as exc:
            print(f"dyad-service: {exc}", file=sys.stderr)
            return 2
    try:
        secure = security.for_server(args, args.ip)
    except security.SecurityError as exc:
        print(f"dyad-service: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(Service(args, secure).run())
    except OSError as exc:
        print(f"dyad-service: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
