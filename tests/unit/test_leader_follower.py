"""LeaderFollower: detect when asked, then report each successor the detector names."""

from __future__ import annotations

import asyncio

import attrs

from dyad.detector import LeaderFollower
from dyad.messages import Address, MasterInfo
from tests.helpers import wait_for


def master(name: str) -> MasterInfo:
    return MasterInfo(id=name, hostname=name, ip="127.0.0.1", port=5050, zmq_port=5055,
                      version="0.1.0", address=Address(hostname=name, ip="127.0.0.1", port=5050))


@attrs.define
class ElectionDetector:
    """A detector over a leader the test sets, like ZooKeeper's watch."""

    leader: MasterInfo | None = None
    detections: int = 0
    changed: asyncio.Event = attrs.field(factory=asyncio.Event)

    def elect(self, leader: MasterInfo) -> None:
        self.leader = leader
        self.changed.set()
        self.changed = asyncio.Event()

    async def detect(self) -> MasterInfo:
        self.detections += 1
        while self.leader is None:
            await self.changed.wait()
        return self.leader

    async def next_leader(self, current: MasterInfo) -> MasterInfo:
        while self.leader is None or self.leader.id == current.id:
            await self.changed.wait()
        return self.leader

    async def close(self) -> None: ...


async def test_detects_when_asked_then_follows_every_successor_until_asked_again() -> None:
    detector = ElectionDetector()
    seen: list[str] = []
    follower = LeaderFollower(detector, lambda m: seen.append(m.id))
    running = asyncio.create_task(follower.run())
    try:
        detector.elect(master("m1"))
        await asyncio.sleep(0)
        assert seen == [] and detector.detections == 0  # nobody asked yet
        follower.detect_again()
        await wait_for(lambda: seen == ["m1"])
        detector.elect(master("m2"))
        await wait_for(lambda: seen == ["m1", "m2"])
        detector.elect(master("m2"))  # the same leader again: not a succession
        detector.elect(master("m3"))
        await wait_for(lambda: seen == ["m1", "m2", "m3"])
        follower.detect_again()  # silence: look again, and report even the same one
        await wait_for(lambda: seen == ["m1", "m2", "m3", "m3"])
        assert detector.detections == 2
        detector.elect(master("m4"))
        await wait_for(lambda: seen[-1] == "m4")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_restarted_loop_looks_again_at_once() -> None:
    detector = ElectionDetector(leader=master("m1"))
    seen: list[str] = []
    follower = LeaderFollower(detector, lambda m: seen.append(m.id))
    follower.detect_again()
    first = asyncio.create_task(follower.run())
    await wait_for(lambda: seen == ["m1"])
    first.cancel()  # the supervisor restarts a loop that died
    await asyncio.gather(first, return_exceptions=True)
    again = asyncio.create_task(follower.run())
    try:
        await wait_for(lambda: seen == ["m1", "m1"])
    finally:
        again.cancel()
        await asyncio.gather(again, return_exceptions=True)
