"""Containers without an engine: the wire types and their codec, the TASK_ERROR
rules, the engine create request, labels for recovery, and the engine's byte
formats (log frames, times, pull progress, stats)."""

from __future__ import annotations

import re
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.container_spec import (
    AGENT_LABEL, ContainerLabels, ContainerRun, ContainerSpecError, DockerConfig,
    check, container_name, create_request, environment,
)
from agent.docker import split_reference
from agent.docker_wire import (
    NANOS, ContainerState, ContainerUsage, LogDemuxer, PullProgress, WireError, parse_time,
    since_argument, split_timestamp,
)
from dyad.codec import CodecError, from_json, to_json
from dyad.containers import (
    NETWORKS, ContainerInfo, DockerInfo, Network, PortMapping, Volume, problems,
)
from dyad.messages import CommandInfo
from dyad.resources import Resources

PORTS = Resources.parse("cpus:1;mem:128;ports:[31000-31002]")


def docker(volumes: list[Volume] | None = None, **kwargs: Any) -> ContainerInfo:
    return ContainerInfo(docker=DockerInfo(**{"image": "busybox", **kwargs}),
                         volumes=volumes or [])


def a_run(container: ContainerInfo, **kwargs: Any) -> ContainerRun:
    fields: dict[str, Any] = {
        "agent_id": "A1", "framework_id": "F1", "executor_id": "E1", "run_id": "R1",
        "task_id": "T1", "sandbox_dir": "/work/frameworks/F1/executors/E1/runs/R1",
        "resources": PORTS, "container": container, **kwargs}
    return ContainerRun(**fields)


# ------------------------------------------------------------------- wire types

names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=12)
ports = st.integers(1, 65535)
containers = st.builds(
    ContainerInfo,
    docker=st.builds(DockerInfo, image=names, network=st.sampled_from(NETWORKS),
                     port_mappings=st.lists(st.builds(
                         PortMapping, host_port=ports, container_port=ports,
                         protocol=st.sampled_from(["tcp", "udp"])), max_size=3),
                     force_pull=st.booleans(),
                     parameters=st.dictionaries(names, names, max_size=2)),
    volumes=st.lists(st.builds(Volume, container_path=names.map(lambda n: "/" + n),
                               host_path=names, mode=st.sampled_from(["RW", "RO"])),
                     max_size=3))


@given(containers)
def test_containers_round_trip_through_the_codec(container: ContainerInfo) -> None:
    assert from_json(ContainerInfo, to_json(container)) == container


@pytest.mark.parametrize("body, where", [
    ({"docker": {"image": "x", "network": "BRIDGED"}}, "docker"),
    ({"docker": {"image": "x", "port_mappings": [{"host_port": 0, "container_port": 80}]}},
     "docker.port_mappings[0]"),
    ({"docker": {"image": "x", "port_mappings": [
        {"host_port": 1, "container_port": 80, "protocol": "sctp"}]}}, "docker.port_mappings[0]"),
    ({"volumes": [{"container_path": "/a", "host_path": "b", "mode": "rw"}],
      "docker": {"image": "x"}}, "volumes[0]"),
    ({"type": "MESOS", "docker": {"image": "x"}}, ""),
    ({}, ""),
])
def test_words_outside_the_vocabulary_are_refused_with_their_place(body: dict, where: str) -> None:
    with pytest.raises(CodecError) as raised:
        from_json(ContainerInfo, body, "container")
    assert raised.value.path == ("container." + where if where else "container")


