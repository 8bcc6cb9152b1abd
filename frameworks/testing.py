"""Test a framework without a cluster.

Two levels, pick what your test needs:

**Unit-test a Scheduler's decisions** with `SchedulerHarness`: it feeds offers and
updates into your scheduler (sync or ``async def`` callbacks) through a
`FakeSchedulerDriver` that records every call instead of talking to a master::

    from frameworks import TaskState
    from frameworks.testing import SchedulerHarness, make_offer

    def test_launches_one_task_per_offer():
        harness = SchedulerHarness(MyScheduler())
        harness.register()
        calls = harness.offer(make_offer(resources="cpus:4;mem:1024"))
        assert [c.method for c in calls] == ["launch_tasks"]
        (task,) = harness.driver.launched_tasks
        harness.update(task, TaskState.TASK_FINISHED)
        assert harness.driver.stopped

Exceptions in your callbacks propagate to the test (the real driver would log them
and call ``error``). The harness is for plain (sync) tests; in an ``async`` test,
await your callbacks yourself with a `FakeSchedulerDriver`.

**Run the real drivers over real sockets** with `FakeMaster` (a master on loopback
that answers ``Subscribe``, sends heartbeats and records what it receives) and
`FakeAgent` (an agent's executor endpoint that registers executors, acknowledges
their updates and records them; ``environ()`` gives the variables to start an
executor process with). Both are async context managers.

Ids made by `make_offer`, `make_agent_id` and `make_status` are sequential and
unique within the process.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs
from aiohttp import web

from dyad.codec import to_json
from dyad.ids import new_uuid
from dyad.messages import (
    Address, AgentInfo, Batch, CommandInfo, ExecutorInfo, ExecutorRegistered, Filters,
    FrameworkInfo, Heartbeat, KillTask, LaunchTask, MasterInfo, Message, Offer, Offers,
    Operation, OperationType, ReconcileTask, RegisterExecutor, ReregisterExecutor,
    ShutdownExecutor, Source, StatusUpdate, StatusUpdateAck, Subscribe, Subscribed,
    TaskInfo, TaskState, TaskStatus)
from dyad.resources import Resources
from dyad.transport import Router
from frameworks.driver_core import DriverStatus
from frameworks.scheduler import Scheduler, reconcile_list

M = TypeVar("M", bound=Message)

DEFAULT_FRAMEWORK_ID = "framework-0001"

_counter = itertools.count(1)


# ------------------------------------------------------------------- builders


def make_agent_id() -> str:
    """A new agent id, ``agent-N``."""
    return f"agent-{next(_counter)}"


def make_master_info(*, ip: str = "127.0.0.1", port: int = 5050,
                     zmq_port: int = 5055) -> MasterInfo:
    return MasterInfo(id="master-fake", hostname="localhost", ip=ip, port=port,
                      zmq_port=zmq_port, version="fake",
                      address=Address(hostname="localhost", ip=ip, port=port))


def make_offer(*, agent_id: str | None = None, hostname: str | None = None,
               resources: str | Resources = "cpus:4;mem:1024",
               attributes: dict[str, str] | None = None,
               framework_id: str = DEFAULT_FRAMEWORK_ID,
               executor_ids: Sequence[str] = (), url: str = "",
               offer_id: str | None = None) -> Offer:
    """An offer as the master would send it; a new agent unless `agent_id` is given."""
    agent_id = agent_id or make_agent_id()
    return Offer(
        id=offer_id or f"offer-{next(_counter)}", framework_id=framework_id,
        agent_id=agent_id, hostname=hostname or f"host-{agent_id}",
        resources=resources if isinstance(resources, Resources) else Resources.parse(resources),
        attributes=dict(attributes or {}), executor_ids=list(executor_ids), url=url)


def make_status(task: TaskInfo | str, state: TaskState, *, reason: str = "",
                message: str = "", agent_id: str | None = None,
                executor_id: str | None = None, uuid: str | None = None,
                source: str = Source.EXECUTOR, healthy: bool | None = None,
                data: bytes = b"") -> TaskStatus:
    """A status update for `task` (a TaskInfo or a task id). It carries a fresh uuid
    (so it needs acknowledging) unless you pass ``uuid=""`` like master-made ones."""
    task_id = task if isinstance(task, str) else task.task_id
    if agent_id is None:
        agent_id = "" if isinstance(task, str) else task.agent_id
    if executor_id is None:
        executor_id = "" if isinstance(task, str) or task.executor is None \
            else task.executor.executor_id
    return TaskStatus(task_id=task_id, state=state, reason=reason, message=message,
                      source=source, agent_id=agent_id, executor_id=executor_id,
                      uuid=new_uuid() if uuid is None else uuid, healthy=healthy,
                      data=data)


# ---------------------------------------------------------------- fake driver


@attrs.frozen
class DriverCall:
    """One call made on a `FakeSchedulerDriver`: method name and its arguments."""

    method: str
    args: tuple[Any, ...] = ()


class FakeSchedulerDriver:
    """Has the `SchedulerDriver` methods and records the calls instead of sending.

    - ``calls``: every call, in order (`DriverCall`);
    - ``launched``: ``(offer_ids, tasks, filters)`` for every LAUNCH, whether made
      with `launch_tasks` or `accept_offers`; ``launched_tasks`` flattens the tasks;
    - ``accepted``: ``(offer_ids, operations, filters)`` for every accept, including
      the ones `launch_tasks` makes;
    - ``declined``: ``(offer_id, filters)``; ``killed``: task ids;
      ``acknowledged``: statuses; ``reconciled``: lists of `ReconcileTask`;
      ``messages``: ``(executor_id, agent_id, data)``;
    - ``suppressed``/``revived``: counts; ``stopped``, ``failover``, ``aborted``.
    """

    def __init__(self, framework_info: FrameworkInfo | None = None) -> None:
        self.framework_info = framework_info or FrameworkInfo(name="test")
        self.framework_id: str | None = self.framework_info.id
        self.master_info: MasterInfo | None = None
        self.status = DriverStatus.NOT_STARTED
        self.calls: list[DriverCall] = []
        self.launched: list[tuple[list[str], list[TaskInfo], Filters]] = []
        self.accepted: list[tuple[list[str], list[Operation], Filters]] = []
        self.declined: list[tuple[str, Filters]] = []
        self.killed: list[str] = []
        self.acknowledged: list[TaskStatus] = []
        self.reconciled: list[list[ReconcileTask]] = []
        self.messages: list[tuple[str, str, bytes]] = []
        self.suppressed = 0
        self.revived = 0
        self.requested: list[list[Any]] = []  # each `request_resources` call's requests
        self.stopped = False
        self.failover: bool | None = None
        self.aborted = False

    @property
    def launched_tasks(self) -> list[TaskInfo]:
        return [task for _, tasks, _ in self.launched for task in tasks]

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append(DriverCall(method, args))

    # lifecycle: nothing runs, so these only move `status`
    def start(self) -> DriverStatus:
        self._record("start")
        self.status = DriverStatus.RUNNING
        return self.status

    def run(self) -> DriverStatus:
        self._record("run")
        return self.status

    def join(self, timeout: float | None = None) -> DriverStatus:
        self._record("join")
        return self.status

    def stop(self, failover: bool = False) -> DriverStatus:
        self._record("stop", failover)
        self.stopped, self.failover = True, failover
        self.status = DriverStatus.STOPPED
        return self.status

    def abort(self) -> DriverStatus:
        self._record("abort")
        self.aborted = True
        self.status = DriverStatus.ABORTED
        return self.status

    def launch_tasks(self, offer_ids: Sequence[str], tasks: Sequence[TaskInfo],
                     filters: Filters | None = None) -> None:
        self._record("launch_tasks", list(offer_ids), list(tasks), filters)
        if not tasks:
            for offer_id in offer_ids:
                self.declined.append((offer_id, filters or Filters()))
            return
        self._accept(list(offer_ids), [Operation(type=OperationType.LAUNCH,
                                                 tasks=list(tasks))], filters)

    def accept_offers(self, offer_ids: Sequence[str], operations: Sequence[Operation],
                      filters: Filters | None = None) -> None:
        self._record("accept_offers", list(offer_ids), list(operations), filters)
        self._accept(list(offer_ids), list(operations), filters)

    def _accept(self, offer_ids: list[str], operations: list[Operation],
                filters: Filters | None) -> None:
        filters = filters or Filters()
        self.accepted.append((offer_ids, operations, filters))
        for op in operations:
            if op.type == OperationType.LAUNCH:
                self.launched.append((offer_ids, list(op.tasks), filters))

    def decline_offer(self, offer_id: str, filters: Filters | None = None) -> None:
        self._record("decline_offer", offer_id, filters)
        self.declined.append((offer_id, filters or Filters()))

    def decline_offers(self, offer_ids: Sequence[str], filters: Filters | None = None) -> None:
        self._record("decline_offers", list(offer_ids), filters)
        self.declined += [(offer_id, filters or Filters()) for offer_id in offer_ids]

    def revive_offers(self) -> None:
        self._record("revive_offers")
        self.revived += 1

    def suppress_offers(self) -> None:
        self._record("suppress_offers")
        self.suppressed += 1

    def request_resources(self, requests: Sequence[Any]) -> None:
        self._record("request_resources", list(requests))
        self.requested.append(list(requests))

    def kill_task(self, task_id: str, kill_grace_period: float | None = None) -> None:
        self._record("kill_task", task_id, kill_grace_period)
        self.killed.append(task_id)

    def acknowledge_status_update(self, status: TaskStatus) -> None:
        self._record("acknowledge_status_update", status)
        self.acknowledged.append(status)

    def reconcile_tasks(self, statuses: Iterable[TaskStatus | tuple[str, str | None]]) -> None:
        tasks = reconcile_list(statuses)
        self._record("reconcile_tasks", tasks)
        self.reconciled.append(tasks)

    def send_framework_message(self, executor_id: str, agent_id: str, data: bytes) -> None:
        self._record("send_framework_message", executor_id, agent_id, data)
        self.messages.append((executor_id, agent_id, bytes(data)))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class SchedulerHarness:
    """Delivers events to a `Scheduler` through a `FakeSchedulerDriver`.

    Every method runs the callback to completion (``async def`` ones on a fresh
    event loop) and returns the `DriverCall`s the scheduler made meanwhile.
    `update` acknowledges like the real driver: after the callback, only with
    implicit acknowledgements, and not recorded in ``driver.acknowledged`` (which
    holds the scheduler's own calls).
    """

    def __init__(self, scheduler: Scheduler, framework_info: FrameworkInfo | None = None,
                 *, driver: FakeSchedulerDriver | None = None) -> None:
        self.scheduler = scheduler
        self.driver = driver or FakeSchedulerDriver(framework_info)
        self.implicitly_acknowledged: list[TaskStatus] = []

    def _deliver(self, callback: str, *args: Any) -> list[DriverCall]:
        before = len(self.driver.calls)
        result = getattr(self.scheduler, callback)(self.driver, *args)
        if inspect.isawaitable(result):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(_awaited(result))
            else:
                if inspect.iscoroutine(result):
                    result.close()
                raise RuntimeError("SchedulerHarness runs async callbacks on a loop of its "
                                   "own; in an async test await them with a "
                                   "FakeSchedulerDriver instead")
        return self.driver.calls[before:]

    def register(self, framework_id: str = DEFAULT_FRAMEWORK_ID,
                 master_info: MasterInfo | None = None) -> list[DriverCall]:
        self.driver.framework_id = framework_id
        self.driver.master_info = master_info or make_master_info()
        self.driver.status = DriverStatus.RUNNING
        return self._deliver("registered", framework_id, self.driver.master_info)

    def reregister(self, master_info: MasterInfo | None = None) -> list[DriverCall]:
        self.driver.master_info = master_info or self.driver.master_info or make_master_info()
        return self._deliver("reregistered", self.driver.master_info)

    def disconnect(self) -> list[DriverCall]:
        return self._deliver("disconnected")

    def offer(self, *offers: Offer) -> list[DriverCall]:
        return self._deliver("resource_offers", list(offers))

    def rescind(self, offer_id: str) -> list[DriverCall]:
        return self._deliver("offer_rescinded", offer_id)

    def update(self, task: TaskInfo | TaskStatus | str, state: TaskState | None = None,
               **fields: Any) -> list[DriverCall]:
        """Deliver a status: a ready TaskStatus, or `make_status(task, state, **fields)`."""
        if isinstance(task, TaskStatus):
            status = task
        else:
            if state is None:
                raise TypeError("update(task, state) needs a state")
            status = make_status(task, state, **fields)
        calls = self._deliver("status_update", status)
        if status.uuid and self.driver.framework_info.implicit_acknowledgements:
            self.implicitly_acknowledged.append(status)
        return calls

    def framework_message(self, executor_id: str, agent_id: str,
                          data: bytes) -> list[DriverCall]:
        return self._deliver("framework_message", executor_id, agent_id, data)

    def lose_agent(self, agent_id: str) -> list[DriverCall]:
        return self._deliver("agent_lost", agent_id)

    def lose_executor(self, executor_id: str, agent_id: str,
                      status: int | None = None) -> list[DriverCall]:
        return self._deliver("executor_lost", executor_id, agent_id, status)

    def error(self, message: str) -> list[DriverCall]:
        return self._deliver("error", message)


# ------------------------------------------------------------- fake endpoints


class _Recorder:
    """Keeps what a fake endpoint received and lets tests wait for it."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self._arrived = asyncio.Event()

    def _record(self, message: Message) -> None:
        self.received.append(message)
        self._arrived.set()

    def of(self, kind: type[M]) -> list[M]:
        """Every received message of `kind`, in order."""
        return [m for m in self.received if isinstance(m, kind)]

    async def wait_for(self, kind: type[M], where: Callable[[M], bool] | None = None,
                       *, timeout: float = 5.0) -> M:
        """The first message of `kind` ever received that satisfies `where`, waiting
        up to `timeout` seconds for it; raises TimeoutError naming what came."""
        def found() -> M | None:
            return next((m for m in self.of(kind) if where is None or where(m)), None)

        async def wait() -> M:
            while (message := found()) is None:
                self._arrived.clear()
                await self._arrived.wait()
            return message

        try:
            return await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            seen = [type(m).__name__ for m in self.received]
            raise TimeoutError(f"no matching {kind.__name__} within {timeout}s; "
                               f"received {seen}") from None

    async def wait_until(self, condition: Callable[[], bool], *, timeout: float = 5.0) -> None:
        """Wait until `condition()` holds, re-checking whenever a message arrives."""
        async def wait() -> None:
            while not condition():
                self._arrived.clear()
                await self._arrived.wait()

        try:
            await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"condition not met within {timeout}s") from None


