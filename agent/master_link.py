"""The agent's link to the master, as a small pure object inside `AgentState`.

DETECTING -> REGISTERING (RegisterAgent retried with backoff, 1 s doubling to
`register_backoff_max`) -> REGISTERED. Silence from the master for
3 x ping_interval sends the agent back to DETECTING, and the shell detects the
master again. While REGISTERED, any frame from the master but a `Rejected` counts
as proof of life, not only a `Ping` (a master restarted on the same address, which
does not know the agent yet, answers its frames with refusals: those must not keep
the agent from registering again) (the agent says so as it registers, `LIVENESS_CAPABILITY`, and the
master then skips the pings of agents it is busy talking to anyway). Frames count
only once the master's `AgentRegistered` (by its id) has made the link REGISTERED:
after a move to a successor the link is REGISTERING, so whatever the old master
still had on its way is never taken as the new one's word. A successor named by
ZooKeeper arrives as another `detected` in any phase: the agent moves to it at
once, without waiting for the old one's silence.

A frame only moves the deadline (`heard`); the silence timer, when it fires, looks
at the deadline and re-arms itself if the master spoke since. So the deadline is
exactly the last frame plus 3 x ping_interval, and a busy link costs no timer
traffic per frame.

The link knows phases, timers and backoff; what a registration says (the agent's
executors and tasks) and what registering unlocks (status updates, queued exits)
are `AgentState`'s business.
"""

from __future__ import annotations

import itertools
import logging

import attrs

from agent.model import (
    DETECTING, REGISTERED, REGISTERING, AgentConfig, ConnectMaster, DetectMaster,
)
from agent.status_updates import SendMaster
from dyad.effects import ArmTimer, CancelTimer, TimerKey
from dyad.messages import AgentRegistered, MasterInfo, RegisterAgent

log = logging.getLogger(__name__)

MAX_PING_INTERVAL = 3600.0

Effect = SendMaster | ArmTimer | CancelTimer | ConnectMaster | DetectMaster


@attrs.frozen
class RegisterRetry(TimerKey):
    """No answer to RegisterAgent yet: send it again. `seq` makes a retry that
    was due when the link changed phase recognisable as stale."""

    seq: int


@attrs.frozen
class MasterSilent(TimerKey):
    """3 x ping_interval since the last word from the master, perhaps: look at the
    deadline, detect the master again if it has passed."""

    seq: int


class MasterLink:
    """Which master the agent talks to and how far registration has got."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.phase = DETECTING
        self.master: MasterInfo | None = None
        self.ping_interval = config.ping_interval
        self._backoff = config.register_backoff
        self._retry: RegisterRetry | None = None
        self._silence: MasterSilent | None = None
        self._heard_at = 0.0  # the last frame from the master (once armed)
        self._seq = itertools.count()

    @property
    def registered(self) -> bool:
        return self.phase == REGISTERED

    def detected(self, master: MasterInfo, registration: RegisterAgent,
                 now: float) -> list[Effect]:
        """A (new) leading master: connect and register with it."""
        self.master = master
        self.phase = REGISTERING
        self._backoff = self.config.register_backoff
        return [ConnectMaster(master.zmq_endpoint), *self.register(registration, now),
                *self._arm_silence(now)]

    def with_master(self, master: MasterInfo) -> bool:
        """Is the link already registering or registered with `master`? Then
        naming it again (a watch and a detection crossing) changes nothing."""
        return (self.phase != DETECTING and self.master is not None
                and self.master.id == master.id)

    def register(self, registration: RegisterAgent, now: float) -> list[Effect]:
        """Send `registration` now, and arm its retry after the current backoff."""
        effects = self._cancel_retry()
        self._retry = RegisterRetry(next(self._seq))
        at = now + self._backoff
        self._backoff = min(self._backoff * 2, self.config.register_backoff_max)
        return effects + [SendMaster(registration), ArmTimer(self._retry, at)]

    def retry_due(self, key: RegisterRetry) -> bool:
        """Is `key` the retry armed now (not a stale one)?"""
        return key == self._retry and self.phase == REGISTERING

    def silence(self, key: MasterSilent, now: float) -> list[Effect] | None:
        """The silence timer `key` fired. None: the master has been silent for
        3 x ping_interval (call `lost`); else the effects, none for a stale key,
        or the timer re-armed for the deadline a frame since has moved."""
        if key != self._silence:
            return []
        deadline = self._heard_at + 3 * self.ping_interval
        if deadline <= now:
            return None
        self._silence = MasterSilent(next(self._seq))
        return [ArmTimer(self._silence, deadline)]

    def answered(self, msg: AgentRegistered, now: float) -> tuple[list[Effect], bool]:
        """The master answered a registration. Returns the effects and whether this
        is the answer that registers us (not a duplicate, not a stale one)."""
        if self.phase == DETECTING:
            return [], False  # an answer from a master we have since given up on
        if self.master is not None and msg.master_info.id != self.master.id:
            # A late answer from the master we left for its successor (it was
            # already on our socket): registering with it would stop our retries
            # to the leader.
            return [], False
        # A nonsensical interval must not make the agent give up on the master at once.
        ok = 0 < msg.ping_interval <= MAX_PING_INTERVAL
        self.ping_interval = msg.ping_interval if ok else self.config.ping_interval
        self.master = msg.master_info
        effects = self._arm_silence(now)
        if self.phase == REGISTERED:
            return effects, False  # a duplicate answer to a retried RegisterAgent
        self.phase = REGISTERED
        return effects + self._cancel_retry(), True

    def heard(self, now: float) -> None:
        """A frame from the master: while REGISTERED (with the master whose
        `AgentRegistered` made it so) it is alive, and the deadline moves."""
        if self.phase == REGISTERED:
            self._heard_at = now

    def lost(self) -> list[Effect]:
        """The master fell silent: detect it again."""
        log.warning("no word from the master for %.1fs; detecting it again",
                    3 * self.ping_interval)
        self.phase = DETECTING
        self._silence = None
        return self._cancel_retry() + [DetectMaster()]

    def validate(self) -> None:
        assert (self._retry is not None) == (self.phase == REGISTERING)
        assert (self._silence is not None) == (self.phase != DETECTING)

    def _arm_silence(self, now: float) -> list[Effect]:
        effects: list[Effect] = [] if self._silence is None else [CancelTimer(self._silence)]
        self._heard_at = now
        self._silence = MasterSilent(next(self._seq))
        return effects + [ArmTimer(self._silence, now + 3 * self.ping_interval)]

    def _cancel_retry(self) -> list[Effect]:
        retry, self._retry = self._retry, None
        return [] if retry is None else [CancelTimer(retry)]
