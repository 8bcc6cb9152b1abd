"""SchedulerDriver: the pure core's decisions, then the real driver over real
sockets against `frameworks.testing.FakeMaster` (a ROUTER plus /master/info)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest

from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.messages import (
    BATCH_CAPABILITY, Accept, Acknowledge, Batch, Decline, Error, ExecutorToFramework,
    Failure, Heartbeat, Kill, Preempt, Reconcile, ReconcileTask, Rejected, Rescind, Revive,
    SchedulerHeartbeat, Subscribe, Subscribed, Suppress, Teardown, Unsubscribe, Update)
from frameworks import (
    CommandInfo, DriverStatus, Filters, FrameworkInfo, Resources, Scheduler,
    SchedulerDriver, TaskInfo, TaskState, TaskStatus)
from frameworks.driver_core import Callback, Finish, Received, Started
from frameworks.scheduler_core import (
    REASON_MASTER_DISCONNECTED, AcceptCall, AcknowledgeCall, DeclineCall, Detect,
    HeartbeatDue, KillCall, LivenessCheck, MasterDetected, PreemptCall, ReconcileCall,
    ReviveCall,
    SchedulerCore, SchedulerTimings, StopCall, SubscribeRetry, SuppressCall)
from frameworks.testing import FakeMaster, make_master_info, make_offer, make_status
from tests.helpers import running

# ----------------------------------------------------------------- helpers


def task_for(offer_agent: str, task_id: str = "t1") -> TaskInfo:
    return TaskInfo(task_id=task_id, name=task_id, agent_id=offer_agent,
                    resources=Resources.parse("cpus:0.1;mem:32"),
                    command=CommandInfo(shell="true"))


def sent(effects: list[Any]) -> list[Any]:
    return [e.message for e in effects if isinstance(e, Send)]


def callbacks(effects: list[Any]) -> list[Callback]:
    return [e for e in effects if isinstance(e, Callback)]


def subscribed_core(**framework: Any) -> SchedulerCore:
    core = SchedulerCore(FrameworkInfo(name="test", **framework))
    core.handle(Started(), 0.0)
    core.handle(MasterDetected(make_master_info()), 0.0)
    core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=1.0,
                                    master_info=make_master_info())), 0.0)
    return core


# ---------------------------------------------------------------- pure core


def test_core_subscribes_until_answered_and_then_registers() -> None:
    core = SchedulerCore(FrameworkInfo(name="test"))
    assert core.handle(Started(), 0.0) == [Detect()]
    effects = core.handle(MasterDetected(make_master_info()), 0.0)
    (subscribe,) = sent(effects)
    assert isinstance(subscribe, Subscribe) and subscribe.framework.id is None
    assert ArmTimer(SubscribeRetry(), 1.0) in effects
    assert isinstance(sent(core.handle(TimerFired(SubscribeRetry()), 1.0))[0], Subscribe)

    effects = core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=2.0,
                                              master_info=make_master_info())), 1.5)
    assert core.framework_id == "fw-1" and core.subscribed
    assert CancelTimer(SubscribeRetry()) in effects
    assert ArmTimer(HeartbeatDue(), 3.5) in effects
    assert ArmTimer(LivenessCheck(), 1.5 + SchedulerTimings().missed_heartbeats * 2.0) in effects
    assert [c.name for c in callbacks(effects)] == ["registered"]
    # a second Subscribed (answer to a retry) changes nothing
    assert core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=2.0,
                                           master_info=make_master_info())), 1.6) == []


def test_core_redetects_after_unanswered_subscribes() -> None:
    core = SchedulerCore(FrameworkInfo(name="test"))
    core.handle(MasterDetected(make_master_info()), 0.0)
    effects: list[Any] = []
    for second in range(1, 10):
        effects = core.handle(TimerFired(SubscribeRetry()), float(second))
        if Detect() in effects:
            break
    assert effects == [Detect()]


def test_core_heartbeats_and_declares_the_master_lost() -> None:
    core = subscribed_core()
    assert sent(core.handle(TimerFired(HeartbeatDue()), 1.0)) == [
        SchedulerHeartbeat(framework_id="fw-1")]
    core.handle(Received(Heartbeat()), 2.0)
    # 2.0 + 3 intervals = 5.0: not yet
    assert core.handle(TimerFired(LivenessCheck()), 3.0) == [ArmTimer(LivenessCheck(), 5.0)]
    effects = core.handle(TimerFired(LivenessCheck()), 5.0)
    assert [c.name for c in callbacks(effects)] == ["disconnected"]
    assert Detect() in effects and not core.subscribed
    # re-subscribes with the id it was given; the master's answer is a re-registration
    (subscribe,) = sent(core.handle(MasterDetected(make_master_info()), 6.0))
    assert subscribe.framework.id == "fw-1"
    effects = core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=1.0,
                                              master_info=make_master_info(),
                                              reregistered=True)), 6.5)
    assert [c.name for c in callbacks(effects)] == ["reregistered"]


def test_core_acknowledges_only_updates_with_a_uuid_when_implicit() -> None:
    core = subscribed_core()
    with_uuid = make_status("t1", TaskState.TASK_RUNNING, agent_id="a1")
    (cb,) = callbacks(core.handle(Received(Update(status=with_uuid)), 1.0))
    assert cb == Callback("status_update", (with_uuid,), ack=with_uuid)
    master_made = make_status("t1", TaskState.TASK_LOST, uuid="")
    (cb,) = callbacks(core.handle(Received(Update(status=master_made)), 1.0))
    assert cb.ack is None

    explicit = subscribed_core(implicit_acknowledgements=False)
    (cb,) = callbacks(explicit.handle(Received(Update(status=with_uuid)), 1.0))
    assert cb.ack is None
    assert sent(explicit.handle(AcknowledgeCall(with_uuid), 1.1)) == [Acknowledge(
        framework_id="fw-1", agent_id="a1", task_id="t1", uuid=with_uuid.uuid)]
    assert explicit.handle(AcknowledgeCall(master_made), 1.1) == []


def test_core_sends_preempt_requests_only_while_subscribed() -> None:
    core = subscribed_core()
    room = Resources.parse("cpus:1;mem:128")
    assert sent(core.handle(PreemptCall(room, 300), 0.5)) == [
        Preempt(framework_id="fw-1", resources=room, priority=300)]
    core.handle(TimerFired(LivenessCheck()), 10.0)  # master lost
    assert core.handle(PreemptCall(room, 300), 10.1) == []  # dropped, not held over
    core.handle(MasterDetected(make_master_info()), 11.0)
    effects = core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=1.0,
                                              master_info=make_master_info())), 11.0)
    assert not [m for m in sent(effects) if isinstance(m, Preempt)]
    (refused,) = callbacks(core.handle(Received(Rejected(
        message_type="preempt", reason="preemption is off")), 12.0))
    assert refused.name == "error" and "rejected preempt: preemption is off" in refused.args[0]


@pytest.mark.parametrize("resources, priority", [
    ("cpus:1", 300), (Resources.parse("cpus:1"), 10**9), (Resources.parse("cpus:1"), 1.5)])
def test_a_bad_preempt_request_raises_in_the_caller(resources: Any, priority: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        PreemptCall(resources, priority)


def test_core_queues_kills_while_disconnected_and_remembers_agents() -> None:
    core = subscribed_core()
    core.handle(AcceptCall(["o1"], [_launch(task_for("agent-9"))], Filters()), 0.5)
    core.handle(Received(Heartbeat()), 1.0)
    core.handle(TimerFired(LivenessCheck()), 10.0)  # master lost
    assert core.handle(KillCall("t1", 2.0), 10.1) == []
    assert core.handle(ReconcileCall([]), 10.2) == []
    core.handle(MasterDetected(make_master_info()), 11.0)
    effects = core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=1.0,
                                              master_info=make_master_info())), 11.0)
    assert sent(effects) == [
        Kill(framework_id="fw-1", task_id="t1", agent_id="agent-9", kill_grace_period=2.0),
        Reconcile(framework_id="fw-1", tasks=[])]


def test_core_turns_launches_without_master_into_lost_updates() -> None:
    core = SchedulerCore(FrameworkInfo(name="test"))
    effects = core.handle(AcceptCall(["o1"], [_launch(task_for("a1"))], Filters()), 0.0)
    (cb,) = callbacks(effects)
    status = cb.args[0]
    assert status.state is TaskState.TASK_LOST and status.uuid == ""
    assert status.reason == REASON_MASTER_DISCONNECTED
    aware = SchedulerCore(FrameworkInfo(name="test", capabilities=["PARTITION_AWARE"]))
    (cb,) = callbacks(aware.handle(
        AcceptCall(["o1"], [_launch(task_for("a1"))], Filters()), 0.0))
    assert cb.args[0].state is TaskState.TASK_DROPPED
    assert core.handle(DeclineCall(["o1"], Filters()), 0.0) == []


def test_core_restates_suppression_after_resubscribing() -> None:
    core = subscribed_core()
    assert sent(core.handle(SuppressCall(), 1.0)) == [Suppress(framework_id="fw-1")]
    core.handle(TimerFired(LivenessCheck()), 100.0)
    core.handle(MasterDetected(make_master_info()), 100.0)
    effects = core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=1.0,
                                              master_info=make_master_info())), 100.0)
    assert Suppress(framework_id="fw-1") in sent(effects)
    core.handle(TimerFired(LivenessCheck()), 200.0)
    assert core.handle(ReviveCall(), 200.0) == []
    core.handle(MasterDetected(make_master_info()), 200.0)
    effects = core.handle(Received(Subscribed(framework_id="fw-1", heartbeat_interval=1.0,
                                              master_info=make_master_info())), 200.0)
    assert Revive(framework_id="fw-1") in sent(effects)
    assert Suppress(framework_id="fw-1") not in sent(effects)


def test_core_error_aborts_and_rejected_only_reports() -> None:
    core = subscribed_core()
    (cb,) = callbacks(core.handle(Received(Rejected(reason="bad", message_type="accept")), 1.0))
    assert cb.name == "error" and "accept" in cb.args[0] and "bad" in cb.args[0]
    assert core.subscribed
    assert core.handle(Received(Error(message="torn down")), 1.0) == [
        Callback("error", ("torn down",)), Finish(DriverStatus.ABORTED)]
    assert core.handle(Received(Heartbeat()), 2.0) == []


def test_core_farewell() -> None:
    assert SchedulerCore(FrameworkInfo(name="t")).handle(StopCall(failover=False), 1.0) == []
    assert sent(subscribed_core().handle(StopCall(failover=False), 1.0)) == [
        Teardown(framework_id="fw-1")]
    assert sent(subscribed_core().handle(StopCall(failover=True), 1.0)) == [
        Unsubscribe(framework_id="fw-1")]


def test_core_timings_are_injected() -> None:
    core = SchedulerCore(FrameworkInfo(name="test"),
                         SchedulerTimings(subscribe_retry=0.25,
                                          subscribe_attempts_before_redetect=2))
    core.handle(Started(), 0.0)
    assert ArmTimer(SubscribeRetry(), 0.25) in core.handle(MasterDetected(make_master_info()), 0.0)
    assert ArmTimer(SubscribeRetry(), 0.5) in core.handle(TimerFired(SubscribeRetry()), 0.25)
    assert core.handle(TimerFired(SubscribeRetry()), 0.5) == [Detect()]


def test_core_ignores_stale_timers_and_raises_on_unknown_ones() -> None:
    core = SchedulerCore(FrameworkInfo(name="test"))
    core.handle(Started(), 0.0)
    # known kinds armed in another state: stale, ignored
    for key in (SubscribeRetry(), HeartbeatDue(), LivenessCheck()):
        assert core.handle(TimerFired(key), 1.0) == []

    @attrs.frozen
    class Stranger(TimerKey):
        pass

    with pytest.raises(UnknownTimer):
        core.handle(TimerFired(Stranger()), 1.0)
    with pytest.raises(UnknownTimer):
        core.handle(TimerFired("subscribe"), 1.0)


def _launch(task: TaskInfo) -> Any:
    from frameworks import Operation, OperationType
    return Operation(type=OperationType.LAUNCH, tasks=[task])


# ------------------------------------------------------ driver over sockets


class Recording(Scheduler):
    """Records every callback; tests wait on `events`."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []
        self.changed = asyncio.Event()

    def _note(self, name: str, *args: Any) -> None:
        self.events.append((name, args))
        self.changed.set()

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def args_of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.events if n == name]

    async def wait_for(self, name: str, count: int = 1, timeout: float = 5.0) -> None:
        async def wait() -> None:
            while self.names().count(name) < count:
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no {count}x {name} within {timeout}s: {self.names()}") from None

    def registered(self, driver: Any, framework_id: str, master_info: Any) -> None:
        self._note("registered", framework_id, master_info)

    def reregistered(self, driver: Any, master_info: Any) -> None:
        self._note("reregistered", master_info)

    def disconnected(self, driver: Any) -> None:
        self._note("disconnected")

    def resource_offers(self, driver: Any, offers: Any) -> None:
        self._note("resource_offers", offers)

    def offer_rescinded(self, driver: Any, offer_id: str) -> None:
        self._note("offer_rescinded", offer_id)

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        self._note("status_update", status)

    def framework_message(self, driver: Any, executor_id: str, agent_id: str,
                          data: bytes) -> None:
        self._note("framework_message", executor_id, agent_id, data)

    def agent_lost(self, driver: Any, agent_id: str) -> None:
        self._note("agent_lost", agent_id)

    def executor_lost(self, driver: Any, executor_id: str, agent_id: str,
                      status: int | None) -> None:
        self._note("executor_lost", executor_id, agent_id, status)

    def error(self, driver: Any, message: str) -> None:
        self._note("error", message)


