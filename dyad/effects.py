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


@attrs.frozen
class TimerFired:
    """The event a shell feeds back when an `ArmTimer` comes due."""

    key: Hashable
