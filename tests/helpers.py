"""Test helpers shared by the unit and integration tiers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Awaitable, Callable, Protocol


async def wait_for(predicate: Callable[[], Any], timeout: float = 15.0,
                   what: str = "condition", interval: float = 0.02) -> Any:
    """Poll `predicate` (sync or async) until truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


class _Driver(Protocol):
    async def run_async(self) -> Any: ...

    def abort(self) -> Any: ...


@contextlib.asynccontextmanager
async def running(driver: _Driver) -> AsyncIterator[asyncio.Task[Any]]:
    """Run a scheduler or executor driver for the block; abort it if still running."""
    task = asyncio.create_task(driver.run_async())
    try:
        yield task
    finally:
        if not task.done():
            driver.abort()
        await asyncio.wait_for(task, 5)


def compat_client(module: str) -> Any:
    """Import a real Mesos/Marathon client from the `compat` extra: skip, saying
    why, where it is not installed, unless DYAD_COMPAT_REQUIRED is set (.ci/run
    sets it), where its absence fails."""
    import importlib
    import os

    import pytest
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("DYAD_COMPAT_REQUIRED"):
            raise
        pytest.skip(f"{module} is not installed: pip install -e '.[compat]' as .ci/run does",
                    allow_module_level=True)
