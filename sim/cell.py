"""The cell spec: the agents of a simulated cell and its roles' weights and quota.

    {
      "name": "small",
      "agent_groups": [
        {"name": "a", "count": 10, "resources": "cpus:8;mem:32768;disk:100000",
         "attributes": {"rack": ["r1", "r2"], "zone": "z1"}}
      ],
      "roles": {
        "prod": {"weight": 2, "quota": {"guarantee": {"cpus": 20}, "limit": {"cpus": 60}}},
        "batch": {"weight": 1}
      }
    }

Agents of a group are called ``<name>-<i>`` (i from 1). An attribute given as a
list is dealt round robin over the group's agents (agent i gets item i mod n),
which is how racks and zones are spread. Weights and quota use the operator
API's forms (`PUT /weights`, `PUT /quota`) and its validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from dyad.messages import AgentInfo
from dyad.resources import Resources
from master.allocator import PolicyError, Quota, check_quotas, parse_quota, parse_weights
from sim.inputs import Fields, InputError, Obj, integer, load_document, number, resources, string


@attrs.frozen
class AgentGroup:
    name: str
    count: int
    resources: Resources
    attributes: dict[str, str | tuple[str, ...]]
    hostname: str | None = None  # a one-agent group named after a real agent (checkpoints)

    def agents(self) -> list[AgentInfo]:
        out = []
        for i in range(self.count):
            attributes = {key: value[i % len(value)] if isinstance(value, tuple) else value
                          for key, value in self.attributes.items()}
            out.append(AgentInfo(hostname=self.hostname or f"{self.name}-{i + 1}", port=5051,
                                 resources=self.resources, attributes=attributes))
        return out


@attrs.frozen
class Cell:
    name: str
    groups: tuple[AgentGroup, ...]
    weights: dict[str, float]
    quota: dict[str, Quota]

    def agents(self) -> list[AgentInfo]:
        return [agent for group in self.groups for agent in group.agents()]

    @property
    def agent_count(self) -> int:
        return sum(group.count for group in self.groups)

    def capacity(self) -> Resources:
        """The cell's scalar resources (ports are per agent: they do not add up)."""
        amounts: dict[str, float] = {}
        for group in self.groups:
            for name, milli in group.resources.scalar_items().items():
                amounts[name] = amounts.get(name, 0.0) + milli / 1000 * group.count
        return Resources.of(**amounts)


def load_cell(path: Path) -> Cell:
    return parse_cell(load_document(path))


def parse_cell(obj: Obj) -> Cell:
    fields = Fields(obj)
    name = fields.get("name", string, "cell")
    raw_groups = fields.get("agent_groups", _list, [])
    if not raw_groups:
        raise fields.fail("agent_groups", "a cell needs at least one agent group")
    groups = [_group(item, f"agent_groups[{i}]", obj) for i, item in enumerate(raw_groups)]
    names = [g.name for g in groups]
    if len(names) != len(set(names)):
        raise fields.fail("agent_groups", "agent group names must be unique")
    weights, quota = parse_roles(fields)
    fields.done()
    return Cell(name=name, groups=tuple(groups), weights=weights, quota=quota)


def parse_roles(fields: Fields) -> tuple[dict[str, float], dict[str, Quota]]:
    """The `roles` field (of a cell, or of a workload's `roles` record): weights
    and quota, validated as `PUT /weights` and `PUT /quota` validate them."""
    weights: dict[str, float] = {}
    quota: dict[str, Quota] = {}
    roles = fields.sub("roles")
    if roles is not None:
        for role in roles.obj:
            role_fields = roles.sub(role)
            if role_fields is not None:
                _role(role, role_fields, weights, quota)
        roles.done()
    try:
        check_quotas(quota)
    except PolicyError as exc:
        raise fields.fail("roles", str(exc)) from None
    return weights, quota


def _group(item: Any, path: str, parent: Obj) -> AgentGroup:
    if not isinstance(item, Obj):
        raise InputError(parent.where, f"{path}: must be an object")
    fields = Fields(item, path)
    group = AgentGroup(
        name=fields.need("name", _hostname),
        count=fields.get("count", integer(1, 1_000_000), 1),
        resources=fields.need("resources", resources),
        attributes=fields.get("attributes", _attributes, {}))
    fields.done()
    return group


def _role(role: str, fields: Fields, weights: dict[str, float], quota: dict[str, Quota]) -> None:
    try:
        if fields.has("weight"):
            weight = fields.get("weight", number(above=True), 1.0)
            weights.update(parse_weights({"role": role, "weight": weight}))
        body = fields.obj_field("quota")
        if body is not None:
            quota.update(parse_quota({"role": role, **body}))
    except PolicyError as exc:
        raise fields.fail(None, str(exc)) from None
    fields.done()


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("must be a list")
    return value


def _hostname(value: Any) -> str:
    name = string(value)
    if not all(c.isalnum() or c in "-." for c in name):
        raise ValueError(f"must be letters, digits, '-' and '.', got {name!r}")
    return name


def _attributes(value: Any) -> dict[str, str | tuple[str, ...]]:
    if not isinstance(value, dict):
        raise ValueError("must be an object of strings (or lists of strings)")
    out: dict[str, str | tuple[str, ...]] = {}
    for key, item in value.items():
        if isinstance(item, str):
            out[key] = item
        elif isinstance(item, list) and item and all(isinstance(v, str) for v in item):
            out[key] = tuple(item)
        else:
            raise ValueError(f"attribute {key!r} must be a string or a non-empty list of "
                             f"strings, got {item!r}")
    return out
