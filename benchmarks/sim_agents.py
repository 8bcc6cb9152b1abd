"""Simulated agents for `benchmarks.master`: thousands a process, cheap a task.

Each `SimAgent` speaks the real agent protocol on its own DEALER socket (the
master sees one peer an agent): it registers (`RegisterAgent`, resent with a
backoff until `AgentRegistered`), answers pings, and for every `RunTask` queues
TASK_RUNNING then TASK_FINISHED on the real status-update manager
(`agent.status_updates`, its retry schedule and all). What one frame from the
master makes it say goes out as one frame (a `Batch` when it is more than one).

What is simulated is the shell around that, written once for a whole process
(`Agents`), as a simulator of many agents would, and not as 5,000 copies of the
agent's own shell (a coroutine, a future and an asyncio socket each, a
`TimerTable` each: issue 19 measured that at 0.21 ms of CPU a task, about
two thirds of what the master itself took):

- one `select.epoll` holds every agent's ZMQ descriptor and the control pipe,
  and one loop (no asyncio) drains each ready socket with non-blocking receives
  until it is empty, polling at most every `PERIOD` (3 ms);
- one heap holds every agent's timers (`Timers`), the manager's retries and the
  registration's backoff, looked at after each poll;
- an agent takes the time once a poll and its uuids from a counter behind a
  random prefix of its own (the form of `uuid4`'s, unique all the same);
- a frame is read for the fields the agent uses (`LIGHT`: one msgspec call
  for the frame, batch and all, against the wire's names and version), not
  built into the full message with every check the real agent makes; a frame
  that does not fit (another message type, another version) is decoded by
  `dyad.messages.decode`, as is every frame with `full_decode`.

ZeroMQ's descriptor says only that the socket's state *may* have changed, and
any call on the socket can take that signal. A receive that finds nothing, or
a look at `EVENTS` that finds nothing to read, has taken every signal up to
then, and a later message signals again; so an agent is drained until one of
them finds nothing after its last send, and after a send made outside a drain
(a retry, a registration) it is drained at once, in case that send took the
signal of a message waiting.
"""

from __future__ import annotations

import heapq
import itertools
import resource
import select
import time
import uuid
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any, Hashable, Literal, Union

import msgspec
import zmq

from agent.status_updates import SendMaster, StatusUpdateManager
from dyad import gc_pauses
from dyad.effects import ArmTimer, CancelTimer
from dyad.messages import (
    ACK_BATCH_CAPABILITY, BATCH_CAPABILITY, LIVENESS_CAPABILITY, MAX_FRAME_BYTES, AgentInfo,
    WIRE_VERSION, AgentRegistered, Batch, ExecutorExited, MessageError, Ping, Pong,
    RegisterAgent, RunTask, Source, StatusUpdate, StatusUpdateAck, StatusUpdateAcks, TaskState,
    TaskStatus, decode, encode, encode_batch)
from dyad.resources import Resources

AGENT_RESOURCES = Resources.parse("cpus:4;mem:4096;disk:10000")
CAPABILITIES = (BATCH_CAPABILITY, LIVENESS_CAPABILITY, ACK_BATCH_CAPABILITY)
REGISTER_BACKOFF = 1.0  # seconds before the first RegisterAgent is resent; doubles
REGISTER_BACKOFF_MOST = 30.0
PERIOD = 0.003
"""Seconds between the starts of two polls, at least: a busy loop drains what
came in 3 ms at once, not a socket or two a wake-up (issue 19: agents' CPU a
task 0.10-0.14 ms without, 0.07-0.10 with; 6 ms did no better)."""
POLL_MOST = 0.1  # seconds the loop sleeps at most (a timer is that late at most)

# As `dyad.transport`: the Cython calls themselves, without pyzmq's layers.
_raw_recv = zmq.backend.Socket.recv
_raw_send = zmq.backend.Socket.send
_raw_get = zmq.backend.Socket.get
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_HARD_FRAME_LIMIT = 4 * MAX_FRAME_BYTES  # as dyad.transport's Dealer

_REGISTER = "register"  # the timer key of an agent's registration backoff
_RUN_TASK, _ACKS, _ACK = RunTask.TYPE, StatusUpdateAcks.TYPE, StatusUpdateAck.TYPE
_PING, _REGISTERED = Ping.TYPE, AgentRegistered.TYPE


# ------------------------------------------------- what the agent reads of a frame
# The wire's own names (dyad.messages); fields not named here are skipped.

Version = Literal[WIRE_VERSION]  # type: ignore[valid-type]


class _AgentId(msgspec.Struct):
    agent_id: str


