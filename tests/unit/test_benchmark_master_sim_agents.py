"""benchmarks.sim_agents: the simulated agents of `benchmarks.master` speak the
real agent protocol to a ROUTER (registration and its resends, pings, status
updates with the manager's retries, batches both ways, duplicate launches), read
what the master sends as the full decoder does, and report on "stop"."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe
from typing import Any

import msgspec
import pytest
import zmq

from benchmarks import sim_agents
from benchmarks.sim_agents import LIGHT, Agents, Timers
from dyad.messages import (
    AgentAck, AgentRegistered, Batch, KillTask, Ping, Pong, RegisterAgent, RunTask,
    StatusUpdate, StatusUpdateAck, StatusUpdateAcks, TaskState, decode, encode, encode_batch)
from dyad.resources import Resources
from dyad.wire_types import Address, MasterInfo
from frameworks import CommandInfo, FrameworkInfo, TaskInfo

INFO = MasterInfo(id="m", hostname="m", ip="127.0.0.1", port=5050, zmq_port=5055,
                  version="0.1.0", address=Address(hostname="m", ip="127.0.0.1", port=5050))
FRAMEWORK = FrameworkInfo(name="fw", id="F-1")
TASK = Resources.parse("cpus:1;mem:1024")


def run_task(task_id: str, agent_id: str = "A-0") -> RunTask:
    return RunTask(framework=FRAMEWORK, task=TaskInfo(
        task_id=task_id, name="t", agent_id=agent_id, resources=TASK,
        command=CommandInfo(shell="true")))


# ------------------------------------------------------------ reading frames


@pytest.mark.parametrize("message", [
    run_task("t1"),
    StatusUpdateAcks(agent_id="A-0", acks=[AgentAck(framework_id="F-1", task_id="t1",
                                                    uuid="u1"),
                                           AgentAck(framework_id="F-1", task_id="t2",
                                                    uuid="u2")]),
    StatusUpdateAck(agent_id="A-0", framework_id="F-1", task_id="t1", uuid="u1"),
    Ping(agent_id="A-0"),
    AgentRegistered(agent_id="A-0", master_info=INFO),
])
def test_the_light_reading_has_what_the_full_decode_has(message: Any) -> None:
    for frame in (encode(message), encode_batch([encode(message), encode(message)])):
        full = decode(frame)
        fulls = full.messages if isinstance(full, Batch) else [full]
        light = LIGHT.decode(frame)
        lights = light.body.messages if light.TYPE == Batch.TYPE else [light]
        assert [one.TYPE for one in lights] == [one.TYPE for one in fulls]
        for one, real in zip(lights, fulls):
            read = msgspec.structs.asdict(one.body)
            if isinstance(real, RunTask):
                assert (one.body.framework.id, one.body.task.task_id) == (
                    real.framework.id, real.task.task_id)
            elif isinstance(real, StatusUpdateAcks):
                assert one.body.agent_id == real.agent_id
                assert [(a.framework_id, a.task_id, a.uuid) for a in one.body.acks] == [
                    (a.framework_id, a.task_id, a.uuid) for a in real.acks]
            else:
                assert read == {k: getattr(real, k) for k in read}


def test_other_frames_are_left_to_the_full_decode() -> None:
    kill = encode(KillTask(framework_id="F-1", task_id="t1"))
    other_version = encode(Ping(agent_id="A-0")).replace(b'"v":1', b'"v":2')
    mixed = encode_batch([encode(Ping(agent_id="A-0")), kill])
    for frame in (kill, other_version, mixed, b"not json"):
        with pytest.raises(msgspec.DecodeError):
            LIGHT.decode(frame)


# ------------------------------------------------------------------ timers


class Owner:
    def __init__(self, timers: Timers) -> None:
        self.armed: dict[Any, int] = {}
        self.timers = timers
        self.fired: list[tuple[Any, float]] = []

    def timer_due(self, key: Any, now: float) -> None:
        self.fired.append((key, now))
        if key == "again":
            self.timers.arm(self, "again2", now + 1)


def test_timers_replace_cancel_and_fire_once_in_order() -> None:
    timers = Timers()
    a, b = Owner(timers), Owner(timers)
    timers.arm(a, "k", 5.0)
    timers.arm(a, "k", 3.0)  # replaces
    timers.arm(b, "k", 4.0)  # another agent's key of the same name
    timers.arm(a, "gone", 1.0)
    a.armed.pop("gone")  # cancelled
    timers.arm(a, "again", 2.0)
    assert timers.next_at() == 1.0
    assert timers.fire_due(3.5) == 2
    assert a.fired == [("again", 3.5), ("k", 3.5)] and b.fired == []
    assert timers.fire_due(10.0) == 2  # b's k, and "again2" armed from inside a fire
    assert b.fired == [("k", 10.0)] and a.fired[-1] == ("again2", 10.0)
    assert timers.fire_due(100.0) == 0 and not a.armed and not b.armed


# ----------------------------------------------------------- on the wire


class Master:
    """A plain ROUTER standing in for the master."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")

    def recv(self, timeout: float = 5.0) -> tuple[bytes, list[Any]]:
        """The next frame: its sender and its messages (a batch's, one by one)."""
        assert self.sock.poll(int(timeout * 1000)), "nothing came"
        identity, frame = self.sock.recv_multipart()
        message = decode(frame)
        return identity, message.messages if isinstance(message, Batch) else [message]

    def recv_after_registration(self) -> tuple[bytes, list[Any]]:
        """`recv`, skipping the registrations resent before the answer came."""
        while True:
            identity, messages = self.recv()
            if not isinstance(messages[0], RegisterAgent):
                return identity, messages

    def send(self, identity: bytes, *messages: Any) -> None:
        frame = encode(messages[0]) if len(messages) == 1 else encode_batch(
            [encode(m) for m in messages])
        self.sock.send_multipart([identity, frame])

    def close(self) -> None:
        self.sock.close()
        self.context.term()


