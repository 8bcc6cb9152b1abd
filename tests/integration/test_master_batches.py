"""The master's batch frames to agents (issue 19): an agent that registers with
`BATCH_FRAMES` gets what one processing batch has for it in one frame (the
`RunTask`s of an accept); one that does not gets single frames, as before."""

from __future__ import annotations

import asyncio

import pytest

from dyad import messages as m
from dyad.ids import IdGenerator
from dyad.resources import Resources
from dyad.transport import Dealer
from master.model import MasterConfig
from master.server import MasterServer

pytestmark = pytest.mark.integration

TASK = Resources.parse("cpus:1;mem:128")


async def _next(dealer: Dealer, kind: type) -> m.Message:
    while True:
        message = (await asyncio.wait_for(dealer.recv(), 10.0)).message
        for one in message.messages if isinstance(message, m.Batch) else [message]:
            if isinstance(one, kind):
                return one


async def _frames_with_run_tasks(dealer: Dealer, count: int) -> list[m.Message]:
    """The frames that brought `count` RunTasks, as they came."""
    frames: list[m.Message] = []
    seen = 0
    while seen < count:
        message = (await asyncio.wait_for(dealer.recv(), 10.0)).message
        inner = message.messages if isinstance(message, m.Batch) else [message]
        runs = sum(isinstance(one, m.RunTask) for one in inner)
        if runs:
            frames.append(message)
            seen += runs
    return frames


@pytest.mark.parametrize("batches", [True, False])
async def test_an_agent_that_takes_batches_gets_an_accepts_launches_in_one_frame(
        batches: bool) -> None:
    server = MasterServer(ip="127.0.0.1", hostname="localhost", port=0, zmq_port=0,
                          config=MasterConfig(allocation_interval=0.05),
                          ids=IdGenerator("batch-master"))
    await server.start()
    agent, driver = Dealer(), Dealer()
    try:
        for dealer in (agent, driver):
            dealer.connect(server.info.zmq_endpoint)
        await agent.send(m.RegisterAgent(
            agent=m.AgentInfo(hostname="a", port=5051, resources=Resources.parse(
                "cpus:4;mem:1024")),
            capabilities=[m.BATCH_CAPABILITY] if batches else []))
        agent_id = (await _next(agent, m.AgentRegistered)).agent_id
        await driver.send(m.Subscribe(framework=m.FrameworkInfo(name="fw")))
        framework_id = (await _next(driver, m.Subscribed)).framework_id
        (offer,) = (await _next(driver, m.Offers)).offers
        tasks = [m.TaskInfo(task_id=f"t{i}", name="t", agent_id=agent_id, resources=TASK,
                            command=m.CommandInfo(shell="true")) for i in range(4)]
        await driver.send(m.Accept(framework_id=framework_id, offer_ids=[offer.id],
                                   operations=[m.Operation(type="LAUNCH", tasks=tasks)]))
        frames = await _frames_with_run_tasks(agent, 4)
        if batches:
            (frame,) = frames
            assert isinstance(frame, m.Batch)
            assert [one.task.task_id for one in frame.messages
                    if isinstance(one, m.RunTask)] == ["t0", "t1", "t2", "t3"]
        else:
            assert [type(frame) for frame in frames] == [m.RunTask] * 4
    finally:
        agent.close()
        driver.close()
        await server.stop()