class _FrameworkId(msgspec.Struct):
    id: str | None = None


class _TaskId(msgspec.Struct):
    task_id: str


class _RunTask(msgspec.Struct):
    framework: _FrameworkId
    task: _TaskId


class _Ack(msgspec.Struct):  # AgentAck, and StatusUpdateAck but for its agent id
    framework_id: str
    task_id: str
    uuid: str


class _Acks(msgspec.Struct):
    agent_id: str
    acks: list[_Ack]


def _frame(message: type, body: type) -> Any:
    """The struct of a frame holding one `message`, read as `body`."""
    return msgspec.defstruct(f"Light{message.__name__}", [("v", Version), ("body", body)],
                             tag_field="type", tag=message.TYPE,
                             namespace={"TYPE": message.TYPE})


_One = Union[_frame(RunTask, _RunTask), _frame(StatusUpdateAcks, _Acks),  # type: ignore
             _frame(StatusUpdateAck, _Ack), _frame(Ping, _AgentId),
             _frame(AgentRegistered, _AgentId)]


class _Messages(msgspec.Struct):
    messages: list[_One]  # type: ignore[valid-type]


_BatchFrame = _frame(Batch, _Messages)
LIGHT = msgspec.json.Decoder(Union[_BatchFrame, _One])  # type: ignore[arg-type]
"""Reads a frame the master sends an agent for what `SimAgent` uses; raises
`msgspec.ValidationError` for any other frame."""


