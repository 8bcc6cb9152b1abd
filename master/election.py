"""The election's decisions, pure: when this master leads, when it must stand
down, and when a standby may call the leader dead before ZooKeeper does.

ZooKeeper alone replaces a dead leader only once its session expires (at least
4 s at stock settings). Silence proves nothing (a paused or cut-off leader is not
dead), but a closed connection nearly does: when a process dies its kernel closes
its sockets, while a stopped process keeps them open and a cut-off host sends
nothing. So the standby next in line holds a TCP connection to the leader's
liveness listener (master/liveness.py), never writing a byte on it, and calls the
leader's process gone only on this proof:

1. that established connection ends by the peer's hand (EOF or reset), and
2. fresh connections to every port the leader listens on (liveness, ZMQ, HTTP)
   are refused: its host answers, and nothing listens there any more.

A firewall rule, a pause or a partition breaks neither half. Then the standby
deletes the leader's contender znode, only if it still belongs to the session it
saw leading at that version, and the election proceeds at once. Anything short of
the proof leaves it to ZooKeeper's session expiry.

Fencing does not rest on the proof alone. A leader acts only within its lease
(`dyad.zk.Lease`: `lease` seconds from a confirmed read of its own znode), and a
master that deleted a leader's znode does not act, nor end its own session,
until that leader's lease has run out (`Lead.not_before`). A leader that sees its
own znode gone stands down at once. So even a false proof costs a failover, never
two leaders at once.

One way in: `Election.handle(event, now) -> list[effect]`; the shell
(master/liveness.py) reads ZooKeeper, opens sockets and arms the timers.
"""

from __future__ import annotations

import enum

import attrs

from dyad.effects import ArmTimer, CancelTimer, TimerFired, TimerKey, UnknownTimer

Endpoint = tuple[str, int]

RETRY_FIRST = 0.5
"""Seconds before a standby tries the leader's liveness listener again after it
could not reach it or saw no proof; doubled up to `RETRY_MOST`."""
RETRY_MOST = 8.0
DYING = 2.0
"""Seconds after the connection closed during which the ports may still answer: a
dying process closes its sockets one by one (a master with a thousand peers takes
a while), so the port check is repeated, every `RECHECK`, until they all refuse
or this runs out. A live leader never closes the connection in the first place."""
RECHECK = 0.05


# ---------------------------------------------------------------- events


@attrs.frozen
class Contenders:
    """The election's children changed: contender paths, lowest sequence first."""

    paths: tuple[str, ...]


@attrs.frozen
class LeaderRead:
    """What the shell read about the leading contender `path`: the session owning
    it and its version, and its liveness record (None when it has none, or one
    owned by another session: then no proof is possible)."""

    path: str
    owner: int
    version: int
    liveness: Endpoint | None
    ports: tuple[Endpoint, ...]
    lease: float


@attrs.frozen
class LeaderUnreadable:
    """The leading contender could not be read (gone already, no connection)."""

    path: str


@attrs.frozen
class Connected:
    path: str


@attrs.frozen
class ConnectFailed:
    path: str
    reason: str


@attrs.frozen
class Closed:
    """The held connection ended; `by_peer`: with EOF or a reset, which only the
    peer's kernel sends (a timeout or unreachable host is not by the peer)."""

    path: str
    by_peer: bool
    reason: str


@attrs.frozen
class PortsChecked:
    """Fresh connections to every port of the leader: `refused` only when each of
    them was refused outright."""

    path: str
    refused: bool
    reason: str


@attrs.frozen
class Deleted:
    """The conditional delete of a dead leader's znode: `done` when it happened."""

    path: str
    done: bool
    reason: str


Event = Contenders | LeaderRead | LeaderUnreadable | Connected | ConnectFailed | Closed \
    | PortsChecked | Deleted | TimerFired


# ---------------------------------------------------------------- effects


@attrs.frozen
class ReadLeader:
    path: str


@attrs.frozen
class Connect:
    """Open and hold a connection to `endpoint`; never write to it."""

    path: str
    endpoint: Endpoint


@attrs.frozen
class Disconnect:
    """Drop whatever connection or check is open for the leader being watched."""


@attrs.frozen
class CheckPorts:
    path: str
    endpoints: tuple[Endpoint, ...]


