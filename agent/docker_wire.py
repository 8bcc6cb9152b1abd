"""What the Docker Engine API sends back, read without I/O.

- Logs of a container without a TTY come as one byte stream of frames, each an
  8-byte header (stream number, three zero bytes, big-endian length) and its
  payload; `LogDemuxer` splits the stream into (stream, payload) however the
  bytes were cut in transit. With `timestamps=1` every payload starts with an
  RFC 3339 nanosecond time; `split_timestamp` parses it, so an agent that follows
  a container's logs again after a restart can skip what it already wrote.
- An image pull answers with JSON lines, one per layer step; `PullProgress` folds
  them into a one-line summary for the task's `TASK_STARTING` message, and keeps
  the engine's error if the pull failed (errors arrive inside a 200 response).
- `ContainerUsage.from_stats` and `ContainerState.from_inspect` read the fields
  the agent needs from `/stats` and `/json`, on cgroups v1 and v2 engines alike.

The shell (`agent/docker.py`) feeds these; the unit tests feed them directly.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

import attrs

STDOUT = 1
STDERR = 2
_HEADER = struct.Struct(">BxxxI")
MIB = 1024 * 1024
NANOS = 1_000_000_000


class WireError(ValueError):
    """The engine sent something that is not what its API documents."""


class LogDemuxer:
    """Feed bytes as they arrive; get whole frames back, in order."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= _HEADER.size:
            stream, size = _HEADER.unpack_from(self._buffer)
            if stream not in (0, STDOUT, STDERR, 3):  # 3: the engine's own error
                raise WireError(f"log frame for unknown stream {stream}")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append((stream, bytes(self._buffer[_HEADER.size:end])))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame (non-zero when a stream ends mid-frame)."""
        return len(self._buffer)


def split_timestamp(payload: bytes) -> tuple[int, bytes]:
    """(nanoseconds since the epoch, the rest) of a `timestamps=1` log payload."""
    stamp, space, rest = payload.partition(b" ")
    if not space:
        raise WireError(f"log payload without a timestamp: {payload[:40]!r}")
    return parse_time(stamp.decode("ascii", "replace")), rest


def parse_time(text: str) -> int:
    """RFC 3339 time, as the engine writes it, in nanoseconds since the epoch.
    Python's datetime stops at microseconds, so the fraction is read apart."""
    if not text.endswith("Z"):
        raise WireError(f"engine time {text!r} is not UTC")
    whole, _, fraction = text[:-1].partition(".")
    try:
        moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc)
        nanos = int((fraction + "000000000")[:9]) if fraction else 0
    except ValueError:
        raise WireError(f"engine time {text!r} is not RFC 3339") from None
    return int(moment.timestamp()) * NANOS + nanos


def since_argument(nanos: int) -> str:
    """The engine's `since` form ('seconds.nanoseconds') of a time in nanoseconds."""
    return f"{nanos // NANOS}.{nanos % NANOS:09d}"


_DONE = ("Pull complete", "Already exists")


@attrs.define
class _Layer:
    status: str = ""
    current: int = 0
    total: int = 0