class Timers:
    """Every agent's timers in one heap: arming a key that is armed replaces it,
    cancelling one that is not is a no-op, and a key is forgotten before it
    fires (so it may be armed again from inside), as `dyad.timers.TimerTable`
    does. A cancelled timer stays in the heap until its time, then is skipped."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, SimAgent, Hashable]] = []
        self._tokens = itertools.count()

    def arm(self, agent: SimAgent, key: Hashable, at: float) -> None:
        token = agent.armed[key] = next(self._tokens)
        heapq.heappush(self._heap, (at, token, agent, key))

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def fire_due(self, now: float) -> int:
        """Fire every timer due by `now`; how many fired."""
        heap, fired = self._heap, 0
        while heap and heap[0][0] <= now:
            _, token, agent, key = heapq.heappop(heap)
            if agent.armed.get(key) == token:
                del agent.armed[key]
                fired += 1
                agent.timer_due(key, now)
        return fired

    def __len__(self) -> int:
        return len(self._heap)


class SimAgent:
    """A stand-in agent: the real wire protocol and status-update manager, no
    processes, no loop of its own (`Agents` drives it). Unless told otherwise it
    takes `Batch` frames and sends what one frame makes it say as one frame,
    and it declares `LIVENESS_CAPABILITY`, as the real agent does: the master
    then skips the pings of agents it is busy talking to. (It never gives up on
    the master, so it keeps no silence timer.)"""

    def __init__(self, name: str, endpoint: str, context: zmq.Context, timers: Timers,
                 capabilities: tuple[str, ...] = CAPABILITIES,
                 executor_exits: bool = False, backoff: float = 10.0,
                 full_decode: bool = False) -> None:
        self.full_decode = full_decode
        sock = self.sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, _HARD_FRAME_LIMIT)
        sock.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())  # as a Dealer's
        sock.connect(endpoint)
        self.fd: int = sock.get(zmq.FD)
        self.timers = timers
        self.armed: dict[Hashable, int] = {}  # key -> token of its entry in `timers`
        self.info = AgentInfo(hostname=name, port=5051, ip="127.0.0.1",
                              resources=AGENT_RESOURCES)
        self.capabilities = list(capabilities)
        self.batches = BATCH_CAPABILITY in capabilities
        self.agent_id: str | None = None
        self.updates = StatusUpdateManager(backoff=backoff, seed=name)
        self.runs: Counter[str] = Counter()
        self.send_failures = 0
        self.bad_frames = 0  # frames that were not one decodable message
        self.executor_exits = executor_exits
        self.received: Counter[str] = Counter()  # messages by wire type, batches opened
        self.sent: Counter[str] = Counter()
        self._outbox: list[bytes] = []
        self._register_backoff = REGISTER_BACKOFF
        # uuid4's form; the last 12 hex digits count (2**48 updates an agent).
        self._uuid_prefix = str(uuid.uuid4())[:24]
        self._uuids = itertools.count()

    # ------------------------------------------------------------ driven by Agents

    def register(self, now: float) -> None:
        """Send RegisterAgent, and again with a backoff until registered."""
        self._send(RegisterAgent(agent=self.info, capabilities=self.capabilities))
        self._flush()
        self.timers.arm(self, _REGISTER, now + self._register_backoff)
        self._register_backoff = min(self._register_backoff * 2, REGISTER_BACKOFF_MOST)
        self.drain(now, time.time())  # our send may have taken a receive's signal

    def timer_due(self, key: Hashable, now: float) -> None:
        if key == _REGISTER:
            if self.agent_id is None:
                self.register(now)
            return
        self._apply(self.updates.timer_fired(key, now))  # type: ignore[arg-type]
        self._flush()
        self.drain(now, time.time())

    def drain(self, now: float, wall: float) -> None:
        """Take every frame waiting, handling each as it comes, until the socket
        holds no more: a receive that finds nothing, or `EVENTS` looked at after
        our last send, leaves the descriptor to signal anew."""
        sock = self.sock
        while True:
            try:
                frame = _raw_recv(sock, _NOBLOCK)
            except zmq.Again:
                return
            self._handle(frame, now, wall)
            if not _raw_get(sock, _EVENTS) & _POLLIN:  # cheaper than a receive's Again
                return

    def _handle(self, frame: bytes, now: float, wall: float) -> None:
        """One frame from the master, and what it makes us say as one frame."""
        if _raw_get(self.sock, _RCVMORE):  # not one frame: the rest of it, then skip it
            while _raw_get(self.sock, _RCVMORE):
                _raw_recv(self.sock, _NOBLOCK)
            self.bad_frames += 1
            return
        if not self.full_decode:
            try:
                light = LIGHT.decode(frame)
            except msgspec.DecodeError:  # another type or version: as the agent reads it
                pass
            else:
                if isinstance(light, _BatchFrame):
                    for one in light.body.messages:
                        self._on(one.TYPE, one.body, now, wall)
                else:
                    self._on(light.TYPE, light.body, now, wall)
                self._flush()
                return
        try:
            message = decode(frame)
        except MessageError:
            self.bad_frames += 1
            return
        for one in message.messages if isinstance(message, Batch) else [message]:
            self._on(one.TYPE, one, now, wall)
        self._flush()

    # ---------------------------------------------------------------- the agent

    def _on(self, type_name: str, message: Any, now: float, wall: float) -> None:
        """`message`: the message of wire type `type_name`, or what `LIGHT` read
        of its body (the same names)."""
        self.received[type_name] += 1
        if type_name == _RUN_TASK:
            self._run(message, now, wall)
        elif type_name == _ACKS:  # as the real agent: one by one
            for ack in message.acks:
                self._on_ack(ack, now)
        elif type_name == _ACK:
            self._on_ack(message, now)
        elif type_name == _PING:
            self._send(Pong(agent_id=message.agent_id))
        elif type_name == _REGISTERED and self.agent_id is None:
            self.agent_id = message.agent_id
            self.armed.pop(_REGISTER, None)
            self._apply(self.updates.resume(now))

    def _on_ack(self, ack: Any, now: float) -> None:
        """`ack`: a StatusUpdateAck, an AgentAck, or `LIGHT`'s reading of one."""
        self._apply(self.updates.acknowledge(ack.framework_id, ack.task_id, ack.uuid, now))
        if self.executor_exits and not self.updates.has_stream(ack.framework_id, ack.task_id):
            # As the agent did before it kept a command task's executor to itself:
            # the terminal update is acknowledged, the executor is gone.
            assert self.agent_id is not None
            self._send(ExecutorExited(
                agent_id=self.agent_id, framework_id=ack.framework_id,
                executor_id=ack.task_id, status=0))

    def _run(self, message: Any, now: float, wall: float) -> None:
        """`message`: a RunTask, or `LIGHT`'s reading of one."""
        task, framework_id = message.task, message.framework.id
        assert framework_id is not None and self.agent_id is not None
        task_id = task.task_id
        runs = self.runs[task_id] = self.runs.get(task_id, 0) + 1
        if runs > 1:
            return
        for state in (TaskState.TASK_RUNNING, TaskState.TASK_FINISHED):
            status = TaskStatus(task_id=task_id, state=state, source=Source.EXECUTOR,
                                agent_id=self.agent_id, executor_id=task_id,
                                uuid=self.new_uuid(), timestamp=wall)
            self._apply(self.updates.add(
                StatusUpdate(framework_id=framework_id, status=status), now))

    def new_uuid(self) -> str:
        return f"{self._uuid_prefix}{next(self._uuids):012x}"

    def _apply(self, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, SendMaster):
                self._send(effect.message)
            elif isinstance(effect, ArmTimer):
                self.timers.arm(self, effect.key, effect.at)
            elif isinstance(effect, CancelTimer):
                self.armed.pop(effect.key, None)

    def _send(self, message: Any) -> None:
        self.sent[message.TYPE] += 1
        self._outbox.append(encode(message))
        if not self.batches:
            self._flush()

    def _flush(self) -> None:
        """Send what waits: one frame, a batch when there is more than one."""
        frames = self._outbox
        if not frames:
            return
        self._outbox = []
        try:
            _raw_send(self.sock, frames[0] if len(frames) == 1 else encode_batch(frames),
                      _NOBLOCK)
        except zmq.Again:
            self.send_failures += 1  # like a frame lost on the network: retries cover it