@pytest.mark.parametrize("container, reason", [
    (docker(image=" "), "container.docker.image is empty"),
    (docker(network=Network.HOST, port_mappings=[PortMapping(host_port=31000,
                                                             container_port=80)]),
     "port_mappings need network BRIDGE, not HOST"),
    (docker(network=Network.BRIDGE, port_mappings=[PortMapping(host_port=32000,
                                                               container_port=80)]),
     r"port_mappings\[0\]: host port 32000 is not among the task's ports \(31000-31002\)"),
    (docker(network=Network.BRIDGE, port_mappings=[
        PortMapping(host_port=31000, container_port=80),
        PortMapping(host_port=31000, container_port=81)]),
     r"port_mappings\[1\]: host port 31000/tcp is mapped twice"),
    (docker(network=Network.BRIDGE, port_mappings=[
        PortMapping(host_port=31000, container_port=80),
        PortMapping(host_port=31001, container_port=80)]),
     r"port_mappings\[1\]: container port 80/tcp is mapped twice"),
    (docker(parameters={"privileged": "true"}),
     "'privileged' is not supported \\(supported: user, workdir, hostname, init\\)"),
    (docker(volumes=[Volume(container_path="data", host_path="d")]),
     r"volumes\[0\].container_path 'data' must be an absolute path"),
    (docker(volumes=[Volume(container_path="/mnt/mesos/sandbox/x", host_path="d")]),
     "would hide the root or the sandbox"),
    (docker(volumes=[Volume(container_path="/", host_path="d")]), "would hide the root"),
    (docker(volumes=[Volume(container_path="/d", host_path="a"),
                     Volume(container_path="/d/", host_path="b")]),
     r"volumes\[1\].container_path '/d/' is mounted twice"),
    (docker(volumes=[Volume(container_path="/d", host_path="../../etc")]),
     r"volumes\[0\].host_path '../../etc' must be a non-empty path without '..'"),
    (docker(volumes=[Volume(container_path="/d", host_path="a:b")]), "without '..' or ':'"),
])
def test_a_task_error_names_the_field_at_fault(container: ContainerInfo, reason: str) -> None:
    found = problems(container, PORTS)
    assert len(found) == 1 and re.search(reason, found[0]), found


def test_a_good_container_has_no_problems() -> None:
    assert problems(docker(network=Network.BRIDGE, port_mappings=[
        PortMapping(host_port=31000, container_port=80),
        PortMapping(host_port=31000, container_port=80, protocol="udp")],
        volumes=[Volume(container_path="/data", host_path="data")]), PORTS) == []


# ------------------------------------------------------------ the agent's rules


def test_the_agent_refuses_what_it_does_not_allow() -> None:
    config = DockerConfig(volume_roots=("/srv/data",), networks=(Network.HOST,))
    run = a_run(docker(network=Network.NONE, volumes=[
        Volume(container_path="/a", host_path="/srv/data/app"),
        Volume(container_path="/b", host_path="/srv/database"),
        Volume(container_path="/c", host_path="/etc")]))
    assert check(run, config) == [
        "container.docker.network NONE is not available on this agent (available: HOST)",
        "container.volumes[1].host_path '/srv/database' is outside what this agent allows "
        "(/srv/data)",
        "container.volumes[2].host_path '/etc' is outside what this agent allows (/srv/data)",
    ]
    with pytest.raises(ContainerSpecError) as raised:
        create_request(run, config)
    assert len(raised.value.problems) == 3


def test_without_volume_roots_only_sandbox_paths_may_be_mounted() -> None:
    found = check(a_run(docker(volumes=[Volume(container_path="/a", host_path="/tmp")])),
                  DockerConfig())
    assert found == ["container.volumes[0].host_path '/tmp' is outside what this agent "
                     "allows (none: only sandbox-relative paths)"]


def test_hostname_cannot_be_set_on_the_hosts_network() -> None:
    found = check(a_run(docker(network=Network.HOST, parameters={"hostname": "h"})),
                  DockerConfig())
    assert found == ["container.docker.parameters: hostname cannot be set under network HOST"]


def test_the_create_request_carries_sandbox_limits_ports_and_labels() -> None:
    run = a_run(docker(network=Network.BRIDGE, parameters={"init": "true", "user": "nobody"},
                       port_mappings=[PortMapping(host_port=31001, container_port=8080)],
                       volumes=[Volume(container_path="/data", host_path="state", mode="RO"),
                                Volume(container_path="/srv", host_path="/srv/data/x")]),
                command=CommandInfo(shell="exec httpd -p $PORT0"),
                env={"A": "1", "PORT0": "31001"},
                cpus=1.5, mem_bytes=256 * 1024 * 1024)
    body = create_request(run, DockerConfig(volume_roots=("/srv/data",)))
    sandbox = run.sandbox_dir
    assert body == {
        "Image": "busybox",
        "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["exec httpd -p $PORT0"],
        "Env": ["A=1", "MESOS_SANDBOX=/mnt/mesos/sandbox", "PORT0=31001"],
        "Labels": {"dyad.agent_id": "A1", "dyad.framework_id": "F1", "dyad.executor_id": "E1",
                   "dyad.run_id": "R1", "dyad.task_id": "T1"},
        "WorkingDir": "/mnt/mesos/sandbox", "User": "nobody",
        "AttachStdin": False, "AttachStdout": False, "AttachStderr": False, "Tty": False,
        "OpenStdin": False, "ExposedPorts": {"8080/tcp": {}},
        "HostConfig": {
            "Binds": [f"{sandbox}:/mnt/mesos/sandbox:rw", f"{sandbox}/state:/data:ro",
                      "/srv/data/x:/srv:rw"],
            "NetworkMode": "bridge", "RestartPolicy": {"Name": "no"},
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "16m", "max-file": "2"}},
            "PortBindings": {"8080/tcp": [{"HostIp": "", "HostPort": "31001"}]},
            "Memory": 256 * 1024 * 1024, "MemorySwap": 256 * 1024 * 1024,
            "CpuShares": 1536, "NanoCpus": 1_500_000_000, "Init": True,
        },
    }


