"""A batch job as a user describes it (`Job`), and what the submitter checks and
works out before it asks the cluster for anything (`prepare`): the inputs exist,
the output does not, the job module imports and defines ``map`` and ``reduce``,
and the inputs cut into splits.

Inputs are glob patterns, directories, files or ``http(s)://`` URIs. A local input
may name the hosts that hold its data, rsync-style: ``agent1:/data/part-0.txt`` or
``agent1,agent2:/data/*.txt``. The scheduler prefers those hosts for its maps (data
locality). Every agent must still be able to read the path: Dyad has no
distributed filesystem, so on the local cluster (one shared filesystem) the hosts
only say where the data *would* be local.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import types
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from dyad import priority as priorities
from dyad.containers import DOCKER, ContainerInfo, DockerInfo, Network, Volume, VolumeMode
from dyad.messages import CommandInfo, ExecutorInfo
from dyad.resources import Resources
from frameworks.batch.config import CoreConfig, Split
from frameworks.batch.work import OUTPUT_FORMATS, TEXT, TaskError, check_module, load_module

DEFAULT_SPLIT_SIZE = 32 * 1024 * 1024
SPLIT_SLOP = 1.1
"""A file's last split may be up to 10% bigger rather than leave a tiny one (Hadoop's rule)."""
MAX_MODULE_BYTES = 256 * 1024
"""Every task carries the job module's source; this keeps task messages small."""
EXECUTOR_ID = "dyad-batch-executor"
TEMPORARY = "_temporary"
SUCCESS = "_SUCCESS"

_HOSTS_PREFIX = re.compile(r"^([A-Za-z0-9_.\-]+(?:,[A-Za-z0-9_.\-]+)*):(.+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")


class JobError(ValueError):
    """The job cannot run as given; the message says why and what to change."""


