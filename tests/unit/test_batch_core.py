"""The batch scheduler core, driven with fake offers and updates and an explicit
clock: splits to tasks, delay scheduling, retries, lost map outputs, speculation,
offer interest. Invariants (`BatchCore.validate`) are checked after every step."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.effects import ArmTimer, TimerFired, UnknownTimer
from dyad.messages import (
    CommandInfo, ExecutorInfo, Offer, Reason, Source, TaskInfo, TaskState, TaskStatus)
from dyad.resources import Resources
from frameworks.batch.config import CoreConfig, Split
from frameworks.batch.core import (
    MAX_REFUSAL_BACKOFF, MIN_REFUSE, REFUSAL_LIMIT, AgentLost, BatchCore, Effect, JobDone,
    OffersMade, Reregistered, Started, TaskUpdate, Tick)
from frameworks.batch.wire import FETCH_FAILED_KEY
from frameworks.effects import (
    DeclineOffers, LaunchTasks, ReconcileTasks, RequestKill, ReviveOffers, SuppressOffers)
from frameworks.testing import make_offer

EXECUTOR = ExecutorInfo(executor_id="dyad-batch-executor", command=CommandInfo(argv=["x"]),
                        resources=Resources.of(cpus=0.1, mem=64))
TASK = Resources.of(cpus=0.5, mem=256)
SLOTS_3 = "cpus:1.6;mem:4096"  # the executor and three tasks
PAYLOAD = '{"kind":"command","map":"cat","reduce":"cat"}'


def config(hosts: list[tuple[str, ...]], reducers: int = 2, **options: Any) -> CoreConfig:
    splits = tuple(Split(i, f"/data/f{i}", 0, 100, h) for i, h in enumerate(hosts))
    return CoreConfig(splits=splits, reducers=reducers, executor=EXECUTOR, map_resources=TASK,
                      reduce_resources=TASK, job_payload=PAYLOAD, output="/out", **options)


class Run:
    """A core plus the time, validated after every event."""

    def __init__(self, cfg: CoreConfig) -> None:
        self.core = BatchCore(cfg)
        self.now = 0.0
        self.tasks: dict[str, TaskInfo] = {}
        self.do(Started())

    def do(self, event: Any) -> list[Effect]:
        effects = self.core.handle(event, self.now)
        self.core.validate()
        for effect in effects:
            if isinstance(effect, LaunchTasks):
                self.tasks.update((t.task_id, t) for t in effect.tasks)
        return effects

    def offer(self, host: str, resources: str = SLOTS_3, executor: bool = True) -> list[Effect]:
        return self.do(OffersMade((self.make_offer(host, resources, executor),)))

    @staticmethod
    def make_offer(host: str, resources: str = SLOTS_3, executor: bool = True) -> Offer:
        return make_offer(agent_id=f"agent-{host}", hostname=host, resources=resources,
                          executor_ids=[EXECUTOR.executor_id] if executor else [],
                          url=f"http://{host}:5051")

    def update(self, task_id: str, state: TaskState, data: bytes = b"",
               message: str = "", uuid: str = "u") -> list[Effect]:
        task = self.tasks[task_id]
        return self.do(TaskUpdate(TaskStatus(task_id=task_id, state=state, data=data,
                                             message=message, agent_id=task.agent_id,
                                             uuid=uuid)))

    def finish(self, task_id: str) -> list[Effect]:
        return self.update(task_id, TaskState.TASK_FINISHED, result_for(self.tasks[task_id]))


def result_for(task: TaskInfo) -> bytes:
    spec = json.loads(task.data)["task"]
    if spec["type"] == "map":
        return json.dumps({"outputs": [f"/sandbox/{task.task_id}/part-{p}"
                                       for p in range(spec["reducers"])],
                           "records_in": 10, "records_out": 4}).encode()
    return json.dumps({"output": f"/out/part-r-{spec['index']:05d}", "records_in": 4,
                       "records_out": 2}).encode()


def launched(effects: list[Effect]) -> list[TaskInfo]:
    return [t for e in effects if isinstance(e, LaunchTasks) for t in e.tasks]


def ids(effects: list[Effect]) -> list[str]:
    return [t.task_id for t in launched(effects)]


def spec(task: TaskInfo) -> dict[str, Any]:
    body: dict[str, dict[str, Any]] = json.loads(task.data)
    return body["task"]


def of(kind: type, effects: list[Effect]) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


# ------------------------------------------------------------------ the rules


def test_core_is_pure() -> None:
    tree = ast.parse(Path(__file__).resolve().parents[2].joinpath(
        "frameworks/batch/core.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {"asyncio", "zmq", "aiohttp", "kazoo", "socket", "subprocess",
                           "os", "time", "threading"}


def test_the_tick_is_armed_only_while_something_is_due() -> None:
    # With speculation it checks stragglers every TICK_INTERVAL.
    assert BatchCore(config([()], speculative=True)).handle(Started(), 5.0) == [
        ArmTimer(Tick(), 5.5)]
    # Without, a running job has nothing to check until a deadline exists: here
    # the starvation timeout, armed once an offer was too small.
    assert BatchCore(config([()])).handle(Started(), 5.0) == []
    run = Run(config([()], starvation_timeout=10.0))
    run.now = 2.0
    assert of(ArmTimer, run.offer("a", "cpus:0.2;mem:64", executor=False)) == [
        ArmTimer(Tick(), 10.0)]
    assert of(ArmTimer, run.offer("b", "cpus:0.2;mem:64", executor=False)) == []  # still due
    launches = run.offer("c")
    assert ids(launches) == ["map-00000-1"] and of(ArmTimer, launches) == []


def test_offers_declined_in_a_row_go_back_in_one_decline() -> None:
    run = Run(config([()]))
    small = "cpus:0.2;mem:64"
    offers = [run.make_offer(h, r) for h, r in
              (("a", small), ("b", small), ("c", SLOTS_3), ("d", small), ("e", SLOTS_3))]
    effects = run.do(OffersMade(tuple(offers)))
    # a and b fit nothing, c gets the map, d and e get nothing: the launch
    # splits the runs, so the master sees them in offer order.
    assert [(type(e).__name__, getattr(e, "offer_ids", None)) for e in effects
            if isinstance(e, (DeclineOffers, LaunchTasks))] == [
        ("DeclineOffers", (offers[0].id, offers[1].id)), ("LaunchTasks", None),
        ("DeclineOffers", (offers[3].id, offers[4].id))]


def test_a_timer_the_core_never_arms_is_a_bug() -> None:
    run = Run(config([()]))
    with pytest.raises(UnknownTimer):
        run.do(TimerFired("tick"))


def test_local_offer_gets_local_maps_and_the_job_payload() -> None:
    run = Run(config([("a",), ("b",), ("a",), ("a",), ("a",)]))
    effects = run.offer("a")
    (launch,) = of(LaunchTasks, effects)
    assert [spec(t)["index"] for t in launch.tasks] == [0, 2, 3]
    task = launch.tasks[0]
    assert task.executor == EXECUTOR and task.resources == TASK
    assert task.task_id == "map-00000-1" and task.agent_id == "agent-a"
    body = json.loads(task.data)
    assert body["job"] == json.loads(PAYLOAD)
    assert body["task"]["split"] == {"path": "/data/f0", "start": 0, "length": 100}
    assert body["task"]["reducers"] == 2 and body["task"]["output"] == "/out"
    # The rest of the offer cannot hold a fourth task: refused for refuse_seconds.
    assert launch.refuse_seconds == 5.0


def test_a_batch_of_offers_shares_the_work() -> None:
    run = Run(config([()] * 4, reducers=1))
    effects = run.do(OffersMade((run.make_offer("a"), run.make_offer("b"))))
    assert [len(launch.tasks) for launch in of(LaunchTasks, effects)] == [2, 2]


def test_first_task_on_an_agent_pays_for_the_executor() -> None:
    run = Run(config([("a",)] * 4))
    assert len(ids(run.offer("a", "cpus:1.5;mem:4096", executor=False))) == 2
    assert len(ids(run.offer("a", "cpus:1.0;mem:4096", executor=True))) == 2


def test_non_local_offer_waits_for_the_locality_wait_then_steals() -> None:
    run = Run(config([("a",)] * 6, locality_wait=1.0))
    assert len(ids(run.offer("a"))) == 3
    (decline,) = of(DeclineOffers, run.offer("b"))
    assert decline.refuse_seconds == 1.0
    run.now = 0.6
    (decline,) = of(DeclineOffers, run.offer("b"))
    assert decline.refuse_seconds == pytest.approx(0.4)
    run.now = 0.95
    assert of(DeclineOffers, run.offer("b"))[0].refuse_seconds == MIN_REFUSE
    run.now = 1.0
    stolen = launched(run.offer("b"))
    assert [spec(t)["index"] for t in stolen] == [3, 4, 5]
    assert run.core.progress().maps_running == 6


def test_a_local_launch_resets_the_wait() -> None:
    run = Run(config([("a",)] * 8, locality_wait=1.0))
    run.offer("a")
    run.offer("b")  # starts waiting at 0
    run.now = 0.8
    run.finish("map-00000-1")
    assert ids(run.offer("a", "cpus:0.5;mem:256")) == ["map-00003-1"]  # local: reset
    run.now = 1.2
    (decline,) = of(DeclineOffers, run.offer("b"))  # waiting again since 1.2
    assert decline.refuse_seconds == pytest.approx(1.0)


def test_delay_scheduling_off_takes_non_local_maps_at_once() -> None:
    run = Run(config([("a",)] * 3, locality_wait=0.0))
    assert len(ids(run.offer("b"))) == 3
    for task_id in list(run.tasks):
        run.finish(task_id)
    assert run.core.progress().locality == 0.0


def test_maps_without_preferred_hosts_run_anywhere_without_waiting() -> None:
    run = Run(config([("a",), (), ()]))
    assert [spec(t)["index"] for t in launched(run.offer("b"))] == [1, 2]
    for task_id in list(run.tasks):
        run.finish(task_id)
    assert run.core.progress().preferred_maps == 0


def test_local_maps_come_before_maps_without_preference() -> None:
    run = Run(config([(), ("a",)]))
    assert [spec(t)["index"] for t in launched(run.offer("a"))] == [1, 0]


def test_a_steal_takes_from_the_longest_backlog() -> None:
    run = Run(config([("a",), ("c",), ("c",), ("c",)], locality_wait=0.0))
    assert [spec(t)["index"] for t in launched(run.offer("b", "cpus:0.6;mem:512"))] == [1]


def test_replicated_split_is_local_on_any_of_its_hosts() -> None:
    run = Run(config([("a", "b")], locality_wait=5.0))
    assert ids(run.offer("b")) == ["map-00000-1"]
    run.finish("map-00000-1")
    assert run.core.progress().local_maps == 1


def test_reduces_wait_for_every_map_and_are_told_where_outputs_are() -> None:
    run = Run(config([("a",), ("b",)], reducers=2))
    run.offer("a")
    run.offer("b")
    run.finish("map-00000-1")
    assert ids(run.offer("a")) == []  # a map is still running: no reduce yet
    effects = run.finish("map-00001-1")
    assert ReviveOffers() in effects
    reduces = launched(run.offer("c"))
    assert [t.task_id for t in reduces] == ["reduce-00000-1", "reduce-00001-1"]
    assert spec(reduces[1])["inputs"] == [
        {"map": 0, "task_id": "map-00000-1", "url": "http://a:5051",
         "path": "/sandbox/map-00000-1/part-1"},
        {"map": 1, "task_id": "map-00001-1", "url": "http://b:5051",
         "path": "/sandbox/map-00001-1/part-1"}]
    run.finish("reduce-00000-1")
    effects = run.finish("reduce-00001-1")
    assert effects == [JobDone(True)]
    assert run.core.done == JobDone(True)
    assert run.core.output_files() == ["/out/part-r-00000", "/out/part-r-00001"]
    progress = run.core.progress()
    assert (progress.maps_done, progress.reduces_done, progress.locality) == (2, 2, 1.0)
    assert (progress.records_in, progress.records_out) == (28, 12)
    assert run.offer("a") == []  # done: the core is silent


# ------------------------------------------------------------------ failures


def test_failed_map_is_retried_on_another_agent() -> None:
    run = Run(config([("a",)], locality_wait=0.0))
    run.offer("b", "cpus:0.1;mem:64")  # too small, but now "b" is known
    run.offer("a")
    effects = run.update("map-00000-1", TaskState.TASK_FAILED, message="boom")
    assert ReviveOffers() in effects
    assert ids(run.offer("a")) == []  # it failed there
    assert ids(run.offer("b")) == ["map-00000-2"]
    assert run.core.progress().failed_attempts == 1


def test_retry_may_return_to_the_only_agent_there_is() -> None:
    run = Run(config([("a",)]))
    run.offer("a")
    run.update("map-00000-1", TaskState.TASK_FAILED)
    assert ids(run.offer("a")) == ["map-00000-2"]


def test_job_fails_after_max_attempts_with_the_last_error() -> None:
    run = Run(config([()], max_attempts=2))
    run.offer("a")
    run.update("map-00000-1", TaskState.TASK_FAILED, message="first")
    run.offer("b")
    effects = run.update("map-00000-2", TaskState.TASK_FAILED, message="ZeroDivisionError")
    (done,) = of(JobDone, effects)
    assert not done.succeeded
    assert done.error == "map 0 failed 2 times; last: TASK_FAILED on b: ZeroDivisionError"


def test_lost_attempt_is_retried_and_counts() -> None:
    run = Run(config([(), ()]))
    run.offer("a")
    run.update("map-00000-1", TaskState.TASK_LOST, message="agent gone")
    assert ids(run.offer("b")) == ["map-00000-2"]
    assert run.core.progress().failed_attempts == 1


def revocable_offer(host: str, resources: str, lent: str, executor: bool = True) -> Offer:
    return attrs.evolve(Run.make_offer(host, resources, executor), revocable=R(lent))


R = Resources.parse


def test_revocable_resources_are_used_only_when_asked_and_never_for_the_executor() -> None:
    offer = revocable_offer("a", "cpus:0.6;mem:320", "cpus:1;mem:512", executor=False)
    plain = Run(config([()] * 4))
    assert [t.revocable for t in launched(plain.do(OffersMade((offer,))))] == [False]
    run = Run(config([()] * 4, revocable=True))
    tasks = launched(run.do(OffersMade((offer,))))
    # The executor and one task on ordinary resources, then two on revocable ones.
    assert [t.revocable for t in tasks] == [False, True, True]
    assert run.core.progress().revocable_launches == 2
    # No ordinary room for the executor: nothing runs, however much is lent.
    fresh = Run(config([()], revocable=True))
    lent_only = revocable_offer("b", "cpus:0.05;mem:16", "cpus:4;mem:4096", executor=False)
    assert ids(fresh.do(OffersMade((lent_only,)))) == []
    # With the executor already there, a revocable-only offer is enough.
    there = revocable_offer("b", "", "cpus:0.5;mem:256", executor=True)
    (task,) = launched(fresh.do(OffersMade((there,))))
    assert task.revocable


def test_a_preempted_attempt_is_retried_anywhere_and_not_charged() -> None:
    run = Run(config([("a",)], max_attempts=1, revocable=True))
    run.offer("a")
    for attempt in (1, 2, 3):
        effects = run.do(TaskUpdate(TaskStatus(
            task_id=f"map-00000-{attempt}", state=TaskState.TASK_KILLED, agent_id="agent-a",
            reason=Reason.CONTAINER_PREEMPTED, message="revocable resources taken back")))
        assert not of(JobDone, effects) and ReviveOffers() in effects
        assert ids(run.offer("a")) == [f"map-00000-{attempt + 1}"]  # same agent: no blame
    progress = run.core.progress()
    assert (progress.preempted_attempts, progress.failed_attempts) == (3, 0)
    # A kill for any other reason is still a failure.
    (done,) = of(JobDone, run.update("map-00000-4", TaskState.TASK_KILLED, message="operator"))
    assert not done.succeeded


def test_refused_launches_back_off_and_are_not_the_tasks_fault() -> None:
    run = Run(config([("a",)] * 3))
    run.offer("a")
    run.update("map-00000-1", TaskState.TASK_DROPPED)
    run.do(TaskUpdate(TaskStatus(task_id="map-00001-1", state=TaskState.TASK_ERROR,
                                 source=Source.AGENT, message="agent has only cpus:0.1")))
    run.do(TaskUpdate(TaskStatus(task_id="map-00002-1", state=TaskState.TASK_ERROR,
                                 source=Source.EXECUTOR, message="bad")))
    progress = run.core.progress()
    assert (progress.refused_launches, progress.failed_attempts) == (2, 1)
    assert ids(run.offer("a")) == ["map-00002-2"]  # the others back off for 0.1 s
    run.now = 0.1
    assert ReviveOffers() in run.do(TimerFired(Tick()))
    assert ids(run.offer("a")) == ["map-00000-2", "map-00001-2"]  # same agent: no blame


def test_a_task_refused_too_often_fails_the_job() -> None:
    run = Run(config([()]))
    for _ in range(REFUSAL_LIMIT):
        run.now += MAX_REFUSAL_BACKOFF
        (task_id,) = ids(run.offer("a"))
        effects = run.update(task_id, TaskState.TASK_DROPPED, message="no room")
    (done,) = of(JobDone, effects)
    assert done.error == (f"map 0 was refused at launch {REFUSAL_LIMIT} times; last: "
                          "TASK_DROPPED on a: no room")


def test_duplicate_and_unknown_updates_are_ignored() -> None:
    run = Run(config([()]))
    run.offer("a")
    run.update("map-00000-1", TaskState.TASK_RUNNING)
    run.finish("map-00000-1")
    assert run.finish("map-00000-1") == []  # at-least-once delivery: a resend
    status = TaskStatus(task_id="nonsense", state=TaskState.TASK_FINISHED)
    assert run.do(TaskUpdate(status)) == []
    progress = run.core.progress()
    assert progress.maps_done == 1 and progress.invalid_updates == 1


def test_finished_without_a_valid_result_counts_as_a_failure() -> None:
    run = Run(config([()]))
    run.offer("a")
    run.update("map-00000-1", TaskState.TASK_FINISHED, data=b'{"outputs": ["relative"]}')
    progress = run.core.progress()
    assert (progress.maps_done, progress.failed_attempts, progress.invalid_updates) == (0, 1, 1)
    assert ids(run.offer("b")) == ["map-00000-2"]


def test_lost_agent_reruns_the_map_outputs_it_held() -> None:
    run = Run(config([("a",), ("b",)], reducers=1))
    run.offer("a")
    run.offer("b")
    run.finish("map-00000-1")
    run.finish("map-00001-1")
    assert ids(run.offer("c")) == ["reduce-00000-1"]
    effects = run.do(AgentLost("agent-a"))
    assert ReviveOffers() in effects
    progress = run.core.progress()
    assert (progress.maps_done, progress.maps_rerun, progress.failed_attempts) == (1, 1, 0)
    # Its data was on "a", which is gone: waiting for a local offer would be in vain.
    assert ids(run.offer("c")) == ["map-00000-2"]
    run.finish("map-00000-2")
    # The running reduce could not fetch from "a": it says so, not its fault, and
    # the map it names has been re-run already.
    run.update("reduce-00000-1", TaskState.TASK_FAILED, data=json.dumps(
        {FETCH_FAILED_KEY: [{"map": 0, "task_id": "map-00000-1"}]}).encode())
    progress = run.core.progress()
    assert (progress.maps_rerun, progress.failed_attempts) == (1, 0)
    (reduce,) = launched(run.offer("c"))
    assert reduce.task_id == "reduce-00000-2"
    assert spec(reduce)["inputs"][0]["task_id"] == "map-00000-2"


def test_a_lost_host_that_comes_back_is_preferred_again() -> None:
    run = Run(config([("a",), ("a",)], reducers=1))
    run.offer("a", "cpus:0.6;mem:512")
    run.do(AgentLost("agent-a"))
    run.offer("a", "cpus:0.6;mem:512")  # re-registered
    run.update("map-00000-1", TaskState.TASK_LOST)
    run.finish("map-00001-1")
    assert of(DeclineOffers, run.offer("b"))  # map 0 waits for "a" again


def test_fetch_failure_reruns_the_map_it_names() -> None:
    run = Run(config([(), ()], reducers=1))
    run.offer("a")
    run.finish("map-00000-1")
    run.finish("map-00001-1")
    run.offer("b")
    run.update("reduce-00000-1", TaskState.TASK_FAILED, data=json.dumps(
        {FETCH_FAILED_KEY: [{"map": 1, "task_id": "map-00001-1"}, {"map": 99, "task_id": "x"}]}
    ).encode())
    progress = run.core.progress()
    assert (progress.maps_done, progress.maps_rerun, progress.failed_attempts) == (1, 1, 0)
    assert progress.invalid_updates == 1  # map 99 does not exist
    assert ids(run.offer("b")) == ["map-00001-2"]  # the reduce waits for it again
    run.finish("map-00001-2")
    assert ids(run.offer("b")) == ["reduce-00000-2"]


def test_losing_outputs_too_often_fails_the_job() -> None:
    run = Run(config([()], reducers=1, max_attempts=2))
    run.offer("a")
    run.finish("map-00000-1")
    run.do(AgentLost("agent-a"))
    run.offer("b")
    run.finish("map-00000-2")
    effects = run.do(AgentLost("agent-b"))
    assert of(JobDone, effects) == [JobDone(False, "map 0 failed 2 times; last: "
                                                   "output lost with agent b")]


def test_agent_loss_after_the_last_reduce_changes_nothing() -> None:
    run = Run(config([()], reducers=1))
    run.offer("a")
    run.finish("map-00000-1")
    run.offer("a")
    assert run.finish("reduce-00000-1") == [JobDone(True)]
    assert run.do(AgentLost("agent-a")) == []


# ------------------------------------------------------------- offer interest


def test_suppresses_with_nothing_to_launch_and_revives_when_a_slot_frees() -> None:
    run = Run(config([(), ()]))
    effects = run.offer("a")
    assert SuppressOffers() in effects  # everything is placed
    assert of(LaunchTasks, effects)[0].refuse_seconds == 5.0
    effects = run.finish("map-00000-1")
    assert ReviveOffers() not in effects and SuppressOffers() not in effects
    effects = run.finish("map-00001-1")
    assert ReviveOffers() in effects  # the reduces want offers now


def test_revives_on_each_freed_slot_while_work_waits() -> None:
    run = Run(config([()] * 5))
    effects = run.offer("a")
    assert ReviveOffers() not in effects and SuppressOffers() not in effects
    assert ReviveOffers() in run.finish("map-00000-1")


def test_starvation_fails_the_job_with_what_was_needed() -> None:
    run = Run(config([()], starvation_timeout=10.0))
    effects = run.offer("a", "cpus:0.2;mem:64", executor=False)
    assert of(DeclineOffers, effects)[0].refuse_seconds == 5.0
    run.now = 9.0
    assert of(JobDone, run.do(TimerFired(Tick()))) == []
    run.now = 10.0
    (done,) = of(JobDone, run.do(TimerFired(Tick())))
    assert "no offer had room for a map task for 10s" in done.error
    assert "cpus:0.2;mem:64" in done.error and "cpus:0.6;mem:320" in done.error


def test_no_offers_at_all_is_not_starvation() -> None:
    run = Run(config([()], starvation_timeout=1.0))
    run.now = 100.0
    assert of(JobDone, run.do(TimerFired(Tick()))) == []


def test_reregistration_reconciles_live_attempts() -> None:
    run = Run(config([(), ()]))
    run.offer("a")
    run.finish("map-00000-1")
    assert run.do(Reregistered()) == [ReconcileTasks((("map-00001-1", "agent-a"),))]


def test_uri_inputs_prefer_the_hosts_that_fetched_them() -> None:
    cfg = CoreConfig(splits=(Split(0, "http://x/a"), Split(1, "http://x/a")), reducers=1,
                     executor=EXECUTOR, map_resources=TASK, reduce_resources=TASK,
                     job_payload=PAYLOAD, output="/out", locality_wait=5.0)
    run = Run(cfg)
    assert ids(run.offer("a", "cpus:0.6;mem:512")) == ["map-00000-1"]  # no preference yet
    outputs = {"outputs": ["/s/p0"], "cached": True}
    run.update("map-00000-1", TaskState.TASK_FINISHED, json.dumps(outputs).encode())
    assert of(DeclineOffers, run.offer("b"))  # "a" has the file now: wait for it
    assert ids(run.offer("a", "cpus:0.5;mem:512")) == ["map-00001-1"]
    run.finish("map-00001-1")
    assert run.core.progress().local_maps == 1 and run.core.progress().preferred_maps == 1


# --------------------------------------------------------------- speculation


def test_speculative_copy_of_a_straggler_and_the_loser_is_killed() -> None:
    run = Run(config([()] * 4, reducers=1, speculative=True))
    run.offer("a", "cpus:2.1;mem:4096")
    for index in range(3):
        run.now = 1.0
        run.finish(f"map-{index:05d}-1")
    run.now = 1.4
    assert of(ReviveOffers, run.do(TimerFired(Tick()))) == []  # 1.4 s is not slow yet
    run.now = 1.6  # > 1.5 x the median (1.0)
    assert ReviveOffers() in run.do(TimerFired(Tick()))
    assert ids(run.offer("a")) == []  # not beside the original
    assert ids(run.offer("b")) == ["map-00003-2"]
    assert run.core.progress().speculative_attempts == 1
    effects = run.finish("map-00003-2")
    assert RequestKill("map-00003-1") in effects
    assert not of(JobDone, run.update("map-00003-1", TaskState.TASK_KILLED))
    progress = run.core.progress()
    assert progress.maps_done == 4 and progress.failed_attempts == 0
    assert spec(launched(run.offer("c"))[0])["inputs"][3]["task_id"] == "map-00003-2"


def test_no_speculation_unless_asked() -> None:
    run = Run(config([()] * 2, reducers=1))
    run.offer("a")
    run.now = 1.0
    run.finish("map-00000-1")
    run.now = 100.0
    run.do(TimerFired(Tick()))
    assert ids(run.offer("b")) == []


# ------------------------------------------------------------ whole jobs


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_faults_end_in_success_or_a_clear_failure(data: st.DataObject) -> None:
    """A simulated cluster where attempts finish, fail, or lose their agent at
    random: the job always ends, never exceeds its attempts, and on success every
    reduce read every map's current output."""
    hosts = ["a", "b", "c"]
    maps = data.draw(st.integers(1, 6))
    prefs = [tuple(data.draw(st.sets(st.sampled_from(hosts), max_size=2))) for _ in range(maps)]
    run = Run(config(prefs, reducers=data.draw(st.integers(1, 3)), max_attempts=3,
                     locality_wait=data.draw(st.sampled_from([0.0, 1.0])),
                     speculative=data.draw(st.booleans())))
    running: dict[str, TaskInfo] = {}
    alive = set(hosts)
    for _ in range(400):
        if run.core.done is not None:
            break
        run.now += 0.3
        action = data.draw(st.sampled_from(["offer", "end", "end", "tick", "lose"]))
        if action == "offer" or not running:
            host = data.draw(st.sampled_from(sorted(alive) or ["d"]))
            alive.add(host)
            running.update((t.task_id, t) for t in launched(run.offer(host)))
        elif action == "tick":
            running.update((t.task_id, t) for t in launched(run.do(TimerFired(Tick()))))
        elif action == "lose" and len(alive) > 1:
            host = data.draw(st.sampled_from(sorted(alive)))
            alive.discard(host)
            run.do(AgentLost(f"agent-{host}"))
            for task_id in [t for t, info in running.items() if info.agent_id == f"agent-{host}"]:
                del running[task_id]
                run.update(task_id, TaskState.TASK_LOST, message="agent lost")
        else:
            task_id = data.draw(st.sampled_from(sorted(running)))
            del running[task_id]
            outcome = data.draw(st.integers(0, 9))
            if outcome == 0:
                run.update(task_id, TaskState.TASK_FAILED, message="random")
            elif outcome == 1:
                run.update(task_id, TaskState.TASK_DROPPED, message="refused")
            else:
                run.finish(task_id)
    done = run.core.done
    if done is None:
        return  # the draw ran out of steps: the invariants held all along
    if done.succeeded:
        assert len(run.core.output_files()) == run.core.config.reducers
        assert run.core.progress().maps_done == maps
    else:
        assert "failed 3 times" in done.error or "refused at launch" in done.error
    assert all(len(t.failures) <= 3 for t in run.core._maps + run.core._reduces)


def test_reason_is_the_message_when_there_is_none() -> None:
    run = Run(config([()], max_attempts=1))
    run.offer("a")
    effects = run.do(TaskUpdate(TaskStatus(task_id="map-00000-1", state=TaskState.TASK_LOST,
                                           reason=Reason.AGENT_REMOVED)))
    assert of(JobDone, effects)[0].error.endswith("TASK_LOST on a: REASON_AGENT_REMOVED")
