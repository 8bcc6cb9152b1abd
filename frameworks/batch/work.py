"""What a batch task does once it reaches an agent: read a split, map, partition,
sort and spill; or fetch every map's partition (the shuffle), merge, reduce and
commit a part file. The executor runs these functions in worker threads; they are
plain blocking code so they can be tested without an agent.

File formats:

- Intermediate files (one per map attempt and reduce partition, in the executor's
  sandbox under ``maps/<attempt>/part-NNNNN``): one record per line,
  ``<key as JSON>\\t<value as JSON>``, sorted by the key's JSON text. JSON text
  never holds a raw tab or newline, so the split is exact.
- Output files ``OUTPUT/part-r-NNNNN``: ``text`` format writes ``key\\tvalue`` (strings
  as they are, anything else as JSON); ``json`` format writes ``[key, value]`` lines.

A reduce attempt writes into ``OUTPUT/_temporary/<attempt>/`` and renames its file
into place when complete, so a part file is never seen half written, and a second
(speculative) attempt of the same reduce can only replace it with the same bytes.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter
from typing import Any

import attrs

from frameworks.batch.wire import FETCH_FAILED_KEY, MAP, REDUCE

FETCH_TIMEOUT = 60.0
FETCH_TRIES = 2
FETCH_PARALLELISM = 4
CANCEL_CHECK_EVERY = 1024  # records between checks of the cancel flag
TEXT, JSON = "text", "json"
OUTPUT_FORMATS = (TEXT, JSON)


class TaskError(Exception):
    """The task failed for a reason the user should read (the message says it)."""


class FetchFailed(TaskError):
    """Some map outputs could not be fetched: ``failures`` names them."""

    def __init__(self, failures: list[dict[str, Any]]) -> None:
        names = ", ".join(f"map {f['map']} ({f['error']})" for f in failures[:5])
        super().__init__(f"could not fetch the output of {len(failures)} map(s): {names}")
        self.failures = failures

    def data(self) -> bytes:
        return json.dumps({FETCH_FAILED_KEY: [
            {"map": f["map"], "task_id": f["task_id"]} for f in self.failures]}).encode()


class Cancelled(Exception):
    """The task was killed while it ran."""


Fetch = Callable[[str, str, str], None]
"""fetch(agent_url, remote_path, local_path): copy one map output; raise OSError."""


# ------------------------------------------------------------------- job code


def load_module(source: str, filename: str) -> types.ModuleType:
    """Run a job module's source as a fresh module. Its directory goes on
    ``sys.path`` so it can import modules beside it (on a shared filesystem)."""
    name = "dyad_batch_job_" + hashlib.sha256(source.encode()).hexdigest()[:12]
    module = types.ModuleType(name)
    module.__file__ = filename
    directory = os.path.dirname(filename)
    if directory and directory not in sys.path:
        sys.path.append(directory)
    sys.modules[name] = module  # dataclasses and pickle look classes up here
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def check_module(module: types.ModuleType) -> None:
    """Raise TaskError unless the module defines what a job needs."""
    for name in ("map", "reduce"):
        if not callable(getattr(module, name, None)):
            raise TaskError(f"{module.__file__} must define a function {name}(key, value)"
                            if name == "map" else
                            f"{module.__file__} must define a function reduce(key, values)")
    for name in ("combine", "partition"):
        if getattr(module, name, None) is not None and not callable(getattr(module, name)):
            raise TaskError(f"{module.__file__}: {name} must be a function")


@attrs.frozen
class PythonCode:
    """A job written as Python functions (see docs/batch.md)."""

    module: types.ModuleType
    output_format: str

    @property
    def combine(self) -> Callable[[Any, list[Any]], Iterable[tuple[Any, Any]]] | None:
        return getattr(self.module, "combine", None)

    @property
    def partition(self) -> Callable[[Any, int], int] | None:
        return getattr(self.module, "partition", None)


@attrs.frozen
class CommandCode:
    """A job written as two shell commands (Hadoop streaming style)."""

    map_command: str
    reduce_command: str


Code = PythonCode | CommandCode
_codes: dict[str, Code] = {}
_codes_lock = threading.Lock()


def job_code(payload: dict[str, Any]) -> Code:
    """The code a task payload describes, loaded once per executor process."""
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    with _codes_lock:
        code = _codes.get(digest)
        if code is None:
            code = _codes[digest] = _load_code(payload)
        return code


def _load_code(payload: dict[str, Any]) -> Code:
    kind = payload.get("kind")
    if kind == "command":
        return CommandCode(str(payload["map"]), str(payload["reduce"]))
    if kind != "python":
        raise TaskError(f"unknown job kind {kind!r}")
    output_format = payload.get("format", TEXT)
    if output_format not in OUTPUT_FORMATS:
        raise TaskError(f"unknown output format {output_format!r}")
    try:
        module = load_module(str(payload["source"]), str(payload["filename"]))
    except Exception:
        raise TaskError("the job module failed to import:\n" + _traceback_tail()) from None
    check_module(module)
    return PythonCode(module, output_format)


def _traceback_tail(lines: int = 12) -> str:
    return "".join(traceback.format_exc().splitlines(keepends=True)[-lines:]).rstrip()


# ---------------------------------------------------------------- entry point


def run_task(data: bytes, sandbox: str, cancel: threading.Event,
             fetch: Fetch | None = None) -> dict[str, Any]:
    """Run the task `data` describes (as `BatchCore` wrote it); return its result
    for the TASK_FINISHED update. Raises TaskError (FetchFailed) or Cancelled."""
    try:
        message = json.loads(data)
        payload, task = message["job"], message["task"]
        kind = task["type"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TaskError(f"bad task data: {exc!r}") from None
    code = job_code(payload)
    try:
        if kind == MAP:
            return run_map(task, code, sandbox, cancel)
        if kind == REDUCE:
            return run_reduce(task, code, sandbox, cancel, fetch or http_fetch)
    except (KeyError, TypeError) as exc:
        raise TaskError(f"bad task data: {exc!r}") from None
    raise TaskError(f"unknown task type {kind!r}")


def _checker(cancel: threading.Event) -> Callable[[], None]:
    counter = itertools.count()

    def check() -> None:
        if next(counter) % CANCEL_CHECK_EVERY == 0 and cancel.is_set():
            raise Cancelled()
    return check


# ------------------------------------------------------------------------ map


def iter_split(path: str, start: int, length: int | None) -> Iterator[tuple[int, str]]:
    """(byte offset, line) for every line that *starts* in ``[start, start+length)``.

    Hadoop's rule, so that splits cut anywhere still give every line exactly once:
    a split that does not begin at 0 skips the line that started before it (even
    if only its newline lies in the split), and the last line may run past the end.
    """
    end = None if length is None else start + length
    with open(path, "rb") as handle:
        position = start
        if start > 0:
            handle.seek(start - 1)
            position = start - 1 + len(handle.readline())
        while end is None or position < end:
            line = handle.readline()
            if not line:
                return
            yield position, line.rstrip(b"\r\n").decode("utf-8", errors="replace")
            position += len(line)


def encode_key(key: Any) -> str:
    """A key's JSON text: the form keys are sorted, grouped and partitioned by."""
    try:
        return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"key {key!r} is not JSON-serializable: {exc}") from None