def _tuple_of_str(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


@attrs.frozen(kw_only=True)
class Job:
    """A MapReduce job. Give either `module` (a ``.py`` file, or an imported module,
    defining ``map(key, value)`` and ``reduce(key, values)``, optionally ``combine``
    and ``partition``) or both `map_command` and `reduce_command` (shell commands
    that read records on stdin and write ``key<TAB>value`` lines on stdout).

    Resources are per task; each agent the job uses also runs one executor with
    `executor_cpus`/`executor_mem`. `locality_wait` is how long (seconds) the
    scheduler declines non-local offers while maps with preferred hosts wait (0
    turns delay scheduling off)."""

    inputs: tuple[str, ...] = attrs.field(converter=_tuple_of_str)
    output: str = attrs.field(converter=str)
    module: str | types.ModuleType | None = None
    map_command: str | None = None
    reduce_command: str | None = None
    reducers: int = 1
    name: str = ""
    map_cpus: float = 0.5
    map_mem: float = 256.0
    reduce_cpus: float = 0.5
    reduce_mem: float = 256.0
    executor_cpus: float = 0.1
    executor_mem: float = 64.0
    max_attempts: int = 4
    locality_wait: float = 1.0
    speculative: bool = False
    split_size: int = DEFAULT_SPLIT_SIZE
    output_format: str = TEXT
    starvation_timeout: float = 60.0
    priority: int = priorities.DEFAULT_BATCH  # dyad/priority.py: the batch band
    revocable: bool = False  # also run on revocable resources (docs/oversubscription.md)
    executor_image: str | None = None
    """Run the executor in this Docker image (it must hold Python 3.11+ with Dyad
    installed); None runs it as a host process with this interpreter."""
    executor_python: str = "python3"
    """The interpreter inside `executor_image`."""
    executor_volumes: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    """More bind mounts for the executor's container, ``HOST:CONTAINER[:ro|rw]``."""
    executor_env: dict[str, str] = attrs.field(factory=dict)
    """More environment for the executor (either kind)."""


@attrs.frozen
class PreparedJob:
    """A checked job: its splits, the payload every task carries, and the absolute
    output directory (which does not exist yet)."""

    job: Job
    name: str
    splits: tuple[Split, ...]
    payload: str
    output: str

    def core_config(self) -> CoreConfig:
        job = self.job
        return CoreConfig(
            splits=self.splits, reducers=job.reducers, executor=executor_info(self),
            map_resources=Resources.of(cpus=job.map_cpus, mem=job.map_mem),
            reduce_resources=Resources.of(cpus=job.reduce_cpus, mem=job.reduce_mem),
            job_payload=self.payload, output=self.output, max_attempts=job.max_attempts,
            locality_wait=job.locality_wait, speculative=job.speculative,
            starvation_timeout=job.starvation_timeout, priority=job.priority,
            revocable=job.revocable)


def executor_info(prepared: PreparedJob) -> ExecutorInfo:
    """The same ExecutorInfo for every task of the job (the master refuses an
    executor id reused with a different one). As a host process the agent runs it
    with this interpreter, so the path must exist on every agent, as it does on
    `dyad local`; in an image, with the image's `executor_python`."""
    job = prepared.job
    resources = Resources.of(cpus=job.executor_cpus, mem=job.executor_mem)
    environment = {**job.executor_env, **_shuffle_credentials()}
    if job.executor_image is None:
        return ExecutorInfo(
            executor_id=EXECUTOR_ID, name="dyad-batch executor", resources=resources,
            command=CommandInfo(argv=[sys.executable, "-m", "frameworks.batch.executor"],
                                environment=environment))
    return ExecutorInfo(
        executor_id=EXECUTOR_ID, name="dyad-batch executor", resources=resources,
        command=CommandInfo(argv=[job.executor_python, "-m", "frameworks.batch.executor"],
                            environment=environment),
        container=ContainerInfo(type=DOCKER, docker=DockerInfo(
            image=job.executor_image, network=Network.HOST),  # it reaches its agent
            volumes=_executor_volumes(prepared)))


def _executor_volumes(prepared: PreparedJob) -> list[Volume]:
    """What an executor in a container must see at the paths the job names: the
    directories of local inputs (read-only) and the output (read-write), mounted at
    their own paths, then the user's extra mounts. The agent refuses host paths
    outside its ``--docker-volume-root``s, naming them."""
    inputs = sorted({os.path.dirname(s.path) for s in prepared.splits
                     if not s.path.startswith(("http://", "https://"))})
    volumes = [Volume(container_path=d, host_path=d, mode=VolumeMode.RO) for d in inputs]
    volumes.append(Volume(container_path=prepared.output, host_path=prepared.output))
    return volumes + [parse_volume(text) for text in prepared.job.executor_volumes]


def parse_volume(text: str) -> Volume:
    """``HOST:CONTAINER[:ro|rw]`` (docker run -v's shape) -> a Volume; JobError if not."""
    parts = text.split(":")
    mode = parts.pop().upper() if len(parts) == 3 else VolumeMode.RW
    if len(parts) != 2 or not all(p.startswith("/") for p in parts) or mode not in (
            VolumeMode.RO, VolumeMode.RW):
        raise JobError(f"executor volume {text!r} must be HOST:CONTAINER[:ro|rw] "
                       "with absolute paths")
    return Volume(container_path=parts[1], host_path=parts[0], mode=mode)


def _shuffle_credentials() -> dict[str, str]:
    """On a secured cluster reducers read map outputs from other agents' /files
    as this framework: they get its token (an executor's environment is private
    to it; docs/security.md)."""
    if not (os.environ.get("DYAD_TOKEN") or os.environ.get("DYAD_TOKEN_FILE")):
        return {}
    from dyad.auth import client_token
    token = client_token()
    return {"DYAD_TOKEN": token} if token else {}


# -------------------------------------------------------------------- checks


def prepare(job: Job) -> PreparedJob:
    """Check everything that can be checked here; raise JobError if anything is
    wrong. Runs the job module's top-level code once, to see that it imports."""
    _check_numbers(job)
    output = os.path.abspath(os.path.expanduser(job.output))
    if os.path.lexists(output):
        raise JobError(f"output {job.output} already exists; remove it or choose another")
    payload, default_name = _payload(job)
    files = expand_inputs(job.inputs)
    splits = make_splits(files, job.split_size)
    if not splits:
        raise JobError(f"the inputs ({', '.join(job.inputs)}) hold no data")
    return PreparedJob(job=job, name=job.name or default_name, splits=splits,
                       payload=json.dumps(payload), output=output)


def _check_numbers(job: Job) -> None:
    problems = []
    if not job.inputs:
        problems.append("give at least one input")
    if job.reducers < 1:
        problems.append("reducers must be at least 1")
    if job.max_attempts < 1:
        problems.append("max_attempts must be at least 1")
    try:
        priorities.check_priority(job.priority)
    except priorities.PriorityError as exc:
        problems.append(str(exc))
    if min(job.map_cpus, job.map_mem, job.reduce_cpus, job.reduce_mem) <= 0:
        problems.append("task cpus and mem must be positive")
    if job.executor_cpus < 0 or job.executor_mem < 0:
        problems.append("executor cpus and mem must not be negative")
    if job.locality_wait < 0:
        problems.append("locality_wait must not be negative")
    if job.split_size < 1:
        problems.append("split_size must be positive")
    if job.starvation_timeout <= 0:
        problems.append("starvation_timeout must be positive")
    if job.output_format not in OUTPUT_FORMATS:
        problems.append(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}")
    if job.executor_volumes and job.executor_image is None:
        problems.append("executor volumes need an executor image")
    for text in job.executor_volumes:
        try:
            parse_volume(text)
        except JobError as exc:
            problems.append(str(exc))
    if problems:
        raise JobError("; ".join(problems))


def _payload(job: Job) -> tuple[dict[str, str], str]:
    """What every task carries to say what code to run, and a default job name."""
    commands = (job.map_command, job.reduce_command)
    if job.module is None:
        if not all(commands):
            raise JobError("give a job module, or both a map command and a reduce command")
        if job.output_format != TEXT:
            raise JobError("command jobs write text output only")
        return ({"kind": "command", "map": job.map_command or "",
                 "reduce": job.reduce_command or ""}, "streaming")
    if any(commands):
        raise JobError("give either a job module or map/reduce commands, not both")
    path = _module_path(job.module)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"cannot read the job module {path}: {exc}") from None
    if len(source.encode()) > MAX_MODULE_BYTES:
        raise JobError(f"the job module {path} is over {MAX_MODULE_BYTES // 1024} KiB; "
                       "move data out of it (read it from a file in map)")
    try:
        check_module(load_module(source, str(path)))
    except TaskError as exc:
        raise JobError(str(exc)) from None
    except BaseException as exc:  # its top-level code is the user's: anything goes
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise JobError(f"the job module {path} failed to import: "
                       f"{type(exc).__name__}: {exc}") from None
    return ({"kind": "python", "source": source, "filename": str(path),
             "format": job.output_format}, path.stem)


