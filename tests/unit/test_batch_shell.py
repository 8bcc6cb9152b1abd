"""The batch framework's shells without a cluster: `BatchScheduler` against a
`FakeSchedulerDriver`, the executor over real sockets against a `FakeAgent`, and
`run_job` when no master answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from frameworks import DriverStatus, ExecutorDriver, Resources, TaskInfo, TaskState
from frameworks.batch import BatchCore, Job, run_job_async
from frameworks.batch.executor import BatchExecutor
from frameworks.batch.job import prepare
from frameworks.batch.scheduler import BatchScheduler
from frameworks.batch.status import FAILED, list_jobs
from frameworks.testing import FakeAgent, FakeSchedulerDriver, make_master_info, make_offer, \
    make_status

WORDCOUNT = str(Path(__file__).resolve().parents[2] / "examples" / "wordcount.py")


def prepared_core(tmp_path: Path, **options: Any) -> BatchCore:
    (tmp_path / "in.txt").write_text("a b a\n")
    job = Job(module=WORDCOUNT, inputs=str(tmp_path / "in.txt"), output=str(tmp_path / "out"),
              reducers=1, **options)
    return BatchCore(prepare(job).core_config())


def finished(task: TaskInfo) -> Any:
    kind = json.loads(task.data)["task"]["type"]
    data = {"outputs": ["/s/part-0"]} if kind == "map" else {"output": "/out/part-r-00000"}
    return make_status(task, TaskState.TASK_FINISHED, data=json.dumps(data).encode())


async def test_scheduler_turns_core_effects_into_driver_calls(tmp_path: Path) -> None:
    core = prepared_core(tmp_path)
    changes: list[int] = []
    scheduler = BatchScheduler(core, on_change=lambda: changes.append(1))
    driver = FakeSchedulerDriver()
    scheduler.registered(driver, "fw-1", make_master_info())
    assert scheduler.framework_id == "fw-1" and scheduler.registered_event.is_set()
    scheduler.resource_offers(driver, [make_offer(hostname="h", resources="cpus:1;mem:1024"),
                                       make_offer(resources="cpus:0.1;mem:16")])
    ((offer_ids, (task,), filters),) = driver.launched
    assert filters.refuse_seconds == 5.0
    assert driver.declined[0][1].refuse_seconds == 5.0
    assert driver.suppressed == 1
    scheduler.status_update(driver, finished(task))
    assert driver.revived == 1  # the reduce is eligible now
    scheduler.resource_offers(driver, [make_offer(resources="cpus:1;mem:1024")])
    reduce = driver.launched_tasks[-1]
    assert reduce.task_id == "reduce-00000-1"
    scheduler.status_update(driver, finished(reduce))
    assert scheduler.outcome is not None and scheduler.outcome.succeeded
    assert driver.stopped and not scheduler._timers
    assert len(changes) == 5


async def test_timers_fire_on_the_loop(tmp_path: Path) -> None:
    core = prepared_core(tmp_path, starvation_timeout=0.01)
    scheduler = BatchScheduler(core)
    driver = FakeSchedulerDriver()
    scheduler.registered(driver, "fw-1", make_master_info())
    scheduler.resource_offers(driver, [make_offer(resources="cpus:0.1;mem:16")])
    for _ in range(100):
        if scheduler.outcome is not None:
            break
        await asyncio.sleep(0.05)
    assert scheduler.outcome is not None and "no offer had room" in scheduler.outcome.error
    assert driver.stopped


async def test_run_job_fails_cleanly_when_no_master_answers(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("x\n")
    job = Job(module=WORDCOUNT, inputs=str(tmp_path / "in.txt"), output=str(tmp_path / "out"))
    result = await run_job_async(job, "127.0.0.1:1", connect_timeout=0.3,
                                 jobs_dir=tmp_path / "jobs")
    assert not result.succeeded
    assert result.error == "no master answered at 127.0.0.1:1 within 0.3s"
    assert not (tmp_path / "out").exists()
    (record,) = list_jobs(tmp_path / "jobs")
    assert record.state == FAILED and record.error == result.error
    assert "FAILED" in result.summary()


# ------------------------------------------------------------------ executor


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[FakeAgent]:
    async with FakeAgent(sandbox=str(tmp_path / "sandbox")) as fake:
        yield fake


def batch_task(task_id: str, payload: dict[str, Any], split_path: Path) -> TaskInfo:
    task = {"type": "map", "index": 0, "task_id": task_id, "reducers": 1, "output": "",
            "split": {"path": str(split_path), "start": 0, "length": None}}
    return TaskInfo(task_id=task_id, name=task_id, agent_id="agent-0001",
                    resources=Resources.of(cpus=0.5),
                    data=json.dumps({"job": payload, "task": task}).encode())


async def test_executor_runs_tasks_reports_results_and_kills(agent: FakeAgent,
                                                              tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a b a\n")
    wordcount = {"kind": "python", "source": Path(WORDCOUNT).read_text(),
                 "filename": WORDCOUNT, "format": "text"}
    sleeper = {"kind": "command", "map": "sleep 30", "reduce": "cat"}
    driver = ExecutorDriver(BatchExecutor(), environ=agent.environ("dyad-batch-executor"))
    await agent.launch(batch_task("map-00000-1", wordcount, tmp_path / "in.txt"))
    await agent.launch(batch_task("map-00001-1", sleeper, tmp_path / "in.txt"))
    await agent.launch(TaskInfo(task_id="bad", name="bad", agent_id="agent-0001",
                                resources=Resources.of(cpus=0.5), data=b"garbage"))
    run = asyncio.create_task(driver.run_async())
    try:
        await agent.wait_until(lambda: agent.states("map-00000-1") == [
            TaskState.TASK_RUNNING, TaskState.TASK_FINISHED], timeout=10)
        result = json.loads(next(u.data for u in agent.updates if u.task_id == "map-00000-1"
                                 and u.state is TaskState.TASK_FINISHED))
        (output,) = result["outputs"]
        assert output.startswith(str(tmp_path / "sandbox"))
        assert Path(output).read_text() == '"a"\t2\n"b"\t1\n'  # combined
        await agent.wait_until(lambda: TaskState.TASK_FAILED in agent.states("bad"), timeout=10)
        failed = next(u for u in agent.updates if u.task_id == "bad" and u.state.is_terminal)
        assert "bad task data" in failed.message
        await agent.wait_until(lambda: agent.states("map-00001-1") == [TaskState.TASK_RUNNING])
        await agent.kill("map-00001-1")
        await agent.wait_until(lambda: agent.states("map-00001-1")[-1:] == [
            TaskState.TASK_KILLED], timeout=10)
        await agent.shutdown()
        assert await asyncio.wait_for(run, 10) is DriverStatus.STOPPED
        assert agent.states("map-00001-1") == [TaskState.TASK_RUNNING, TaskState.TASK_KILLED]
    finally:
        if not run.done():
            driver.abort()
            await asyncio.wait_for(run, 5)