@pytest.fixture
async def master() -> AsyncIterator[FakeMaster]:
    async with FakeMaster(heartbeat_interval=0.2) as fake:
        yield fake


def make_driver(scheduler: Scheduler, master: FakeMaster, **framework: Any) -> SchedulerDriver:
    return SchedulerDriver(scheduler, FrameworkInfo(name="test-fw", **framework),
                           master=master.address)


async def test_subscribes_and_registers(master: FakeMaster) -> None:
    sched = Recording()
    driver = make_driver(sched, master)
    async with running(driver):
        await sched.wait_for("registered")
        (framework_id, master_info), = sched.args_of("registered")
        assert framework_id == "framework-0001" == driver.framework_id
        assert master_info == master.master_info
        subscribe = master.of(Subscribe)[0]
        assert subscribe.framework.name == "test-fw" and subscribe.framework.id is None
        assert subscribe.framework.user and subscribe.framework.hostname
        await master.wait_for(SchedulerHeartbeat)
    assert driver.status is DriverStatus.ABORTED


async def test_subscribe_is_retried_until_answered(master: FakeMaster) -> None:
    master.answer_subscribe = False
    sched = Recording()
    driver = SchedulerDriver(sched, FrameworkInfo(name="test-fw"), master=master.address,
                             timings=SchedulerTimings(subscribe_retry=0.1))
    async with running(driver):
        await master.wait_until(lambda: len(master.of(Subscribe)) >= 2, timeout=3)
        master.answer_subscribe = True
        await sched.wait_for("registered", timeout=3)


