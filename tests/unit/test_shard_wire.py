"""Link shards' frame format and the master's table of routes (master/shard_wire.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from master.shard_wire import (
    FRAME_BYTES, FRAME_RECORDS, MAGIC, ShardFrameError, ShardRoutes, pack, unpack)

records = st.lists(st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=20),
                             st.binary(max_size=300)), max_size=50)


@given(records)
def test_what_is_packed_unpacks_to_the_same_records_in_order(these: list) -> None:
    frames = pack(these)
    assert [r for frame, _ in frames for r in unpack(frame)] == these
    assert sum(count for _, count in frames) == len(these)


def test_frames_are_bounded_by_records_and_by_bytes() -> None:
    many = [(b"a%d" % i, b"", b"x") for i in range(FRAME_RECORDS * 2 + 1)]
    assert [count for _, count in pack(many)] == [FRAME_RECORDS, FRAME_RECORDS, 1]
    big = [(b"a", b"", b"x" * (FRAME_BYTES // 2)) for _ in range(5)]
    frames = pack(big)
    assert [count for _, count in frames] == [2, 2, 1]
    assert all(len(frame) < FRAME_BYTES + FRAME_BYTES // 2 for frame, _ in frames)


def test_nothing_to_send_is_no_frame() -> None:
    assert pack([]) == []
    assert unpack(MAGIC) == []


@pytest.mark.parametrize("frame, reason", [
    (b'{"type":"Ping"}', "wrong opening"),
    (MAGIC + b"\x00\x01\x00", "cut off"),
    (MAGIC + b"\x00\x01\x00\x00\x00\x00\x00\x05ab", "past the end"),
    (MAGIC + b"\x00\x00\x00\x00\x00\x00\x00\x01x", "no agent identity"),
])
def test_a_frame_that_does_not_parse_is_refused_whole_with_a_reason(
        frame: bytes, reason: str) -> None:
    with pytest.raises(ShardFrameError, match=reason):
        unpack(frame)


@given(st.binary(max_size=200))
def test_no_bytes_make_unpack_raise_anything_but_a_shard_frame_error(junk: bytes) -> None:
    for frame in (junk, MAGIC + junk):
        try:
            unpack(frame)
        except ShardFrameError:
            pass


def test_replies_go_back_the_way_the_last_frame_came() -> None:
    routes = ShardRoutes()
    routes.learn(b"agent", b"shard-1")
    assert routes.shard_of(b"agent") == b"shard-1"
    routes.learn(b"agent", b"shard-2")  # reconnected through another shard
    assert routes.shard_of(b"agent") == b"shard-2"
    routes.forget(b"agent")  # came directly: the master's own socket reaches it
    assert routes.shard_of(b"agent") is None
    routes.forget(b"never-seen")  # a no-op
    assert len(routes) == 0


def test_routes_are_bounded_and_the_one_quiet_longest_goes_first() -> None:
    routes = ShardRoutes(most=3)
    for name in (b"a", b"b", b"c"):
        routes.learn(name, b"s1")
    routes.learn(b"a", b"s1")  # heard again: now the freshest
    routes.learn(b"d", b"s2")
    assert routes.shard_of(b"b") is None
    assert [routes.shard_of(n) for n in (b"a", b"c", b"d")] == [b"s1", b"s1", b"s2"]
    assert len(routes) == 3 and routes.forgotten == 1
    assert routes.shards() == {b"s1", b"s2"}


def test_a_route_keeps_its_principal_until_it_is_forgotten() -> None:
    routes = ShardRoutes()
    assert routes.learn(b"agent", b"s1", b"agent-host1")
    assert not routes.learn(b"agent", b"s2", b"intruder")  # refused, route unchanged
    assert routes.shard_of(b"agent") == b"s1"
    assert routes.learn(b"agent", b"s2", b"agent-host1")
    routes.forget(b"agent")
    assert routes.learn(b"agent", b"s1", b"someone-else")
