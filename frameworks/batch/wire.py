"""Where the batch scheduler and its executor meet: the JSON a task attempt
carries in `TaskInfo.data` (the job's code and the task's spec) and the JSON it
reports in its final status (a finished attempt's result, the map outputs a failed
reduce could not fetch). `BatchCore` writes the first and reads the second;
`frameworks.batch.work` does the opposite. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAP = "map"
REDUCE = "reduce"

FETCH_FAILED_KEY = "fetch_failed"
"""Key in a reduce's TASK_FAILED data: ``[{"map": i, "task_id": id}, ...]``."""


def task_data(job_payload: str, spec: Mapping[str, Any]) -> bytes:
    """`TaskInfo.data` of one attempt: ``{"job": <payload>, "task": <spec>}``. The
    payload (the user's code) is already JSON text: it is spliced in rather than
    decoded and encoded again for every task."""
    return ('{"job":' + job_payload + ',"task":' + json.dumps(spec) + "}").encode()


def parse_result(kind: str, data: bytes, reducers: int) -> Mapping[str, Any]:
    """A finished attempt's result: a map names R partition files, a reduce its
    part file. Raises ValueError for anything else."""
    try:
        result = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"result is not JSON: {exc}") from None
    if not isinstance(result, dict):
        raise ValueError("result is not a JSON object")
    if kind == MAP:
        outputs = result.get("outputs")
        if (not isinstance(outputs, list) or len(outputs) != reducers
                or not all(isinstance(p, str) and p.startswith("/") for p in outputs)):
            raise ValueError(f"a map must name {reducers} absolute output paths")
    elif not isinstance(result.get("output"), str):
        raise ValueError("a reduce must name its output file")
    for key in ("records_in", "records_out"):
        if not isinstance(result.get(key, 0), int):
            raise ValueError(f"{key} must be an integer")
    return result


def parse_fetch_failures(data: bytes) -> list[tuple[int, str]]:
    """The (map index, attempt id) pairs a failed reduce could not fetch; empty if
    its data says nothing of the kind."""
    try:
        found = json.loads(data).get(FETCH_FAILED_KEY) if data else None
    except (ValueError, AttributeError, UnicodeDecodeError):
        return []
    if not isinstance(found, list):
        return []
    return [(item["map"], item["task_id"]) for item in found
            if isinstance(item, dict) and isinstance(item.get("map"), int)
            and isinstance(item.get("task_id"), str)]