def encode_value(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"value {value!r} is not JSON-serializable: {exc}") from None


def run_map(task: dict[str, Any], code: Code, sandbox: str,
            cancel: threading.Event) -> dict[str, Any]:
    split, reducers, task_id = task["split"], int(task["reducers"]), str(task["task_id"])
    workdir = os.path.join(sandbox, "maps", task_id)
    os.makedirs(workdir, exist_ok=True)
    path, cached = local_input(str(split["path"]), sandbox)
    counted = _Counted(iter_split(path, int(split["start"]), split["length"]))
    if isinstance(code, PythonCode):
        pairs = _python_map(code, counted, _checker(cancel))
    else:
        pairs = _command_map(code.map_command, counted, workdir, cancel)
    partition = code.partition if isinstance(code, PythonCode) else None
    buckets = _group(pairs, reducers, partition, _checker(cancel))
    combine = code.combine if isinstance(code, PythonCode) else None
    outputs, written = [], 0
    for number, bucket in enumerate(buckets):
        target = os.path.join(workdir, f"part-{number:05d}")
        written += _spill(bucket, combine, target, _checker(cancel))
        outputs.append(agent_path(target, sandbox))
    return {"outputs": outputs, "records_in": counted.count, "records_out": written,
            "cached": cached}


def agent_path(path: str, sandbox: str) -> str:
    """Where the agent sees `path` (reducers fetch it through the agent's /files):
    in a container the sandbox is mounted elsewhere, and the agent says where it
    really is in ``DYAD_HOST_SANDBOX_DIRECTORY``."""
    path = os.path.abspath(path)
    host = os.environ.get("DYAD_HOST_SANDBOX_DIRECTORY")
    if not host:
        return path
    return os.path.join(host, os.path.relpath(path, os.path.abspath(sandbox)))