class PullProgress:
    """Folds an image pull's JSON lines; `summary` is what the task is told."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.error = ""
        self.last_status = ""
        self._layers: dict[str, _Layer] = {}

    def feed(self, line: Any) -> None:
        if not isinstance(line, dict):
            raise WireError(f"pull progress line is not an object: {line!r}")
        if "error" in line or "errorDetail" in line:
            detail = line.get("errorDetail") or {}
            self.error = str(detail.get("message") or line.get("error") or "pull failed")
            return
        status = str(line.get("status", ""))
        layer_id = line.get("id")
        detail = line.get("progressDetail") or {}
        # Lines naming a layer have a short hex id; the first names the tag instead.
        if isinstance(layer_id, str) and (detail or status.startswith(
                ("Pulling fs", "Waiting", "Download", "Verifying", "Extract", *_DONE))):
            layer = self._layers.setdefault(layer_id, _Layer())
            layer.status = status
            if status == "Downloading" and isinstance(detail, dict):
                layer.current = _int(detail.get("current"))
                layer.total = _int(detail.get("total")) or layer.total
            elif status == "Download complete" or status in _DONE:
                layer.current = layer.total
        else:
            self.last_status = status

    @property
    def layers(self) -> int:
        return len(self._layers)

    @property
    def layers_done(self) -> int:
        return sum(1 for layer in self._layers.values() if layer.status in _DONE)

    @property
    def downloaded_bytes(self) -> int:
        return sum(layer.current for layer in self._layers.values())

    @property
    def total_bytes(self) -> int:
        return sum(layer.total for layer in self._layers.values())

    def summary(self) -> str:
        if self.error:
            return f"pulling {self.image} failed: {self.error}"
        if not self._layers:
            return f"pulling {self.image}" + (f": {self.last_status}" if self.last_status else "")
        text = f"pulling {self.image}: {self.layers_done}/{self.layers} layers"
        if self.total_bytes:
            text += (f", {self.downloaded_bytes / MIB:.1f} of "
                     f"{self.total_bytes / MIB:.1f} MiB downloaded")
        return text


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@attrs.frozen
class ContainerUsage:
    """One sample of a container's cgroup. Times are cumulative seconds;
    `mem_bytes` leaves out the page cache (what the docker CLI shows as usage);
    `mem_peak_bytes` is 0 where the engine does not say (cgroups v2)."""

    cpus_user_time: float
    cpus_system_time: float
    cpus_total_time: float
    mem_bytes: int
    mem_limit_bytes: int
    mem_peak_bytes: int
    processes: int
    cpus_nr_throttled: int
    cpus_throttled_time: float

    @classmethod
    def from_stats(cls, stats: Any) -> ContainerUsage:
        if not isinstance(stats, dict):
            raise WireError("stats are not an object")
        cpu = _dict(stats.get("cpu_stats"))
        usage = _dict(cpu.get("cpu_usage"))
        throttling = _dict(cpu.get("throttling_data"))
        memory = _dict(stats.get("memory_stats"))
        details = _dict(memory.get("stats"))
        # cgroups v1 calls the reclaimable cache total_inactive_file, v2 inactive_file.
        cache = _int(details.get("total_inactive_file", details.get("inactive_file")))
        used = _int(memory.get("usage"))
        return cls(
            cpus_user_time=_int(usage.get("usage_in_usermode")) / NANOS,
            cpus_system_time=_int(usage.get("usage_in_kernelmode")) / NANOS,
            cpus_total_time=_int(usage.get("total_usage")) / NANOS,
            mem_bytes=used - cache if cache < used else used,
            mem_limit_bytes=_int(memory.get("limit")),
            mem_peak_bytes=_int(memory.get("max_usage")),
            processes=_int(_dict(stats.get("pids_stats")).get("current")),
            cpus_nr_throttled=_int(throttling.get("throttled_periods")),
            cpus_throttled_time=_int(throttling.get("throttled_time")) / NANOS)


@attrs.frozen
class ContainerState:
    """A container's state from `GET /containers/{id}/json`. `exit_code` is the
    engine's: 128+n when signal n ended the container's first process."""

    id: str
    status: str  # created, running, paused, restarting, removing, exited, dead
    running: bool
    exit_code: int
    oom_killed: bool
    error: str
    pid: int
    labels: dict[str, str]

    @classmethod
    def from_inspect(cls, document: Any) -> ContainerState:
        if not isinstance(document, dict):
            raise WireError("container inspect is not an object")
        state = _dict(document.get("State"))
        labels = _dict(_dict(document.get("Config")).get("Labels"))
        return cls(id=str(document.get("Id", "")), status=str(state.get("Status", "")),
                   running=bool(state.get("Running")), exit_code=_int(state.get("ExitCode")),
                   oom_killed=bool(state.get("OOMKilled")), error=str(state.get("Error", "")),
                   pid=_int(state.get("Pid")),
                   labels={str(k): str(v) for k, v in labels.items()})


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