async def test_offers_launch_and_decline(master: FakeMaster) -> None:
    class LaunchFirstDeclineRest(Recording):
        def resource_offers(self, driver: Any, offers: Any) -> None:
            first, *rest = offers
            driver.launch_tasks([first.id], [task_for(first.agent_id)],
                                filters=Filters(refuse_seconds=7))
            for offer in rest:
                driver.decline_offer(offer.id, Filters(refuse_seconds=30))

    sched = LaunchFirstDeclineRest()
    async with running(make_driver(sched, master)):
        await sched.wait_for("registered")
        one, two = make_offer(), make_offer()
        await master.offer(one, two)
        accept = await master.wait_for(Accept)
        assert accept.framework_id == "framework-0001"
        assert accept.offer_ids == [one.id]
        (operation,) = accept.operations
        assert operation.type == "LAUNCH"
        assert operation.tasks == [task_for(one.agent_id)]
        assert accept.filters == Filters(refuse_seconds=7)
        decline = await master.wait_for(Decline)
        assert decline.offer_ids == [two.id] and decline.filters.refuse_seconds == 30


async def test_implicit_ack_goes_out_after_an_async_callback_returns(master: FakeMaster) -> None:
    class SlowToDigest(Recording):
        acked_during_callback: bool | None = None

        async def status_update(  # type: ignore[override]  # async is allowed
                self, driver: Any, status: TaskStatus) -> None:
            try:
                await master.wait_for(Acknowledge, timeout=0.3)
                self.acked_during_callback = True
            except TimeoutError:
                self.acked_during_callback = False
            self._note("status_update", status)

    sched = SlowToDigest()
    async with running(make_driver(sched, master)):
        await sched.wait_for("registered")
        status = make_status("t1", TaskState.TASK_RUNNING, agent_id="a1")
        await master.send(Update(status=status))
        ack = await master.wait_for(Acknowledge)
        assert sched.acked_during_callback is False
        assert (ack.task_id, ack.agent_id, ack.uuid) == ("t1", "a1", status.uuid)
        # master-made updates carry no uuid and are not acknowledged
        await master.send(Update(status=make_status("t2", TaskState.TASK_LOST, uuid="")))
        await sched.wait_for("status_update", count=2)
        await master.send(Heartbeat())
        await master.wait_for(SchedulerHeartbeat)
        assert len(master.of(Acknowledge)) == 1