class _Counted:
    """Counts what passes through an iterator (map input records)."""

    def __init__(self, items: Iterator[tuple[int, str]]) -> None:
        self._items = items
        self.count = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for item in self._items:
            self.count += 1
            yield item


def _python_map(code: PythonCode, records: Iterable[tuple[int, str]],
                check: Callable[[], None]) -> Iterator[tuple[Any, Any]]:
    for offset, line in records:
        check()
        try:
            yield from code.module.map(offset, line)
        except Exception:
            raise TaskError(f"map raised on the line at byte {offset}:\n"
                            + _traceback_tail()) from None


def _command_map(command: str, records: Iterable[tuple[int, str]], workdir: str,
                 cancel: threading.Event) -> Iterator[tuple[str, str]]:
    source = os.path.join(workdir, "input")
    with open(source, "w", encoding="utf-8") as handle:
        for _, line in records:
            handle.write(line + "\n")
    target = os.path.join(workdir, "output")
    run_command(command, source, target, workdir, cancel)
    with open(target, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            key, _, value = line.rstrip("\n").partition("\t")
            yield key, value


def _group(pairs: Iterable[tuple[Any, Any]], reducers: int,
           partition: Callable[[Any, int], int] | None,
           check: Callable[[], None]) -> list[dict[str, tuple[Any, list[Any]]]]:
    """Partition map output and group it by key: bucket -> key text -> (key, values)."""
    buckets: list[dict[str, tuple[Any, list[Any]]]] = [{} for _ in range(reducers)]
    for pair in pairs:
        check()
        key, value = _pair(pair, "map")
        text = encode_key(key)
        if partition is None:
            number = zlib.crc32(text.encode()) % reducers
        else:
            try:
                number = partition(key, reducers)
            except Exception:
                raise TaskError(f"partition raised for key {key!r}:\n"
                                + _traceback_tail()) from None
            if not isinstance(number, int) or not 0 <= number < reducers:
                raise TaskError(f"partition({key!r}, {reducers}) returned {number!r}; "
                                f"it must return an int in 0..{reducers - 1}")
        entry = buckets[number].get(text)
        if entry is None:
            buckets[number][text] = (key, [value])
        else:
            entry[1].append(value)
    return buckets


def _pair(pair: Any, who: str) -> tuple[Any, Any]:
    try:
        key, value = pair
    except (TypeError, ValueError):
        raise TaskError(f"{who} must yield (key, value) pairs; it yielded {pair!r}") from None
    return key, value


def _spill(bucket: dict[str, tuple[Any, list[Any]]],
           combine: Callable[[Any, list[Any]], Iterable[tuple[Any, Any]]] | None,
           target: str, check: Callable[[], None]) -> int:
    """Write one partition sorted by key text, combined if the job has a combiner."""
    written = 0
    with open(target, "w", encoding="utf-8") as handle:
        for text in sorted(bucket):
            check()
            key, values = bucket[text]
            if combine is not None:
                values = _combined(combine, key, text, values)
            for value in values:
                handle.write(f"{text}\t{encode_value(value)}\n")
                written += 1
    return written


def _combined(combine: Callable[[Any, list[Any]], Iterable[tuple[Any, Any]]], key: Any,
              text: str, values: list[Any]) -> list[Any]:
    try:
        pairs = list(combine(key, values))
    except Exception:
        raise TaskError(f"combine raised for key {key!r}:\n" + _traceback_tail()) from None
    result = []
    for pair in pairs:
        out_key, value = _pair(pair, "combine")
        if encode_key(out_key) != text:
            raise TaskError(f"combine must keep the key it was given ({key!r}); "
                            f"it yielded {pair!r}")
        result.append(value)
    return result


def local_input(path: str, sandbox: str) -> tuple[str, bool]:
    """A readable local path for an input, and whether this host now caches it.
    ``http(s)://`` inputs are downloaded once per executor into its sandbox."""
    if not path.startswith(("http://", "https://")):
        return path, False
    cache = os.path.join(sandbox, "cache")
    os.makedirs(cache, exist_ok=True)
    target = os.path.join(cache, hashlib.sha256(path.encode()).hexdigest()[:32])
    if not os.path.exists(target):
        partial = f"{target}.{threading.get_ident()}.part"
        try:
            with urllib.request.urlopen(path, timeout=FETCH_TIMEOUT) as response, \
                    open(partial, "wb") as handle:
                shutil.copyfileobj(response, handle)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise TaskError(f"could not download input {path}: {exc}") from None
        os.replace(partial, target)
    return target, True


# --------------------------------------------------------------------- reduce


def http_fetch(url: str, path: str, destination: str) -> None:
    """Copy a file from an agent's sandboxes through its ``/files/download`` API."""
    query = urllib.parse.urlencode({"path": path})
    if os.environ.get("DYAD_CA") or os.environ.get("DYAD_TOKEN"):  # a secured cluster
        from dyad.auth import ClientCredentials
        client = ClientCredentials.from_env()
        opened = client.urlopen(f"{client.base_url(url.split('://', 1)[-1])}/files/download?"
                                f"{query}", FETCH_TIMEOUT)
    else:
        opened = urllib.request.urlopen(f"{url}/files/download?{query}", timeout=FETCH_TIMEOUT)
    with opened as response, open(destination, "wb") as handle:
        shutil.copyfileobj(response, handle)


def _fetch_all(inputs: list[dict[str, Any]], workdir: str, fetch: Fetch,
               cancel: threading.Event) -> list[str]:
    def one(item: dict[str, Any]) -> str | dict[str, Any]:
        destination = os.path.join(workdir, f"map-{int(item['map']):05d}")
        error: Exception | None = None
        for attempt in range(FETCH_TRIES):
            if cancel.is_set():
                return destination
            try:
                fetch(str(item["url"]), str(item["path"]), destination)
                return destination
            except (OSError, urllib.error.URLError, ValueError) as exc:
                error = exc
                if attempt + 1 < FETCH_TRIES:
                    time.sleep(0.2 * (attempt + 1))
        return {"map": item["map"], "task_id": item["task_id"], "error": str(error)}

    with ThreadPoolExecutor(FETCH_PARALLELISM, thread_name_prefix="batch-fetch") as pool:
        results = list(pool.map(one, inputs))
    if cancel.is_set():
        raise Cancelled()
    failures = [r for r in results if isinstance(r, dict)]
    if failures:
        raise FetchFailed(failures)
    return [r for r in results if isinstance(r, str)]


def _records(path: str) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.rstrip("\n").partition("\t")
            yield key, value


def format_record(key: Any, value: Any, output_format: str) -> str:
    if output_format == JSON:
        return json.dumps([key, value], ensure_ascii=False) + "\n"
    return f"{_text(key)}\t{_text(value)}\n"


def _text(item: Any) -> str:
    return item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)


