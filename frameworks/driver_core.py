"""What the two driver cores (`SchedulerCore`, `ExecutorCore`) share with the
runtime that carries them out (`frameworks._callbacks.DriverRuntime`).

Kept apart from the runtime so the cores can import it without importing asyncio:
the events every driver core hears (`Started`, `Received`, and `TimerFired` from
`dyad.effects`) and the effects that are about user code rather than the wire
(`Callback`, `Finish`).
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from dyad.messages import Message, TaskStatus


class DriverStatus(enum.StrEnum):
    """Where a driver is in its life; compares equal to Mesos' status names."""

    NOT_STARTED = "DRIVER_NOT_STARTED"
    RUNNING = "DRIVER_RUNNING"
    STOPPED = "DRIVER_STOPPED"
    ABORTED = "DRIVER_ABORTED"


@attrs.frozen
class Started:
    """Event: the driver's loop runs and its socket is open."""


@attrs.frozen
class Received:
    """Event: a message from the peer (the master or the agent) was decoded."""

    message: Message


@attrs.frozen
class Callback:
    """Effect: call the user's `name(driver, *args)`. `ack` is a status to
    acknowledge once the callback has returned without raising."""

    name: str
    args: tuple[Any, ...] = ()
    ack: TaskStatus | None = None


@attrs.frozen
class Finish:
    """Effect: end the driver with `status` once the callbacks before it have run."""

    status: DriverStatus
