"""Effects shared by the pure cores: what a core asks its shell to do.

A core's `handle(event, now)` returns a list of these; the shell performs them in
order. Component-specific effects (launch a process, write the registry) live next
to their core; the ones every core needs live here.
"""

from __future__ import annotations

from typing import Hashable

import attrs

from dyad.messages import Message


@attrs.frozen
class Send:
    """Send `message` to the peer known to the shell as `to` (an id or identity)."""

    to: str
    message: Message


@attrs.frozen
class ArmTimer:
    """Deliver `TimerFired(key)` at time `at` (clock seconds); re-arming replaces."""

    key: Hashable
    at: float


@attrs.frozen
class CancelTimer:
    key: Hashable


class TimerKey:
    """Base of every typed timer key (`OfferTimeout(offer_id)`, `PingDue(agent_id)`,
    ...): small frozen attrs classes, one per kind of timer, which a core matches
    exhaustively. A key a core does not know raises `UnknownTimer`: it is a bug,
    never input, so tests must see it."""

    __slots__ = ()


class UnknownTimer(Exception):
    """A core was handed a `TimerFired` whose key it never arms."""

    def __init__(self, core: str, key: Hashable) -> None:
        super().__init__(f"{core} does not arm timers keyed {key!r}")
        self.key = key


@attrs.frozen
class TimerFired:
    """The event a shell feeds back when an `ArmTimer` comes due."""

    key: Hashable
