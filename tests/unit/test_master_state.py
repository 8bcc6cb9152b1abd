"""Tests for master.state: the master's pure core driven by plain messages and a
fake clock. Every step runs `validate()` (the `Harness` does it), so each test
also checks the resource books after every event."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Hashable, Iterable

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from dyad.clock import FakeClock
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired, TimerKey, UnknownTimer
from dyad.ids import IdGenerator
from dyad.containers import ContainerInfo, DockerInfo, PortMapping
from dyad.messages import (
    Accept, Acknowledge, Address, AgentInfo, AgentRegistered, CheckpointResources, CommandInfo,
    Decline, Error, ExecutorExited, ExecutorInfo, ExecutorToFramework, Failure, Filters, FrameworkInfo,
    FrameworkToExecutor, Heartbeat, Kill, KillTask, MasterInfo, Message, MessageError, Offer,
    Offers, Operation, Ping, Pong, Reason, Reconcile, ReconcileTask, RegisterAgent, Rejected,
    Rescind, Revive, RunTask, SchedulerHeartbeat, ShutdownFramework, StatusUpdate,
    StatusUpdateAck, Subscribe, Subscribed, Suppress, Task, TaskInfo, TaskState, TaskStatus,
    Teardown, Unsubscribe, Update,
)
from dyad.resources import Resources
from master.allocator import Quota
from master.operator import OperatorCall, Reply, Request, SetQuota, SetWeights
from master.model import (
    Allocate, AllocationTimed, FailoverTimeout, HeartbeatDue, InvalidFrame, MasterConfig,
    OfferTimeout, PersistRegistry, PingDue, Received,
)
from master.removals import Decision, RemovalLimiter
from master.tasks import story_lines
from master.state import MasterState
from master.views import resources_json

INFO = MasterInfo(id="m", hostname="master", ip="127.0.0.1", port=5050, zmq_port=5055,
                  version="0.1.0", address=Address(hostname="master", ip="127.0.0.1", port=5050))
AGENT_RES = "cpus:4;mem:4096;disk:1000;ports:[31000-31099]"
CMD = CommandInfo(shell="true")


class Harness:
    """Plays the shell: feeds events at the fake clock's time, keeps the armed
    timers, fires them in time order on `advance`, validates after every step."""

    def __init__(self, config: MasterConfig | None = None) -> None:
        self.clock = FakeClock(1000.0)
        self.config = config or MasterConfig()
        self.state = MasterState(self.config, INFO, IdGenerator("m"), start_time=self.clock.now())
        self.timers: dict[Hashable, float] = {}
        self.log: list[Send] = []
        self.silent_agents: set[str] = set()  # agents that stopped answering pings
        self.drivers: dict[str, str] = {}  # live driver peer -> framework id
        self.persisted = 0  # PersistRegistry effects seen
        self.replies: list[Reply] = []
        self._calls = 0

    def handle(self, event: object) -> list[Send]:
        effects = self.state.handle(event, self.clock.now())  # type: ignore[arg-type]
        self.state.validate()
        sends = []
        for effect in effects:
            if isinstance(effect, ArmTimer):
                self.timers[effect.key] = effect.at
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)
            elif isinstance(effect, PersistRegistry):
                self.persisted += 1
            elif isinstance(effect, Reply):
                self.replies.append(effect)
            else:
                assert isinstance(effect, Send)
                sends.append(effect)
        self.log.extend(sends)
        return sends

    def call(self, request: Request) -> Reply:
        """An operator call, answered at once (the shell would queue it)."""
        self._calls += 1
        self.handle(OperatorCall(self._calls, request))
        (reply,) = [r for r in self.replies if r.call_id == self._calls]
        return reply

    def recv(self, peer: str, message: Message) -> list[Send]:
        return self.handle(Received(peer, message))

    def fire(self, key: Hashable) -> list[Send]:
        self.timers.pop(key)
        return self.handle(TimerFired(key))

    def advance(self, seconds: float) -> list[Send]:
        """Move time forward, firing every due timer in order; agents not in
        `silent_agents` answer their pings, drivers in `drivers` heartbeat back."""
        end = self.clock.now() + seconds
        sends: list[Send] = []
        while True:
            due = [(at, str(key), key) for key, at in self.timers.items() if at <= end]
            if not due:
                break
            at, _, key = min(due)
            self.clock.advance(max(0.0, at - self.clock.now()))
            for send in self.fire(key):
                sends.append(send)
                if isinstance(send.message, Ping) and send.message.agent_id not in self.silent_agents:
                    sends.extend(self.recv(send.to, Pong(agent_id=send.message.agent_id)))
                if isinstance(send.message, Heartbeat) and send.to in self.drivers:
                    sends.extend(self.recv(send.to, SchedulerHeartbeat(
                        framework_id=self.drivers[send.to])))
        self.clock.advance(end - self.clock.now())
        return sends

    def allocate(self) -> list[Send]:
        return self.fire(Allocate()) if Allocate() in self.timers else self.handle(TimerFired(Allocate()))

    # ----- conveniences

    def subscribe(self, peer: str, name: str = "fw", **info: object) -> str:
        sends = self.recv(peer, Subscribe(framework=FrameworkInfo(name=name, **info)))  # type: ignore[arg-type]
        (subscribed,) = messages(sends, Subscribed)
        self.drivers[peer] = subscribed.framework_id
        return subscribed.framework_id

    def register(self, peer: str, resources: str = AGENT_RES, hostname: str = "h",
                 **info: object) -> str:
        sends = self.recv(peer, RegisterAgent(agent=AgentInfo(
            hostname=hostname, port=5051, resources=Resources.parse(resources), **info)))  # type: ignore[arg-type]
        (registered,) = messages(sends, AgentRegistered)
        return registered.agent_id

    def offers_to(self, sends: Iterable[Send], peer: str) -> list[Offer]:
        return [o for s in sends if s.to == peer and isinstance(s.message, Offers)
                for o in s.message.offers]

    def metric(self, name: str) -> float:
        return self.state.metrics()[name]


def messages(sends: Iterable[Send], kind: type, to: str | None = None) -> list:
    return [s.message for s in sends if isinstance(s.message, kind) and (to is None or s.to == to)]


def task(task_id: str, agent_id: str, resources: str = "cpus:1;mem:128", **kw: object) -> TaskInfo:
    kw.setdefault("command", CMD)
    return TaskInfo(task_id=task_id, name=task_id, agent_id=agent_id,
                    resources=Resources.parse(resources), **kw)  # type: ignore[arg-type]


def launch(fid: str, offers: list[Offer], *tasks: TaskInfo, refuse: float = 5.0) -> Accept:
    return Accept(framework_id=fid, offer_ids=[o.id for o in offers],
                  operations=[Operation(type="LAUNCH", tasks=list(tasks))],
                  filters=Filters(refuse_seconds=refuse))


def status(task_id: str, state: TaskState, uuid: str = "u1", **kw: object) -> TaskStatus:
    return TaskStatus(task_id=task_id, state=state, uuid=uuid, **kw)  # type: ignore[arg-type]


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def cluster(h: Harness) -> tuple[Harness, str, str, Offer]:
    """One framework ('fw' on peer 'f1'), one agent ('a1'), one outstanding offer."""
    fid = h.subscribe("f1")
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    return h, fid, aid, offer


def running(h: Harness, fid: str, aid: str, offer: Offer, task_id: str = "t1",
            resources: str = "cpus:1;mem:128") -> None:
    h.recv("f1", launch(fid, [offer], task(task_id, aid, resources)))
    h.recv("a1", StatusUpdate(framework_id=fid, status=status(task_id, TaskState.TASK_RUNNING,
                                                             uuid="r-" + task_id)))


# --------------------------------------------------------------------- the core is pure


def test_core_imports_no_io() -> None:
    root = pathlib.Path(__file__).resolve().parents[2] / "master"
    for path in [root / "state.py", root / "metrics.py", *sorted((root / "allocator").glob("*.py"))]:
        text = path.read_text()
        bad = re.findall(r"^\s*(?:import|from)\s+(asyncio|zmq|aiohttp|kazoo)\b", text, re.M)
        assert not bad, f"{path.name} imports {bad}"


# ------------------------------------------------------------------------- frameworks


def test_subscribe_new_framework(h: Harness) -> None:
    sends = h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw")))
    (sub,) = messages(sends, Subscribed, to="f1")
    assert sub.framework_id.startswith("m-F")
    assert not sub.reregistered
    assert sub.heartbeat_interval == 5.0 and sub.master_info == INFO
    assert h.metric("master/frameworks_connected") == 1


def test_repeated_first_subscribe_is_idempotent(h: Harness) -> None:
    first = h.subscribe("f1")
    assert h.subscribe("f1") == first
    assert len(h.state.snapshot()["frameworks"]) == 1


def test_subscribe_with_unknown_id_is_reregistration(h: Harness) -> None:
    sends = h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", id="old-F1")))
    (sub,) = messages(sends, Subscribed)
    assert sub.framework_id == "old-F1" and sub.reregistered


def test_subscribe_invalid_role_rejected(h: Harness) -> None:
    sends = h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", roles=["a b"])))
    (rej,) = messages(sends, Rejected)
    assert "invalid role" in rej.reason and rej.message_type == "subscribe"
    assert h.metric("master/messages_invalid") == 1


def test_takeover_by_new_identity(cluster) -> None:
    h, fid, aid, offer = cluster
    sends = h.recv("f2", Subscribe(framework=FrameworkInfo(name="fw", id=fid)))
    (err,) = messages(sends, Error, to="f1")
    assert "taken over" in err.message
    (sub,) = messages(sends, Subscribed, to="f2")
    assert sub.reregistered
    assert h.metric("master/outstanding_offers") == 0  # old offers are void
    # The old connection no longer owns the framework.
    (rej,) = messages(h.recv("f1", Revive(framework_id=fid)), Rejected)
    assert "not subscribed on this connection" in rej.reason
    assert h.offers_to(h.allocate(), "f2")


def test_foreign_framework_id_rejected(cluster) -> None:
    h, fid, aid, offer = cluster
    h.subscribe("f2", name="other")
    sends = h.recv("f2", launch(fid, [offer], task("t1", aid)))
    (rej,) = messages(sends, Rejected, to="f2")
    assert "not subscribed on this connection" in rej.reason
    assert not messages(sends, RunTask)
    assert h.metric("master/outstanding_offers") == 1
    (rej,) = messages(h.recv("f2", Teardown(framework_id="nope")), Rejected)
    assert "unknown framework" in rej.reason


def test_master_heartbeats_and_disconnect_after_three_silent_intervals(h: Harness) -> None:
    fid = h.subscribe("f1", failover_timeout=60.0)
    del h.drivers["f1"]  # this driver only speaks when told to
    h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    sends = h.advance(5.0)
    assert messages(sends, Heartbeat, to="f1")
    h.recv("f1", SchedulerHeartbeat(framework_id=fid))
    sends = h.advance(10.0)  # 15 s since subscribe, 10 since the driver spoke
    assert not messages(sends, Rescind)
    sends = h.advance(6.0)
    assert [r.offer_id for r in messages(sends, Rescind)] == [offer.id]
    fw = h.state.snapshot()["frameworks"][0]
    assert fw["connected"] is False and fw["offers"] == []
    assert h.metric("master/frameworks_connected") == 0
    # Disconnected frameworks get no offers.
    assert not messages(h.allocate(), Offers)


def test_failover_timeout_tears_down(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", id=fid, failover_timeout=30)))
    (offer,) = h.offers_to(h.allocate(), "f1")
    running(h, fid, aid, offer)
    h.recv("f1", Unsubscribe(framework_id=fid))
    sends = h.advance(29.0)
    assert not messages(sends, KillTask)
    sends = h.advance(2.0)
    (kill,) = messages(sends, KillTask, to="a1")
    assert kill.task_id == "t1"
    assert messages(sends, ShutdownFramework, to="a1")
    snap = h.state.snapshot()
    assert snap["frameworks"] == []
    assert snap["completed_frameworks"][0]["id"] == fid
    assert [t["state"] for t in snap["completed_frameworks"][0]["completed_tasks"]] == ["TASK_KILLED"]
    assert snap["agents"][0]["used_resources"]["cpus"] == 0.0
    # A torn-down framework cannot come back under its id.
    sends = h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", id=fid)))
    assert messages(sends, Error) and not messages(sends, Subscribed)


def test_reregistration_within_failover_timeout_keeps_tasks(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", id=fid, failover_timeout=30)))
    (offer,) = h.offers_to(h.allocate(), "f1")
    running(h, fid, aid, offer)
    del h.drivers["f1"]
    h.advance(20.0)  # silent driver: disconnected after 3 intervals
    assert h.state.snapshot()["frameworks"][0]["connected"] is False
    sends = h.recv("f9", Subscribe(framework=FrameworkInfo(name="fw", id=fid, failover_timeout=30)))
    (sub,) = messages(sends, Subscribed, to="f9")
    assert sub.reregistered
    sends = h.advance(40.0)
    assert not messages(sends, KillTask)
    assert [t["id"] for t in h.state.snapshot()["frameworks"][0]["tasks"]] == ["t1"]


def test_teardown_kills_and_rescinds(cluster) -> None:
    h, fid, aid, offer = cluster
    running(h, fid, aid, offer)
    h.recv("a1", RegisterAgent(agent=AgentInfo(hostname="h", port=5051, id=aid,
                                               resources=Resources.parse(AGENT_RES))))
    sends = h.recv("f1", Teardown(framework_id=fid))
    assert [k.task_id for k in messages(sends, KillTask)] == ["t1"]
    assert h.metric("master/tasks_killed") == 1
    assert h.state.snapshot()["frameworks"] == []


def test_unsubscribe_disconnects(cluster) -> None:
    h, fid, aid, offer = cluster
    sends = h.recv("f1", Unsubscribe(framework_id=fid))
    assert [r.offer_id for r in messages(sends, Rescind)] == [offer.id]
    assert h.metric("master/frameworks_connected") == 0


# ----------------------------------------------------------------------------- offers


def test_offer_goes_to_lowest_share(h: Harness) -> None:
    fa = h.subscribe("fa", name="a")
    h.subscribe("fb", name="b")
    h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "fa")  # tie: fewer allocations, then id
    h.recv("fa", launch(fa, [offer], task("t1", offer.agent_id, "cpus:2;mem:128"), refuse=0))
    sends = h.allocate()  # fa holds 2/4 cpus: the rest goes to fb
    (rest,) = h.offers_to(sends, "fb")
    assert rest.resources.get("cpus") == 2 and not h.offers_to(sends, "fa")
    h.register("a2", hostname="h2")
    # fa: 2/8 cpus = 0.25; fb: 1000/2000 disk = 0.5 -> a2 goes to fa.
    (new,) = h.offers_to(h.allocate(), "fa")
    assert new.hostname == "h2"
    shares = {f["name"]: f["dominant_share"] for f in h.state.snapshot()["frameworks"]}
    assert shares == {"a": pytest.approx(0.75), "b": pytest.approx(0.5)}


def test_offer_holds_everything_and_is_not_reoffered(cluster) -> None:
    h, fid, aid, offer = cluster
    assert offer.resources == Resources.parse(AGENT_RES)
    assert offer.hostname == "h" and offer.url == "http://h:5051"
    h.subscribe("f2", name="other")
    assert not messages(h.allocate(), Offers)
    assert not messages(h.advance(10.0), Offers)  # still outstanding (30 s timeout)
    snap = h.state.snapshot()
    assert snap["agents"][0]["offered_resources"]["ports"] == "[31000-31099]"
    assert snap["frameworks"][0]["offers"][0]["id"] == offer.id


def test_freed_resources_never_make_a_second_offer_on_one_agent(cluster) -> None:
    h, fid, aid, offer = cluster
    running(h, fid, aid, offer)
    (held,) = h.offers_to(h.advance(5.5), "f1")  # the remainder, after the filter
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_FINISHED)))
    assert not messages(h.allocate(), Offers)  # t1's cpus wait for `held` to close
    h.recv("f1", Decline(framework_id=fid, offer_ids=[held.id], filters=Filters(refuse_seconds=0)))
    (whole,) = h.offers_to(h.allocate(), "f1")
    assert whole.resources == Resources.parse(AGENT_RES)


def test_decline_filter_honoured_until_refuse_seconds(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", Decline(framework_id=fid, offer_ids=[offer.id], filters=Filters(refuse_seconds=10)))
    assert h.metric("master/offers_declined") == 1
    assert not h.offers_to(h.advance(9.5), "f1")
    assert h.offers_to(h.advance(1.0), "f1")


def test_decline_of_unknown_offer_is_ignored(cluster) -> None:
    h, fid, aid, offer = cluster
    assert h.recv("f1", Decline(framework_id=fid, offer_ids=["nope"])) == []


def test_unused_part_of_accept_is_filtered(cluster) -> None:
    h, fid, aid, offer = cluster
    sends = h.recv("f1", launch(fid, [offer], task("t1", aid), refuse=10))
    (run,) = messages(sends, RunTask, to="a1")
    assert run.task.task_id == "t1" and run.framework.id == fid
    assert not h.offers_to(h.advance(9.5), "f1")
    (again,) = h.offers_to(h.advance(1.0), "f1")
    assert again.resources == Resources.parse(AGENT_RES) - Resources.parse("cpus:1;mem:128")


def test_unused_part_goes_to_another_framework_at_once(cluster) -> None:
    h, fid, aid, offer = cluster
    h.subscribe("f2", name="other")
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    (other,) = h.offers_to(h.allocate(), "f2")
    assert other.resources.get("cpus") == 3


def test_offer_timeout_rescinds_then_launch_is_dropped(cluster) -> None:
    h, fid, aid, offer = cluster
    sends = h.advance(30.0)
    assert [r.offer_id for r in messages(sends, Rescind, to="f1")] == [offer.id]
    assert h.metric("master/offers_rescinded") == 1
    sends = h.recv("f1", launch(fid, [offer], task("t1", aid)))
    (upd,) = messages(sends, Update, to="f1")
    assert upd.status.state is TaskState.TASK_DROPPED
    assert upd.status.reason == Reason.INVALID_OFFERS and upd.status.uuid == ""
    assert "no longer valid" in upd.status.message
    assert not messages(sends, RunTask)
    assert h.metric("master/tasks_dropped") == 1


def test_a_pass_arms_one_offer_timeout_and_it_rescinds_what_is_left_in_order(h: Harness) -> None:
    fid = h.subscribe("f1")
    for n in range(3):
        h.register(f"a{n}", hostname=f"h{n}")
    offers = h.offers_to(h.allocate(), "f1")
    assert len(offers) == 3
    armed = [key for key in h.timers if isinstance(key, OfferTimeout)]
    assert armed == [OfferTimeout(offers[0].id)]  # one for the pass, named by its first offer
    h.recv("f1", Decline(framework_id=fid, offer_ids=[offers[1].id]))
    sends = h.advance(30.0)
    assert [r.offer_id for r in messages(sends, Rescind, to="f1")] == [offers[0].id, offers[2].id]
    assert offers[0].id not in h.state.offer_groups


def test_the_pass_timer_is_cancelled_when_its_last_offer_is_gone(h: Harness) -> None:
    fid = h.subscribe("f1")
    for n in range(2):
        h.register(f"a{n}", hostname=f"h{n}")
    offers = h.offers_to(h.allocate(), "f1")
    h.recv("f1", Decline(framework_id=fid, offer_ids=[offers[0].id]))
    assert OfferTimeout(offers[0].id) in h.timers  # the pass still has an offer out
    h.recv("f1", Decline(framework_id=fid, offer_ids=[offers[1].id],
                         filters=Filters(refuse_seconds=100.0)))
    assert not any(isinstance(key, OfferTimeout) for key in h.timers)
    assert h.state.offer_groups == {}


def test_offers_from_two_agents_are_invalid_and_valid_ones_returned(h: Harness) -> None:
    fid = h.subscribe("f1")
    h.register("a1")
    h.register("a2", hostname="h2")
    offers = h.offers_to(h.allocate(), "f1")
    assert len(offers) == 2
    sends = h.recv("f1", launch(fid, offers, task("t1", offers[0].agent_id)))
    (upd,) = messages(sends, Update)
    assert upd.status.state is TaskState.TASK_DROPPED and "several agents" in upd.status.message
    assert h.metric("master/outstanding_offers") == 0
    assert len(h.offers_to(h.allocate(), "f1")) == 2  # returned without a filter


def test_another_frameworks_offer_is_invalid(cluster) -> None:
    h, fid, aid, offer = cluster
    h.register("a2", hostname="h2")
    other = h.subscribe("f2", name="other")
    (theirs,) = h.offers_to(h.allocate(), "f2")
    sends = h.recv("f1", launch(fid, [offer, theirs], task("t1", aid)))
    (upd,) = messages(sends, Update, to="f1")
    assert "belongs to another framework" in upd.status.message
    assert theirs.id in h.state.snapshot()["frameworks"][1]["offers"][0]["id"]
    assert other


@pytest.mark.parametrize("make, expect", [
    (lambda aid: task("", aid), "task id is empty"),
    (lambda aid: task("t1", "other-agent"), "not the offer's agent"),
    (lambda aid: task("t1", aid, command=None), "exactly one of command or executor"),
    (lambda aid: task("t1", aid, executor=ExecutorInfo(executor_id="e", command=CMD)),
     "exactly one of command or executor"),
    (lambda aid: task("t1", aid, "ports:[]"), "resources are empty"),
    (lambda aid: task("t1", aid, "cpus:5"), "only"),
    (lambda aid: task("t1", aid, "ports:[40000-40000]"), "only"),
    (lambda aid: task("t1", aid, command=None, executor=ExecutorInfo(
        executor_id="e", command=CMD, framework_id="other")), "names framework other"),
    (lambda aid: task("t1", aid, container=ContainerInfo(docker=DockerInfo(image=" "))),
     "container.docker.image is empty"),
    (lambda aid: task("t1", aid, container=ContainerInfo(docker=DockerInfo(
        image="i", network="BRIDGE", port_mappings=[PortMapping(host_port=1, container_port=2)]))),
     "host port 1 is not among the task's ports"),
])
def test_launch_validation(cluster, make, expect) -> None:
    h, fid, aid, offer = cluster
    sends = h.recv("f1", launch(fid, [offer], make(aid)))
    (upd,) = messages(sends, Update)
    assert upd.status.state is TaskState.TASK_ERROR
    assert upd.status.reason == Reason.TASK_INVALID
    assert expect in upd.status.message
    assert not messages(sends, RunTask)
    assert h.metric("master/tasks_error") == 1


def test_launch_validation_duplicates_and_executors(cluster) -> None:
    h, fid, aid, offer = cluster
    ex = ExecutorInfo(executor_id="e", command=CMD, resources=Resources.parse("cpus:0.5;mem:64"))
    ex2 = ExecutorInfo(executor_id="e", command=CommandInfo(shell="other"))
    sends = h.recv("f1", launch(
        fid, [offer],
        task("t1", aid, command=None, executor=ex),
        task("t1", aid),                                # duplicate within the accept
        task("t2", aid, command=None, executor=ex2),    # executor id reused differently
        task("t3", aid, command=None, executor=ex),     # same executor: no extra charge
        task("t4", aid, "cpus:1.5;mem:128"),            # 4 - 0.5 - 1 - 1 = 1.5 left
        task("t5", aid, "cpus:0.5"),                    # nothing left
    ))
    assert [r.task.task_id for r in messages(sends, RunTask)] == ["t1", "t3", "t4"]
    errors = {u.status.task_id + ":" + u.status.message for u in messages(sends, Update)}
    assert any("t1:task id t1 is already in use" in e for e in errors)
    assert any(e.startswith("t2:executor e is already running") for e in errors)
    assert any(e.startswith("t5:task needs") for e in errors)
    agent = h.state.snapshot()["agents"][0]
    assert agent["used_resources"]["cpus"] == 4.0
    # A live task id cannot be reused in a later accept either.
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t4", TaskState.TASK_FINISHED)))
    (offer2,) = h.offers_to(h.advance(6.0), "f1")
    sends = h.recv("f1", launch(fid, [offer2], task("t1", aid, "cpus:0.5")))
    assert "already in use" in messages(sends, Update)[0].status.message
    # An executor exit frees its resources and tells the framework.
    sends = h.recv("a1", ExecutorExited(agent_id=aid, framework_id=fid, executor_id="e", status=1))
    (fail,) = messages(sends, Failure, to="f1")
    assert fail.executor_id == "e" and fail.status == 1


def test_unsupported_operation_is_rejected_but_launch_proceeds(cluster) -> None:
    h, fid, aid, offer = cluster
    sends = h.recv("f1", Accept(framework_id=fid, offer_ids=[offer.id], operations=[
        Operation(type="RESERVE", resources=Resources.parse("cpus:1")),
        Operation(type="LAUNCH", tasks=[task("t1", aid)])]))
    assert "RESERVE refused: resources must name the role" in messages(sends, Rejected)[0].reason
    assert messages(sends, RunTask)


def test_suppress_and_revive(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", Suppress(framework_id=fid))
    h.recv("f1", Decline(framework_id=fid, offer_ids=[offer.id], filters=Filters(refuse_seconds=60)))
    assert not messages(h.advance(10.0), Offers)
    sends = h.recv("f1", Revive(framework_id=fid))  # clears the 60 s filter too
    assert not messages(sends, Offers)
    assert h.offers_to(h.allocate(), "f1")


def test_allocation_is_batched_and_periodic(h: Harness) -> None:
    h.subscribe("f1")
    assert h.timers[Allocate()] == h.clock.now()  # early run requested
    h.allocate()
    assert h.timers[Allocate()] == h.clock.now() + 1.0
    h.handle(AllocationTimed(0.002))
    assert h.metric("allocator/allocation_run_ms") == pytest.approx(2.0)
    assert h.metric("allocator/allocation_runs") == 1


# ------------------------------------------------------------------------------ tasks


def test_kill_forwards_to_agent(cluster) -> None:
    h, fid, aid, offer = cluster
    running(h, fid, aid, offer)
    sends = h.recv("f1", Kill(framework_id=fid, task_id="t1", kill_grace_period=2.0))
    (kill,) = messages(sends, KillTask, to="a1")
    assert (kill.task_id, kill.kill_grace_period) == ("t1", 2.0)


def test_kill_unknown_task_answers_lost_or_unknown(h: Harness) -> None:
    fid = h.subscribe("f1")
    (upd,) = messages(h.recv("f1", Kill(framework_id=fid, task_id="x")), Update)
    assert (upd.status.state, upd.status.reason) == (TaskState.TASK_LOST, Reason.RECONCILIATION)
    pa = h.subscribe("f2", name="pa", capabilities=["PARTITION_AWARE"])
    (upd,) = messages(h.recv("f2", Kill(framework_id=pa, task_id="x")), Update)
    assert upd.status.state is TaskState.TASK_UNKNOWN


def test_status_updates_forwarded_and_acks_forwarded(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    assert h.metric("master/tasks_staging") == 1
    sends = h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_RUNNING)))
    (upd,) = messages(sends, Update, to="f1")
    assert upd.status.agent_id == aid and upd.status.uuid == "u1"
    assert h.metric("master/tasks_running") == 1 and h.metric("master/status_updates") == 1
    sends = h.recv("f1", Acknowledge(framework_id=fid, agent_id=aid, task_id="t1", uuid="u1"))
    assert messages(sends, StatusUpdateAck, to="a1") == [
        StatusUpdateAck(agent_id=aid, framework_id=fid, task_id="t1", uuid="u1")]
    sends = h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_FINISHED, "u2")))
    assert messages(sends, Update)
    assert h.metric("master/tasks_finished") == 1 and h.metric("master/tasks_running") == 0
    snap = h.state.snapshot()
    done = snap["frameworks"][0]["completed_tasks"][0]
    assert done["state"] == "TASK_FINISHED"
    assert [s["state"] for s in done["statuses"]] == ["TASK_STAGING", "TASK_RUNNING", "TASK_FINISHED"]
    assert snap["agents"][0]["used_resources"]["cpus"] == 0.0
    # A retried terminal update (the ack was lost) is forwarded again.
    sends = h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_FINISHED, "u2")))
    assert messages(sends, Update, to="f1")
    assert h.metric("master/tasks_finished") == 1


def test_updates_not_forwarded_to_disconnected_framework(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", id=fid, failover_timeout=60)))
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    h.recv("f1", Unsubscribe(framework_id=fid))
    sends = h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_RUNNING)))
    assert sends == []
    assert h.state.snapshot()["frameworks"][0]["tasks"][0]["state"] == "TASK_RUNNING"


def test_status_update_for_torn_down_framework_is_acked_by_master(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    h.recv("f1", Teardown(framework_id=fid))
    sends = h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_KILLED)))
    assert messages(sends, StatusUpdateAck, to="a1")


def test_agent_messages_checked(cluster) -> None:
    h, fid, aid, offer = cluster
    (rej,) = messages(h.recv("stranger", StatusUpdate(framework_id=fid, status=status(
        "t1", TaskState.TASK_RUNNING))), Rejected)
    assert "register first" in rej.reason
    (rej,) = messages(h.recv("a1", Pong(agent_id="other")), Rejected)
    assert "does not match" in rej.reason
    (rej,) = messages(h.recv("a1", StatusUpdate(framework_id="nope", status=status(
        "t1", TaskState.TASK_RUNNING))), Rejected)
    assert "unknown framework" in rej.reason


def test_framework_messages_are_relayed(cluster) -> None:
    h, fid, aid, offer = cluster
    out = FrameworkToExecutor(framework_id=fid, agent_id=aid, executor_id="e", data=b"hi")
    assert messages(h.recv("f1", out), FrameworkToExecutor, to="a1") == [out]
    back = ExecutorToFramework(framework_id=fid, agent_id=aid, executor_id="e", data=b"yo")
    assert messages(h.recv("a1", back), ExecutorToFramework, to="f1") == [back]
    (rej,) = messages(h.recv("f1", FrameworkToExecutor(
        framework_id=fid, agent_id="gone", executor_id="e", data=b"")), Rejected)
    assert "not registered" in rej.reason


# -------------------------------------------------------------------------- reconcile


def test_reconciliation_explicit_and_implicit(cluster) -> None:
    h, fid, aid, offer = cluster
    h.recv("f1", launch(fid, [offer], task("t1", aid), task("t2", aid)))
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_RUNNING)))
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t2", TaskState.TASK_FAILED)))
    sends = h.recv("f1", Reconcile(framework_id=fid))
    states = {u.status.task_id: u.status.state for u in messages(sends, Update)}
    assert states == {"t1": TaskState.TASK_RUNNING}
    assert all(u.status.reason == Reason.RECONCILIATION for u in messages(sends, Update))
    sends = h.recv("f1", Reconcile(framework_id=fid, tasks=[
        ReconcileTask(task_id="t1"), ReconcileTask(task_id="t2"),
        ReconcileTask(task_id="t9", agent_id=aid)]))
    states = {u.status.task_id: u.status.state for u in messages(sends, Update)}
    assert states == {"t1": TaskState.TASK_RUNNING, "t2": TaskState.TASK_FAILED,
                      "t9": TaskState.TASK_LOST}


# ----------------------------------------------------------------------------- agents


def test_agent_registration_and_retry(h: Harness) -> None:
    aid = h.register("a1")
    assert aid.startswith("m-S")
    assert h.register("a1") == aid  # retried registration
    assert h.metric("master/agents_active") == 1
    assert h.metric("master/cpus_total") == 4
    sends = h.advance(0.0)
    assert messages(sends, Ping, to="a1") == [Ping(agent_id=aid)]


@pytest.mark.parametrize("partition_aware", [False, True])
def test_agent_ping_timeouts(partition_aware: bool) -> None:
    h = Harness(MasterConfig(offer_timeout=1000.0))
    caps = ["PARTITION_AWARE"] if partition_aware else []
    fid = h.subscribe("f1", capabilities=caps)
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    h.recv("f1", launch(fid, [offer], task("t1", aid, "cpus:1")))
    (offer,) = h.offers_to(h.advance(5.5), "f1")  # the filtered remainder, again
    h.silent_agents.add(aid)
    # Pings at 0 (answered), 15, 30, 45, 60, 75 (unanswered); lost at 90.
    sends = h.advance(90.0 - 5.5 - 0.5)
    assert not messages(sends, Failure)
    sends = h.advance(1.0)
    assert [r.offer_id for r in messages(sends, Rescind)] == [offer.id]
    (upd,) = messages(sends, Update, to="f1")
    expected = TaskState.TASK_UNREACHABLE if partition_aware else TaskState.TASK_LOST
    assert (upd.status.state, upd.status.reason) == (expected, Reason.AGENT_UNREACHABLE)
    assert messages(sends, Failure, to="f1") == [Failure(agent_id=aid)]
    assert h.metric("master/agents_active") == 0 and h.metric("master/agents_unreachable") == 1
    assert h.metric("master/cpus_total") == 0
    assert h.metric("master/tasks_unreachable" if partition_aware else "master/tasks_lost") == 1
    snap = h.state.snapshot()
    assert snap["unreachable_agents"][0]["id"] == aid and snap["agents"] == []
    # Messages from the lost agent's connection are refused until it re-registers.
    assert messages(h.recv("a1", Pong(agent_id=aid)), Rejected)
    # It comes back: tasks restored; non-partition-aware ones are killed.
    sends = h.recv("a1", RegisterAgent(
        agent=AgentInfo(hostname="h", port=5051, id=aid, resources=Resources.parse(AGENT_RES)),
        tasks=[Task(task_id="t1", framework_id=fid, agent_id=aid, executor_id="t1", name="t1",
                    state=TaskState.TASK_RUNNING, resources=Resources.parse("cpus:1"))]))
    assert messages(sends, AgentRegistered)
    assert bool(messages(sends, KillTask)) is not partition_aware
    assert h.metric("master/agents_unreachable") == 0 and h.metric("master/tasks_unreachable") == 0
    (fw,) = h.state.snapshot()["frameworks"]
    assert [t["state"] for t in fw["tasks"]] == ["TASK_RUNNING"]


def test_agent_reregistration_after_master_restart_restores_everything(h: Harness) -> None:
    ex = ExecutorInfo(executor_id="e1", command=CMD, resources=Resources.parse("cpus:0.5;mem:32"),
                      framework_id="old-F1")
    sends = h.recv("a1", RegisterAgent(
        agent=AgentInfo(hostname="h", port=5051, id="old-S1", resources=Resources.parse(AGENT_RES)),
        tasks=[Task(task_id="t1", framework_id="old-F1", agent_id="old-S1", executor_id="e1",
                    name="t1", state=TaskState.TASK_RUNNING,
                    resources=Resources.parse("cpus:1;mem:128;ports:[31000-31000]"))],
        executors=[ex],
        frameworks=[FrameworkInfo(name="fw", id="old-F1", failover_timeout=100)]))
    (reg,) = messages(sends, AgentRegistered)
    assert reg.agent_id == "old-S1" and reg.ping_interval == 15.0
    snap = h.state.snapshot()
    (fw,) = snap["frameworks"]
    assert fw["id"] == "old-F1" and fw["connected"] is False
    assert fw["used_resources"]["cpus"] == 1.5
    assert snap["agents"][0]["used_resources"]["ports"] == "[31000-31000]"
    # Disconnected frameworks get no offers until they subscribe.
    assert not messages(h.allocate(), Offers)
    sends = h.recv("f1", Subscribe(framework=FrameworkInfo(name="fw", id="old-F1")))
    assert messages(sends, Subscribed)[0].reregistered
    (offer,) = h.offers_to(h.allocate(), "f1")
    assert offer.executor_ids == ["e1"]
    assert offer.resources.get("cpus") == 2.5 and offer.resources.get("ports") == 99


def test_registered_agent_reregisters_from_a_new_connection(cluster) -> None:
    h, fid, aid, offer = cluster
    running(h, fid, aid, offer)
    (held,) = h.offers_to(h.advance(5.5), "f1")
    reported = [
        Task(task_id="t1", framework_id=fid, agent_id=aid, executor_id="t1", name="t1",
             state=TaskState.TASK_STAGING, resources=Resources.parse("cpus:1;mem:128")),
        Task(task_id="t7", framework_id=fid, agent_id=aid, executor_id="t7", name="t7",
             state=TaskState.TASK_RUNNING, resources=Resources.parse("cpus:2")),
    ]
    sends = h.recv("a1-new", RegisterAgent(agent=AgentInfo(
        hostname="h", port=5051, id=aid, resources=Resources.parse(AGENT_RES)), tasks=reported))
    assert messages(sends, AgentRegistered, to="a1-new")
    assert [r.offer_id for r in messages(sends, Rescind, to="f1")] == [held.id]
    (fw,) = h.state.snapshot()["frameworks"]
    # The master's record of t1 (RUNNING) is newer than the report; t7 is added.
    assert {t["id"]: t["state"] for t in fw["tasks"]} == {"t1": "TASK_RUNNING", "t7": "TASK_RUNNING"}
    assert h.state.snapshot()["agents"][0]["used_resources"]["cpus"] == 3.0
    assert messages(h.recv("a1", Pong(agent_id=aid)), Rejected)  # old connection
    assert not messages(h.recv("a1-new", Pong(agent_id=aid)), Rejected)
    (offer,) = h.offers_to(h.allocate(), "f1")
    assert offer.resources.get("cpus") == 1


def test_a_task_the_restarted_agent_never_got_is_lost_not_staging_forever(cluster) -> None:
    """The framework launched on an offer while the agent was restarting: the
    RunTask went to the dead process's connection. The agent re-registers without
    it, so the framework hears TASK_LOST and the agent is told to kill it."""
    h, fid, aid, offer = cluster
    h.recv("f1", launch(fid, [offer], task("t1", aid, "cpus:1;mem:128")))
    sends = h.recv("a1-new", RegisterAgent(agent=AgentInfo(
        hostname="h", port=5051, id=aid, resources=Resources.parse(AGENT_RES))))
    (update,) = [u for u in messages(sends, Update, to="f1") if u.status.task_id == "t1"]
    assert update.status.state is TaskState.TASK_LOST
    assert update.status.reason == Reason.RECONCILIATION
    assert "never reached the agent" in update.status.message
    assert [k.task_id for k in messages(sends, KillTask, to="a1-new")] == ["t1"]
    (agent,) = h.state.snapshot()["agents"]
    assert agent["used_resources"]["cpus"] == 0 and not h.state.snapshot()["frameworks"][0]["tasks"]
    assert h.metric("master/tasks_lost") == 1
    (offer,) = h.offers_to(h.advance(5.5), "f1")  # all of it, once the accept filter ends
    assert offer.resources.get("cpus") == Resources.parse(AGENT_RES).get("cpus")


def test_recovered_framework_that_never_returns_is_torn_down(h: Harness) -> None:
    h.recv("a1", RegisterAgent(
        agent=AgentInfo(hostname="h", port=5051, id="S1", resources=Resources.parse(AGENT_RES)),
        tasks=[Task(task_id="t1", framework_id="F1", agent_id="S1", executor_id="t1", name="t1",
                    state=TaskState.TASK_RUNNING, resources=Resources.parse("cpus:1"))],
        frameworks=[FrameworkInfo(name="fw", id="F1")]))
    assert not messages(h.advance(19.0), KillTask)  # 0 s failover gets 4 heartbeats' grace
    assert [k.task_id for k in messages(h.advance(2.0), KillTask)] == ["t1"]


def test_bad_reregistration_is_rejected(h: Harness) -> None:
    def reg(**kw: object) -> Rejected:
        sends = h.recv("a1", RegisterAgent(agent=AgentInfo(
            hostname="h", port=5051, id="S1", resources=Resources.parse("cpus:1;mem:64")), **kw))  # type: ignore[arg-type]
        (rej,) = messages(sends, Rejected)
        return rej

    t = Task(task_id="t1", framework_id="F1", agent_id="S1", executor_id="t1", name="t1",
             state=TaskState.TASK_RUNNING, resources=Resources.parse("cpus:2"))
    fw = [FrameworkInfo(name="fw", id="F1")]
    assert "unreported framework" in reg(tasks=[t]).reason
    assert "more than the agent's" in reg(tasks=[t], frameworks=fw).reason
    assert "reported twice" in reg(tasks=[t, t], frameworks=fw).reason
    assert "without an id" in reg(frameworks=[FrameworkInfo(name="x")]).reason
    sends = h.recv("a1", RegisterAgent(agent=AgentInfo(
        hostname="h", port=5051, resources=Resources.parse("cpus:1")), tasks=[t]))
    assert "first registration" in messages(sends, Rejected)[0].reason
    assert h.state.snapshot()["agents"] == []


# ----------------------------------------------------------------------- bad input


def test_invalid_frames_are_rejected_and_counted(h: Harness) -> None:
    sends = h.handle(InvalidFrame("p", MessageError("not JSON: boom")))
    assert sends == [Send("p", Rejected(reason="not JSON: boom", message_type=""))]
    sends = h.recv("p", Offers(offers=[]))  # a master -> framework message
    assert "does not accept offers" in messages(sends, Rejected)[0].reason
    assert h.metric("master/messages_invalid") == 2
    assert h.metric("master/messages_rejected") == 2
    assert h.metric("master/messages_received") == 2


def test_acknowledge_checks(cluster) -> None:
    h, fid, aid, offer = cluster
    assert "uuid is empty" in messages(h.recv("f1", Acknowledge(
        framework_id=fid, agent_id=aid, task_id="t", uuid="")), Rejected)[0].reason
    assert "not registered" in messages(h.recv("f1", Acknowledge(
        framework_id=fid, agent_id="x", task_id="t", uuid="u")), Rejected)[0].reason


# ------------------------------------------------------------------------- snapshot


def test_snapshot_shape(cluster) -> None:
    h, fid, aid, offer = cluster
    running(h, fid, aid, offer)
    snap = h.state.snapshot()
    for key in ("id", "hostname", "leader", "leader_info", "version", "start_time",
                "elected_time", "activated_slaves", "agents", "slaves", "frameworks",
                "unreachable_agents"):
        assert key in snap
    assert snap["leader_info"]["zmq_port"] == 5055
    agent = snap["agents"][0]
    assert {"id", "hostname", "port", "url", "resources", "used_resources", "offered_resources",
            "unreserved_resources", "attributes", "registered_time", "active"} <= set(agent)
    fw = snap["frameworks"][0]
    assert {"id", "name", "roles", "active", "connected", "used_resources", "offered_resources",
            "dominant_share", "tasks", "completed_tasks", "offers"} <= set(fw)
    assert fw["dominant_share"] == pytest.approx(0.25)
    assert {"id", "name", "framework_id", "agent_id", "executor_id", "state", "resources",
            "statuses"} <= set(fw["tasks"][0])
    h.recv("f1", Teardown(framework_id=fid))
    (done,) = h.state.snapshot()["completed_frameworks"]
    assert set(done) - {"removal_reason"} == set(fw)  # tools can treat both lists alike


def test_resources_json() -> None:
    assert resources_json(Resources.parse("cpus:1.5;cpus(eng):1;mem:128;ports:[1-2,5-5]")) == {
        "cpus": 2.5, "mem": 128.0, "disk": 0.0, "gpus": 0.0, "ports": "[1-2,5-5]"}


# ------------------------------------------------------- roles, reservations, policy


def reserve(fid: str, offer: Offer, text: str, kind: str = "RESERVE",
            *tasks: TaskInfo) -> Accept:
    ops = [Operation(type=kind, resources=Resources.parse(text))]
    if tasks:
        ops.append(Operation(type="LAUNCH", tasks=list(tasks)))
    return Accept(framework_id=fid, offer_ids=[offer.id], operations=ops,
                  filters=Filters(refuse_seconds=0))


def test_static_reservations_are_offered_only_to_their_role(h: Harness) -> None:
    eng = h.subscribe("f1", "eng-fw", roles=["eng"])
    ops = h.subscribe("f2", "ops-fw", roles=["ops"])
    aid = h.register("a1", "cpus:2;mem:512;cpus(eng):2;mem(eng):256")
    sends = h.allocate()
    (offer,) = h.offers_to(sends, "f1")  # roles tie at 0: 'eng' first by name
    assert offer.resources == Resources.parse("cpus:2;mem:512;cpus(eng):2;mem(eng):256")
    h.recv("f1", Decline(framework_id=eng, offer_ids=[offer.id], filters=Filters(refuse_seconds=60)))
    (other,) = h.offers_to(h.allocate(), "f2")
    assert other.resources == Resources.parse("cpus:2;mem:512")
    agent = h.state.snapshot()["agents"][0]
    assert agent["reserved_resources"]["eng"]["cpus"] == 2.0
    assert ops and aid


def test_dynamic_reserve_launch_and_unreserve(h: Harness) -> None:
    fid = h.subscribe("f1", roles=["eng"])
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    t1 = task("t1", aid, "cpus(eng):1;mem(eng):128")
    sends = h.recv("f1", reserve(fid, offer, "cpus(eng):2;mem(eng):256", "RESERVE", t1))
    assert not messages(sends, Rejected)
    (run,) = messages(sends, RunTask)
    # The agent hears of the reservation first, then runs the task on it as offered.
    (told,) = messages(sends, CheckpointResources)
    assert told.resources.reservations == Resources.parse("cpus(eng):2;mem(eng):256")
    assert told.resources.version == 1
    kinds = [type(s.message) for s in sends if isinstance(s, Send)]
    assert kinds.index(CheckpointResources) < kinds.index(RunTask)
    assert run.task.resources == Resources.parse("cpus(eng):1;mem(eng):128")
    agent = h.state.snapshot()["agents"][0]
    assert agent["dynamic_reservations"] == "cpus(eng):2;mem(eng):256"
    assert agent["reserved_resources"]["eng"] == {**agent["reserved_resources"]["eng"],
                                                  "cpus": 2.0, "mem": 256.0}
    (again,) = h.offers_to(h.allocate(), "f1")
    assert again.resources.reserved("eng") == Resources.parse("cpus(eng):1;mem(eng):128")
    # Another role never sees them.
    other = h.subscribe("f2", "other", roles=["ops"])
    h.recv("f1", Decline(framework_id=fid, offer_ids=[again.id],
                         filters=Filters(refuse_seconds=60)))
    (theirs,) = h.offers_to(h.allocate(), "f2")
    assert not theirs.resources.reserved("eng")
    h.recv("f2", Decline(framework_id=other, offer_ids=[theirs.id],
                         filters=Filters(refuse_seconds=60)))
    h.recv("f1", Revive(framework_id=fid))
    (back,) = h.offers_to(h.allocate(), "f1")
    sends = h.recv("f1", reserve(fid, back, "cpus(eng):1;mem(eng):128", "UNRESERVE"))
    assert not messages(sends, Rejected)
    assert h.state.snapshot()["agents"][0]["dynamic_reservations"] == "cpus(eng):1;mem(eng):128"
    assert h.metric("master/operations_reserve") == 1
    assert h.metric("master/operations_unreserve") == 1


@pytest.mark.parametrize("kind,text,reason", [
    ("RESERVE", "cpus:1", "must name the role"),
    ("RESERVE", "cpus(ops):1", "made to role eng"),
    ("RESERVE", "cpus(eng):99", "not unreserved"),
    ("RESERVE", "ports(eng):[31000-31000]", "only scalar"),
    ("RESERVE", "gpus(eng):1", "not unreserved"),
    ("UNRESERVE", "cpus(eng):1", "not in what remains"),
])
def test_bad_reservations_are_refused_and_change_nothing(h: Harness, kind: str, text: str,
                                                         reason: str) -> None:
    fid = h.subscribe("f1", roles=["eng"])
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    sends = h.recv("f1", reserve(fid, offer, text, kind, task("t1", aid)))
    (rejected,) = messages(sends, Rejected)
    assert reason in rejected.reason
    assert messages(sends, RunTask)  # the rest of the accept goes on
    assert h.state.snapshot()["agents"][0]["dynamic_reservations"] == ""
    assert h.metric("master/messages_invalid") == 1


def test_static_and_dynamic_reservation_of_one_resource_and_role_is_refused(h: Harness) -> None:
    fid = h.subscribe("f1", roles=["eng"])
    h.register("a1", "cpus:2;mem:512;cpus(eng):1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    sends = h.recv("f1", reserve(fid, offer, "cpus(eng):1"))
    assert "statically" in messages(sends, Rejected)[0].reason


def test_agent_with_dynamic_reservations_reregisters_with_its_static_resources(h: Harness) -> None:
    fid = h.subscribe("f1", roles=["eng"])
    aid = h.register("a1")
    (offer,) = h.offers_to(h.allocate(), "f1")
    t1 = task("t1", aid, "cpus(eng):1;mem(eng):128")
    sends = h.recv("f1", reserve(fid, offer, "cpus(eng):1;mem(eng):128", "RESERVE", t1))
    (told,) = messages(sends, CheckpointResources)
    report = Task(task_id="t1", framework_id=fid, agent_id=aid, executor_id="t1", name="t1",
                  state=TaskState.TASK_RUNNING,
                  resources=Resources.parse("cpus(eng):1;mem(eng):128"))
    sends = h.recv("a2", RegisterAgent(
        agent=AgentInfo(id=aid, hostname="h", port=5051, resources=Resources.parse(AGENT_RES)),
        tasks=[report], frameworks=[FrameworkInfo(name="fw", id=fid, roles=["eng"])],
        dynamic=told.resources))
    assert messages(sends, AgentRegistered)
    assert not messages(sends, CheckpointResources)  # the agent has it already
    assert h.state.snapshot()["agents"][0]["dynamic_reservations"] == "cpus(eng):1;mem(eng):128"


def test_weights_and_quota_are_plain_data_set_in_one_place(h: Harness) -> None:
    h.subscribe("f1", "a", roles=["eng"])
    h.subscribe("f2", "b", roles=["ops"])
    h.register("a1")
    h.register("a2")
    h.register("a3")
    before = h.persisted
    assert h.call(SetWeights({"eng": 2.0})).ok
    assert h.call(SetQuota({"ops": Quota(limit={"cpus": 2000})})).ok
    assert h.state.weights == {"eng": 2.0}
    assert h.state.quota == {"ops": Quota(limit={"cpus": 2000})}
    assert h.persisted == before + 2
    sends = h.allocate()
    offered = {peer: sum(o.resources.get("cpus") for o in h.offers_to(sends, peer))
               for peer in ("f1", "f2")}
    assert offered == {"f1": 10.0, "f2": 2.0}  # ops capped at its limit
    roles = {r["name"]: r for r in h.state.snapshot()["roles"]}
    assert roles["eng"]["weight"] == 2.0 and roles["ops"]["quota"]["limit"] == {"cpus": 2.0}
    assert roles["ops"]["allocated"]["cpus"] == 2.0
    assert h.metric("allocator/roles/ops/shares/dominant") == pytest.approx(1 / 3)  # mem
    assert h.metric("allocator/agents_considered") == 3
    for refused in (SetWeights({"eng": -1.0}),
                    # incoherent: guarantee above the limit
                    SetQuota({"ops": Quota(guarantee={"cpus": 3000}, limit={"cpus": 2000})}),
                    SetQuota({"*": Quota(limit={"cpus": 1000})})):
        reply = h.call(refused)
        assert (reply.ok, reply.refusal) == (False, "invalid") and reply.error, refused
    assert h.state.weights == {"eng": 2.0} and h.persisted == before + 2
    assert h.metric("master/operator_calls_invalid") == 3
    h.call(SetWeights({"eng": 1.0}))
    h.call(SetQuota({"ops": Quota()}))
    assert h.state.weights == {} and h.state.quota == {}


def test_stale_timers_are_ignored_and_unknown_kinds_raise(h: Harness) -> None:
    for stale in (OfferTimeout("O9"), PingDue("S9"), HeartbeatDue("F9"), FailoverTimeout("F9")):
        assert h.handle(TimerFired(stale)) == []

    @attrs.frozen
    class Bogus(TimerKey):
        name: str

    for unknown in (Bogus("x"), ("offer", "O1"), "allocate"):
        with pytest.raises(UnknownTimer):
            h.state.handle(TimerFired(unknown), h.clock.now())


# ------------------------------------------------------------------- state machine


class MasterMachine(RuleBasedStateMachine):
    """Random interleavings of agents, frameworks, offers and time. Checks the
    master's books (validate) and that no framework holds two offers for one
    agent as seen on the wire."""

    agents = Bundle("agents")
    frameworks = Bundle("frameworks")

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(MasterConfig(offer_timeout=7.0, agent_ping_timeout=3.0,
                                      max_agent_ping_timeouts=2, heartbeat_interval=2.0))
        self.held: dict[str, dict[str, Offer]] = {}  # framework peer -> offer id -> offer
        self.seq = 0

    def feed(self, sends: list[Send]) -> None:
        for send in sends:
            if isinstance(send.message, Offers):
                self.held.setdefault(send.to, {}).update({o.id: o for o in send.message.offers})
            elif isinstance(send.message, Rescind):
                self.held.get(send.to, {}).pop(send.message.offer_id, None)
            elif isinstance(send.message, Error):
                self.held.pop(send.to, None)

    @rule(target=agents, cpus=st.integers(1, 4))
    def add_agent(self, cpus: int) -> str:
        self.seq += 1
        peer = f"a{self.seq}"
        self.feed(self.h.recv(peer, RegisterAgent(agent=AgentInfo(
            hostname=peer, port=1, resources=Resources.parse(f"cpus:{cpus};mem:512;ports:[1-9]")))))
        return peer

    @rule(peer=consumes(agents))
    def lose_agent(self, peer: str) -> None:
        agent_id = self.h.state.agent_by_peer.get(peer)
        if agent_id is not None:
            self.h.silent_agents.add(agent_id)

    @rule(target=frameworks, partition_aware=st.booleans())
    def subscribe(self, partition_aware: bool) -> str:
        self.seq += 1
        peer = f"f{self.seq}"
        caps = ["PARTITION_AWARE"] if partition_aware else []
        self.feed(self.h.recv(peer, Subscribe(framework=FrameworkInfo(
            name=peer, capabilities=caps, failover_timeout=4.0))))
        return peer

    def fid(self, peer: str) -> str | None:
        for framework in self.h.state.snapshot()["frameworks"]:
            if framework["name"] == peer:
                return framework["id"]
        return None

    @rule()
    def allocate(self) -> None:
        self.feed(self.h.allocate())

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 6.0]))
    def advance(self, seconds: float) -> None:
        self.feed(self.h.advance(seconds))
        for peer in list(self.held):  # live drivers keep talking
            fid = self.fid(peer)
            if fid is not None:
                self.feed(self.h.recv(peer, SchedulerHeartbeat(framework_id=fid)))

    @rule(peer=frameworks, data=st.data())
    def accept_part(self, peer: str, data: st.DataObject) -> None:
        fid, offers = self.fid(peer), list(self.held.get(peer, {}).values())
        if fid is None or not offers:
            return
        offer = data.draw(st.sampled_from(offers))
        self.held[peer].pop(offer.id)
        self.seq += 1
        cpus = data.draw(st.sampled_from([0.5, 1, 3]))
        self.feed(self.h.recv(peer, launch(fid, [offer], task(
            f"t{self.seq}", offer.agent_id, f"cpus:{cpus};mem:64;ports:[2-3]"),
            refuse=data.draw(st.sampled_from([0, 1.5])))))

    @rule(peer=frameworks, data=st.data())
    def decline(self, peer: str, data: st.DataObject) -> None:
        fid, offers = self.fid(peer), list(self.held.get(peer, {}))
        if fid is None or not offers:
            return
        offer_id = data.draw(st.sampled_from(offers))
        self.held[peer].pop(offer_id)
        self.feed(self.h.recv(peer, Decline(framework_id=fid, offer_ids=[offer_id])))

    @rule(peer=frameworks, data=st.data())
    def finish_task(self, peer: str, data: st.DataObject) -> None:
        fid = self.fid(peer)
        tasks = [t for f in self.h.state.snapshot()["frameworks"] if f["id"] == fid for t in f["tasks"]]
        if not tasks:
            return
        t = data.draw(st.sampled_from(tasks))
        agent_peer = next((p for p, a in self.h.state.agent_by_peer.items() if a == t["agent_id"]), None)
        if agent_peer is not None:
            self.feed(self.h.recv(agent_peer, StatusUpdate(framework_id=fid, status=status(
                t["id"], data.draw(st.sampled_from([TaskState.TASK_RUNNING, TaskState.TASK_FINISHED]))))))

    @rule(peer=frameworks, suppress=st.booleans())
    def suppress_or_revive(self, peer: str, suppress: bool) -> None:
        fid = self.fid(peer)
        if fid is not None:
            message = Suppress(framework_id=fid) if suppress else Revive(framework_id=fid)
            self.feed(self.h.recv(peer, message))

    @rule(peer=consumes(frameworks))
    def tear_down_framework(self, peer: str) -> None:
        fid = self.fid(peer)
        if fid is not None:
            self.feed(self.h.recv(peer, Teardown(framework_id=fid)))
        self.held.pop(peer, None)

    @invariant()
    def one_offer_per_agent_per_framework(self) -> None:
        for offers in self.held.values():
            agents = [o.agent_id for o in offers.values()]
            assert len(agents) == len(set(agents))

    @invariant()
    def valid(self) -> None:
        self.h.state.validate()


MasterMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_master_state_machine = MasterMachine.TestCase


def test_removal_limiter_spends_permits_in_order() -> None:
    limiter = RemovalLimiter((1, 10.0))
    assert limiter.ask("a", 0.0) == Decision(remove=True)
    assert limiter.ask("b", 1.0) == Decision(remove=False, queued=True, wake_at=10.0)
    assert limiter.ask("c", 2.0) == Decision(remove=False, queued=True)
    assert limiter.ask("b", 3.0) == Decision(remove=False)  # already waiting
    assert limiter.forget("b") and not limiter.forget("b")
    assert limiter.due(10.0, lambda agent: agent != "c") == (None, None)  # c recovered
    assert limiter.ask("d", 11.0) == Decision(remove=True)  # no permit was spent at 10
    assert limiter.ask("e", 12.0) == Decision(remove=False, queued=True, wake_at=21.0)
    assert limiter.ask("f", 13.0) == Decision(remove=False, queued=True)
    assert limiter.due(21.0, lambda agent: True) == ("e", 31.0)
    assert limiter.due(31.0, lambda agent: True) == ("f", None)
    assert RemovalLimiter(None).ask("x", 0.0).remove


def test_a_tasks_story_reads_as_the_lines_it_was_told(cluster: tuple[Harness, str, str, Offer]) -> None:
    """Story notes are kept unformatted and rendered when read (`story_lines`)."""
    h, fid, aid, offer = cluster
    h.recv("f1", launch(fid, [offer], task("t1", aid)))
    h.clock.advance(0.25)
    h.recv("a1", StatusUpdate(framework_id=fid, status=status("t1", TaskState.TASK_RUNNING,
                                                              uuid="u7")))
    h.recv("f1", Acknowledge(framework_id=fid, agent_id=aid, task_id="t1", uuid="u7"))
    start = h.clock.now() - 0.25
    assert story_lines(h.state.frameworks[fid].tasks["t1"]) == [
        f"{start:.3f} launched on agent {aid} with cpus:1;mem:128",
        f"{start + 0.25:.3f} TASK_RUNNING from agent (u7)",
        f"{start + 0.25:.3f} acknowledged u7"]
