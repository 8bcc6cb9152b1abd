"""The policy file: the knobs a simulation is run with (all optional).

    {
      "allocator": {"interval": 1.0, "offer_timeout": 30.0, "default_refuse_seconds": 5.0,
                    "min_allocatable_cpus": 0.01, "min_allocatable_mem": 32.0},
      "master": {"agent_ping_timeout": 15.0, "max_agent_ping_timeouts": 5,
                 "heartbeat_interval": 5.0},
      "frameworks": {"batch": {"refuse_seconds": 5.0, "locality_wait": 1.0},
                     "service": {"refuse_seconds": 30.0}},
      "agents": {"launch_delay": 0.5, "usage_report_interval": 0},
      "wire": {"latency": 0.001, "codec": false},
      "report": {"interval": 60},
      "run": {"until": null, "settle": 60},
      "oversubscription": {"enabled": false},
      "preemption": {"enabled": false},
      "recommender": {"enabled": false}
    }

Defaults are the production defaults (`MasterConfig`, the batch and service
cores), so an empty policy simulates Dyad as shipped. `oversubscription`,
`preemption` and `recommender` are placeholders for issues 13 and 14: they
exist so that policy files can be written today, and turning one on is refused
with a clear error until the feature exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from master.state import MasterConfig
from sim.inputs import Fields, Obj, boolean, integer, load_document, number

NOT_YET = {
    "oversubscription": "oversubscription (revocable resources) is not implemented yet "
                        "(issue 13)",
    "preemption": "guarantee preemption is not implemented yet (issue 13)",
    "recommender": "the Autopilot recommender is not implemented yet (issue 14)",
}


@attrs.frozen(kw_only=True)
class Policy:
    allocation_interval: float = 1.0
    offer_timeout: float = 30.0
    default_refuse_seconds: float = 5.0
    min_allocatable_cpus: float = 0.01
    min_allocatable_mem: float = 32.0
    agent_ping_timeout: float = 15.0
    max_agent_ping_timeouts: int = 5
    heartbeat_interval: float = 5.0
    batch_refuse_seconds: float = 5.0
    batch_locality_wait: float = 1.0
    service_refuse_seconds: float = 30.0
    launch_delay: float = 0.5
    usage_report_interval: float = 0.0
    latency: float = 0.001
    codec: bool = False
    report_interval: float = 60.0
    until: float | None = None
    settle: float = 60.0

    def master_config(self) -> MasterConfig:
        return MasterConfig(
            offer_timeout=self.offer_timeout, allocation_interval=self.allocation_interval,
            agent_ping_timeout=self.agent_ping_timeout,
            max_agent_ping_timeouts=self.max_agent_ping_timeouts,
            heartbeat_interval=self.heartbeat_interval,
            min_allocatable_cpus=self.min_allocatable_cpus,
            min_allocatable_mem=self.min_allocatable_mem,
            default_refuse_seconds=self.default_refuse_seconds,
            # A simulated master keeps little history: /state is never served.
            max_completed_tasks=100, max_events=100)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def load_policy(path: Path | None) -> Policy:
    return Policy() if path is None else parse_policy(load_document(path))


def parse_policy(obj: Obj) -> Policy:
    top = Fields(obj)
    values: dict[str, Any] = {}
    positive = number(above=True)
    sections: dict[str, dict[str, tuple[str, Any]]] = {
        "allocator": {"interval": ("allocation_interval", positive),
                      "offer_timeout": ("offer_timeout", positive),
                      "default_refuse_seconds": ("default_refuse_seconds", number()),
                      "min_allocatable_cpus": ("min_allocatable_cpus", number()),
                      "min_allocatable_mem": ("min_allocatable_mem", number())},
        "master": {"agent_ping_timeout": ("agent_ping_timeout", positive),
                   "max_agent_ping_timeouts": ("max_agent_ping_timeouts", integer(1)),
                   "heartbeat_interval": ("heartbeat_interval", positive)},
        "agents": {"launch_delay": ("launch_delay", number()),
                   "usage_report_interval": ("usage_report_interval", number())},
        "wire": {"latency": ("latency", number(0, 60)), "codec": ("codec", boolean)},
        "report": {"interval": ("report_interval", positive)},
        "run": {"until": ("until", lambda v: None if v is None else positive(v)),
                "settle": ("settle", number())},
    }
    for name, knobs in sections.items():
        section = top.sub(name)
        if section is None:
            continue
        for key, (attribute, parse) in knobs.items():
            if section.has(key):
                values[attribute] = section.get(key, parse, None)
        section.done()
    frameworks = top.sub("frameworks")
    if frameworks is not None:
        for kind, knobs2 in (("batch", {"refuse_seconds": "batch_refuse_seconds",
                                        "locality_wait": "batch_locality_wait"}),
                             ("service", {"refuse_seconds": "service_refuse_seconds"})):
            section = frameworks.sub(kind)
            if section is None:
                continue
            for key, attribute in knobs2.items():
                if section.has(key):
                    values[attribute] = section.get(key, number(), None)
            section.done()
        frameworks.done()
    for name, why in NOT_YET.items():
        section = top.sub(name)
        if section is None:
            continue
        if section.get("enabled", boolean, False):
            raise section.fail("enabled", f"{why}; set it to false or remove the section")
        section.done()
    top.done()
    return Policy(**values)