class FakeMaster(_Recorder):
    """A master on loopback for tests of code that uses the real `SchedulerDriver`.

    Serves ``GET /master/info`` and a ROUTER; answers every ``Subscribe`` with
    ``Subscribed`` (new frameworks get `framework_id`); sends ``Heartbeat`` every
    `heartbeat_interval` to the subscribed driver. Everything it receives is in
    ``received``. Point a driver at ``master.address``.
    """

    def __init__(self, *, framework_id: str = DEFAULT_FRAMEWORK_ID,
                 heartbeat_interval: float = 1.0, answer_subscribe: bool = True) -> None:
        super().__init__()
        self.framework_id = framework_id
        self.heartbeat_interval = heartbeat_interval
        self.answer_subscribe = answer_subscribe
        self.framework_identity: bytes | None = None
        self.master_info: MasterInfo | None = None
        self._silent = False
        self._router: Router | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.frames_received = 0
        """Frames, not messages: a `Batch` is one frame (recorded message by message)."""

    @property
    def address(self) -> str:
        """``ip:port`` of the HTTP endpoint, as users give it to drivers."""
        assert self.master_info is not None, "start the FakeMaster first"
        return f"{self.master_info.ip}:{self.master_info.port}"

    async def start(self) -> FakeMaster:
        self._router = Router()
        zmq_port = self._router.bind("127.0.0.1", 0)
        app = web.Application()
        app.router.add_get("/master/info", self._info)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        http_port = self._runner.addresses[0][1]
        self.master_info = make_master_info(port=http_port, zmq_port=zmq_port)
        self._tasks = [asyncio.create_task(self._serve()),
                       asyncio.create_task(self._heartbeat())]
        return self

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._router is not None:
            self._router.close()

    async def __aenter__(self) -> FakeMaster:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(to_json(self.master_info))

    def go_silent(self) -> None:
        """Stop heartbeats until the next ``Subscribe`` (a driver should then call
        `disconnected`, detect us again and re-subscribe)."""
        self._silent = True

    async def send(self, message: Message) -> None:
        """Send to the subscribed driver."""
        assert self._router is not None and self.framework_identity is not None, \
            "no driver has subscribed"
        await self._router.send(self.framework_identity, message)

    async def offer(self, *offers: Offer) -> None:
        await self.send(Offers(offers=list(offers)))

    async def _serve(self) -> None:
        assert self._router is not None
        while True:
            inbound = await self._router.recv()
            if inbound.message is None:
                continue
            self.frames_received += 1
            batch = inbound.message
            for message in batch.messages if isinstance(batch, Batch) else [batch]:
                self._record(message)
                if isinstance(message, Subscribe) and self.answer_subscribe:
                    await self._subscribed(inbound.identity, message)

    async def _subscribed(self, identity: bytes, message: Subscribe) -> None:
        assert self._router is not None and self.master_info is not None
        self.framework_identity, self._silent = identity, False
        known = message.framework.id
        await self._router.send(identity, Subscribed(
            framework_id=known or self.framework_id,
            heartbeat_interval=self.heartbeat_interval,
            master_info=self.master_info, reregistered=known is not None))

    async def _heartbeat(self) -> None:
        assert self._router is not None
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if self.framework_identity is not None and not self._silent:
                await self._router.send(self.framework_identity, Heartbeat())