def run_reduce(task: dict[str, Any], code: Code, sandbox: str, cancel: threading.Event,
               fetch: Fetch) -> dict[str, Any]:
    index, task_id, output = int(task["index"]), str(task["task_id"]), str(task["output"])
    workdir = os.path.join(sandbox, "reduces", task_id)
    os.makedirs(workdir, exist_ok=True)
    files = _fetch_all(list(task["inputs"]), workdir, fetch, cancel)
    merged = heapq.merge(*(_records(f) for f in files), key=itemgetter(0))
    attempt_dir = os.path.join(output, "_temporary", task_id)
    try:
        # Not makedirs: once the job has ended and its output is gone, a straggling
        # attempt must fail here rather than recreate the directory.
        os.mkdir(attempt_dir)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TaskError(f"cannot write to the output {output}: {exc}") from None
    name = f"part-r-{index:05d}"
    staged = os.path.join(attempt_dir, name)
    check = _checker(cancel)
    if isinstance(code, PythonCode):
        records_in, records_out = _python_reduce(code, merged, staged, check)
    else:
        records_in = _write_stream(merged, os.path.join(workdir, "input"), check)
        run_command(code.reduce_command, os.path.join(workdir, "input"), staged, workdir,
                    cancel)
        with open(staged, "rb") as handle:
            records_out = sum(1 for _ in handle)
    final = os.path.join(output, name)
    os.replace(staged, final)
    shutil.rmtree(attempt_dir, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)  # fetched copies are not needed again
    return {"output": final, "records_in": records_in, "records_out": records_out}