async def test_explicit_acknowledgement(master: FakeMaster) -> None:
    sched = Recording()
    driver = make_driver(sched, master, implicit_acknowledgements=False)
    async with running(driver):
        await sched.wait_for("registered")
        status = make_status("t1", TaskState.TASK_RUNNING, agent_id="a1")
        await master.send(Update(status=status))
        await sched.wait_for("status_update")
        # a round trip after the update: had an ack been sent, it would be here
        await master.send(Heartbeat())
        beats = len(master.of(SchedulerHeartbeat))
        await master.wait_until(lambda: len(master.of(SchedulerHeartbeat)) > beats)
        assert master.of(Acknowledge) == []
        driver.acknowledge_status_update(status)
        ack = await master.wait_for(Acknowledge)
        assert ack.uuid == status.uuid


async def test_user_exception_reported_through_error_and_driver_carries_on(
        master: FakeMaster) -> None:
    class Clumsy(Recording):
        def resource_offers(self, driver: Any, offers: Any) -> None:
            self._note("resource_offers", offers)
            if len(self.args_of("resource_offers")) == 1:
                raise ValueError("oops")
            driver.decline_offer(offers[0].id)

        def status_update(self, driver: Any, status: TaskStatus) -> None:
            raise RuntimeError("cannot digest")

    sched = Clumsy()
    async with running(make_driver(sched, master)):
        await sched.wait_for("registered")
        await master.offer(make_offer())
        await sched.wait_for("error")
        assert "resource_offers" in sched.args_of("error")[0][0]
        assert "oops" in sched.args_of("error")[0][0]
        second = make_offer()
        await master.offer(second)
        decline = await master.wait_for(Decline)
        assert decline.offer_ids == [second.id]
        # an update whose callback raised is not acknowledged: it will come again
        await master.send(Update(status=make_status("t1", TaskState.TASK_RUNNING)))
        await sched.wait_for("error", count=2)
        assert master.of(Acknowledge) == []


