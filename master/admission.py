"""Admission: how much launching the master lets frameworks start at once
(issue 19).

A framework that launches everything it is offered turns one allocation pass
over 10,000 idle agents into 40,000 launches at once. The master then carries
them at its own pace -- each launch is a `RunTask`, two status updates and two
acknowledgements through its one queue -- and a task accepted last waits for all
the others: measured, p99 accept -> TASK_RUNNING of 16-48 s, and tens of
thousands of agents' resends that the wait provokes. Accepting is where the
clock starts, so the bound belongs before it: offers a pass makes wait here,
and go out only while what is *in flight* stays under what is `allowed`.

In flight, in tasks: every task launched and not yet heard of from its agent
(`launched` .. `started`), plus for every offer sent and not yet answered the
tasks it is expected to become -- the framework's running mean of tasks per
accepted offer, or before its first accept the offer's whole cpus. Offers go out
while in flight is under `allowed`, and once they wait, again only when it has
fallen to three quarters of it: in batches, not one Offers frame per freed slot.

How much is allowed is learnt, much as TCP learns its window: each launch's
time from `launched` to `started` is a sample, judged a round at a time (a
round: as many samples as are allowed). A round whose median launch is late --
later than `target`, or, when even the round's fastest launch missed that, than
1.5 times the last round's fastest -- cuts `allowed` by a quarter, and launches
made before a cut are not samples (they cannot speak for the smaller window). A
round in time, while offers wait for room, grows it -- doubling until the first
cut, then by an eighth -- between `LEAST` and `limit`. So the master lets out
what it carries at its speed today (a shared machine's is not yesterday's), and
the latency of a flood is about `target`, not the flood's length. The tail is
not steered: on a shared machine it is processes descheduled for a moment,
which no window cuts, and steering by it cut a loaded run to half its
throughput (measured: 10 frameworks, 223 tasks/s, main 479).

Nothing waits for ever on a peer that is slow or silent: a launch counts for at
most `launch_seconds` (a container image being pulled is not a flood), an offer
for at most `offer_seconds` (a framework sitting on its offers holds no
launches up), so one framework cannot stall the others' offers. Waiting offers
are let out in the order of the pass that made them (frameworks taking turns,
as the allocator ordered them within each); their offer timeout starts when
they go out, and one rescinded while it waits is never announced. `limit` 0
turns admission off: every offer goes out at once.

Pure: the core tells it what happened, with the time, and asks what may go.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable

from dyad.messages import Offer

DEFAULT_LIMIT = 1024
"""Most tasks in flight, whatever the pace (`limit`)."""
INITIAL = 64
"""Tasks in flight allowed at first: the pace is learnt from there."""
LEAST = 32
"""Below this, admission would cost throughput, not latency: 32 launches in
flight carry 1,000 tasks/s at 32 ms each."""
TARGET = 0.05
"""Seconds from a launch to its agent's first word on it, as the master sees it,
that admission steers under: the framework's accept -> TASK_RUNNING adds the
accept's own wait and the update's way back (a few ms each, frameworks' frames
go first: master/inflow.py)."""
CUT = 0.75
GROW = 0.125
LATE_SHARE = 0.5
"""A round (`allowed` launches, at least `ROUND_LEAST`) with more than this
share of late ones cuts `allowed`: the median is steered, not the tail, which
on a shared machine is processes descheduled, not a queue admission can cut."""
FLOOR = 1.5
"""Late means later than `target`, or than this times the last round's fastest
launch when even that missed the target."""
ROUND_LEAST = 16
LAUNCH_SECONDS = 5.0
OFFER_SECONDS = 1.0
SMOOTHING = 0.2  # weight of the newest accept in the tasks-per-offer mean
GUESS_MOST = 16  # tasks per offer guessed at most before a framework's first accept


class _Window:
    """Weights that lapse after `seconds` unless closed first, and their sum."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.weights: dict[Hashable, float] = {}
        self.opened: dict[Hashable, float] = {}
        self.total = 0.0
        self.changes = 0  # opens and closes so far: `total` may differ only if this does
        self._order: deque[tuple[float, Hashable]] = deque()

    def open(self, key: Hashable, weight: float, now: float) -> None:
        self.close(key)
        self.changes += 1
        self.weights[key] = weight
        self.opened[key] = now
        self.total += weight
        self._order.append((now, key))

    def close(self, key: Hashable) -> float | None:
        """Close `key`; when it was opened (None: it was not open)."""
        weight = self.weights.pop(key, None)
        if weight is None:
            return None
        self.changes += 1
        self.total -= weight
        if not self.weights:
            self.total = 0.0  # no float drift survives an empty window
        return self.opened.pop(key)

    def lapse(self, now: float) -> None:
        order = self._order
        while order and order[0][0] <= now - self.seconds:
            key = order.popleft()[1]
            if self.opened.get(key, now) <= now - self.seconds:
                self.close(key)
        if not self.weights:
            order.clear()

    def lapses_at(self) -> float:
        """The earliest time a weight may lapse (never before it)."""
        return self._order[0][0] + self.seconds if self._order else math.inf

    def lapses_by(self, now: float) -> float:
        """`lapses_at` of this window at `now` and after: a weight opened later
        lapses `seconds` after `now` at the earliest, so an empty window bounds
        it by that rather than never."""
        return (self._order[0][0] if self._order else now) + self.seconds