@attrs.frozen
class DeleteLeader:
    """Delete `path` only while it is at `version` and owned by session `owner`."""

    path: str
    owner: int
    version: int


@attrs.frozen
class Lead:
    """This master's znode is the lowest: lead, but act not before `not_before`."""

    not_before: float


@attrs.frozen
class StandDown:
    reason: str


@attrs.frozen
class Note:
    """Something an operator should read in the log; `counter` names the figure
    it adds one to (master/election/<counter>)."""

    text: str
    counter: str


Effect = ReadLeader | Connect | Disconnect | CheckPorts | DeleteLeader | Lead | StandDown \
    | Note | ArmTimer | CancelTimer


@attrs.frozen
class RetryWatch(TimerKey):
    """Try the leader `path`'s liveness listener again."""

    path: str


@attrs.frozen
class Recheck(TimerKey):
    """Check the ports of the leader `path` again: it may still be dying."""

    path: str


class Watch(enum.Enum):
    """How far the standby got with the leader it watches."""

    READING = "reading"        # its znode's owner and liveness record
    CONNECTING = "connecting"
    HOLDING = "holding"        # the connection is up: waiting for it to end
    CHECKING = "checking"      # it ended by the peer's hand: are all ports refused?
    DELETING = "deleting"      # proven dead: the conditional delete is on its way
    WAITING = "waiting"        # no proof now; retry later (RetryWatch)
    IDLE = "idle"              # nothing more to do for this leader (deleted, unwatchable)


