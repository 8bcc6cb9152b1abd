"""How `dyad-batch` shows jobs: a progress line (a bar in a terminal, plain lines
otherwise), and job records that `dyad-batch status` and `list` read.

A submitting process writes its job's record, a small JSON file named after the
job id, into a jobs directory (``$DYAD_BATCH_JOBS``, else
``$XDG_STATE_HOME/dyad-batch/jobs``, else ``~/.local/state/dyad-batch/jobs``),
atomically, as the job progresses. So `status` and `list` see the jobs submitted
from this machine (or any that shares the directory), running or finished. A
record still marked RUNNING whose submitter process is gone is shown as LOST.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

import attrs

from frameworks.batch.core import Progress

RUNNING, SUCCEEDED, FAILED, LOST = "RUNNING", "SUCCEEDED", "FAILED", "LOST"
PLAIN_INTERVAL = 1.0
"""Seconds between plain progress lines when nothing but counts changed."""


def default_jobs_dir() -> Path:
    if os.environ.get("DYAD_BATCH_JOBS"):
        return Path(os.environ["DYAD_BATCH_JOBS"])
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "dyad-batch" / "jobs"


@attrs.define
class JobRecord:
    """What `status` shows about one job."""

    job_id: str
    name: str
    state: str
    master: str
    output: str
    pid: int
    started_at: float
    updated_at: float = 0.0
    elapsed: float = 0.0
    framework_id: str = ""
    error: str = ""
    progress: dict[str, Any] = attrs.field(factory=dict)

    def save(self, jobs_dir: Path) -> None:
        jobs_dir.mkdir(parents=True, exist_ok=True)
        self.updated_at = time.time()
        target = jobs_dir / f"{self.job_id}.json"
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(attrs.asdict(self), indent=1))
        os.replace(partial, target)

    @classmethod
    def load(cls, path: Path) -> JobRecord:
        data = json.loads(path.read_text())
        return cls(**{f.name: data[f.name] for f in attrs.fields(cls) if f.name in data})

    @property
    def shown_state(self) -> str:
        """RUNNING only while the submitter lives; LOST if it died mid-job."""
        if self.state == RUNNING and not _alive(self.pid):
            return LOST
        return self.state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process with that pid: assume it is the submitter
    return True


def progress_dict(progress: Progress) -> dict[str, Any]:
    return {**attrs.asdict(progress), "locality": progress.locality}


def list_jobs(jobs_dir: Path) -> list[JobRecord]:
    """Every readable record, oldest first (unreadable files are skipped: a record
    is replaced atomically, so only foreign files are unreadable)."""
    records = []
    for path in sorted(jobs_dir.glob("*.json")) if jobs_dir.is_dir() else []:
        try:
            records.append(JobRecord.load(path))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return sorted(records, key=lambda r: r.started_at)


def find_job(jobs_dir: Path, job_id: str) -> JobRecord:
    """The job with this id, or the only one whose id starts with it."""
    matches = [r for r in list_jobs(jobs_dir) if r.job_id.startswith(job_id)]
    exact = [r for r in matches if r.job_id == job_id]
    if exact:
        return exact[0]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no job {job_id!r} in {jobs_dir}")
    raise LookupError(f"{job_id!r} matches {len(matches)} jobs: "
                      + ", ".join(r.job_id for r in matches))


# ------------------------------------------------------------------ rendering


def _count(progress: dict[str, Any], kind: str) -> str:
    done, total = progress.get(f"{kind}s_done", 0), progress.get(f"{kind}s_total", 0)
    running = progress.get(f"{kind}s_running", 0)
    return f"{kind}s {done}/{total}" + (f" ({running} running)" if running else "")


def progress_text(progress: dict[str, Any]) -> str:
    """``maps 120/200 (8 running)  reduces 0/4  failures 1  locality 97%``."""
    parts = [_count(progress, "map"), _count(progress, "reduce"),
             f"failures {progress.get('failed_attempts', 0)}"]
    if progress.get("refused_launches"):
        parts.append(f"refused launches {progress['refused_launches']}")
    if progress.get("maps_rerun"):
        parts.append(f"re-run maps {progress['maps_rerun']}")
    if progress.get("preempted_attempts"):
        parts.append(f"preempted {progress['preempted_attempts']}")
    if progress.get("speculative_attempts"):
        parts.append(f"speculative {progress['speculative_attempts']}")
    locality = progress.get("locality")
    if locality is not None:
        parts.append(f"locality {locality:.0%}")
    return "  ".join(parts)


def progress_bar(progress: dict[str, Any], width: int = 30) -> str:
    """Maps fill the first half of the bar, reduces the second."""
    def share(kind: str) -> float:
        total = progress.get(f"{kind}s_total", 0)
        return progress.get(f"{kind}s_done", 0) / total if total else 0.0
    filled = round(width * (share("map") + share("reduce")) / 2)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def describe(record: JobRecord) -> str:
    """The `dyad-batch status` text."""
    lines = [f"job       {record.job_id} ({record.name})",
             f"state     {record.shown_state}",
             f"master    {record.master}" + (f"  framework {record.framework_id}"
                                              if record.framework_id else ""),
             f"output    {record.output}",
             f"started   {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.started_at))}"
             f"  elapsed {record.elapsed:.1f}s",
             f"progress  {progress_text(record.progress)}"]
    if record.error:
        lines.append(f"error     {record.error}")
    return "\n".join(lines)


def table(records: list[JobRecord]) -> str:
    """The `dyad-batch list` text: one line per job."""
    if not records:
        return "no jobs"
    rows = [("JOB", "NAME", "STATE", "ELAPSED", "PROGRESS")]
    rows += [(r.job_id, r.name, r.shown_state, f"{r.elapsed:.1f}s", progress_text(r.progress))
             for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4]
                     for row in rows)


class ProgressPrinter:
    """Shows progress on `stream`: a bar redrawn in place on a terminal, otherwise a
    plain line whenever a task finishes or fails, at most once per
    `PLAIN_INTERVAL` unless a phase ends (logs stay readable)."""

    def __init__(self, stream: TextIO, tty: bool | None = None,
                 clock: Any = time.monotonic) -> None:
        self._stream = stream
        self._tty = stream.isatty() if tty is None else tty
        self._clock = clock
        self._last_text = ""
        self._last_at = float("-inf")
        self._last: dict[str, Any] = {}

    def update(self, progress: dict[str, Any]) -> None:
        text = progress_text(progress)
        if self._tty:
            if text != self._last_text:
                self._stream.write(f"\r{progress_bar(progress)} {text}\x1b[K")
                self._stream.flush()
        elif self._worth_a_line(progress):
            self._stream.write(text + "\n")
            self._stream.flush()
            self._last_at = self._clock()
        self._last_text, self._last = text, progress

    def _worth_a_line(self, progress: dict[str, Any]) -> bool:
        keys = ("maps_done", "reduces_done", "failed_attempts", "maps_rerun")
        if all(progress.get(k) == self._last.get(k) for k in keys):
            return False
        phase_ended = any(progress.get(f"{k}s_done") == progress.get(f"{k}s_total")
                          != self._last.get(f"{k}s_done") for k in ("map", "reduce"))
        return phase_ended or self._clock() - self._last_at >= PLAIN_INTERVAL

    def close(self) -> None:
        if self._tty and self._last_text:
            self._stream.write("\n")
            self._stream.flush()
