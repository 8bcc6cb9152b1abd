"""The master's side of what agents report (issue 5): usage shown per task in
`/state`, cached URIs in offers, a draining agent offered nothing. `MasterState`
driven with plain messages; `validate()` after every step keeps the books honest."""

from __future__ import annotations

from typing import Any

from dyad.effects import Send, TimerFired
from dyad.ids import IdGenerator
from dyad.messages import (
    Accept, Address, AgentInfo, AgentRegistered, CommandInfo, DrainAgent, ExecutorUsage,
    FrameworkInfo, MasterInfo, Offers, Operation, RegisterAgent, Rejected, Rescind,
    Subscribe, Subscribed, TaskInfo, UsageReport,
)
from dyad.resources import Resources
from master.model import Allocate, MasterConfig, Received
from master.state import MasterState

INFO = MasterInfo(id="m", hostname="m", ip="127.0.0.1", port=5050, zmq_port=5055,
                  version="0.1.0", address=Address(hostname="m", ip="127.0.0.1", port=5050))


class Master:
    def __init__(self) -> None:
        self.state = MasterState(MasterConfig(), INFO, IdGenerator("m"), start_time=0.0)
        self.now = 0.0

    def send(self, peer: str, message: Any) -> list[Any]:
        return self.handle(Received(peer, message))

    def handle(self, event: Any) -> list[Any]:
        effects = self.state.handle(event, self.now)
        self.state.validate()
        return [e.message for e in effects if isinstance(e, Send)]

    def allocate(self) -> list[Any]:
        self.now += 1.0
        return [o for m in self.handle(TimerFired(Allocate())) if isinstance(m, Offers)
                for o in m.offers]


def started() -> tuple[Master, str, str, Any]:
    """A master with agent A (on peer "a") and framework F (on "f") and one offer."""
    master = Master()
    (registered,) = master.send("a", RegisterAgent(agent=AgentInfo(
        hostname="h", port=5051, resources=Resources.parse("cpus:4;mem:1024"))))
    assert isinstance(registered, AgentRegistered)
    (subscribed,) = master.send("f", Subscribe(framework=FrameworkInfo(name="fw")))
    assert isinstance(subscribed, Subscribed)
    (offer,) = master.allocate()
    return master, registered.agent_id, subscribed.framework_id, offer


def test_usage_reports_show_per_task_and_cached_uris_reach_offers() -> None:
    master, agent_id, framework_id, offer = started()
    assert offer.cached_uris == []
    task = TaskInfo(task_id="t1", name="t1", agent_id=agent_id,
                    resources=Resources.parse("cpus:1;mem:128"), command=CommandInfo(shell="x"))
    master.send("f", Accept(framework_id=framework_id, offer_ids=[offer.id],
                            operations=[Operation(type="LAUNCH", tasks=[task])]))
    usage = ExecutorUsage(framework_id=framework_id, executor_id="t1", task_ids=["t1"],
                          timestamp=5.0, cpus_used=0.25, cpus_limit=1.1,
                          mem_rss_bytes=64 * 2 ** 20, mem_limit_bytes=192 * 2 ** 20)
    assert master.send("a", UsageReport(agent_id=agent_id, executors=[usage],
                                        cached_uris=["http://x/b.tgz", "http://x/a.tgz"])) == []
    (framework,) = master.state.snapshot()["frameworks"]
    (shown,) = framework["tasks"]
    assert shown["resources"]["cpus"] == 1.0 and shown["usage"]["cpus_used"] == 0.25
    assert shown["usage"]["mem_rss_mb"] == 64.0 and shown["usage"]["mem_limit_mb"] == 192.0
    (agent,) = master.state.snapshot()["agents"]
    assert agent["cached_uris"] == ["http://x/a.tgz", "http://x/b.tgz"]
    master.now += 10  # past the accept's default 5 s filter on what was left
    (offer,) = master.allocate()
    assert offer.cached_uris == ["http://x/a.tgz", "http://x/b.tgz"]
    # Only the agent itself may report for itself.
    (refused,) = master.send("x", UsageReport(agent_id=agent_id))
    assert isinstance(refused, Rejected)


def test_a_draining_agent_loses_its_offers_and_gets_no_more() -> None:
    master, agent_id, framework_id, offer = started()
    sent = master.send("a", DrainAgent(agent_id=agent_id))
    assert Rescind(offer_id=offer.id) in sent
    assert master.allocate() == []
    master.now += 100
    assert master.allocate() == []
    assert master.state.snapshot()["agents"][0]["drained"] is True
    assert master.send("a", DrainAgent(agent_id=agent_id)) == []  # said twice: no news
    assert master.state.metrics()["master/agents_drained"] == 1
