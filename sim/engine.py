"""The simulator's engine: one virtual clock, one event heap, timers and a wire.

Everything that happens in a simulation is an entry on one heap ordered by
``(time, sequence)``. The sequence number is taken when the entry is pushed, so
two things due at the same instant happen in the order they were scheduled:
with the same inputs and seed every run takes the same steps, and nothing ever
reads a wall clock, a hash order or a thread.

Nodes are the simulated processes (the master, each agent, each framework
driver). A node gets `deliver(sender, message, now)` for a wire message and
`fire(key, now)` for one of its timers. Timers follow `dyad.timers.TimerTable`'s
contract: arming an armed key replaces it, cancelling an unarmed key is a
no-op, a key fires once and is forgotten before `fire` runs. Keys are opaque:
the engine stores them and hands them back.

The wire delivers a message `latency` seconds after it is sent, in send order.
With `codec=True` every message is encoded and decoded on the way, as a real
socket would, so a message that does not survive the codec fails the run where
it was sent. A message to an unknown peer is dropped and counted (a ZMQ ROUTER
drops what it cannot route).

Pings take one heap entry per round trip instead of two. A node may register an
*echo* for `Ping` (`add_echo`: the simulated agent's, which answers a ping with a
`Pong` and nothing else, whatever the time, once registered): a ping to it is
answered when sent, and only the answer goes on the heap, due `2 x latency`
later, as it would arrive. The master's liveness code runs unchanged; what
changes is the Pong's place among other events due at the very same instant
(it comes before messages sent at the instant the ping arrived), and a Pong
touches nothing but its agent's liveness. An echo that has no answer (an agent
not registered yet) sends the ping the ordinary way.

Far timers wait in buckets, not on the heap. Most timers a master arms are
cancelled or re-armed long before they are due (an offer's 30 s timeout ends
when the offer is declined a millisecond later), so a timer due more than
`BUCKET` seconds ahead goes into the bucket of its `BUCKET`-wide slice of time
and onto the heap only when the clock reaches that slice, if it is still armed
by then. Its sequence number is taken when it is armed, so the order of
everything is the same as with one heap; what is saved is a push and a pop
per timer that dies early.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Protocol

from dyad.messages import Message, Ping, decode, encode

_MESSAGE = 0
_TIMER = 1
_CALL = 2

BUCKET = 4.0
"""Seconds of simulated time per bucket of far timers (module docstring)."""


class Node(Protocol):
    def deliver(self, sender: str, message: Message, now: float) -> None: ...

    def fire(self, key: Hashable, now: float) -> None: ...


class SimulationError(RuntimeError):
    """The simulation cannot go on (a bug in a core or in the simulator)."""


class Engine:
    """Virtual time and the event heap; see the module docstring."""

    def __init__(self, *, latency: float = 0.0, codec: bool = False) -> None:
        if latency < 0:
            raise ValueError("latency must not be negative")
        self.now = 0.0
        self.latency = latency
        self.codec = codec
        self.counters: Counter[str] = Counter()
        self._heap: list[tuple[float, int, int, str, object]] = []
        self._seq = 0
        self._nodes: dict[str, Node] = {}
        self._armed: dict[tuple[str, Hashable], int] = {}
        # Far timers: bucket number -> entries, and a heap of the bucket numbers.
        self._buckets: dict[int, list[tuple[float, int, int, str, object]]] = {}
        self._bucket_order: list[int] = []
        self._echoes: dict[str, Callable[[Message], Message | None]] = {}
        self._stopped = False

    # ------------------------------------------------------------------ nodes

    def add_node(self, name: str, node: Node) -> None:
        if name in self._nodes:
            raise SimulationError(f"two nodes are called {name!r}")
        self._nodes[name] = node

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def add_echo(self, name: str, answer: Callable[[Message], Message | None]) -> None:
        """`answer(ping)` is what node `name` replies to a `Ping` (module docstring)."""
        self._echoes[name] = answer

    # ------------------------------------------------------------------- wire

    def send(self, sender: str, to: str, message: Message) -> None:
        message = self._wire(message)
        if type(message) is Ping and to in self._echoes:
            answer = self._echoes[to](message)
            if answer is not None:
                self._push(self.now + 2 * self.latency, _MESSAGE, sender,
                           (to, self._wire(answer)))
                return
        self._push(self.now + self.latency, _MESSAGE, to, (sender, message))

    def _wire(self, message: Message) -> Message:
        if self.codec:
            frame = encode(message)
            self.counters["wire_bytes"] += len(frame)
            message = decode(frame)
        self.counters["messages"] += 1
        return message

    # ----------------------------------------------------------------- timers

    def arm(self, owner: str, key: Hashable, at: float) -> None:
        at = max(at, self.now)
        if at - self.now < BUCKET or at == math.inf:
            seq = self._push(at, _TIMER, owner, key)
        else:  # its bucket starts after now: see `run`
            bucket = int(at // BUCKET)
            self._seq += 1
            seq = self._seq
            entries = self._buckets.get(bucket)
            if entries is None:
                entries = self._buckets[bucket] = []
                heapq.heappush(self._bucket_order, bucket)
            entries.append((at, seq, _TIMER, owner, key))
        self._armed[(owner, key)] = seq

    def cancel(self, owner: str, key: Hashable) -> None:
        self._armed.pop((owner, key), None)

    def armed(self, owner: str, key: Hashable) -> bool:
        return (owner, key) in self._armed

    # ------------------------------------------------------------------ calls

    def call_at(self, at: float, call: Callable[[float], None]) -> None:
        """Run `call(now)` at `at` (the workload's arrivals, the report's samples)."""
        self._push(max(at, self.now), _CALL, "", call)

    def stop(self) -> None:
        """End `run` after the current step."""
        self._stopped = True

    # -------------------------------------------------------------------- run

    def run(self, until: float, on_step: Callable[[float], None] | None = None,
            step_every: int = 10_000) -> float:
        """Process entries due at or before `until`; return the time reached.
        `on_step(now)` is called every `step_every` entries (a progress bar)."""
        heap = self._heap
        armed = self._armed
        nodes = self._nodes
        order = self._bucket_order
        steps = timers = 0
        self._stopped = False
        # Everything due before `next_bucket` (the start of the first bucket not
        # yet moved to the heap) is on the heap.
        next_bucket = order[0] * BUCKET if order else math.inf
        while not self._stopped:
            if heap:
                at, seq, kind, target, payload = heap[0]
                if at >= next_bucket:
                    next_bucket = self._unbucket()
                    continue
            elif next_bucket != math.inf:
                next_bucket = self._unbucket()
                continue
            else:
                break
            if at > until:
                break
            heapq.heappop(heap)
            self.now = at
            if kind == _TIMER:
                timer = (target, payload)
                armed_seq = armed.pop(timer, None)  # one lookup for the common case
                if armed_seq != seq:
                    if armed_seq is not None:
                        armed[timer] = armed_seq  # re-armed since: that one stays
                    continue  # cancelled or re-armed since
                timers += 1
                nodes[target].fire(payload, at)  # type: ignore[arg-type]
            elif kind == _MESSAGE:
                node = nodes.get(target)
                if node is None:
                    self.counters["messages_dropped"] += 1
                    continue
                sender, message = payload  # type: ignore[misc]
                node.deliver(sender, message, at)
            else:
                payload(at)  # type: ignore[operator]
            if order and order[0] * BUCKET < next_bucket:
                next_bucket = order[0] * BUCKET  # a step armed a timer in an earlier bucket
            steps += 1
            if on_step is not None and steps % step_every == 0:
                on_step(at)
        self.counters["steps"] += steps
        if timers:
            self.counters["timers"] += timers
        if not self._stopped and until != math.inf:
            self.now = max(self.now, until)  # nothing left to do before `until`
        return self.now

    def _unbucket(self) -> float:
        """Move the first bucket's timers that are still armed to the heap; return
        the start of the next bucket."""
        order, armed, heap = self._bucket_order, self._armed, self._heap
        entries = self._buckets.pop(heapq.heappop(order))
        for entry in entries:
            if armed.get((entry[3], entry[4])) == entry[1]:
                heapq.heappush(heap, entry)
        return order[0] * BUCKET if order else math.inf

    def idle(self) -> bool:
        return not self._heap and not self._bucket_order

    def _push(self, at: float, kind: int, target: str, payload: object) -> int:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, target, payload))
        return self._seq
