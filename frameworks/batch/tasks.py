"""The job's books: its map and reduce tasks, their attempts and map outputs, and
the `Progress` that sums them up. Apart from `frameworks.batch.core` because
these are plain records, read by the offer, update and speculation logic there
and by the shell's status output, and hold no scheduling rules of their own.
Pure: no I/O."""

from __future__ import annotations

import enum

import attrs


class TaskPhase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


@attrs.frozen
class MapOutput:
    """Where a finished map attempt left its R partition files."""

    task_id: str
    agent_id: str
    hostname: str
    url: str
    paths: tuple[str, ...]
    local: bool | None


@attrs.define(eq=False)
class Attempt:
    task_id: str
    task: Task
    agent_id: str
    hostname: str
    url: str
    launched_at: float
    local: bool | None
    killed: bool = False  # we asked for the kill: its end is no failure
    ended: bool = False


@attrs.define(eq=False)
class Task:
    kind: str
    index: int
    phase: TaskPhase = TaskPhase.PENDING
    launches: int = 0
    failures: list[str] = attrs.field(factory=list)
    avoid: set[str] = attrs.field(factory=set)  # agent ids where it failed
    live: list[Attempt] = attrs.field(factory=list)
    output: MapOutput | None = None
    result: str = ""  # a reduce's committed part file
    duration: float | None = None
    wants_copy: bool = False
    refusals: int = 0
    not_before: float = 0.0  # refused launches back off until then

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}"


@attrs.frozen
class Progress:
    """What `dyad-batch` shows and `JobResult` reports. `locality` is the share of
    finished maps with preferred hosts that ran on one (None: no map had any)."""

    maps_total: int
    maps_done: int
    maps_running: int
    reduces_total: int
    reduces_done: int
    reduces_running: int
    failed_attempts: int
    refused_launches: int
    preempted_attempts: int
    revocable_launches: int
    maps_rerun: int
    speculative_attempts: int
    local_maps: int
    preferred_maps: int
    records_in: int
    records_out: int
    invalid_updates: int

    @property
    def locality(self) -> float | None:
        return self.local_maps / self.preferred_maps if self.preferred_maps else None
