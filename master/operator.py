"""Operator calls: what an operator may ask of the master core, and the answer.

Every operator action -- `PUT /weights`, `PUT /quota`, `POST /tasks/kill`,
`POST /machine/drain`, `POST /teardown`, and a call refused for its body --
reaches `MasterState.handle` as one `OperatorCall` event, through the same queue
as the messages and timers. So a leader whose ZooKeeper lease is unconfirmed acts
on none of them, and their order with everything else is the order they were
handled in. The core answers each with a `Reply` effect; the shell hands it back
to whoever waits on `call_id` (an HTTP handler), which turns it into a response.

Requests are already parsed (the HTTP layer turns JSON into these with
`master.allocator.parse_weights`/`parse_quota`); the core re-checks anything that
depends on state (unknown task, incoherent quota) and refuses with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from master.allocator import Quota

# Why a call was refused; the HTTP layer maps each to a status (400, 404, 409;
# INTERNAL, which only the shell answers when the core raised, is a 500).
INVALID = "invalid"
NOT_FOUND = "not_found"
CONFLICT = "conflict"
FORBIDDEN = "forbidden"  # the caller's principal may not (master/authorization.py)
INTERNAL = "internal"


@attrs.frozen
class SetWeights:
    """Set some roles' weights (1.0 clears a role's entry)."""

    weights: Mapping[str, float]


@attrs.frozen
class SetQuota:
    """Set some roles' quota (an empty `Quota` removes a role's)."""

    quotas: Mapping[str, Quota]


@attrs.frozen
class KillLiveTask:
    """Kill a live task; `framework_id` is needed only when two frameworks use the id."""

    task_id: str
    framework_id: str | None = None


@attrs.frozen
class DrainMachine:
    """An operator drains an agent: the core checks it is registered and answers
    with its URL, where the shell forwards the drain (the agent kills its tasks and
    tells the master, which then offers it nothing)."""

    agent_id: str


@attrs.frozen
class TeardownFramework:
    """Remove a framework as if it had torn itself down: its tasks are killed."""

    framework_id: str


@attrs.frozen
class MalformedCall:
    """A call whose body could not be read (not JSON, wrong shape); the core only
    counts it (`master/operator_calls_invalid`) and refuses it with `reason`."""

    reason: str


Request = SetWeights | SetQuota | KillLiveTask | DrainMachine | TeardownFramework | MalformedCall


@attrs.frozen
class OperatorCall:
    """The event: `request`, to be answered by a `Reply` with the same `call_id`."""

    call_id: int
    request: Request
    principal: str | None = None  # who asked (HTTP authentication); None: security off


@attrs.frozen
class Reply:
    """The core's answer to `OperatorCall(call_id)`: `result` when done, or
    `refusal` (INVALID, NOT_FOUND, CONFLICT, FORBIDDEN, INTERNAL) with `error` saying why."""

    call_id: int
    result: Mapping[str, Any] = attrs.field(factory=dict)
    refusal: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.refusal