class FakeAgent(_Recorder):
    """An agent's executor endpoint on loopback for tests of executors.

    Answers ``RegisterExecutor``/``ReregisterExecutor`` with ``ExecutorRegistered``
    and then sends the launches queued with `launch`; acknowledges every status
    update unless ``auto_ack=False``. Start the executor with ``environ()``.
    """

    def __init__(self, *, sandbox: str, agent_id: str = "agent-0001",
                 framework: FrameworkInfo | None = None,
                 executor: ExecutorInfo | None = None, auto_ack: bool = True) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.agent_id = agent_id
        self.framework = framework or FrameworkInfo(name="test", id=DEFAULT_FRAMEWORK_ID)
        self.executor = executor
        self.auto_ack = auto_ack
        self.executor_identity: bytes | None = None
        self.endpoint = ""
        self._queued: list[LaunchTask] = []
        self._router: Router | None = None
        self._task: asyncio.Task[None] | None = None

    def environ(self, executor_id: str = "executor-1", **extra: str) -> dict[str, str]:
        """The agent-provided variables for an executor process (merge them into
        ``os.environ`` for a subprocess)."""
        assert self.framework.id is not None
        return {"DYAD_AGENT_ENDPOINT": self.endpoint, "DYAD_AGENT_ID": self.agent_id,
                "DYAD_FRAMEWORK_ID": self.framework.id, "DYAD_EXECUTOR_ID": executor_id,
                "DYAD_SANDBOX_DIRECTORY": self.sandbox, **extra}

    @property
    def updates(self) -> list[TaskStatus]:
        """Statuses received, each once (resends of the same uuid are dropped)."""
        seen: set[str] = set()
        result = []
        for update in self.of(StatusUpdate):
            if update.status.uuid not in seen:
                seen.add(update.status.uuid)
                result.append(update.status)
        return result

    def states(self, task_id: str) -> list[TaskState]:
        return [s.state for s in self.updates if s.task_id == task_id]

    async def start(self) -> FakeAgent:
        self._router = Router()
        port = self._router.bind("127.0.0.1", 0)
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._task = asyncio.create_task(self._serve())
        return self

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._router is not None:
            self._router.close()

    async def __aenter__(self) -> FakeAgent:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def send(self, message: Message) -> None:
        """Send to the registered executor."""
        assert self._router is not None and self.executor_identity is not None, \
            "no executor has registered"
        await self._router.send(self.executor_identity, message)

    async def launch(self, task: TaskInfo) -> None:
        """Send the task now if the executor has registered, else right after."""
        message = LaunchTask(framework=self.framework, task=task)
        if self.executor_identity is None:
            self._queued.append(message)
        else:
            await self.send(message)

    async def kill(self, task_id: str, kill_grace_period: float | None = None) -> None:
        assert self.framework.id is not None
        await self.send(KillTask(framework_id=self.framework.id, task_id=task_id,
                                 kill_grace_period=kill_grace_period))

    async def shutdown(self, grace_period: float = 3.0) -> None:
        await self.send(ShutdownExecutor(grace_period=grace_period))

    async def acknowledge(self, status: TaskStatus) -> None:
        assert self.framework.id is not None
        await self.send(StatusUpdateAck(agent_id=self.agent_id, framework_id=self.framework.id,
                                        task_id=status.task_id, uuid=status.uuid))

    async def _serve(self) -> None:
        assert self._router is not None
        while True:
            inbound = await self._router.recv()
            if inbound.message is None:
                continue
            message = inbound.message
            self._record(message)
            if isinstance(message, (RegisterExecutor, ReregisterExecutor)):
                self.executor_identity = inbound.identity
                await self.send(ExecutorRegistered(
                    executor=self.executor or ExecutorInfo(
                        executor_id=message.executor_id, framework_id=message.framework_id,
                        command=CommandInfo(argv=[sys.executable, "-m",
                                                  "frameworks.executors.command"])),
                    framework=self.framework,
                    agent=AgentInfo(hostname="localhost", port=5051, id=self.agent_id,
                                    ip="127.0.0.1", resources=Resources.parse("cpus:4;mem:1024"))))
                queued, self._queued = self._queued, []
                for launch in queued:
                    await self.send(launch)
            elif isinstance(message, StatusUpdate) and self.auto_ack:
                await self.acknowledge(message.status)