@pytest.mark.parametrize("command, expected", [
    (None, {}),
    (CommandInfo(argv=["/app", "--port", "1"]), {"Entrypoint": ["/app"],
                                                 "Cmd": ["--port", "1"]}),
    (CommandInfo(shell="echo hi", user="app"), {"Entrypoint": ["/bin/sh", "-c"],
                                                "Cmd": ["echo hi"], "User": "app"}),
])
def test_commands_map_onto_entrypoint_and_cmd(command: CommandInfo | None,
                                              expected: dict) -> None:
    body = create_request(a_run(docker(), command=command), DockerConfig(cpu_hard_limit=False))
    assert {k: body[k] for k in ("Entrypoint", "Cmd", "User") if k in body} == expected
    host = body["HostConfig"]
    assert isinstance(host, dict)
    assert "Memory" not in host and "NanoCpus" not in host  # nothing asked, nothing limited


def test_args_go_to_the_images_own_entrypoint() -> None:
    body = create_request(a_run(docker(), args=("--port", "80")), DockerConfig())
    assert body["Cmd"] == ["--port", "80"] and "Entrypoint" not in body


def test_a_small_cpu_share_stays_above_the_kernels_floor() -> None:
    body = create_request(a_run(docker(), cpus=0.001), DockerConfig(cpu_hard_limit=False))
    host = body["HostConfig"]
    assert isinstance(host, dict) and host["CpuShares"] == 2 and "NanoCpus" not in host


@pytest.mark.parametrize("network", NETWORKS)
def test_the_environment_is_the_runs_and_the_sandboxs(network: str) -> None:
    env = environment(a_run(docker(network=network), env={"PORT0": "31000"}))
    assert env == {"PORT0": "31000", "MESOS_SANDBOX": "/mnt/mesos/sandbox"}


ids = st.text(min_size=1, max_size=40).filter(lambda s: "\0" not in s)


@given(ids, ids, ids, ids, st.text(max_size=20))
def test_labels_read_back_what_they_wrote(agent: str, framework: str, executor: str,
                                          run: str, task: str) -> None:
    labels = ContainerLabels(agent, framework, executor, run, task)
    assert ContainerLabels.parse(labels.to_labels()) == labels
    assert ContainerLabels.parse({**labels.to_labels(), "other": "x"}) == labels


@pytest.mark.parametrize("labels", [None, {}, {AGENT_LABEL: "A1"},
                                    {**ContainerLabels("A", "F", "E", "").to_labels()}])
def test_containers_without_a_whole_label_set_are_not_ours(labels: dict | None) -> None:
    assert ContainerLabels.parse(labels) is None


@given(ids, ids)
def test_container_names_are_ones_the_engine_accepts(agent: str, run: str) -> None:
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", container_name(agent, run))


# ------------------------------------------------------------ the engine's bytes


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


frames = st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=50)), max_size=8)


@given(frames, st.data())
def test_log_frames_survive_any_cut_of_the_stream(sent: list[tuple[int, bytes]],
                                                  data: st.DataObject) -> None:
    stream = b"".join(frame(s, p) for s, p in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    demuxer = LogDemuxer()
    received = []
    for begin, end in zip([0, *cuts], [*cuts, len(stream)]):
        received += demuxer.feed(stream[begin:end])
    assert received == sent and demuxer.pending == 0


def test_a_frame_for_an_unknown_stream_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="unknown stream 9"):
        LogDemuxer().feed(frame(9, b"x"))


@pytest.mark.parametrize("text, nanos", [
    ("1970-01-01T00:00:01Z", NANOS),
    ("2026-12-01T08:50:09.538392541Z", 1796115009 * NANOS + 538392541),
    ("2026-12-01T08:50:09.5Z", 1796115009 * NANOS + 500_000_000),
])
def test_engine_times_keep_their_nanoseconds(text: str, nanos: int) -> None:
    assert parse_time(text) == nanos
    assert split_timestamp(text.encode() + b" a line\n") == (nanos, b"a line\n")