class Agents:
    """The simulated agents of one process and the loop that drives them all."""

    def __init__(self, endpoints: list[str], names: list[str],
                 capabilities: tuple[str, ...] = CAPABILITIES,
                 executor_exits: bool = False, backoff: float = 10.0,
                 full_decode: bool = False, period: float = PERIOD) -> None:
        self.context = zmq.Context()
        self.context.set(zmq.MAX_SOCKETS, len(names) + 100)
        self.timers = Timers()
        self.agents = [SimAgent(name, endpoints[i % len(endpoints)], self.context,
                                self.timers, capabilities, executor_exits, backoff,
                                full_decode)
                       for i, name in enumerate(names)]
        self._by_fd = {agent.fd: agent for agent in self.agents}
        self._poll = select.epoll()
        for fd in self._by_fd:
            self._poll.register(fd, select.EPOLLIN)
        self.period = period
        self._last = 0.0  # when the last poll returned

    def registered(self) -> bool:
        return all(agent.agent_id is not None for agent in self.agents)

    def step(self, most: float = POLL_MOST) -> list[int]:
        """Wait up to `most` seconds (less if a timer is due sooner) for a
        descriptor, but not before `period` has passed since the last poll,
        drain the agents whose sockets signalled, fire the timers due; the
        other descriptors that were ready (the control pipe's)."""
        now = time.monotonic()
        if now < self._last + self.period:
            time.sleep(self._last + self.period - now)
            now = time.monotonic()
        due = self.timers.next_at()
        timeout = most if due is None else max(0.0, min(most, due - now))
        others = []
        ready = self._poll.poll(timeout)
        self._last = time.monotonic()
        if ready:
            now, wall, by_fd = time.monotonic(), time.time(), self._by_fd
            for fd, _ in ready:
                agent = by_fd.get(fd)
                if agent is None:
                    others.append(fd)
                else:
                    agent.drain(now, wall)
        self.timers.fire_due(time.monotonic())
        return others

    def start(self) -> None:
        now = time.monotonic()
        for agent in self.agents:
            agent.register(now)

    def serve(self, conn: Connection) -> None:
        """Register every agent, say "registered" on `conn` once all are, then
        serve until "stop" comes, answered with the report."""
        self._poll.register(conn.fileno(), select.EPOLLIN)
        self.start()
        while not self.registered():
            if self.step():
                conn.recv()  # nothing is said before "registered"
        gc_pauses.settle()  # the agents are built: as the real agent does once it is up
        for agent in self.agents:  # count the flood's messages, not the registrations'
            agent.received.clear()
            agent.sent.clear()
        conn.send("registered")
        while True:
            if self.step() and conn.poll() and conn.recv() == "stop":
                break
        conn.send(self.report())

    def report(self) -> dict[str, Any]:
        agents = self.agents
        return {
            "received": sum((a.received for a in agents), Counter()),
            "sent": sum((a.sent for a in agents), Counter()),
            "launches": sum(sum(a.runs.values()) for a in agents),
            "duplicates": sum(n - 1 for a in agents for n in a.runs.values() if n > 1),
            "retried": sum(a.updates.retried for a in agents),
            "send_failures": sum(a.send_failures for a in agents),
            "bad_frames": sum(a.bad_frames for a in agents),
        }

    def close(self) -> None:
        self._poll.close()
        for agent in self.agents:
            agent.sock.close(linger=0)
        self.context.term()


def agent_worker(endpoint: str | list[str], names: list[str], conn: Connection,
                 capabilities: tuple[str, ...], executor_exits: bool,
                 full_decode: bool = False) -> None:
    """A process of simulated agents; says when all are registered, reports on "stop"."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    gc_pauses.install()  # as the master does: 5,000 agents are a large heap too
    endpoints = [endpoint] if isinstance(endpoint, str) else endpoint  # link shards: many
    agents = Agents(endpoints, names, capabilities, executor_exits, full_decode=full_decode)
    try:
        agents.serve(conn)
    finally:
        agents.close()
