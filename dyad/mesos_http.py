"""What the Mesos v1 HTTP endpoints share (master/api_v1.py, agent/api_v1.py):
reading a JSON call body, and writing RecordIO records.

Mesos' answers to bad requests are plain text with a 4xx status; `Refused`
carries both, for the endpoint to answer with.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from dyad import bounded_json


class Refused(Exception):
    """A request answered `status` with the plain-text `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_json(request: web.Request, who: str) -> Any:
    """The request's JSON body; `Refused` (415, 406, 400) naming what is wrong.
    `who` names the answering side in reasons ("master", "agent")."""
    if request.content_type == "application/x-protobuf":
        raise Refused(415, f"this {who} speaks the v1 API in JSON only: send "
                           "Content-Type: application/json")
    if request.content_type != "application/json":
        raise Refused(415, "expecting Content-Type: application/json")
    accept = request.headers.get("Accept", "")
    if accept and not any(kind in accept for kind in ("application/json", "*/*",
                                                      "application/*")):
        raise Refused(406, f"this {who} answers application/json only")
    try:
        return bounded_json.loads(await request.read())
    except bounded_json.JsonInputError as exc:
        raise Refused(400, f"the body must be JSON: {exc.reason}") from None


def record(event: Any) -> bytes:
    """One RecordIO record: the JSON's length in bytes, a newline, the JSON."""
    data = json.dumps(event, separators=(",", ":")).encode("utf-8")
    return b"%d\n%s" % (len(data), data)
