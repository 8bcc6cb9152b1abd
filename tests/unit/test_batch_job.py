"""What the submitter checks and works out before the cluster is asked for
anything: inputs and their hosts, splits, the job module, the output directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frameworks.batch.config import Split
from frameworks.batch.job import (
    EXECUTOR_ID, InputFile, Job, JobError, commit_output, create_output, expand_inputs,
    make_splits, parse_input, parse_volume, prepare, remove_output)
from dyad.containers import Network, Volume, VolumeMode
from frameworks.batch.work import agent_path

WORDCOUNT = str(Path(__file__).resolve().parents[2] / "examples" / "wordcount.py")


@pytest.mark.parametrize(("text", "expected"), [
    ("data/*.txt", ((), "data/*.txt")),
    ("agent1:/data/a.txt", (("agent1",), "/data/a.txt")),
    ("agent1,agent-2.lan:rel/*.txt", (("agent1", "agent-2.lan"), "rel/*.txt")),
    ("http://example.com/a.txt", ((), "http://example.com/a.txt")),
    ("./a:b.txt", ((), "./a:b.txt")),
    ("/abs/a:b", ((), "/abs/a:b")),
])
def test_inputs_may_name_their_hosts(text: str, expected: tuple[tuple[str, ...], str]) -> None:
    assert parse_input(text) == expected


def test_inputs_expand_globs_and_directories(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", "sub/c.txt", "_SUCCESS", ".hidden", "_logs/x.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x" * len(name))
    files = expand_inputs([f"h1:{tmp_path}/*.txt", str(tmp_path), "https://e.org/f"])
    assert files == [
        InputFile(str(tmp_path / "a.txt"), 5, ("h1",)),
        InputFile(str(tmp_path / "b.txt"), 5, ("h1",)),
        InputFile(str(tmp_path / "sub" / "c.txt"), 9, ()),
        InputFile("https://e.org/f", None, ())]


def test_missing_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(JobError, match="input .*nothing.txt does not exist"):
        expand_inputs([str(tmp_path / "nothing.txt")])
    with pytest.raises(JobError, match=r"input .*\*.csv matches no files"):
        expand_inputs([f"{tmp_path}/*.csv"])


def test_splits_cut_big_files_and_skip_empty_ones() -> None:
    files = [InputFile("/big", 250, ("a",)), InputFile("/empty", 0),
             InputFile("/slop", 105), InputFile("http://x/y", None)]
    assert make_splits(files, 100) == (
        Split(0, "/big", 0, 100, ("a",)), Split(1, "/big", 100, 100, ("a",)),
        Split(2, "/big", 200, 50, ("a",)), Split(3, "/slop", 0, 105),
        Split(4, "http://x/y", 0, None))


def write_inputs(tmp_path: Path) -> str:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello world\n")
    return str(tmp_path / "in")


def test_prepare_builds_splits_and_the_payload(tmp_path: Path) -> None:
    prepared = prepare(Job(module=WORDCOUNT, inputs=write_inputs(tmp_path),
                           output=str(tmp_path / "out"), reducers=3, locality_wait=0.5))
    assert prepared.name == "wordcount"
    assert prepared.output == str(tmp_path / "out")
    payload = json.loads(prepared.payload)
    assert payload["kind"] == "python" and payload["filename"] == WORDCOUNT
    assert "def reduce" in payload["source"]
    config = prepared.core_config()
    assert config.reducers == 3 and config.locality_wait == 0.5
    assert config.executor.executor_id == EXECUTOR_ID
    assert str(config.map_resources) == "cpus:0.5;mem:256"
    assert [s.path for s in config.splits] == [str(tmp_path / "in" / "a.txt")]


def test_an_executor_image_mounts_the_inputs_and_output_at_their_paths(
        tmp_path: Path) -> None:
    prepared = prepare(Job(module=WORDCOUNT, inputs=write_inputs(tmp_path),
                           output=str(tmp_path / "out"), executor_image="batch:1",
                           executor_python="/usr/bin/python3",
                           executor_volumes=["/opt/dyad:/opt/dyad:ro"],
                           executor_env={"PYTHONPATH": "/opt/dyad"}))
    executor = prepared.core_config().executor
    assert executor.command.argv == ["/usr/bin/python3", "-m", "frameworks.batch.executor"]
    assert executor.command.environment == {"PYTHONPATH": "/opt/dyad"}
    assert executor.container.docker.image == "batch:1"
    assert executor.container.docker.network == Network.HOST
    inputs, output = str(tmp_path / "in"), str(tmp_path / "out")
    assert executor.container.volumes == [
        Volume(container_path=inputs, host_path=inputs, mode=VolumeMode.RO),
        Volume(container_path=output, host_path=output, mode=VolumeMode.RW),
        Volume(container_path="/opt/dyad", host_path="/opt/dyad", mode=VolumeMode.RO)]
    host = prepare(Job(module=WORDCOUNT, inputs=inputs,
                       output=str(tmp_path / "out2"))).core_config().executor
    assert host.container is None


@pytest.mark.parametrize("text", ["/a", "a:/b", "/a:/b:rx", "/a:/b:ro:x", ""])
def test_bad_executor_volumes_are_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(JobError, match="HOST:CONTAINER"):
        parse_volume(text)
    with pytest.raises(JobError, match="HOST:CONTAINER"):
        prepare(Job(module=WORDCOUNT, inputs=write_inputs(tmp_path), output=str(
            tmp_path / "out"), executor_image="i", executor_volumes=[text]))


def test_executor_volumes_need_an_image(tmp_path: Path) -> None:
    with pytest.raises(JobError, match="need an executor image"):
        prepare(Job(module=WORDCOUNT, inputs=write_inputs(tmp_path), output=str(
            tmp_path / "out"), executor_volumes=["/a:/b"]))


def test_map_outputs_are_named_where_the_agent_sees_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inside = "/mnt/mesos/sandbox/maps/m1/part-00000"
    assert agent_path(inside, "/mnt/mesos/sandbox") == inside  # a host process
    monkeypatch.setenv("DYAD_HOST_SANDBOX_DIRECTORY", "/var/dyad/runs/r1")
    assert agent_path(inside, "/mnt/mesos/sandbox") == "/var/dyad/runs/r1/maps/m1/part-00000"


def test_command_jobs_need_both_commands(tmp_path: Path) -> None:
    inputs = write_inputs(tmp_path)
    prepared = prepare(Job(map_command="cat", reduce_command="uniq -c", inputs=inputs,
                           output=str(tmp_path / "o")))
    assert json.loads(prepared.payload) == {"kind": "command", "map": "cat",
                                            "reduce": "uniq -c"}
    with pytest.raises(JobError, match="both a map command and a reduce command"):
        prepare(Job(map_command="cat", inputs=inputs, output=str(tmp_path / "o")))
    with pytest.raises(JobError, match="not both"):
        prepare(Job(module=WORDCOUNT, map_command="cat", inputs=inputs,
                    output=str(tmp_path / "o")))


@pytest.mark.parametrize(("source", "message"), [
    ("raise RuntimeError('no config')\n", "failed to import: RuntimeError: no config"),
    ("def map(:\n", "failed to import: SyntaxError"),
    ("import sys\nsys.exit(3)\n", "failed to import: SystemExit: 3"),
    ("def map(k, v):\n    pass\n", "must define a function reduce"),
    ("map = 3\ndef reduce(k, v):\n    pass\n", "must define a function map"),
])
def test_a_bad_job_module_is_refused_before_the_job(tmp_path: Path, source: str,
                                                     message: str) -> None:
    module = tmp_path / "job.py"
    module.write_text(source)
    with pytest.raises(JobError) as caught:
        prepare(Job(module=str(module), inputs=write_inputs(tmp_path),
                    output=str(tmp_path / "out")))
    assert message in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_existing_output_and_bad_numbers_are_refused(tmp_path: Path) -> None:
    inputs = write_inputs(tmp_path)
    (tmp_path / "out").mkdir()
    with pytest.raises(JobError, match="output .* already exists"):
        prepare(Job(module=WORDCOUNT, inputs=inputs, output=str(tmp_path / "out")))
    with pytest.raises(JobError, match="reducers must be at least 1; task cpus and mem"):
        prepare(Job(module=WORDCOUNT, inputs=inputs, output=str(tmp_path / "o"),
                    reducers=0, map_cpus=0))
    with pytest.raises(JobError, match="output_format must be one of text, json"):
        prepare(Job(module=WORDCOUNT, inputs=inputs, output=str(tmp_path / "o"),
                    output_format="csv"))
    with pytest.raises(JobError, match="hold no data"):
        (tmp_path / "empty").write_text("")
        prepare(Job(module=WORDCOUNT, inputs=str(tmp_path / "empty"),
                    output=str(tmp_path / "o")))


def test_output_is_created_committed_or_removed(tmp_path: Path) -> None:
    output = str(tmp_path / "out")
    create_output(output)
    with pytest.raises(JobError, match="already exists"):
        create_output(output)
    (tmp_path / "out" / "part-r-00001").write_text("b\n")
    (tmp_path / "out" / "part-r-00000").write_text("a\n")
    assert commit_output(output) == [f"{output}/part-r-00000", f"{output}/part-r-00001"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_SUCCESS", "part-r-00000", "part-r-00001"]
    remove_output(output)
    assert not (tmp_path / "out").exists()