async def test_error_callback_that_raises_is_not_reported_to_itself(
        master: FakeMaster) -> None:
    class Hopeless(Recording):
        def resource_offers(self, driver: Any, offers: Any) -> None:
            raise ValueError("first")

        def error(self, driver: Any, message: str) -> None:
            self._note("error", message)
            raise ValueError("second")

    sched = Hopeless()
    async with running(make_driver(sched, master)):
        await sched.wait_for("registered")
        await master.offer(make_offer())
        await master.offer(make_offer())
        await sched.wait_for("error", count=2)
        assert len(sched.args_of("error")) == 2  # one per offer, no recursion


async def test_missed_heartbeats_disconnect_and_resubscribe_with_same_id(
        master: FakeMaster) -> None:
    sched = Recording()
    driver = make_driver(sched, master)
    async with running(driver):
        await sched.wait_for("registered")
        master.go_silent()
        await sched.wait_for("disconnected", timeout=3)
        await sched.wait_for("reregistered", timeout=3)
        first, *later = master.of(Subscribe)
        assert first.framework.id is None
        assert later and later[-1].framework.id == "framework-0001"
        assert sched.names().index("disconnected") < sched.names().index("reregistered")
        assert driver.framework_id == "framework-0001"


async def test_master_error_aborts_the_driver(master: FakeMaster) -> None:
    sched = Recording()
    async with running(make_driver(sched, master)) as task:
        await sched.wait_for("registered")
        await master.send(Error(message="framework removed"))
        assert await asyncio.wait_for(task, 5) is DriverStatus.ABORTED
    assert sched.args_of("error") == [("framework removed",)]
    assert master.of(Teardown) == [] and master.of(Unsubscribe) == []


