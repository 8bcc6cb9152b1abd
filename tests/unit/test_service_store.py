"""The shells around the core: the file store, the runtime's order of store writes
and driver calls, and how leadership reacts to ZooKeeper connection states."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooState

from dyad.clock import FakeClock
from frameworks.service.appdef import parse_app
from frameworks.service.core import (
    OffersReceived, Persist, PutApp, Registered, ServiceConfig, ServiceCore, Snapshot)
from frameworks.service.leader import Leadership, parse_service_zk_url
from frameworks.service.runtime import ServiceRuntime, ServiceScheduler
from frameworks.service.store import FileStore, StoreError
from frameworks.testing import FakeSchedulerDriver, make_master_info, make_offer

APP = {"id": "/web", "cmd": "sleep 100", "instances": 2, "cpus": 0.1, "mem": 16}


def test_file_store_round_trip(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store.load() == Snapshot()
    store.apply([Persist("framework", "id", "fw-1"), Persist("apps", "web", {"a": 1}),
                 Persist("tasks", "t1", {"x": 1}), Persist("tasks", "t2", {"x": 2})])
    store.apply([Persist("tasks", "t1", None)])
    store.close()
    again = FileStore(tmp_path)
    assert again.load() == Snapshot(framework_id="fw-1", apps={"web": {"a": 1}},
                                    tasks={"t2": {"x": 2}})
    assert not (tmp_path / "state.tmp").exists()
    again.close()


def test_file_store_is_exclusive_and_refuses_garbage(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with pytest.raises(StoreError, match="in use by another dyad-service"):
        FileStore(tmp_path)
    store.close()
    (tmp_path / "state.json").write_text("{not json")
    store = FileStore(tmp_path)
    with pytest.raises(StoreError, match="cannot read"):
        store.load()
    store.close()


class BrokenStore:
    def __init__(self) -> None:
        self.applied: list[list[Persist]] = []

    def load(self) -> Snapshot:
        return Snapshot()

    def apply(self, changes: Any) -> None:
        raise StoreError("disk full")

    def close(self) -> None:
        pass


class RecordingStore(BrokenStore):
    def __init__(self, driver: FakeSchedulerDriver) -> None:
        super().__init__()
        self.driver = driver
        self.calls_seen: list[int] = []

    def apply(self, changes: Any) -> None:
        self.applied.append(list(changes))
        self.calls_seen.append(len(self.driver.calls))


async def test_runtime_writes_the_store_before_launching() -> None:
    driver = FakeSchedulerDriver()
    store = RecordingStore(driver)
    runtime = ServiceRuntime(ServiceCore(ServiceConfig(), iter(map(str, range(99))).__next__),
                             store, FakeClock())
    runtime.driver = driver
    scheduler = ServiceScheduler(runtime)
    scheduler.registered(driver, "fw-1", make_master_info())
    runtime.execute(PutApp(parse_app(APP)))
    scheduler.resource_offers(driver, [make_offer(), make_offer()])
    launches = [i for i, c in enumerate(driver.calls) if c.method == "launch_tasks"]
    assert len(launches) == 2
    task_writes = [seen for seen, batch in zip(store.calls_seen, store.applied)
                   if any(p.kind == "tasks" for p in batch)]
    assert task_writes and task_writes[0] <= launches[0]
    runtime.close()


async def test_a_store_failure_is_reported_once_and_refuses_commands() -> None:
    failures: list[Exception] = []
    runtime = ServiceRuntime(ServiceCore(ServiceConfig(), iter(map(str, range(99))).__next__),
                             BrokenStore(), FakeClock(), on_fatal=failures.append)
    runtime.driver = FakeSchedulerDriver()
    with pytest.raises(StoreError):
        runtime.handle(Registered("fw-1"))
    with pytest.raises(StoreError, match="stopped after a store failure"):
        runtime.execute(PutApp(parse_app(APP)))
    with pytest.raises(StoreError):
        runtime.handle(OffersReceived((make_offer(),)))
    assert len(failures) == 1
    runtime.close()


class FakeZk:
    """Just enough of a KazooClient for `Leadership`'s bookkeeping."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def Lock(self, path: str, identifier: str) -> Any:  # noqa: N802 (kazoo's name)
        return FakeLock()

    def tell(self, state: str) -> None:
        for listener in self.listeners:
            listener(state)


class FakeLock:
    def acquire(self) -> bool:
        return True

    def release(self) -> bool:
        return True


async def test_leadership_rides_out_a_short_suspension_but_not_a_long_one() -> None:
    zk = FakeZk()
    leadership = Leadership(zk, "/svc", "me:1", grace=0.2)  # type: ignore[arg-type]
    await leadership.campaign()
    zk.tell(KazooState.SUSPENDED)
    await asyncio.sleep(0.05)
    zk.tell(KazooState.CONNECTED)
    await asyncio.sleep(0.3)
    assert not leadership.lost.is_set()
    zk.tell(KazooState.SUSPENDED)
    await asyncio.wait_for(leadership.lost.wait(), 2)
    await leadership.resign()
    await leadership.campaign()          # a new term starts clean
    assert not leadership.lost.is_set()
    zk.tell(KazooState.LOST)
    await asyncio.wait_for(leadership.lost.wait(), 2)


def test_zk_urls() -> None:
    assert parse_service_zk_url("zk://a:2181,b:2181/svc/") == ("a:2181,b:2181", "/svc")
    assert parse_service_zk_url("zk://a:2181") == ("a:2181", "/dyad-service")
    for bad in ("http://a:2181/x", "zk:///x", "zk://a:2181/dyad"):
        with pytest.raises(ValueError):
            parse_service_zk_url(bad)
