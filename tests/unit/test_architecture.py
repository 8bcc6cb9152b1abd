"""The rules of DESIGN.md that a grep can check: pure cores import no I/O, and the
three roles meet only on the wire."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IO_MODULES = {"asyncio", "zmq", "aiohttp", "kazoo", "socket", "subprocess"}
PURE_CORES = [
    "dyad/resources.py", "dyad/messages.py", "dyad/codec.py",
    "master/state.py", "master/allocator", "master/metrics.py",
    "agent/state.py", "agent/model.py", "agent/status_updates.py", "agent/health.py",
    "agent/limits.py", "agent/views.py",
    "frameworks/batch/core.py",
    "frameworks/service/core.py", "frameworks/service/deployment.py",
    "frameworks/service/placement.py", "frameworks/service/constraints.py",
    "frameworks/service/appdef.py", "frameworks/service/records.py",
]
ROLES = ["master", "agent", "frameworks"]


def _python_files(relative: str) -> list[Path]:
    path = ROOT / relative
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("core", PURE_CORES)
def test_pure_cores_import_no_io(core: str) -> None:
    for path in _python_files(core):
        assert not _imported_top_levels(path) & IO_MODULES, path


@pytest.mark.parametrize("role", ROLES)
def test_roles_meet_only_on_the_wire(role: str) -> None:
    others = set(ROLES) - {role}
    for path in _python_files(role):
        assert not _imported_top_levels(path) & others, path
