"""The leader's lease (dyad/zk.py): its term, what renews it, and when a lapsed
one means the holder is done. A fake session and a hand-moved monotonic clock."""

from __future__ import annotations

import pytest

from dyad import zk
from dyad.zk import LEASE_MOST, Lease, lease_term


class FakeSession:
    """What a lease asks of a session: sync, then whether its znode exists."""

    def __init__(self, timeout: float = 4.0) -> None:
        self.session_timeout = timeout
        self.connected = True
        self.present = True
        self.calls: list[str] = []

    async def sync(self, path: str) -> None:
        self.calls.append("sync")

    async def exists(self, path: str) -> int | None:
        self.calls.append("exists")
        return 0 if self.present else None


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(zk.time, "monotonic", lambda: now[0])
    return now


def lease_on(session: FakeSession, expired: list[str] | None = None) -> Lease:
    return Lease(session, "/dyad/json.info_0000000001", grace=session.session_timeout,
                 on_expired=(expired if expired is not None else []).append)  # type: ignore[arg-type]


def test_the_term_is_two_thirds_of_the_session_but_never_above_the_most() -> None:
    assert lease_term(4.0) == LEASE_MOST == 0.5
    assert lease_term(0.6) == pytest.approx(0.4)


async def test_a_renewal_syncs_before_it_reads_and_lasts_one_term(clock: list[float]) -> None:
    session = FakeSession()
    lease = lease_on(session)
    assert await lease.renew()
    assert session.calls == ["sync", "exists"]  # a stale follower cannot extend it
    clock[0] += LEASE_MOST - 0.01
    assert lease.valid()
    clock[0] += 0.02
    assert not lease.valid() and not lease.dead()


async def test_a_deleted_znode_renews_nothing(clock: list[float]) -> None:
    """A standby proved us dead and deleted our znode (wrongly): the lease runs
    out within one term of the last renewal, whatever we believe."""
    session = FakeSession()
    lease = lease_on(session)
    assert await lease.renew()
    session.present = False
    clock[0] += 0.1
    assert not await lease.renew()
    clock[0] += LEASE_MOST
    assert not lease.valid()


async def test_a_revoked_lease_keeps_its_end_so_a_long_pause_is_seen_at_once(
        clock: list[float]) -> None:
    """SIGSTOP past the session timeout, then SIGCONT: kazoo says SUSPENDED
    first (revoke), and the holder must already count as done."""
    session = FakeSession()
    lease = lease_on(session)
    assert await lease.renew()
    clock[0] += LEASE_MOST + session.session_timeout + 1  # the pause
    lease.revoke()
    assert lease.dead()
    assert not lease.valid()


async def test_a_short_revocation_is_not_the_end(clock: list[float]) -> None:
    session = FakeSession()
    lease = lease_on(session)
    assert await lease.renew()
    lease.revoke()
    assert not lease.valid() and not lease.dead()
    assert await lease.renew()
    assert lease.valid()