@pytest.mark.parametrize("failover, farewell", [(False, Teardown), (True, Unsubscribe)])
async def test_stop_says_goodbye(master: FakeMaster, failover: bool, farewell: type) -> None:
    class StopOnFinish(Recording):
        def status_update(self, driver: Any, status: TaskStatus) -> None:
            self._note("status_update", status)
            driver.stop(failover=failover)

    sched = StopOnFinish()
    async with running(make_driver(sched, master)) as task:
        await sched.wait_for("registered")
        status = make_status("t1", TaskState.TASK_FINISHED, agent_id="a1")
        await master.send(Update(status=status))
        assert await asyncio.wait_for(task, 5) is DriverStatus.STOPPED
        message: Teardown | Unsubscribe = await master.wait_for(farewell)
        assert message.framework_id == "framework-0001"
        kinds = [type(m) for m in master.received]
        # the implicit ack of the update that made us stop still goes out, first
        assert kinds.index(Acknowledge) < kinds.index(farewell)


async def test_rejected_is_reported_and_forwarded_callbacks(master: FakeMaster) -> None:
    sched = Recording()
    async with running(make_driver(sched, master)) as task:
        await sched.wait_for("registered")
        await master.send(Rejected(reason="offer unknown", message_type="accept"))
        await master.send(Rescind(offer_id="o-9"))
        await master.send(ExecutorToFramework(framework_id="framework-0001", agent_id="a1",
                                              executor_id="e1", data=b"\x00hi"))
        await master.send(Failure(agent_id="a2"))
        await master.send(Failure(agent_id="a1", executor_id="e1", status=3))
        await sched.wait_for("executor_lost")
        assert not task.done()
    assert sched.names()[1:] == ["error", "offer_rescinded", "framework_message",
                                 "agent_lost", "executor_lost"]
    assert sched.args_of("framework_message") == [("e1", "a1", b"\x00hi")]
    assert sched.args_of("executor_lost") == [("e1", "a1", 3)]