@attrs.define
class Election:
    """One master's view of the election under its own contender znode `me`."""

    me: str
    leading: bool = False
    fenced_until: float = 0.0  # we deleted a leader whose lease may run till then
    target: LeaderRead | None = None
    watched: str | None = None  # the leading path we watch (as next in line)
    watch: Watch = Watch.IDLE
    retry: float = RETRY_FIRST
    gone: bool = False  # our znode vanished: this master is done
    # A conditional delete we sent and have no answer to (its path, its lease):
    # however it ends, we act only a lease after the answer.
    deleting: tuple[str, float] | None = None
    lead_deferred: bool = False  # our znode is the lowest, but a delete is out
    closed_at: float = 0.0  # when the held connection ended by the peer's hand

    def handle(self, event: Event, now: float) -> list[Effect]:
        match event:
            case Contenders(paths):
                return self._contenders(paths, now)
            case LeaderRead() if self._current(event.path, Watch.READING):
                return self._read(event)
            case LeaderUnreadable(path) if self._current(path, Watch.READING):
                return self._wait(path, now, "cannot read the leader's znode")
            case Connected(path) if self._current(path, Watch.CONNECTING):
                self.watch = Watch.HOLDING
                self.retry = RETRY_FIRST
                return []
            case ConnectFailed(path, reason) if self._current(path, Watch.CONNECTING):
                # Never seen alive on this connection, so a refusal proves nothing.
                return self._wait(path, now, f"cannot reach its liveness listener: {reason}")
            case Closed(path, by_peer, reason) if self._current(path, Watch.HOLDING):
                return self._closed(path, by_peer, reason, now)
            case PortsChecked(path, refused, reason) if self._current(path, Watch.CHECKING):
                return self._checked(path, refused, reason, now)
            case Deleted(path, done, reason) if self.deleting and self.deleting[0] == path:
                return self._deleted(path, done, reason, now)
            case TimerFired(key):
                return self._timer(key)
            case (LeaderRead() | LeaderUnreadable() | Connected() | ConnectFailed() | Closed()
                  | PortsChecked() | Deleted()):
                return []  # about a leader we no longer watch, or out of turn
        raise TypeError(f"Election cannot handle {event!r}")

    def _current(self, path: str, watch: Watch) -> bool:
        return self.watched == path and self.watch is watch

    # ------------------------------------------------------------ contenders

    def _contenders(self, paths: tuple[str, ...], now: float) -> list[Effect]:
        if self.gone:
            return []
        if self.me not in paths:
            self.gone = True
            return [*self._unwatch(), StandDown("our contender znode is gone")]
        if paths[0] == self.me:
            effects = self._unwatch()
            if not self.leading:
                self.leading = True
                if self.deleting is not None:
                    self.lead_deferred = True  # the delete's answer sets the fence
                else:
                    effects.append(Lead(not_before=max(now, self.fenced_until)))
            return effects
        if self.leading:  # a lower znode appeared under us: impossible unless reset
            self.gone = True
            return [*self._unwatch(), StandDown(f"{paths[0]} leads in our place")]
        if paths[1] != self.me:
            return self._unwatch()  # someone else is next in line: they watch
        if self.watched == paths[0]:
            return []
        effects = self._unwatch()
        self.watched, self.watch, self.retry = paths[0], Watch.READING, RETRY_FIRST
        effects.append(ReadLeader(paths[0]))
        return effects

    def _unwatch(self) -> list[Effect]:
        if self.watched is None:
            return []
        effects: list[Effect] = [CancelTimer(RetryWatch(self.watched)),
                                 CancelTimer(Recheck(self.watched))]
        if self.watch in (Watch.CONNECTING, Watch.HOLDING, Watch.CHECKING):
            effects.append(Disconnect())
        self.watched, self.target, self.watch = None, None, Watch.IDLE
        return effects

    # ------------------------------------------------------------ watching

    def _read(self, read: LeaderRead) -> list[Effect]:
        if read.liveness is None:
            self.watch = Watch.IDLE
            return [Note(f"{read.path} publishes no liveness listener of its own session; "
                         "its death waits for ZooKeeper", "unwatchable")]
        self.target = read
        return self._connect()

    def _connect(self) -> list[Effect]:
        assert self.target is not None and self.target.liveness is not None
        self.watch = Watch.CONNECTING
        return [Connect(self.target.path, self.target.liveness)]

    def _wait(self, path: str, now: float, why: str) -> list[Effect]:
        self.watch = Watch.WAITING
        delay, self.retry = self.retry, min(self.retry * 2, RETRY_MOST)
        return [Note(f"watching {path}: {why}; again in {delay:g}s", "watch_retries"),
                ArmTimer(RetryWatch(path), now + delay)]

    def _closed(self, path: str, by_peer: bool, reason: str, now: float) -> list[Effect]:
        if not by_peer:
            return self._wait(path, now, f"connection lost ({reason}), not closed by the leader")
        assert self.target is not None
        self.watch, self.closed_at = Watch.CHECKING, now
        return [CheckPorts(path, (*self.target.ports,))]

    def _checked(self, path: str, refused: bool, reason: str, now: float) -> list[Effect]:
        if not refused:
            if now < self.closed_at + DYING:
                return [ArmTimer(Recheck(path), now + RECHECK)]
            # Closed, yet something still answers: not proof. Watch it anew.
            return self._wait(path, now, f"closed, but not dead ({reason})")
        assert self.target is not None
        self.watch = Watch.DELETING
        self.deleting = (path, self.target.lease)
        return [Note(f"{path}: connection closed by the leader and every port refused: "
                     "its process is gone; deleting its znode", "proven_dead"),
                DeleteLeader(path, self.target.owner, self.target.version)]

    def _deleted(self, path: str, done: bool, reason: str, now: float) -> list[Effect]:
        assert self.deleting is not None
        # The dead leader's last lease began before the delete reached ZooKeeper,
        # hence before this answer: it is over `lease` seconds from now. A delete
        # that failed may still have happened (an answer lost with the
        # connection), so the fence holds whatever the answer says.
        self.fenced_until = max(self.fenced_until, now + self.deleting[1])
        self.deleting = None
        if self._current(path, Watch.DELETING):
            self.watch = Watch.IDLE
        effects: list[Effect] = [
            Note(f"deleted dead leader {path}", "fast_failovers") if done
            else Note(f"did not delete {path}: {reason}", "deletes_refused")]
        if self.lead_deferred:
            self.lead_deferred = False
            effects.append(Lead(not_before=self.fenced_until))
        return effects

    def _timer(self, key: object) -> list[Effect]:
        match key:
            case RetryWatch(path):
                if self._current(path, Watch.WAITING):
                    if self.target is None:
                        self.watch = Watch.READING
                        return [ReadLeader(path)]
                    return self._connect()
                return []
            case Recheck(path):
                if self._current(path, Watch.CHECKING) and self.target is not None:
                    return [CheckPorts(path, (*self.target.ports,))]
                return []
            case _:
                raise UnknownTimer("Election", key)
