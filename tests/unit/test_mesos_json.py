"""Mesos v1 JSON <-> Dyad types (dyad/mesos_json.py, dyad/mesos_calls.py): every
value survives the trip to Mesos' shape and back, Mesos' own documents read as
Mesos means them, and bad input is refused with the JSON path of the fault."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyad import mesos_calls as mc
from dyad import mesos_json as mj
from dyad.containers import ContainerInfo, DockerInfo, PortMapping, Volume
from dyad.messages import (
    URI, Accept, Acknowledge, Address, CommandInfo, Decline, Error, ExecutorInfo,
    ExecutorToFramework, Failure, FrameworkInfo, FrameworkToExecutor, HealthCheck, Heartbeat,
    Kill, MasterInfo, Offer, Offers, OperationType, Reconcile, Rejected, Rescind, Subscribe,
    Subscribed, TaskInfo, TaskState, TaskStatus, Teardown, Update,
)
from dyad.resources import Resources

ids = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)
texts = st.text(max_size=8)
roles = st.sampled_from(["*", "eng", "eng/ml", "web"])
seconds = st.integers(0, 10**6).map(lambda n: n / 1000)


@st.composite
def resources(draw: st.DrawFn) -> Resources:
    total = Resources()
    for name in draw(st.lists(st.sampled_from(["cpus", "mem", "disk", "gpus", "bogomips"]),
                              unique=True, max_size=4)):
        for role in draw(st.lists(roles, unique=True, min_size=1, max_size=2)):
            total = total + Resources.scalar_milli(name, draw(st.integers(1, 10**7)), role)
    ports = sorted(draw(st.sets(st.integers(1, 200), max_size=6)))
    for i, port in enumerate(ports):  # each value once, whatever the role
        total = total + Resources.from_ranges("ports", [(port, port)], draw(roles))
    return total


commands = st.one_of(
    st.builds(CommandInfo, shell=st.text(min_size=1, max_size=10)),
    st.builds(CommandInfo, argv=st.lists(st.text(min_size=1, max_size=5), min_size=1,
                                         max_size=3),
              environment=st.dictionaries(ids, texts, max_size=2),
              uris=st.lists(st.builds(URI, value=ids, extract=st.booleans(),
                                      executable=st.booleans(), cache=st.booleans(),
                                      output_file=texts), max_size=2),
              user=texts))
health_checks = st.one_of(
    st.builds(HealthCheck, type=st.just("COMMAND"), command=commands, delay=seconds,
              interval=seconds, timeout=seconds, grace_period=seconds,
              consecutive_failures=st.integers(0, 9)),
    st.builds(HealthCheck, type=st.just("HTTP"), port=st.integers(1, 65535),
              path=st.sampled_from(["/", "/health"]), scheme=st.sampled_from(["http", "https"])),
    st.builds(HealthCheck, type=st.just("TCP"), port=st.integers(1, 65535)))
executors = st.builds(ExecutorInfo, executor_id=ids, command=commands, resources=resources(),
                      name=texts, framework_id=st.none() | ids)


@st.composite
def tasks(draw: st.DrawFn) -> TaskInfo:
    with_executor = draw(st.booleans())
    return TaskInfo(
        task_id=draw(ids), name=draw(texts), agent_id=draw(ids), resources=draw(resources()),
        command=None if with_executor else draw(commands),
        executor=draw(executors) if with_executor else None,
        data=draw(st.binary(max_size=8)), labels=draw(st.dictionaries(ids, texts, max_size=2)),
        kill_grace_period=draw(st.none() | seconds),
        health_check=draw(st.none() | health_checks))


frameworks = st.builds(
    FrameworkInfo, name=st.text(min_size=1, max_size=8),
    roles=st.lists(roles, unique=True, min_size=1, max_size=3), id=st.none() | ids,
    user=texts, hostname=texts, principal=texts, webui_url=texts, failover_timeout=seconds,
    checkpoint=st.booleans(),
    capabilities=st.lists(st.sampled_from(["MULTI_ROLE", "PARTITION_AWARE", "GPU_RESOURCES"]),
                          unique=True),
    implicit_acknowledgements=st.just(False))
offers = st.builds(
    Offer, id=ids, framework_id=ids, agent_id=ids, hostname=ids, resources=resources(),
    attributes=st.dictionaries(ids, texts, max_size=3), executor_ids=st.lists(ids, max_size=2),
    url=st.sampled_from(["", "http://10.0.0.7:5051", "https://agent.example:443"]))
statuses = st.builds(
    TaskStatus, task_id=ids, state=st.sampled_from(TaskState), reason=texts, message=texts,
    source=st.sampled_from(["", "SOURCE_MASTER", "SOURCE_AGENT", "SOURCE_EXECUTOR"]),
    agent_id=st.just("") | ids, executor_id=st.just("") | ids, uuid=st.just("") | ids,
    healthy=st.none() | st.booleans(), timestamp=seconds, data=st.binary(max_size=8))


def through_json(value: Any) -> Any:
    """What a client sees: the document as JSON text and parsed again."""
    return json.loads(json.dumps(value))


@given(resources())
def test_resources_round_trip(value: Resources) -> None:
    assert mj.resources_from_mesos(through_json(mj.resources_to_mesos(value)), "r") == value


@given(frameworks)
def test_framework_info_round_trip(info: FrameworkInfo) -> None:
    back = mj.framework_info_from_mesos(through_json(mj.framework_info_to_mesos(info)), "f")
    assert back == info


@given(offers)
def test_offer_round_trip(offer: Offer) -> None:
    assert mj.offer_from_mesos(through_json(mj.offer_to_mesos(offer)), "o") == offer


@given(tasks())
def test_task_info_round_trip(task: TaskInfo) -> None:
    assert mj.task_info_from_mesos(through_json(mj.task_info_to_mesos(task)), "t") == task


@given(statuses)
def test_task_status_round_trip(status: TaskStatus) -> None:
    assert mj.task_status_from_mesos(through_json(mj.task_status_to_mesos(status)),
                                     "s") == status


def test_container_round_trip() -> None:
    container = ContainerInfo(
        docker=DockerInfo(image="nginx:1.25", network="BRIDGE", force_pull=True,
                          port_mappings=[PortMapping(host_port=31000, container_port=80)],
                          parameters={"user": "nobody"}),
        volumes=[Volume(container_path="/data", host_path="data", mode="RO")])
    assert mj.container_from_mesos(through_json(mj.container_to_mesos(container)),
                                   "c") == container


def test_mesos_container_with_a_docker_image_runs_that_image() -> None:
    mesos = {"type": "MESOS", "mesos": {"image": {"type": "DOCKER",
                                                  "docker": {"name": "busybox"}}}}
    assert mj.container_from_mesos(mesos, "c") == ContainerInfo(docker=DockerInfo(
        image="busybox"))
    assert mj.container_from_mesos({"type": "MESOS"}, "c") is None


def test_resources_in_mesos_shapes() -> None:
    value = Resources.parse("cpus:1.5;mem:128;ports:[31000-31002,31005-31005];cpus(eng):2")
    assert mj.resources_to_mesos(value) == [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.5}, "role": "*"},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": 128.0}, "role": "*"},
        {"name": "ports", "type": "RANGES", "role": "*", "ranges": {"range": [
            {"begin": 31000, "end": 31002}, {"begin": 31005, "end": 31005}]}},
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 2.0}, "role": "eng",
         "reservations": [{"role": "eng"}]}]
    # The innermost of refined reservations is the role; `allocation_info` and
    # other keys Dyad does not know are ignored.
    refined = [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1},
                "allocation_info": {"role": "eng/ml"},
                "reservations": [{"type": "STATIC", "role": "eng"},
                                 {"type": "DYNAMIC", "role": "eng/ml"}]}]
    assert mj.resources_from_mesos(refined, "r") == Resources.parse("cpus(eng/ml):1")


def test_shell_false_command_execs_value_with_arguments() -> None:
    command = mj.command_from_mesos({"shell": False, "value": "/bin/echo",
                                     "arguments": ["echo", "hi"]}, "c")
    assert command == CommandInfo(argv=["/bin/echo", "hi"])
    assert mj.command_from_mesos({"value": "echo hi"}, "c") == CommandInfo(shell="echo hi")


def test_master_info_packs_the_ip_as_mesos_does() -> None:
    info = MasterInfo(id="m1", hostname="h", ip="127.0.0.1", port=5050, zmq_port=5055,
                      version="0.1.0", address=Address(hostname="h", ip="127.0.0.1",
                                                       port=5050))
    mesos = mj.master_info_to_mesos(info)
    assert mesos["ip"] == 16777343 and mesos["port"] == 5050
    assert mesos["address"] == {"hostname": "h", "ip": "127.0.0.1", "port": 5050}
    assert mesos["version"] == mj.MESOS_VERSION


@pytest.mark.parametrize("document, where, reason", [
    ([{"name": "cpus", "type": "SCALAR"}], "r[0].scalar", "is required"),
    ([{"name": "cpus", "type": "SCALAR", "scalar": {"value": "1"}}], "r[0].scalar.value",
     "expected a number"),
    ([{"name": "cpus", "type": "SCALAR", "scalar": {"value": -1}}], "r[0].scalar.value",
     ">= 0"),
    ([{"name": "disks", "type": "SET", "set": {"item": ["a"]}}], "r[0].type", "SET"),
    ([{"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 5, "end": 1}]}}],
     "r[0]", "invalid range"),
    ([{"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 5}]}},
      {"name": "ports", "type": "RANGES", "role": "eng",
       "ranges": {"range": [{"begin": 3, "end": 3}]}}], "r[1]", "overlaps"),
    ([{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}, "disk": {}}], "r[0].disk",
     "persistent volumes"),
    ({"name": "cpus"}, "r", "expected a list"),
    ([{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}, "role": "bad role!"}],
     "r[0]", "role"),
])
def test_bad_resources_name_the_path(document: Any, where: str, reason: str) -> None:
    with pytest.raises(mj.MesosJsonError) as caught:
        mj.resources_from_mesos(document, "r")
    assert caught.value.path == where and reason in caught.value.reason


def _launch(task: dict[str, Any]) -> dict[str, Any]:
    return {"type": "ACCEPT", "framework_id": {"value": "F1"}, "accept": {
        "offer_ids": [{"value": "O1"}], "filters": {"refuse_seconds": 30},
        "operations": [{"type": "LAUNCH", "launch": {"task_infos": [task]}}]}}


TASK = {"name": "t", "task_id": {"value": "t1"}, "agent_id": {"value": "S1"},
        "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}}],
        "command": {"value": "sleep 1"}, "some_future_field": {"x": 1}}


def test_calls_become_the_messages_dyad_drivers_send() -> None:
    call = mc.call_from_mesos(_launch(TASK))
    assert call.kind == "ACCEPT" and call.framework_id == "F1"
    assert isinstance(call.message, Accept)
    assert call.message.offer_ids == ["O1"] and call.message.filters.refuse_seconds == 30
    (operation,) = call.message.operations
    assert operation.type == OperationType.LAUNCH
    assert operation.tasks[0].command == CommandInfo(shell="sleep 1")
    fid = {"framework_id": {"value": "F1"}}
    uuid = base64.b64encode(b"u-1").decode()
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"type": "DECLINE", "decline": {"offer_ids": [{"value": "O1"}]}},
         Decline(framework_id="F1", offer_ids=["O1"])),
        ({"type": "TEARDOWN"}, Teardown(framework_id="F1")),
        ({"type": "KILL", "kill": {"task_id": {"value": "t1"}, "agent_id": {"value": "S1"},
                                   "kill_policy": {"grace_period": {"nanoseconds": 2 * 10**9}}}},
         Kill(framework_id="F1", task_id="t1", agent_id="S1", kill_grace_period=2.0)),
        ({"type": "ACKNOWLEDGE", "acknowledge": {"agent_id": {"value": "S1"},
                                                 "task_id": {"value": "t1"}, "uuid": uuid}},
         Acknowledge(framework_id="F1", agent_id="S1", task_id="t1", uuid="u-1")),
        ({"type": "RECONCILE"}, Reconcile(framework_id="F1")),
        ({"type": "MESSAGE", "message": {"agent_id": {"value": "S1"},
                                         "executor_id": {"value": "e"}, "data": "aGk="}},
         FrameworkToExecutor(framework_id="F1", agent_id="S1", executor_id="e", data=b"hi")),
        ({"type": "SHUTDOWN", "shutdown": {"agent_id": {"value": "S1"},
                                           "executor_id": {"value": "e"}}},
         mc.ShutdownExecutorCall(framework_id="F1", agent_id="S1", executor_id="e")),
        ({"type": "REQUEST", "request": {}}, None),
    ]
    for body, message in cases:
        assert mc.call_from_mesos({**body, **fid}).message == message, body


def test_subscribe_takes_the_framework_id() -> None:
    body = {"type": "SUBSCRIBE", "framework_id": {"value": "F9"},
            "subscribe": {"framework_info": {"user": "u", "name": "n", "role": "eng"}}}
    call = mc.call_from_mesos(body)
    assert call.message == Subscribe(framework=FrameworkInfo(
        name="n", user="u", id="F9", roles=["eng"], implicit_acknowledgements=False))
    body["subscribe"]["framework_info"]["id"] = {"value": "F8"}  # type: ignore[index]
    with pytest.raises(mj.MesosJsonError, match="differs"):
        mc.call_from_mesos(body)


@pytest.mark.parametrize("body, where, reason", [
    ([], "", "expected an object"),
    ({}, "type", "is required"),
    ({"type": "DANCE", "framework_id": {"value": "F"}}, "type", "unknown call type"),
    ({"type": "DECLINE", "decline": {"offer_ids": []}}, "framework_id", "is required"),
    ({"type": "DECLINE", "framework_id": {"value": ""}}, "framework_id.value", "empty"),
    ({"type": "DECLINE", "framework_id": {"value": "F"}}, "decline", "is required"),
    ({"type": "KILL", "framework_id": {"value": "F"}, "kill": {"task_id": "t1"}},
     "kill.task_id", "expected an object"),
    ({"type": "ACKNOWLEDGE", "framework_id": {"value": "F"}, "acknowledge": {
        "agent_id": {"value": "S"}, "task_id": {"value": "t"}, "uuid": "%%%"}},
     "acknowledge.uuid", "base64"),
    ({"type": "UPDATE_FRAMEWORK", "framework_id": {"value": "F"}}, "type", "not supported"),
    (_launch({**TASK, "resources": [{"name": "cpus", "type": "SCALAR",
                                     "scalar": {"value": True}}]}),
     "accept.operations[0].launch.task_infos[0].resources[0].scalar.value",
     "expected a number"),
    (_launch({**TASK, "command": {"value": "x", "environment": {"variables": [
        {"name": "K", "type": "SECRET", "secret": {}}]}}}),
     "accept.operations[0].launch.task_infos[0].command.environment.variables[0].type",
     "SECRET"),
    (_launch({**TASK, "executor": {"executor_id": {"value": "e"}, "type": "DEFAULT"}}),
     "accept.operations[0].launch.task_infos[0].executor.type", "CUSTOM"),
    ({"type": "ACCEPT", "framework_id": {"value": "F"}, "accept": {
        "offer_ids": [], "operations": [{"type": "CREATE", "create": {}}]}},
     "accept.operations[0].type", "not supported"),
    (_launch({**TASK, "health_check": {"type": "HTTP", "http": {"port": 0}}}),
     "accept.operations[0].launch.task_infos[0].health_check", "port"),
])
def test_bad_calls_name_the_path(body: Any, where: str, reason: str) -> None:
    with pytest.raises(mj.MesosJsonError) as caught:
        mc.call_from_mesos(body)
    assert caught.value.path == where, caught.value
    assert reason in caught.value.reason


def test_events_in_mesos_shapes() -> None:
    info = MasterInfo(id="m1", hostname="h", ip="10.0.0.1", port=5050, zmq_port=5055,
                      version="0.1.0", address=Address(hostname="h", ip="10.0.0.1", port=5050))
    subscribed = mc.event_to_mesos(Subscribed(framework_id="F1", heartbeat_interval=5.0,
                                              master_info=info))
    assert subscribed is not None and subscribed["type"] == "SUBSCRIBED"
    assert subscribed["subscribed"]["framework_id"] == {"value": "F1"}
    assert subscribed["subscribed"]["heartbeat_interval_seconds"] == 5.0
    offer = Offer(id="O1", framework_id="F1", agent_id="S1", hostname="h",
                  resources=Resources.parse("cpus:1"))
    assert mc.event_to_mesos(Offers(offers=[offer])) == {
        "type": "OFFERS", "offers": {"offers": [mj.offer_to_mesos(offer)]}}
    assert mc.event_to_mesos(Rescind(offer_id="O1")) == {
        "type": "RESCIND", "rescind": {"offer_id": {"value": "O1"}}}
    update = mc.event_to_mesos(Update(status=TaskStatus(
        task_id="t", state=TaskState.TASK_RUNNING, uuid="u-1", agent_id="S1")))
    assert update is not None
    status = update["update"]["status"]
    assert status["state"] == "TASK_RUNNING" and base64.b64decode(status["uuid"]) == b"u-1"
    assert mc.event_to_mesos(ExecutorToFramework(framework_id="F1", agent_id="S1",
                                                 executor_id="e", data=b"hi")) == {
        "type": "MESSAGE", "message": {"agent_id": {"value": "S1"},
                                       "executor_id": {"value": "e"}, "data": "aGk="}}
    assert mc.event_to_mesos(Failure(agent_id="S1")) == {
        "type": "FAILURE", "failure": {"agent_id": {"value": "S1"}}}
    assert mc.event_to_mesos(Error(message="gone")) == {"type": "ERROR",
                                                        "error": {"message": "gone"}}
    assert mc.event_to_mesos(Heartbeat()) == {"type": "HEARTBEAT"}
    assert mc.event_to_mesos(Rejected(reason="no")) is None
