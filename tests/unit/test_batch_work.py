"""What a batch task does on an agent, run in-process: splits read by Hadoop's
line rule, map/partition/sort/spill, the merge and reduce, streaming commands,
commit into the output, and the errors a user sees. The shuffle's fetch is a
local copy here (the integration test fetches over the agents' HTTP API)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks.batch import work
from frameworks.batch.wire import FETCH_FAILED_KEY
from frameworks.batch.work import Cancelled, FetchFailed, TaskError, iter_split, run_task

WORDCOUNT = Path(__file__).resolve().parents[2] / "examples" / "wordcount.py"
TEXT = "the cat sat\non the mat\n\nthe end\nno newline at the end"


def python_payload(source: str | None = None, output_format: str = "text",
                   filename: str = str(WORDCOUNT)) -> dict[str, Any]:
    return {"kind": "python", "source": source or WORDCOUNT.read_text(),
            "filename": filename, "format": output_format}


def task_data(payload: dict[str, Any], task: dict[str, Any]) -> bytes:
    return json.dumps({"job": payload, "task": task}).encode()


def map_task(index: int, path: Path | str, reducers: int, start: int = 0,
             length: int | None = None) -> dict[str, Any]:
    return {"type": "map", "index": index, "task_id": f"map-{index:05d}-1",
            "reducers": reducers, "output": "", "split": {
                "path": str(path), "start": start, "length": length}}


def local_fetch(url: str, path: str, destination: str) -> None:
    shutil.copyfile(path, destination)


class Job:
    """Runs maps, then reduces, in this process, the way executors would."""

    def __init__(self, tmp: Path, payload: dict[str, Any], reducers: int = 2) -> None:
        self.tmp, self.payload, self.reducers = tmp, payload, reducers
        self.output = tmp / "out"
        (self.output / "_temporary").mkdir(parents=True)
        self.maps: list[dict[str, Any]] = []
        self.sandbox = tmp / "sandbox"

    def map(self, path: Path | str, **split: Any) -> dict[str, Any]:
        task = map_task(len(self.maps), path, self.reducers, **split)
        result = run_task(task_data(self.payload, task), str(self.sandbox), threading.Event())
        self.maps.append({"map": task["index"], "task_id": task["task_id"],
                          "url": "http://agent", "outputs": result["outputs"]})
        return result

    def reduce(self, index: int, fetch: work.Fetch = local_fetch,
               cancel: threading.Event | None = None) -> dict[str, Any]:
        task = {"type": "reduce", "index": index, "task_id": f"reduce-{index:05d}-1",
                "reducers": self.reducers, "output": str(self.output),
                "inputs": [{"map": m["map"], "task_id": m["task_id"], "url": m["url"],
                            "path": m["outputs"][index]} for m in self.maps]}
        return run_task(task_data(self.payload, task), str(self.sandbox),
                        cancel or threading.Event(), fetch)

    def output_lines(self) -> list[str]:
        return [line for part in sorted(self.output.glob("part-r-*"))
                for line in part.read_text().splitlines()]


# ---------------------------------------------------------------- splits


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\r\n"),
                              max_size=12), max_size=15),
       final_newline=st.booleans(), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_splits_cut_anywhere_give_every_line_once(tmp_path_factory: Any, lines: list[str],
                                                 final_newline: bool, cuts: list[int]) -> None:
    content = "\n".join(lines) + ("\n" if final_newline and lines else "")
    path = tmp_path_factory.mktemp("split") / "input"
    path.write_text(content, encoding="utf-8")
    size = path.stat().st_size
    bounds = sorted({0, size, *(c for c in cuts if c < size)})
    read = [line for start, end in zip(bounds, bounds[1:])
            for _, line in iter_split(str(path), start, end - start)]
    expected = content.split("\n")
    if expected[-1] == "":
        expected.pop()  # after a final newline there is no further line
    assert read == expected


def test_split_offsets_are_byte_offsets_of_lines(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"ab\r\ncd\nef")
    assert list(iter_split(str(path), 0, None)) == [(0, "ab"), (4, "cd"), (7, "ef")]
    assert list(iter_split(str(path), 4, 3)) == [(4, "cd")]
    assert list(iter_split(str(path), 5, 3)) == [(7, "ef")]


# ------------------------------------------------------------------ map+reduce


def expected_counts(text: str) -> dict[str, int]:
    module = work.load_module(WORDCOUNT.read_text(), str(WORDCOUNT))
    return dict(Counter(w for line in text.splitlines() for w in module.words(line)))


def test_wordcount_maps_then_reduces_to_the_counts(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    text = "\n".join([TEXT] * 50)
    source.write_text(text)
    job = Job(tmp_path, python_payload(), reducers=3)
    size = source.stat().st_size
    results = [job.map(source, start=s, length=min(97, size - s)) for s in range(0, size, 97)]
    assert sum(r["records_in"] for r in results) == len(text.split("\n"))
    for result in results:
        for path in result["outputs"]:
            keys = [json.loads(line.split("\t")[0]) for line in Path(path).read_text().splitlines()]
            assert keys == sorted(keys) and len(keys) == len(set(keys))  # sorted, combined
    for index in range(3):
        result = job.reduce(index)
        assert result["output"] == str(job.output / f"part-r-{index:05d}")
    got = {k: int(v) for k, v in (line.split("\t") for line in job.output_lines())}
    assert got == expected_counts(text)
    assert list((job.output / "_temporary").iterdir()) == []


def test_each_key_goes_to_one_reducer_and_partition_can_be_chosen(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("b a\nc a\n")
    module = ("def map(k, line):\n    for w in line.split():\n        yield w, 1\n"
              "def partition(key, n):\n    return 0 if key < 'b' else 1\n"
              "def reduce(key, values):\n    yield key, len(list(values))\n")
    job = Job(tmp_path, python_payload(module), reducers=2)
    job.map(source)
    job.reduce(0)
    job.reduce(1)
    assert (job.output / "part-r-00000").read_text() == "a\t2\n"
    assert (job.output / "part-r-00001").read_text() == "b\t1\nc\t1\n"


def test_json_output_format_keeps_types(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("1 2\n3\n")
    module = ("def map(k, line):\n    for n in line.split():\n        yield [int(n) % 2], int(n)\n"
              "def reduce(key, values):\n    yield key, sorted(values)\n")
    job = Job(tmp_path, python_payload(module, output_format="json"), reducers=1)
    job.map(source)
    job.reduce(0)
    assert [json.loads(line) for line in job.output_lines()] == [[[0], [2]], [[1], [1, 3]]]


def test_streaming_commands_map_and_reduce(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text(TEXT)
    payload = {"kind": "command",
               "map": "tr -s ' ' '\\n' | grep -v '^$' | sed 's/$/\\t1/'",
               "reduce": "awk -F'\\t' '{c[$1]+=$2} END {for (k in c) print k \"\\t\" c[k]}'"}
    job = Job(tmp_path, payload, reducers=2)
    job.map(source)
    job.reduce(0)
    job.reduce(1)
    got = {k: int(v) for k, v in (line.split("\t") for line in job.output_lines())}
    assert got == dict(Counter(TEXT.split()))


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize(("module", "message"), [
    ("def map(k, v):\n    yield 1 / 0\ndef reduce(k, v):\n    pass\n",
     "map raised on the line at byte 0:"),
    ("def map(k, v):\n    yield {1, 2}, 1\ndef reduce(k, v):\n    pass\n",
     "is not JSON-serializable"),
    ("def map(k, v):\n    yield 'just a key'\ndef reduce(k, v):\n    pass\n",
     "map must yield (key, value) pairs; it yielded 'just a key'"),
    ("def map(k, v):\n    yield k, 1\ndef partition(k, n):\n    return n\n"
     "def reduce(k, v):\n    pass\n", "partition(0, 2) returned 2"),
    ("def map(k, v):\n    yield 'a', 1\ndef combine(k, vs):\n    yield 'b', 1\n"
     "def reduce(k, v):\n    pass\n", "combine must keep the key it was given"),
    ("import no_such_module_here\n", "the job module failed to import"),
    ("def map(k, v):\n    pass\n", "must define a function reduce(key, values)"),
])
def test_map_errors_tell_the_user_what_went_wrong(tmp_path: Path, module: str,
                                                  message: str) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x\n")
    job = Job(tmp_path, python_payload(module, filename=str(tmp_path / "job.py")))
    with pytest.raises(TaskError) as caught:
        job.map(source)
    assert message in str(caught.value)


def test_reduce_error_names_the_key(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x\n")
    module = "def map(k, v):\n    yield v, 1\ndef reduce(k, vs):\n    raise KeyError(k)\n"
    job = Job(tmp_path, python_payload(module, filename=str(tmp_path / "job.py")), reducers=1)
    job.map(source)
    with pytest.raises(TaskError, match="reduce raised for key 'x'"):
        job.reduce(0)


def test_failing_command_reports_its_status_and_stderr(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x\n")
    job = Job(tmp_path, {"kind": "command", "map": "echo broken >&2; exit 3", "reduce": "cat"})
    with pytest.raises(TaskError, match="exited with status 3: broken"):
        job.map(source)


def test_unfetchable_map_outputs_are_named(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text(TEXT)
    job = Job(tmp_path, python_payload(), reducers=1)
    job.map(source)
    job.map(source)
    calls: list[str] = []

    def flaky(url: str, path: str, destination: str) -> None:
        calls.append(path)
        if "map-00001" in path:
            raise ConnectionRefusedError("agent down")
        local_fetch(url, path, destination)

    with pytest.raises(FetchFailed) as caught:
        job.reduce(0, fetch=flaky)
    assert json.loads(caught.value.data()) == {
        FETCH_FAILED_KEY: [{"map": 1, "task_id": "map-00001-1"}]}
    assert "map 1 (agent down)" in str(caught.value)
    assert len(calls) == 1 + work.FETCH_TRIES  # a failed fetch is tried again once
    assert not list(job.output.glob("part-*"))


def test_reduce_after_the_output_was_removed_fails_instead_of_recreating_it(
        tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text(TEXT)
    job = Job(tmp_path, python_payload(), reducers=1)
    job.map(source)
    shutil.rmtree(job.output)
    with pytest.raises(TaskError, match="cannot write to the output"):
        job.reduce(0)
    assert not job.output.exists()


def test_bad_task_data_is_a_task_error(tmp_path: Path) -> None:
    for data in (b"not json", b'{"job": {}}', json.dumps(
            {"job": python_payload(), "task": {"type": "sort"}}).encode()):
        with pytest.raises(TaskError, match="bad task data|unknown task type"):
            run_task(data, str(tmp_path), threading.Event())


# ------------------------------------------------------------------ cancels


def test_cancelled_task_stops(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x\n" * 5000)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        run_task(task_data(python_payload(), map_task(0, source, 1)), str(tmp_path), cancel)


def test_cancel_kills_a_running_command(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x\n")
    pid_file = tmp_path / "pid"
    payload = {"kind": "command", "map": f"echo $$ > {pid_file}; sleep 30", "reduce": "cat"}
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    began = time.monotonic()
    with pytest.raises(Cancelled):
        run_task(task_data(payload, map_task(0, source, 1)), str(tmp_path), cancel)
    assert time.monotonic() - began < 5
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_http_inputs_are_downloaded_once_per_executor(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "words.txt").write_text("b a\na\n")
    requests: list[str] = []

    class Site(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path / "site"), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/words.txt"
        job = Job(tmp_path, python_payload(), reducers=1)
        first = job.map(url)
        second = job.map(url)
        missing = f"http://127.0.0.1:{server.server_address[1]}/nothing.txt"
        with pytest.raises(TaskError, match="could not download input .*nothing.txt"):
            job.map(missing)
    finally:
        server.shutdown()
        server.server_close()
    assert first["cached"] and second["cached"] and first["records_in"] == 2
    assert requests.count("/words.txt") == 1  # the second map read the cache
    job.reduce(0)
    assert job.output_lines() == ["a\t4", "b\t2"]  # both maps read the same file
