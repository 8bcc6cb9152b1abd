"""The rules of DESIGN.md that a grep can check: pure cores import no I/O, not
even through the modules they import, and the three roles meet only on the wire."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = {"dyad", "master", "agent", "frameworks"}
IO_MODULES = {"asyncio", "zmq", "aiohttp", "kazoo", "socket", "subprocess",
              "os", "signal", "fcntl", "threading", "shutil", "selectors"}
PURE_CORES = [
    "dyad/resources.py", "dyad/messages.py", "dyad/codec.py", "dyad/effects.py",
    "master/state.py", "master/allocator", "master/offer_frames.py", "master/inflow.py",
    "master/outflow.py", "master/admission.py",
    "agent/state.py", "agent/status_updates.py", "agent/model.py", "agent/health.py",
    "agent/views.py", "agent/limits.py", "agent/checkpoint.py", "agent/sandbox.py",
    "frameworks/scheduler_core.py", "frameworks/executor_core.py",
    "frameworks/batch/core.py", "frameworks/service/core.py", "frameworks/autopilot",
    "frameworks/batch/placement.py", "frameworks/batch/tasks.py",
    "frameworks/service/rightsizing.py", "master/usage_rows.py", "master/usage_view.py",
    "dyad/authz.py", "master/authorization.py", "dyad/containers.py",
    "agent/container_spec.py",
    "agent/container_runs.py", "agent/docker_wire.py", "agent/containers_core.py",
    "agent/host_runs.py", "agent/runs.py", "agent/launch.py",
    "agent/tasks.py",
    "frameworks/service/appdef.py", "frameworks/service/constraints.py",
    "frameworks/service/deployment.py", "frameworks/service/placement.py",
    "frameworks/service/records.py", "frameworks/service/views.py",
    "frameworks/service/testing.py", "frameworks/service/marathon_shape.py",
    "frameworks/service/marathon_events.py",
    "dyad/mesos_json.py", "dyad/mesos_calls.py", "agent/executor_api_core.py",
    "dyad/volumes.py", "master/volumes.py", "agent/persistent.py",
    "dyad/priority.py", "agent/reclaim.py", "agent/qos.py", "agent/oversubscription.py",
    "master/revocable.py", "master/preempting.py", "master/election.py", "master/acks.py",
    "master/shard_wire.py",
]
CLOCK_FREE = ["frameworks/autopilot"]
"""Cores that must not even read the wall clock (`time`): given time, always."""
ROLES = ["master", "agent", "frameworks"]


def _python_files(relative: str) -> list[Path]:
    path = ROOT / relative
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> set[str]:
    """Dotted names of the modules `path` imports at run time (not under
    `if TYPE_CHECKING:`), relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:  # `from a import b`: module a.b, or a itself
                module = f"{base}.{alias.name}"
                names.add(module if _module_file(module) is not None else base)
    return names


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] not in PROJECT:
        return None
    candidate = ROOT.joinpath(*parts)
    if candidate.with_suffix(".py").is_file():
        return candidate.with_suffix(".py")
    if (candidate / "__init__.py").is_file():
        return candidate / "__init__.py"
    return None


@cache
def _reachable(path: Path) -> frozenset[tuple[str, Path]]:
    """Every (top-level module, importing file) reachable from `path`."""
    seen: set[Path] = set()
    found: set[tuple[str, Path]] = set()
    todo = [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _imports(current):
            found.add((name.split(".")[0], current))
            # Only the named module is followed, not its packages' __init__: a
            # core may live in a package whose curated public face (such as
            # `frameworks/__init__`) is a shell, as long as it imports what it
            # uses from pure modules.
            module = _module_file(name)
            if module is not None:
                todo.append(module)
    return frozenset(found)


@pytest.mark.parametrize("core", PURE_CORES)
def test_pure_cores_import_no_io_even_transitively(core: str) -> None:
    for path in _python_files(core):
        impure = sorted((name, str(where.relative_to(ROOT)))
                        for name, where in _reachable(path) if name in IO_MODULES)
        assert not impure, f"{path.relative_to(ROOT)} reaches I/O: {impure}"


@pytest.mark.parametrize("role", ROLES)
def test_roles_meet_only_on_the_wire(role: str) -> None:
    others = set(ROLES) - {role}
    for path in _python_files(role):
        imported = {name.split(".")[0] for name in _imports(path)}
        assert not imported & others, path


@pytest.mark.parametrize("core", CLOCK_FREE)
def test_clock_free_cores_never_read_the_time(core: str) -> None:
    for path in _python_files(core):
        reads = sorted(str(where.relative_to(ROOT)) for name, where in _reachable(path)
                       if name == "time")
        assert not reads, f"{path.relative_to(ROOT)} reaches time through {reads}"
