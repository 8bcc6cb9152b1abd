"""The autopilot inside the service framework (frameworks/service/rightsizing.py):
an app's `autopilot` block, samples in, a recommendation out, and in `auto` a
rolling upgrade to the new limits; an OOM kill raises memory at once.

A real `ServiceRuntime` (file store, fake driver, fake clock): the clock is moved
by hand, and the autopilot's step is a few milliseconds of loop time, so its
timers fire while the test waits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from dyad.clock import FakeClock
from dyad.messages import Reason, TaskState, TaskStatus
from frameworks.autopilot import MIB, Config
from frameworks.service.appdef import AppInvalid, parse_app
from frameworks.service.core import (
    OffersReceived,
    PutApp,
    Registered,
    RestartApp,
    ServiceConfig,
    ServiceCore,
    StatusReceived,
)
from frameworks.service.records import RESTART, SCALE, UPGRADE
from frameworks.service.rightsizing import Sample, recommendation_json
from frameworks.service.runtime import ServiceRuntime
from frameworks.service.store import FileStore
from frameworks.testing import FakeSchedulerDriver, make_offer
from tests.helpers import wait_for

PILOT = Config(step=0.01, warmup=60.0, min_samples=5, min_interval=0.0)
APP = {"id": "/web", "cmd": "sleep 1000", "instances": 2, "cpus": 1.0, "mem": 512,
       "upgradeStrategy": {"minimumHealthCapacity": 0.5, "maximumOverCapacity": 0.5},
       "autopilot": {"mode": "auto", "min": {"mem": 64}}}


def make_runtime(tmp_path: Path, config: Config) -> Iterator[ServiceRuntime]:
    store = FileStore(tmp_path)
    core = ServiceCore(ServiceConfig(), iter(f"{i:04d}" for i in range(1, 10**6)).__next__)
    runtime = ServiceRuntime(core, store, FakeClock(1_000_000.0), autopilot=config)
    runtime.driver = FakeSchedulerDriver()
    yield runtime
    runtime.close()
    store.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ServiceRuntime]:
    yield from make_runtime(tmp_path, PILOT)


@pytest.fixture
def horizontal(tmp_path: Path) -> Iterator[ServiceRuntime]:
    """Vertical sizing never ready (a long warmup), so only the count moves."""
    yield from make_runtime(tmp_path, Config(step=0.01, warmup=1e9, min_samples=5))


def start(runtime: ServiceRuntime, app: dict[str, Any]) -> None:
    runtime.handle(Registered("framework-1"))
    runtime.execute(PutApp(parse_app(app)))
    run_all(runtime)


def run_all(runtime: ServiceRuntime) -> None:
    offers = tuple(make_offer(agent_id=f"agent-{i}", hostname=f"h{i}",
                              resources="cpus:4;mem:4096") for i in range(2))
    runtime.handle(OffersReceived(offers))
    for task in list(runtime.core.tasks.values()):
        if task.state is not TaskState.TASK_RUNNING:
            runtime.handle(StatusReceived(TaskStatus(
                task_id=task.task_id, state=TaskState.TASK_RUNNING, agent_id=task.agent_id)))


def feed(runtime: ServiceRuntime, n: int, mem: float = 30e6, every: float = 10.0) -> None:
    clock = runtime.clock
    assert isinstance(clock, FakeClock)
    for _ in range(n):
        clock.advance(every)
        runtime.sampled([Sample("/web", clock.now(), 0.05, mem)])


def test_an_autopilot_block_is_part_of_the_definition_and_its_errors_have_paths() -> None:
    app = parse_app(APP)
    assert app.autopilot.mode == "auto" and app.autopilot.bounds.min_mem_bytes == 64 * MIB
    with pytest.raises(AppInvalid) as bad:
        parse_app({**APP, "autopilot": {"mode": "always", "max": {"cpus": -1}}})
    assert bad.value.details == [("/autopilot/mode", "must be one of off, recommend, auto"),
                                 ("/autopilot/max/cpus", "must be a positive number")]
    # Changing only the autopilot block restarts no task.
    assert app.same_config(parse_app({**APP, "autopilot": {"mode": "recommend"}}))


async def test_an_over_declared_app_is_right_sized_by_a_rolling_upgrade(
        runtime: ServiceRuntime) -> None:
    start(runtime, APP)
    assert runtime.rightsizing.followed() == ["/web"]
    feed(runtime, 8)

    def upgrading() -> Any:
        deployment = runtime.core.deployment_of("/web")
        return deployment if deployment is not None and deployment.kind == UPGRADE else None

    deployment = await wait_for(upgrading, 5, "the autopilot's upgrade")
    assert deployment.original.mem == 512 and deployment.target.mem == 64  # the app's min
    assert runtime.core.apps["/web"].mem == 64
    answer = recommendation_json(runtime.core.apps["/web"],
                                 runtime.rightsizing.pilot.recommendation("/web"))
    rec = answer["recommendation"]
    assert rec["ready"] and rec["mem"] == 64 and rec["samples"] == 8
    assert rec["memVariant"] and rec["reasons"]
    assert runtime.rightsizing.counters["autopilot_upgrades"] == 1

    # A task of the new version dies for memory: raised at once, over the autopilot's
    # own deployment still rolling.
    run_all(runtime)
    new = next(t for t in runtime.core.tasks.values()
               if t.config_version == runtime.core.apps["/web"].config_version)
    runtime.handle(StatusReceived(TaskStatus(
        task_id=new.task_id, state=TaskState.TASK_FAILED, agent_id=new.agent_id,
        reason=Reason.CONTAINER_LIMITATION_MEMORY)))
    assert runtime.core.apps["/web"].mem == 96  # 1.5 x 64
    assert runtime.rightsizing.counters["autopilot_oom_kills"] == 1


async def test_an_oom_kill_during_the_apps_own_deployment_raises_memory_at_once(
        runtime: ServiceRuntime) -> None:
    # Tasks that die for memory keep the creation from finishing: the raise cannot
    # wait for it, and supersedes it keeping its target.
    runtime.handle(Registered("framework-1"))
    runtime.execute(PutApp(parse_app({**APP, "instances": 1, "mem": 128, "upgradeStrategy": {
        "minimumHealthCapacity": 0, "maximumOverCapacity": 1}})))
    runtime.handle(OffersReceived((make_offer(agent_id="agent-0", resources="cpus:4;mem:4096"),)))
    [task] = runtime.core.tasks.values()
    assert runtime.core.deployment_of("/web") is not None
    runtime.handle(StatusReceived(TaskStatus(
        task_id=task.task_id, state=TaskState.TASK_FAILED, agent_id=task.agent_id,
        reason=Reason.CONTAINER_LIMITATION_MEMORY)))
    app = runtime.core.apps["/web"]
    assert app.mem == 192 and app.instances == 1 and app.cmd == APP["cmd"]
    deployment = runtime.core.deployment_of("/web")
    assert deployment is not None and deployment.target.mem == 192
    assert runtime.rightsizing.counters["autopilot_upgrades"] == 1
    assert runtime.rightsizing.counters["autopilot_upgrades_deferred"] == 0


async def test_recommend_mode_changes_nothing(runtime: ServiceRuntime) -> None:
    start(runtime, {**APP, "autopilot": {"mode": "recommend"}})
    feed(runtime, 8)

    def ready() -> Any:
        rec = runtime.rightsizing.pilot.recommendation("/web")
        return rec if rec is not None and rec.ready else None

    rec = await wait_for(ready, 5, "a recommendation")
    assert rec.mem_bytes <= 128 * MIB
    assert runtime.core.apps["/web"].mem == 512 and runtime.core.deployment_of("/web") is None


async def test_an_operators_deployment_is_waited_for_not_overridden(
        runtime: ServiceRuntime) -> None:
    start(runtime, APP)
    runtime.execute(RestartApp("/web"))  # the operator's deployment, still rolling
    feed(runtime, 8)
    await wait_for(lambda: runtime.rightsizing.counters["autopilot_upgrades_deferred"], 5,
                   "the autopilot to defer")
    assert runtime.core.apps["/web"].mem == 512
    for _ in range(10):  # the restart rolls on: new tasks run, old ones end
        run_all(runtime)
        for task in [t for t in runtime.core.tasks.values() if t.killing]:
            runtime.handle(StatusReceived(TaskStatus(
                task_id=task.task_id, state=TaskState.TASK_KILLED, agent_id=task.agent_id)))
        if runtime.core.apps["/web"].mem != 512:
            break
    assert runtime.core.apps["/web"].mem == 64  # applied as soon as the app was free
    assert runtime.core.deployment_of("/web").kind == UPGRADE


def test_apps_without_autopilot_are_not_followed(runtime: ServiceRuntime) -> None:
    app = {k: v for k, v in APP.items() if k != "autopilot"}
    runtime.handle(Registered("framework-1"))
    runtime.execute(PutApp(parse_app(app)))
    assert runtime.rightsizing.followed() == []
    assert recommendation_json(runtime.core.apps["/web"], None)["recommendation"] is None


SCALED = {**APP, "autopilot": {"mode": "auto",
                               "horizontal": {"target": 0.5, "min": 1, "max": 6}}}


def feed_tasks(runtime: ServiceRuntime, n: int, cpus: float) -> None:
    """`n` rounds of samples, 10 s apart, of every task the app has, each at `cpus`."""
    clock = runtime.clock
    assert isinstance(clock, FakeClock)
    for _ in range(n):
        clock.advance(10.0)
        runtime.sampled([Sample("/web", clock.now(), cpus, 30e6, task.task_id)
                         for task in runtime.core.tasks.values()])


async def test_auto_with_horizontal_scales_the_app(horizontal: ServiceRuntime) -> None:
    runtime = horizontal
    start(runtime, SCALED)
    assert runtime.core.deployment_of("/web") is None  # created: both tasks run
    feed_tasks(runtime, 3, 0.9)  # 1.8 cores at 0.5 a task: 4 instances
    await wait_for(lambda: runtime.core.apps["/web"].instances == 4, 5, "the scale-up")
    deployment = runtime.core.deployment_of("/web")
    assert deployment is not None and deployment.kind == SCALE
    assert runtime.core.apps["/web"].mem == 512  # the limits were not touched
    assert runtime.rightsizing.counters["autopilot_scales"] == 1
    answer = recommendation_json(runtime.core.apps["/web"],
                                 runtime.rightsizing.pilot.recommendation("/web"))
    instances = answer["recommendation"]["instances"]
    assert instances["current"] == 4 and instances["ready"]
    assert "4 wanted" in instances["reason"]
    assert answer["autopilot"]["horizontal"] == {"target": 0.5, "min": 1, "max": 6}


async def test_horizontal_skips_an_app_under_deployment(horizontal: ServiceRuntime) -> None:
    runtime = horizontal
    start(runtime, SCALED)
    runtime.execute(RestartApp("/web"))  # the operator's deployment, still rolling
    feed_tasks(runtime, 3, 0.9)
    await wait_for(lambda: runtime.rightsizing.counters["autopilot_scales_skipped"], 5,
                   "the autopilot to skip")
    assert runtime.core.apps["/web"].instances == 2
    assert runtime.core.deployment_of("/web").kind == RESTART


def test_a_horizontal_blocks_errors_have_paths_and_editing_it_restarts_nothing() -> None:
    with pytest.raises(AppInvalid) as bad:
        parse_app({**SCALED, "autopilot": {"mode": "auto", "horizontal": {
            "target": 0.5, "min": 4, "max": 2}}})
    assert bad.value.details == [("/autopilot/horizontal/min", "exceeds max (4 > 2)")]
    assert parse_app(SCALED).same_config(parse_app(APP))


def test_horizontal_sizings_damping_is_set_by_flags() -> None:
    from frameworks.autopilot.horizontal import HorizontalConfig
    from frameworks.service.main import autopilot_config, build_parser, main

    def config(*flags: str) -> HorizontalConfig:
        return autopilot_config(build_parser().parse_args(["--master", "m:1", *flags])).horizontal

    assert config() == HorizontalConfig()
    set_ = config("--autopilot-scale-window", "2mins", "--autopilot-scale-stabilization",
                  "10mins", "--autopilot-scale-interval", "30s")
    assert (set_.window, set_.stabilization, set_.interval) == (120.0, 600.0, 30.0)
    assert main(["--master", "m:1", "--autopilot-scale-window", "0s"]) == 2  # said, not raised


def test_the_room_before_a_first_jump_is_sized_or_flat_by_flag() -> None:
    from frameworks.autopilot import DEFAULT_MEMORY_VARIANTS, FLAT_FIRST_ROOM_VARIANTS
    from frameworks.service.main import autopilot_config, build_parser

    def memory(*flags: str) -> tuple:
        return autopilot_config(build_parser().parse_args(
            ["--master", "m:1", *flags])).memory_variants

    assert memory() == DEFAULT_MEMORY_VARIANTS
    assert memory("--autopilot-first-room", "sized") == DEFAULT_MEMORY_VARIANTS
    [flat] = memory("--autopilot-first-room", "flat")
    assert flat == FLAT_FIRST_ROOM_VARIANTS[0]
    assert (flat.first_size, flat.first_rate) == (0.0, 0.05)
    # Only that part differs from the default.
    assert attrs.evolve(flat, name=DEFAULT_MEMORY_VARIANTS[0].name, first_size=0.5,
                        first_rate=0.03) == DEFAULT_MEMORY_VARIANTS[0]