async def test_kill_names_the_agent_and_calls_from_another_thread(master: FakeMaster) -> None:
    sched = Recording()
    driver = make_driver(sched, master)
    driver.start()
    try:
        await sched_wait_threadsafe(lambda: driver.framework_id is not None)
        await master.send(Update(status=make_status("t1", TaskState.TASK_RUNNING,
                                                    agent_id="agent-7")))
        await master.wait_for(Acknowledge)
        # this test's thread is not the driver's: calls hop onto its loop
        assert threading.current_thread() is threading.main_thread()
        driver.kill_task("t1", kill_grace_period=1.5)
        driver.reconcile_tasks([("t2", "agent-8"), make_status("t1", TaskState.TASK_RUNNING,
                                                               agent_id="agent-7")])
        driver.suppress_offers()
        driver.revive_offers()
        driver.send_framework_message("e1", "agent-7", b"ping")
        kill = await master.wait_for(Kill)
        assert (kill.task_id, kill.agent_id, kill.kill_grace_period) == ("t1", "agent-7", 1.5)
        reconcile = await master.wait_for(Reconcile)
        assert reconcile.tasks == [ReconcileTask(task_id="t2", agent_id="agent-8"),
                                   ReconcileTask(task_id="t1", agent_id="agent-7")]
        await master.wait_for(Suppress)
        await master.wait_for(Revive)
    finally:
        driver.stop()
        assert await asyncio.to_thread(driver.join, 5) is DriverStatus.STOPPED
    await master.wait_for(Teardown)


async def test_calls_before_start_apply_once_running(master: FakeMaster) -> None:
    sched = Recording()
    driver = make_driver(sched, master)
    driver.kill_task("t1")
    driver.launch_tasks(["o1"], [task_for("a1")])
    async with running(driver):
        await sched.wait_for("registered")
        kill = await master.wait_for(Kill)
        assert kill.framework_id == "framework-0001" and kill.agent_id is None
        # the launch had no master to go to: it comes back as TASK_LOST
        (status,), = sched.args_of("status_update")
        assert status.state is TaskState.TASK_LOST
        assert master.of(Accept) == []


async def test_bad_frame_is_answered_with_rejected(master: FakeMaster) -> None:
    sched = Recording()
    driver = make_driver(sched, master)
    async with running(driver):
        await sched.wait_for("registered")
        assert master.framework_identity is not None
        assert master._router is not None
        await master._router.send_raw(master.framework_identity, b"not json")
        rejected = await master.wait_for(Rejected)
        assert "JSON" in rejected.reason
        assert driver.messages_invalid == 1


async def sched_wait_threadsafe(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition that another thread makes true (nothing to await on here)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_run_refuses_inside_a_running_loop_and_bad_arguments() -> None:
    driver = SchedulerDriver(Scheduler(), FrameworkInfo(name="x"), master="127.0.0.1:1")
    with pytest.raises(TypeError, match="list of ids"):
        driver.launch_tasks("offer-1", [task_for("a1")])

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="run_async"):
            driver.run()

    asyncio.run(inside())
    with pytest.raises(ValueError, match="port"):
        SchedulerDriver(Scheduler(), FrameworkInfo(name="x"), master="localhost")


async def test_a_batch_is_handled_message_by_message_and_then_acks_go_in_batches(
        master: FakeMaster) -> None:
    """A master that sends a `Batch` takes them: the driver's acknowledgements
    that queue up meanwhile go back as one frame (issue 19)."""
    sched = Recording()
    driver = make_driver(sched, master)
    async with running(driver):
        await sched.wait_for("registered")
        assert BATCH_CAPABILITY in master.of(Subscribe)[0].framework.capabilities
        assert not driver.peer_batches
        statuses = [make_status(f"t{i}", TaskState.TASK_RUNNING, agent_id="a1")
                    for i in range(50)]
        await master.send(Batch(messages=[Update(status=s) for s in statuses]))
        await sched.wait_for("status_update", count=50)
        assert [s.task_id for (s,) in sched.args_of("status_update")] == \
            [s.task_id for s in statuses]
        await master.wait_until(lambda: len(master.of(Acknowledge)) == 50)
        assert [a.uuid for a in master.of(Acknowledge)] == [s.uuid for s in statuses]
        assert driver.peer_batches and driver.batches_sent >= 1