def _module_path(module: str | types.ModuleType) -> Path:
    if isinstance(module, types.ModuleType):
        filename = getattr(module, "__file__", None)
        if not filename:
            raise JobError(f"module {module.__name__} has no file to send to the agents")
        return Path(filename).resolve()
    return Path(module).expanduser().resolve()


# -------------------------------------------------------------------- inputs


@attrs.frozen
class InputFile:
    """One input: an absolute path (size known) or a URI (size None)."""

    path: str
    size: int | None
    hosts: tuple[str, ...] = ()


def parse_input(text: str) -> tuple[tuple[str, ...], str]:
    """``'agent1,agent2:/data/*.txt'`` -> ``(('agent1', 'agent2'), '/data/*.txt')``.
    URIs and plain paths have no hosts. Write ``./a:b`` for a file named ``a:b``."""
    if text.startswith(("http://", "https://")):
        return (), text
    match = _HOSTS_PREFIX.match(text)
    if match is None:
        return (), text
    return tuple(match.group(1).split(",")), match.group(2)


def expand_inputs(inputs: Sequence[str]) -> list[InputFile]:
    """Every input file, in the order given (globs sorted); raise JobError for an
    input that matches nothing or cannot be read."""
    found: dict[str, InputFile] = {}
    for text in inputs:
        hosts, pattern = parse_input(text)
        if pattern.startswith(("http://", "https://")):
            found.setdefault(pattern, InputFile(pattern, None))
            continue
        pattern = os.path.expanduser(pattern)
        matches = sorted(glob.glob(pattern)) if _GLOB_CHARS.search(pattern) else (
            [pattern] if os.path.exists(pattern) else [])
        if not matches:
            raise JobError(f"input {text} " + ("matches no files" if _GLOB_CHARS.search(
                pattern) else "does not exist"))
        for match in matches:
            for path in _files_under(match):
                if not os.access(path, os.R_OK):
                    raise JobError(f"input {path} is not readable")
                found.setdefault(path, InputFile(path, os.path.getsize(path), hosts))
    return list(found.values())


def _files_under(path: str) -> list[str]:
    """The file itself, or a directory's files (recursively, sorted), skipping names
    that start with '.' or '_' as Hadoop does (``_SUCCESS``, ``.crc``)."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        return [path]
    result = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        result += [os.path.join(root, f) for f in sorted(files) if not f.startswith((".", "_"))]
    return result


def make_splits(files: Iterable[InputFile], split_size: int) -> tuple[Split, ...]:
    """Cut files into byte ranges of about `split_size` (a URI is one split; an
    empty file none). Splits are cut anywhere: readers keep lines whole."""
    splits: list[Split] = []
    for item in files:
        if item.size is None:
            splits.append(Split(len(splits), item.path, 0, None, item.hosts))
            continue
        start = 0
        while item.size - start > split_size * SPLIT_SLOP:
            splits.append(Split(len(splits), item.path, start, split_size, item.hosts))
            start += split_size
        if item.size > start:
            splits.append(Split(len(splits), item.path, start, item.size - start, item.hosts))
    return tuple(splits)


# -------------------------------------------------------------------- output


def create_output(output: str) -> None:
    """Make the output directory and its ``_temporary`` (reduces stage files there)."""
    try:
        os.makedirs(os.path.join(output, TEMPORARY))
    except FileExistsError:
        raise JobError(f"output {output} already exists; remove it or choose another") from None
    except OSError as exc:
        raise JobError(f"cannot create the output {output}: {exc}") from None


def commit_output(output: str) -> list[str]:
    """After success: drop ``_temporary``, mark ``_SUCCESS``, list the part files."""
    shutil.rmtree(os.path.join(output, TEMPORARY), ignore_errors=True)
    Path(output, SUCCESS).touch()
    return sorted(str(p) for p in Path(output).glob("part-*"))


def remove_output(output: str) -> None:
    """After failure: no partial output is left. Retried because an attempt that
    was still running may write into it while it goes."""
    for _ in range(3):
        shutil.rmtree(output, ignore_errors=True)
        if not os.path.lexists(output):
            return
