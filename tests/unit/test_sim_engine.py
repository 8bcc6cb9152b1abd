"""The simulator's engine: ordering, timers, the wire."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from dyad.messages import Message, Ping, Pong
from sim.engine import Engine, SimulationError


class Log:
    def __init__(self, engine: Engine, name: str, seen: list[tuple[float, str, object]]) -> None:
        self.name = name
        self.seen = seen
        engine.add_node(name, self)

    def deliver(self, sender: str, message: Message, now: float) -> None:
        self.seen.append((now, self.name, message))

    def fire(self, key: Hashable, now: float) -> None:
        self.seen.append((now, self.name, key))


def test_same_instant_runs_in_scheduling_order() -> None:
    engine = Engine()
    seen: list[tuple[float, str, object]] = []
    node = Log(engine, "a", seen)
    engine.arm("a", "t2", 5.0)
    engine.call_at(5.0, lambda now: seen.append((now, "call", None)))
    engine.arm("a", "t1", 5.0)
    engine.run(10.0)
    assert [entry[2] for entry in seen] == ["t2", None, "t1"]
    assert node.seen is seen


def test_rearming_replaces_and_cancelling_an_unarmed_key_is_a_no_op() -> None:
    engine = Engine()
    seen: list[tuple[float, str, object]] = []
    Log(engine, "a", seen)
    engine.arm("a", "k", 1.0)
    engine.arm("a", "k", 3.0)
    engine.cancel("a", "other")
    engine.arm("a", "gone", 2.0)
    engine.cancel("a", "gone")
    engine.run(10.0)
    assert seen == [(3.0, "a", "k")]
    assert not engine.armed("a", "k")


def test_wire_latency_codec_and_unknown_peers() -> None:
    engine = Engine(latency=0.5, codec=True)
    seen: list[tuple[float, str, object]] = []
    Log(engine, "b", seen)
    engine.send("a", "b", Ping(agent_id="S1"))
    engine.send("a", "nobody", Ping(agent_id="S1"))
    assert engine.run(10.0) == 10.0
    assert seen == [(0.5, "b", Ping(agent_id="S1"))]
    assert engine.counters["messages_dropped"] == 1
    assert engine.counters["wire_bytes"] > 0


def test_a_ping_to_an_echo_is_one_heap_entry_and_its_pong_arrives_a_round_trip_later() -> None:
    engine = Engine(latency=0.5)
    seen: list[tuple[float, str, object]] = []
    Log(engine, "master", seen)
    Log(engine, "agent", seen)
    registered: list[str] = []
    engine.add_echo("agent", lambda ping: Pong(agent_id=registered[0]) if registered else None)
    engine.send("master", "agent", Ping(agent_id="S1"))  # not registered: sent as usual
    registered.append("S1")
    engine.send("master", "agent", Ping(agent_id="S1"))
    engine.run(10.0)
    assert seen == [(0.5, "agent", Ping(agent_id="S1")), (1.0, "master", Pong(agent_id="S1"))]
    assert engine.counters["steps"] == 2 and engine.counters["messages"] == 3


def test_run_stops_at_until_and_resumes() -> None:
    engine = Engine()
    seen: list[tuple[float, str, object]] = []
    Log(engine, "a", seen)
    engine.arm("a", "late", 20.0)
    assert engine.run(10.0) == 10.0
    assert seen == []
    engine.run(30.0)
    assert seen == [(20.0, "a", "late")]


def test_node_names_are_unique() -> None:
    engine = Engine()
    Log(engine, "a", [])
    with pytest.raises(SimulationError):
        Log(engine, "a", [])


def test_far_timers_keep_the_order_of_one_heap() -> None:
    """Timers armed far ahead wait in buckets; they still fire in (time, arming
    order) among messages and near timers, re-armed and cancelled ones never."""
    from sim.engine import BUCKET
    engine = Engine(latency=0.25)
    seen: list[tuple[float, str, object]] = []
    Log(engine, "a", seen)
    Log(engine, "b", seen)
    engine.arm("a", "far", 3 * BUCKET)
    engine.arm("a", "tie-near", 3 * BUCKET)  # armed later: fires after "far"
    engine.arm("a", "gone", 5 * BUCKET)
    engine.cancel("a", "gone")
    engine.arm("a", "moved", 9 * BUCKET)
    engine.arm("a", "moved", 2.5 * BUCKET)  # re-armed earlier, into another bucket
    engine.arm("a", "never", 100 * BUCKET)

    def later(now: float) -> None:
        engine.arm("b", "from-a-step", 3 * BUCKET)  # the same instant, armed last
        engine.send("a", "b", Ping(agent_id="S1"))

    engine.call_at(2.5 * BUCKET - 0.25, later)
    assert engine.run(50 * BUCKET) == 50 * BUCKET
    assert [(t, what) for t, _, what in seen] == [
        (2.5 * BUCKET, "moved"), (2.5 * BUCKET, Ping(agent_id="S1")),
        (3 * BUCKET, "far"), (3 * BUCKET, "tie-near"), (3 * BUCKET, "from-a-step")]
    assert engine.armed("a", "never") and not engine.idle()
    engine.cancel("a", "never")
    engine.run(200 * BUCKET)
    assert engine.idle()
