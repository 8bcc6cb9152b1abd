"""A batch job as the scheduler's core sees it: its input splits and the numbers
it decides with. `frameworks.batch.job` builds these from a `Job`; `BatchCore`
takes a `CoreConfig`."""

from __future__ import annotations

from typing import Any

import attrs

from dyad.messages import ExecutorInfo
from dyad.resources import Resources


@attrs.frozen
class Split:
    """One map task's input: bytes ``[start, start + length)`` of `path` (``length``
    None: to the end), read whole lines by Hadoop's rule (see
    `frameworks.batch.work.iter_split`). `path` is an absolute local path or an
    ``http(s)://`` URI; `hosts` are the hostnames that hold the data."""

    index: int
    path: str
    start: int = 0
    length: int | None = None
    hosts: tuple[str, ...] = ()

    @property
    def is_uri(self) -> bool:
        return self.path.startswith(("http://", "https://"))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "start": self.start, "length": self.length}


@attrs.frozen
class CoreConfig:
    """Everything the core decides with. `job_payload` is the JSON text every
    task carries (the job's code); `output` the absolute output directory."""

    splits: tuple[Split, ...]
    reducers: int
    executor: ExecutorInfo
    map_resources: Resources
    reduce_resources: Resources
    job_payload: str
    output: str
    max_attempts: int = 4
    locality_wait: float = 1.0
    speculative: bool = False
    refuse_seconds: float = 5.0
    starvation_timeout: float = 60.0
    priority: int = 100  # every task's TaskInfo.priority (dyad/priority.py)
    revocable: bool = False  # also run tasks on offers' revocable resources

    def __attrs_post_init__(self) -> None:
        if not self.splits:
            raise ValueError("a job needs at least one split")
        if self.reducers < 1:
            raise ValueError("a job needs at least one reducer")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.locality_wait < 0 or self.refuse_seconds < 0:
            raise ValueError("locality_wait and refuse_seconds must not be negative")
