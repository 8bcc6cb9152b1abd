"""Autopilot: right-size task limits from measured usage (a pure core).

    from frameworks.autopilot import (AppConfigured, Autopilot, AutopilotSpec, Config,
                                      Limits, UsageSampled, AUTO)

    pilot = Autopilot(Config(warmup=600, min_samples=10))
    effects = pilot.handle(AppConfigured("/web", AutopilotSpec(AUTO), Limits(1.0, 512 * MIB)), now)
    pilot.handle(UsageSampled("/web", at=now, cpus=0.05, mem_bytes=30 * MIB), now)
    ...  # the shell feeds TimerFired(Evaluate("/web")) when the ArmTimer comes due

No I/O: the service framework and the simulator feed it events and carry out its
`ApplyLimits` / `ApplyInstances` / `Recommended` effects. See docs/autopilot.md.
"""

from frameworks.autopilot.core import (
    AppConfigured, AppRemoved, ApplyInstances, ApplyLimits, Autopilot, Config, Evaluate,
    Recommendation, Recommended, TaskOomKilled, UsageSampled)
from frameworks.autopilot.histogram import DecayingHistogram, Scale
from frameworks.autopilot.horizontal import HorizontalConfig, HorizontalSizer, InstancesAdvice
from frameworks.autopilot.meta import Choice, Costs, MetaRecommender
from frameworks.autopilot.recommenders import (
    DEFAULT_CPU_VARIANTS, DEFAULT_MEMORY_VARIANTS, FLAT_FIRST_ROOM_VARIANTS, CpuRecommender,
    CpuVariant, MemoryRecommender, MemoryVariant)
from frameworks.autopilot.spec import (
    AUTO, MIB, MODES, OFF, RECOMMEND, AutopilotSpec, Bounds, HorizontalSpec, Limits,
    SpecInvalid, parse_spec, unparse_spec)
from frameworks.autopilot.window import SlidingPeak

__all__ = [
    "AUTO", "DEFAULT_CPU_VARIANTS", "DEFAULT_MEMORY_VARIANTS", "FLAT_FIRST_ROOM_VARIANTS",
    "MIB", "MODES", "OFF", "RECOMMEND", "AppConfigured", "AppRemoved", "ApplyInstances", "ApplyLimits",
    "Autopilot", "AutopilotSpec", "Bounds", "Choice", "Config", "Costs", "CpuRecommender",
    "CpuVariant", "DecayingHistogram", "Evaluate", "HorizontalConfig", "HorizontalSizer",
    "HorizontalSpec", "InstancesAdvice", "Limits", "MemoryRecommender",
    "MemoryVariant", "MetaRecommender", "Recommendation", "Recommended", "Scale",
    "SlidingPeak", "SpecInvalid", "TaskOomKilled", "UsageSampled", "parse_spec",
    "unparse_spec",
]
