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
      "oversubscription": {"enabled": false, "window": 300, "margin": 0.2,
                           "margin_floor": {"cpus": 0.05, "mem": 32},
                           "qos_mem_watermark": 0.9, "qos_cpu_watermark": 1.0,
                           "borrowers": null},
      "preemption": {"enabled": false, "guarantees": true, "max_per_minute": 60,
                     "hold": 10, "guarantee_priority": 200, "askers": [], "ask_after": 10},
      "recommender": {"enabled": false, "mode": "auto", "apps": null, "step": 300,
                      "warmup": 3600, "min_samples": 30, "min_interval": 3600}
    }

Defaults are the production defaults (`MasterConfig`, the agent's reclamation
and QoS configs, the batch, service and autopilot cores), so an empty policy
simulates Dyad as shipped -- except that the three policies of issues 13 and 14
are off unless switched on, so that a run compares against the plain DRF cell.
They are carried out by the real cores (sim/lending.py, sim/autopilot.py and
docs/simulator.md say how).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from agent.qos import QosConfig
from agent.reclaim import Amount, ReclaimConfig
from frameworks.autopilot import AUTO, MODES, OFF, Config as AutopilotConfig
from master.allocator.preemption import PreemptionConfig
from master.state import MasterConfig
from sim.inputs import Fields, Obj, boolean, integer, load_document, number, string

SAMPLED_REPORT_INTERVAL = 5.0
"""Agents' usage report interval when a policy needs usage and none is given."""


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
    usage_report_interval: float | None = None  # None: 0, or 5 s when a policy needs usage
    latency: float = 0.001
    codec: bool = False
    report_interval: float = 60.0
    until: float | None = None
    settle: float = 60.0
    # Oversubscription (agent/reclaim.py, agent/qos.py, master/revocable.py).
    oversubscription: bool = False
    reclaim: ReclaimConfig = ReclaimConfig()
    qos: QosConfig = QosConfig()
    borrowers: tuple[str, ...] | None = None  # None: `tasks` frameworks below production
    # Preemption (master/preempting.py); its `enabled` is the switch.
    preemption: PreemptionConfig = PreemptionConfig()
    askers: tuple[str, ...] = ()  # `tasks` or service frameworks with PREEMPTION that ask
    ask_after: float = 10.0  # how long their head task waits before they ask (and between)
    # The Autopilot recommender in the service frameworks (frameworks/autopilot/).
    recommender: bool = False
    recommender_mode: str = AUTO
    recommender_apps: tuple[str, ...] | None = None  # None: every app without its own block
    autopilot: AutopilotConfig = AutopilotConfig()

    @property
    def report_interval_of_agents(self) -> float:
        if self.usage_report_interval is not None:
            return self.usage_report_interval
        return SAMPLED_REPORT_INTERVAL if self.oversubscription or self.recommender else 0.0

    def master_config(self) -> MasterConfig:
        return MasterConfig(
            offer_timeout=self.offer_timeout, allocation_interval=self.allocation_interval,
            agent_ping_timeout=self.agent_ping_timeout,
            max_agent_ping_timeouts=self.max_agent_ping_timeouts,
            heartbeat_interval=self.heartbeat_interval,
            min_allocatable_cpus=self.min_allocatable_cpus,
            min_allocatable_mem=self.min_allocatable_mem,
            default_refuse_seconds=self.default_refuse_seconds,
            oversubscription=self.oversubscription, preemption=self.preemption,
            # The recommender reads what the usage store would hold (samples only:
            # task events go at the end of their step, no `UsageDue` timers).
            record_usage=self.recommender, usage_batch=0.0,
            # A simulated master keeps little history: /state is never served.
            max_completed_tasks=100, max_events=100)

    def to_json(self) -> dict[str, Any]:
        def plain(_: Any, __: Any, value: Any) -> Any:
            return list(value) if isinstance(value, tuple) else value
        out = attrs.asdict(self, value_serializer=plain)
        # The autopilot's variant tables and costs are not policy knobs: keep its knobs.
        out["autopilot"] = {k: out["autopilot"][k] for k in AUTOPILOT_KNOBS}
        return out


AUTOPILOT_KNOBS = ("step", "warmup", "min_samples", "min_interval")


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
    values.update(_oversubscription(top.sub("oversubscription")))
    values.update(_preemption(top.sub("preemption")))
    values.update(_recommender(top.sub("recommender")))
    top.done()
    policy = Policy(**values)
    if (policy.oversubscription or policy.recommender) and policy.usage_report_interval == 0:
        raise top.fail("agents", "usage_report_interval: oversubscription and the recommender "
                                 "need usage reports; give an interval > 0 or leave it out")
    return policy


def _names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"must be a list of names or null, got {value!r}")
    return tuple(string(v) for v in value)


def _amount(value: Any) -> Amount:
    if not isinstance(value, dict) or set(value) - {"cpus", "mem"}:
        raise ValueError(f"must be an object of cpus and mem, got {value!r}")
    return Amount(number()(value.get("cpus", 0.0)), number()(value.get("mem", 0.0)))


def _config(section: Fields, knobs: dict[str, tuple[str, Any]], default: Any) -> Any:
    """A config object from the knobs present (the rest keep `default`'s values),
    its own validation errors named at the section."""
    given = {attribute: section.get(key, parse, None)
             for key, (attribute, parse) in knobs.items() if section.has(key)}
    try:
        return attrs.evolve(default, **given) if given else default
    except ValueError as exc:
        raise section.fail(None, str(exc)) from None


def _oversubscription(section: Fields | None) -> dict[str, Any]:
    if section is None:
        return {}
    fraction = number(0, 1, above=True)
    out: dict[str, Any] = {"oversubscription": section.get("enabled", boolean, False),
                           "borrowers": section.get("borrowers", _names, None)}
    out["reclaim"] = _config(section, {"window": ("window", number(above=True)),
                                       "margin": ("margin", number()),
                                       "margin_floor": ("margin_floor", _amount)},
                             ReclaimConfig())
    out["qos"] = _config(section, {"qos_mem_watermark": ("mem_watermark", fraction),
                                   "qos_cpu_watermark": ("cpu_watermark", fraction)},
                         QosConfig())
    section.done()
    return out


def _preemption(section: Fields | None) -> dict[str, Any]:
    if section is None:
        return {}
    config = _config(section, {"enabled": ("enabled", boolean),
                               "guarantees": ("guarantees", boolean),
                               "max_per_minute": ("max_per_minute", integer(1)),
                               "hold": ("hold", number()),
                               "guarantee_priority": ("guarantee_priority",
                                                      integer(-1_000_000))},
                     PreemptionConfig())
    out = {"preemption": config, "askers": section.get("askers", _names, None) or (),
           "ask_after": section.get("ask_after", number(above=True), 10.0)}
    section.done()
    return out


def _mode(value: Any) -> str:
    if value not in MODES or value == OFF:
        raise ValueError(f"must be one of {sorted(set(MODES) - {OFF})}, got {value!r}")
    return str(value)


def _recommender(section: Fields | None) -> dict[str, Any]:
    if section is None:
        return {}
    out: dict[str, Any] = {"recommender": section.get("enabled", boolean, False),
                           "recommender_mode": section.get("mode", _mode, AUTO),
                           "recommender_apps": section.get("apps", _names, None)}
    out["autopilot"] = _config(section, {"step": ("step", number(above=True)),
                                         "warmup": ("warmup", number()),
                                         "min_samples": ("min_samples", integer(1)),
                                         "min_interval": ("min_interval", number())},
                               AutopilotConfig())
    section.done()
    return out