def _python_reduce(code: PythonCode, merged: Iterator[tuple[str, str]], staged: str,
                   check: Callable[[], None]) -> tuple[int, int]:
    records_in = records_out = 0

    def values(group: Iterator[tuple[str, str]]) -> Iterator[Any]:
        nonlocal records_in
        for _, value in group:
            records_in += 1
            yield json.loads(value)

    with open(staged, "w", encoding="utf-8") as handle:
        for text, group in itertools.groupby(merged, key=itemgetter(0)):
            check()
            key = json.loads(text)
            try:
                for pair in code.module.reduce(key, values(group)):
                    out_key, out_value = _pair(pair, "reduce")
                    handle.write(format_record(out_key, out_value, code.output_format))
                    records_out += 1
            except TaskError:
                raise
            except Exception:
                raise TaskError(f"reduce raised for key {key!r}:\n"
                                + _traceback_tail()) from None
    return records_in, records_out


def _write_stream(merged: Iterator[tuple[str, str]], path: str,
                  check: Callable[[], None]) -> int:
    """The reduce command's stdin: ``key\\tvalue`` lines, sorted by key."""
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for text, value in merged:
            check()
            handle.write(f"{_text(json.loads(text))}\t{_text(json.loads(value))}\n")
            count += 1
    return count


def run_command(command: str, stdin_path: str, stdout_path: str, workdir: str,
                cancel: threading.Event) -> None:
    """Run ``/bin/sh -c command`` in its own process group; a kill of the task kills
    the group. Raises TaskError (with the end of its stderr) if it exits non-zero."""
    stderr_path = os.path.join(workdir, "command.stderr")
    with open(stdin_path, "rb") as stdin, open(stdout_path, "wb") as stdout, \
            open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(["/bin/sh", "-c", command], stdin=stdin, stdout=stdout,
                                   stderr=stderr, cwd=workdir, start_new_session=True)
    try:
        while True:
            try:
                status = process.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if cancel.is_set():
                    raise Cancelled() from None
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if status != 0:
        with open(stderr_path, "rb") as handle:
            tail = handle.read()[-2000:].decode("utf-8", errors="replace").strip()
        raise TaskError(f"command {command!r} exited with status {status}"
                        + (f": {tail}" if tail else ""))