def test_agents_register_launch_retry_and_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_agents, "REGISTER_BACKOFF", 0.05)
    settled: list[bool] = []
    monkeypatch.setattr(sim_agents.gc_pauses, "settle", lambda: settled.append(True))
    master = Master()
    agents = Agents([f"tcp://127.0.0.1:{master.port}"], ["sim0", "sim1"], backoff=0.2,
                    period=0.001)
    ours, theirs = Pipe()
    worker = threading.Thread(target=agents.serve, args=(theirs,), daemon=True)
    worker.start()
    try:
        # Registration, resent until answered.
        registrations: dict[bytes, int] = {}
        while len(registrations) < 2 or min(registrations.values()) < 2:
            identity, [message] = master.recv()
            assert isinstance(message, RegisterAgent)
            registrations[identity] = registrations.get(identity, 0) + 1
        first, second = sorted(registrations)
        for n, identity in enumerate((first, second)):
            master.send(identity, AgentRegistered(agent_id=f"A-{n}", master_info=INFO))
        assert ours.poll(5) and ours.recv() == "registered"

        # Two tasks and a duplicate of one in a batch: two updates in one frame back.
        master.send(first, run_task("t1"), run_task("t2"), run_task("t1"))
        identity, updates = master.recv_after_registration()
        assert identity == first
        assert [(u.status.task_id, u.status.state) for u in updates] == [
            ("t1", TaskState.TASK_RUNNING), ("t2", TaskState.TASK_RUNNING)]
        assert all(isinstance(u, StatusUpdate) and u.framework_id == "F-1"
                   and u.status.agent_id == "A-0" for u in updates)
        uuids = [u.status.uuid for u in updates]
        assert len(set(uuids)) == 2 and all(len(u) == 36 for u in uuids)

        # Not acknowledged: the manager's retry timer resends the same updates.
        resent: set[str] = set()
        while resent != set(uuids):  # each stream's own timer (jitter apart)
            _, again = master.recv_after_registration()
            resent |= {u.status.uuid for u in again}
            assert resent <= set(uuids)

        # Acknowledged together, then alone: TASK_FINISHED each, then nothing.
        master.send(first, StatusUpdateAcks(agent_id="A-0", acks=[
            AgentAck(framework_id="F-1", task_id=u.status.task_id, uuid=u.status.uuid)
            for u in updates]))
        finished: list[StatusUpdate] = []
        while len(finished) < 2:
            _, more = master.recv_after_registration()
            finished += [u for u in more if u.status.state == TaskState.TASK_FINISHED]
        for update in finished:
            master.send(first, StatusUpdateAck(
                agent_id="A-0", framework_id="F-1", task_id=update.status.task_id,
                uuid=update.status.uuid))

        master.send(second, Ping(agent_id="A-1"))
        while True:
            identity, [message] = master.recv_after_registration()
            if isinstance(message, Pong):
                break
        assert identity == second and message.agent_id == "A-1"

        deadline = time.monotonic() + 5
        while any(a.updates._streams for a in agents.agents):  # the acks are in
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ours.send("stop")
        assert ours.poll(5)
        report = ours.recv()
    finally:
        worker.join(5)
        agents.close()
        master.close()
    assert not worker.is_alive() and settled == [True]  # (frozen, in a worker process)
    assert report["launches"] == 3 and report["duplicates"] == 1
    assert report["retried"] >= 2 and report["bad_frames"] == 0
    assert report["received"]["run_task"] == 3 and report["received"]["ping"] == 1
    assert report["received"]["status_update_acks"] == 1
    assert report["received"]["status_update_ack"] == 2
    assert report["sent"]["pong"] == 1 and report["sent"]["status_update"] >= 6


def test_full_decode_and_single_frames_say_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without batches (each message its own frame) and with every frame decoded
    in full, the agent says the same."""
    monkeypatch.setattr(sim_agents, "REGISTER_BACKOFF", 0.05)
    master = Master()
    agents = Agents([f"tcp://127.0.0.1:{master.port}"], ["sim0"],
                    capabilities=(sim_agents.LIVENESS_CAPABILITY,), full_decode=True,
                    period=0.0)
    [agent] = agents.agents
    agents.start()
    try:
        identity, [message] = master.recv()
        assert isinstance(message, RegisterAgent) and message.capabilities == [
            sim_agents.LIVENESS_CAPABILITY]
        master.send(identity, AgentRegistered(agent_id="A-0", master_info=INFO))
        while agent.agent_id is None:
            agents.step(0.01)
        master.send(identity, run_task("t1"), run_task("t2"))
        got: list[Any] = []
        deadline = time.monotonic() + 5
        while len(got) < 2:
            agents.step(0.01)
            while master.sock.poll(0):
                got.append(master.recv()[1])
            assert time.monotonic() < deadline
        assert [len(frame) for frame in got] == [1, 1]  # a frame a message
        assert [frame[0].status.task_id for frame in got] == ["t1", "t2"]
    finally:
        agents.close()
        master.close()