@given(st.integers(0, 4_000_000_000 * NANOS))
def test_since_is_seconds_dot_nanoseconds(nanos: int) -> None:
    seconds, fraction = since_argument(nanos).split(".")
    assert int(seconds) * NANOS + int(fraction) == nanos and len(fraction) == 9


@pytest.mark.parametrize("payload", [b"no-timestamp", b"2026-12-01T08:50:09 x",
                                     b"yesterday-ish x"])
def test_payloads_without_a_good_time_are_wire_errors(payload: bytes) -> None:
    with pytest.raises(WireError):
        split_timestamp(payload)


def test_pull_progress_sums_layers_into_one_line() -> None:
    progress = PullProgress("app:1")
    assert progress.summary() == "pulling app:1"
    for line in [
        {"status": "Pulling from library/app", "id": "1"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "a1"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "b2"},
        {"status": "Already exists", "progressDetail": {}, "id": "c3"},
        {"status": "Downloading", "progressDetail": {"current": 1048576, "total": 4194304},
         "id": "a1"},
        {"status": "Downloading", "progressDetail": {"current": 524288, "total": 2097152},
         "id": "b2"},
    ]:
        progress.feed(line)
    assert progress.summary() == "pulling app:1: 1/3 layers, 1.5 of 6.0 MiB downloaded"
    for line in [{"status": "Download complete", "progressDetail": {}, "id": "a1"},
                 {"status": "Extracting", "progressDetail": {"current": 5, "total": 9},
                  "id": "a1"},
                 {"status": "Pull complete", "progressDetail": {}, "id": "a1"},
                 {"status": "Digest: sha256:abc"}]:
        progress.feed(line)
    assert progress.summary() == "pulling app:1: 2/3 layers, 4.5 of 6.0 MiB downloaded"
    assert progress.last_status == "Digest: sha256:abc"


def test_pull_progress_keeps_the_engines_error() -> None:
    progress = PullProgress("nope")
    progress.feed({"errorDetail": {"message": "manifest unknown"}, "error": "manifest unknown"})
    assert progress.error == "manifest unknown"
    assert progress.summary() == "pulling nope failed: manifest unknown"
    with pytest.raises(WireError):
        progress.feed(["not", "an", "object"])


def test_usage_reads_cgroups_v1_stats() -> None:
    usage = ContainerUsage.from_stats({
        "cpu_stats": {"cpu_usage": {"total_usage": 3 * NANOS, "usage_in_usermode": 2 * NANOS,
                                    "usage_in_kernelmode": NANOS},
                      "throttling_data": {"throttled_periods": 4, "throttled_time": NANOS // 2}},
        "memory_stats": {"usage": 10_000, "max_usage": 12_000, "limit": 64_000,
                         "stats": {"total_inactive_file": 1_000}},
        "pids_stats": {"current": 3}})
    assert usage == ContainerUsage(
        cpus_user_time=2.0, cpus_system_time=1.0, cpus_total_time=3.0, mem_bytes=9_000,
        mem_limit_bytes=64_000, mem_peak_bytes=12_000, processes=3, cpus_nr_throttled=4,
        cpus_throttled_time=0.5)


def test_usage_reads_cgroups_v2_stats_and_survives_gaps() -> None:
    usage = ContainerUsage.from_stats({"memory_stats": {"usage": 5_000,
                                                        "stats": {"inactive_file": 500}},
                                       "cpu_stats": None})
    assert (usage.mem_bytes, usage.mem_peak_bytes, usage.cpus_total_time) == (4_500, 0, 0.0)
    with pytest.raises(WireError):
        ContainerUsage.from_stats([])


def test_state_reads_exit_code_and_oom() -> None:
    state = ContainerState.from_inspect({
        "Id": "c1", "State": {"Status": "exited", "Running": False, "ExitCode": 137,
                              "OOMKilled": True, "Error": "", "Pid": 0},
        "Config": {"Labels": {"dyad.run_id": "R1"}}})
    assert (state.exit_code, state.oom_killed, state.labels) == (137, True, {"dyad.run_id": "R1"})


@pytest.mark.parametrize("image, expected", [
    ("busybox", ("busybox", "latest")),
    ("busybox:1.36", ("busybox", "1.36")),
    ("registry:5000/team/app", ("registry:5000/team/app", "latest")),
    ("registry:5000/team/app:2", ("registry:5000/team/app", "2")),
    ("app@sha256:abc", ("app", "sha256:abc")),
])
def test_image_references_split_into_name_and_tag(image: str, expected: tuple) -> None:
    assert split_reference(image) == expected

