"""What this machine can offer when the operator does not say (`--resources`).

Like Mesos, only 90% of memory and free disk is offered: the agent, the operating
system and page cache need the rest. Kinds the operator names win; kinds left out
are detected, so `--resources cpus:2` still offers memory, disk and ports.
"""

from __future__ import annotations

import os
import shutil

import psutil

from dyad.resources import Resources

DEFAULT_PORTS = "[31000-32000]"
DETECTED_KINDS = ("cpus", "mem", "disk", "ports")


def detect_resources(work_dir: str) -> Resources:
    cpus = os.cpu_count() or 1
    mem_mib = psutil.virtual_memory().total // (1024 * 1024)
    disk_mib = shutil.disk_usage(_existing_ancestor(work_dir)).free // (1024 * 1024)
    return Resources.parse(f"cpus:{cpus};mem:{int(mem_mib * 0.9)};disk:{int(disk_mib * 0.9)};"
                           f"ports:{DEFAULT_PORTS}")


def resolve_resources(text: str | None, work_dir: str) -> Resources:
    """The operator's `--resources`, completed with detected values for the kinds
    it leaves out. Raises `dyad.resources.ResourcesError` for bad text."""
    given = Resources.parse(text) if text else Resources()
    detected = detect_resources(work_dir)
    result = given
    for kind in DETECTED_KINDS:
        if kind not in given.names():
            if kind == "ports":
                result = result + Resources.parse(f"ports:{DEFAULT_PORTS}")
            else:
                result = result + Resources.of(**{kind: detected.get(kind)})
    return result


def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path