class Admission:
    """Offers waiting to go out, what is in flight, and how much may be (see the
    module docstring)."""

    def __init__(self, limit: int = DEFAULT_LIMIT, target: float = TARGET,
                 launch_seconds: float = LAUNCH_SECONDS,
                 offer_seconds: float = OFFER_SECONDS) -> None:
        if limit < 0 or target <= 0:
            raise ValueError(f"admission needs a limit of at least 0 and a target above "
                             f"0, not {limit} and {target}")
        self.limit = limit
        self.target = target
        self.allowed = float(min(limit, INITIAL))
        """Tasks in flight allowed now: between `LEAST` and `limit`."""
        self._launches = _Window(launch_seconds)
        self._offers = _Window(offer_seconds)
        self._waiting: deque[Offer] = deque()
        self._waiting_ids: set[str] = set()
        self._per_offer: dict[str, float] = {}  # framework -> mean tasks per accepted offer
        self._cut_at = -math.inf  # launches before the last cut are not samples
        self._learning = True  # no cut yet: double each round
        self._samples = 0  # in this round
        self._late = 0  # of them, later than `_late_after`
        self._late_after = target
        self._fastest = math.inf  # the round's fastest launch
        self._bound = False  # offers waited for room since the last look
        # Until when nothing in flight can lapse, as of the last look that let
        # nothing out: before then, in flight is the windows' totals, so a look
        # needs no lapsing (the core asks after every event while offers wait).
        self._full_until = -math.inf
        self.held = 0
        """Offers that did not go out when made (a counter)."""
        self.cuts = 0
        """Times `allowed` was cut: a launch took longer than `target` (a counter)."""

    def __len__(self) -> int:
        """Offers waiting."""
        return len(self._waiting_ids)

    def in_flight(self, now: float) -> float:
        self._launches.lapse(now)
        self._offers.lapse(now)
        return self._launches.total + self._offers.total

    def admit(self, passes: Iterable[list[Offer]], now: float) -> list[Offer]:
        """A pass's offers, one list per framework: those that may go out now, in
        order; the rest wait (for `release`)."""
        lists = [deque(offers) for offers in passes if offers]
        added = [offer.id for offers in lists for offer in offers]
        while lists:  # frameworks take turns
            for offers in lists:
                offer = offers.popleft()
                self._waiting.append(offer)
                self._waiting_ids.add(offer.id)
            lists = [offers for offers in lists if offers]
        out = self.release(now, fill=True)
        self.held += sum(offer_id in self._waiting_ids for offer_id in added)
        return out

    def release(self, now: float, fill: bool = False) -> list[Offer]:
        """Waiting offers that may go out now: none while in flight is above
        three quarters of `allowed` (unless `fill`), else as many as fill it."""
        if not self._waiting_ids:
            self._waiting.clear()
            return []
        if self.limit == 0:
            out = [offer for offer in self._waiting if offer.id in self._waiting_ids]
            self._waiting.clear()
            self._waiting_ids.clear()
            return out
        launches, offers = self._launches, self._offers
        if not fill and now < self._full_until and \
                launches.total + offers.total > self.allowed * 0.75:
            # Nothing can lapse before `_full_until`, so in flight is the totals.
            self._bound = True
            return []
        flight = self.in_flight(now)
        if not fill and flight > self.allowed * 0.75:
            self._bound = True
            self._full_until = min(launches.lapses_by(now), offers.lapses_by(now))
            return []
        out = []
        while self._waiting and flight < self.allowed:
            offer = self._waiting.popleft()
            if offer.id in self._waiting_ids:
                self._waiting_ids.discard(offer.id)
                expected = self._expected(offer)
                flight += expected
                self._offers.open(offer.id, expected, now)
                out.append(offer)
        self._bound = bool(self._waiting_ids)
        return out

    def _expected(self, offer: Offer) -> float:
        mean = self._per_offer.get(offer.framework_id)
        if mean is not None:
            return mean
        return float(min(GUESS_MOST, max(1, math.ceil(offer.resources.get("cpus")))))

    def waiting(self, offer_id: str) -> bool:
        """Does this offer still wait (the framework has not seen it)?"""
        return offer_id in self._waiting_ids

    def closed(self, offer_id: str) -> None:
        """The offer is gone: accepted, declined, rescinded or timed out."""
        self._waiting_ids.discard(offer_id)
        self._offers.close(offer_id)

    def accepted(self, framework_id: str, offers: int, tasks: int) -> None:
        """An accept of `offers` launched `tasks`: learn tasks per offer."""
        if offers <= 0:
            return
        sample = max(tasks / offers, 0.25)  # an accept that only reserves counts a little
        mean = self._per_offer.get(framework_id)
        self._per_offer[framework_id] = (
            sample if mean is None else mean + SMOOTHING * (sample - mean))

    def launched(self, key: Hashable, now: float) -> None:
        """A task went to its agent (`key`: its framework and task ids)."""
        if self.limit:
            self._launches.open(key, 1.0, now)

    def started(self, key: Hashable, now: float) -> None:
        """The task's agent spoke of it (any status), or it ended: how long that
        took is a sample that steers `allowed`, judged a round at a time."""
        at = self._launches.close(key)
        if at is None or at < self._cut_at:
            return  # launched before the last cut: it cannot speak for what follows
        took = now - at
        self._samples += 1
        self._late += took > self._late_after
        self._fastest = min(self._fastest, took)
        if self._samples < max(ROUND_LEAST, self.allowed):
            return
        if self._late > LATE_SHARE * self._samples:
            self.allowed = max(float(min(LEAST, self.limit)), self.allowed * CUT)
            self._cut_at = now
            self._learning = False
            self.cuts += 1
        elif self._bound:
            grow = self.allowed if self._learning else self.allowed * GROW
            self.allowed = min(float(self.limit), self.allowed + max(1.0, grow))
        # A target even the round's fastest launch missed is not this master's
        # queue (the machine is slow today): judge the next round by that instead.
        self._late_after = max(self.target, FLOOR * self._fastest)
        self._samples = self._late = 0
        self._fastest = math.inf

    def forget_framework(self, framework_id: str) -> None:
        self._per_offer.pop(framework_id, None)
