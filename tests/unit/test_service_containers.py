"""Marathon's `container` in app definitions (frameworks/service/app_container.py):
parsing, refusals, the JSON round trip, and the `ContainerInfo` a placed task gets."""

from __future__ import annotations

from typing import Any

import pytest

from dyad.containers import ContainerInfo, DockerInfo, PortMapping, Volume
from dyad.messages import HealthCheckType, Offer
from dyad.resources import Resources
from frameworks.service.appdef import AppInvalid, app_to_json, parse_app
from frameworks.service.placement import Fit, fit, task_info

WEB = {"id": "/web", "cmd": "exec httpd -f -p 8080 -h /www", "cpus": 0.1, "mem": 32,
       "container": {"type": "DOCKER", "docker": {
           "image": "busybox:1", "network": "BRIDGE", "forcePullImage": True,
           "portMappings": [{"containerPort": 8080, "hostPort": 0, "name": "http"},
                            {"containerPort": 0, "hostPort": 31005}],
           "parameters": [{"key": "user", "value": "nobody"}]},
           "volumes": [{"containerPath": "/data", "hostPath": "data", "mode": "RO"}]},
       "healthChecks": [{"protocol": "HTTP", "portIndex": 0}]}
OFFER = Offer(id="o1", framework_id="F1", agent_id="A1", hostname="h1",
              resources=Resources.parse("cpus:4;mem:1024;ports:[31000-31010]"))


def problems(container: Any, **fields: Any) -> str:
    with pytest.raises(AppInvalid) as info:
        parse_app({"id": "/w", "cmd": "true", "container": container, **fields})
    return dict(info.value.details)["/container"]


def test_a_bridged_app_gets_its_mapped_ports_bound_to_the_offer() -> None:
    app = parse_app(WEB)
    assert app.host_ports == [0, 31005]
    placement = fit(app, OFFER.resources)
    assert isinstance(placement, Fit) and placement.ports == (31000, 31005)
    task = task_info(app, "web.1", OFFER, placement)
    assert task.container == ContainerInfo(
        docker=DockerInfo(image="busybox:1", network="BRIDGE", force_pull=True,
                          port_mappings=[PortMapping(host_port=31000, container_port=8080),
                                         PortMapping(host_port=31005, container_port=31005)],
                          parameters={"user": "nobody"}),
        volumes=[Volume(container_path="/data", host_path="data", mode="RO")])
    assert task.command.environment["PORT0"] == "31000"
    check = task.health_check
    assert check is not None and check.type == HealthCheckType.HTTP and check.port == 31000
    assert parse_app(app_to_json(app)) == app


def test_a_host_network_app_keeps_its_port_definitions() -> None:
    app = parse_app({"id": "/w", "cmd": "true", "ports": [0],
                     "container": {"docker": {"image": "busybox:1"}}})
    task = task_info(app, "w.1", OFFER, fit(app, OFFER.resources))
    assert task.container.docker.network == "HOST" and not task.container.docker.port_mappings
    assert task.resources.ranges("ports") == [(31000, 31000)]


@pytest.mark.parametrize("container, expect", [
    ({"type": "MESOS", "docker": {"image": "x"}}, "only DOCKER"),
    ({"docker": {"image": " "}}, "docker.image must be a non-empty string"),
    ({"docker": {"image": "x", "portMappings": [{"containerPort": 80}]}}, "need network BRIDGE"),
    ({"docker": {"image": "x", "network": "BRIDGE", "portMappings": [
        {"hostPort": 31000}, {"hostPort": 31000}]}}, "hostPort is listed twice"),
    ({"docker": {"image": "x", "parameters": [{"key": "privileged", "value": "true"}]}},
     "'privileged' is not supported"),
    ({"docker": {"image": "x", "privileged": True}}, "privileged is not supported"),
    ({"docker": {"image": "x"}, "volumes": [{"containerPath": "/d", "persistent": {"size": 1}}]},
     "must be a relative path"),
    ({"docker": {"image": "x"}, "volumes": [{"containerPath": "/mnt/mesos/sandbox",
                                             "hostPath": "x"}]}, "would hide"),
    ({"docker": {"image": "x", "colour": "red"}}, "unknown field(s) colour"),
])
def test_bad_containers_are_refused_saying_why(container: Any, expect: str) -> None:
    assert expect in problems(container)


def test_port_mappings_and_port_definitions_do_not_mix() -> None:
    bridged = WEB["container"]
    assert "not both" in problems(bridged, ports=[0])
