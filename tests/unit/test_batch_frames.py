"""`Batch` frames (several messages for one peer in one frame, issue 19), the
master's `Outflow` that makes them, and the msgspec writer behind `encode`."""

from __future__ import annotations

import enum
import json

import pytest
from hypothesis import HealthCheck, given, settings

from dyad import messages as m
from dyad.codec import dumps, to_json
from master.inflow import Inflow
from master.outflow import Outflow
from tests.unit.test_wire_properties import decode_or_reject, envelopes

ACK = m.Acknowledge(framework_id="F", agent_id="A", task_id="t1", uuid="u1")
UPDATE = m.Update(status=m.TaskStatus(task_id="t1", state=m.TaskState.TASK_RUNNING,
                                      source=m.Source.EXECUTOR, uuid="u1"))


def batch_frame(*items: bytes) -> bytes:
    return m.encode_batch(list(items))


def reason_of(frame: bytes) -> str:
    with pytest.raises(m.MessageError) as caught:
        m.decode(frame)
    assert caught.value.type_name == m.BATCH_TYPE
    return caught.value.reason


# ------------------------------------------------------------------- the frame


def test_a_batch_round_trips_in_order() -> None:
    batch = m.Batch(messages=[ACK, m.Heartbeat(), UPDATE])
    frame = m.encode(batch)
    assert frame == batch_frame(m.encode(ACK), m.encode(m.Heartbeat()), m.encode(UPDATE))
    assert m.decode(frame) == batch
    assert m.BATCH_TYPE not in m.MESSAGE_TYPES  # never handed to a core as such


@pytest.mark.parametrize("frame, fragment", [
    (b'{"type":"batch","v":1,"body":{"messages":[]}}', "non-empty list"),
    (b'{"type":"batch","v":1,"body":{"messages":{}}}', "non-empty list"),
    (b'{"type":"batch","v":1,"body":{}}', 'exactly {"messages"'),
    (b'{"type":"batch","v":1,"body":{"messages":[1],"more":2}}', 'exactly {"messages"'),
    (batch_frame(m.encode(ACK), b"7"), "messages[1]: frame must be a JSON object"),
    (batch_frame(b'{"type":"nope","v":1,"body":{}}'), "messages[0]: unknown message type"),
    (batch_frame(b'{"type":"heartbeat","v":2,"body":{}}'), "messages[0]: unsupported version"),
    (batch_frame(b'{"type":"rescind","v":1,"body":{}}'),
     "messages[0]: invalid rescind: offer_id: missing required field"),
    (batch_frame(m.encode(m.Batch(messages=[ACK]))), "messages[0] is a batch itself"),
])
def test_a_bad_batch_is_refused_with_a_reason(frame: bytes, fragment: str) -> None:
    assert fragment in reason_of(frame)


def test_a_batch_other_than_version_one_is_refused_as_any_frame() -> None:
    with pytest.raises(m.MessageError, match="unsupported version"):
        m.decode(b'{"type":"batch","v":2,"body":{"messages":[]}}')


def test_deep_nesting_inside_a_batch_is_a_reason_not_a_recursion_error() -> None:
    deep = b'{"type":"heartbeat","v":1,"body":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with pytest.raises(m.MessageError, match="nested deeper"):
        m.decode(batch_frame(deep))


# ----------------------------------------------------------- the msgspec writer


def test_every_wire_enum_is_written_by_its_name() -> None:
    """msgspec writes an enum's value, the codec its name: they must agree."""
    for value in vars(m).values():
        if isinstance(value, type) and issubclass(value, enum.Enum):
            assert all(member.value == member.name for member in value), value


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes)
def test_dumps_writes_what_the_codec_would(envelope: dict) -> None:
    message = decode_or_reject(json.dumps(envelope).encode())
    if message is not None:
        assert json.loads(dumps(message)) == to_json(message)
        assert m.decode(m.encode(message)) == message


def test_dumps_falls_back_for_what_msgspec_refuses() -> None:
    """A lone surrogate (from a local path, say) is escaped as `json` would, for
    the receiver to judge, instead of raising in the sender."""
    status = m.TaskStatus(task_id="t\udcff", state=m.TaskState.TASK_RUNNING)
    assert json.loads(dumps(status)) == to_json(status)


# ------------------------------------------------------------------ the outflow


def test_one_message_goes_alone_and_several_as_one_batch_per_peer() -> None:
    outflow = Outflow()
    a, b, c = (m.encode(x) for x in (ACK, m.Heartbeat(), UPDATE))
    assert outflow.add("p1", a) == [] and outflow.add("p2", b) == []
    assert outflow.add("p1", c) == []
    assert len(outflow) == 3
    assert outflow.flush() == [("p1", batch_frame(a, c)), ("p2", b)]
    assert outflow.flush() == [] and len(outflow) == 0
    assert (outflow.batches, outflow.batched) == (1, 2)


def test_a_large_frame_goes_alone_after_what_waited_for_its_peer() -> None:
    outflow = Outflow(max_bytes=1000, alone_bytes=100)
    small, large = m.encode(ACK), b"x" * 100
    outflow.add("p", small)
    assert outflow.add("p", large) == [("p", small), ("p", large)]
    assert outflow.flush() == []


def test_a_batch_is_closed_at_its_size() -> None:
    small = m.encode(ACK)
    outflow = Outflow(max_bytes=2 * len(small) + 2, alone_bytes=len(small) + 1)
    assert outflow.add("p", small) == [] and outflow.add("p", small) == []
    assert outflow.add("p", small) == [("p", batch_frame(small, small))]
    assert outflow.flush() == [("p", small)]


def test_an_outflow_needs_sane_sizes() -> None:
    with pytest.raises(ValueError):
        Outflow(max_bytes=10, alone_bytes=20)


# ------------------------------------------------------------------- the inflow


def test_a_drivers_batch_takes_the_framework_lane() -> None:
    inflow = Inflow(turns=1)
    pong = m.encode(m.Pong(agent_id="a"))
    acks = batch_frame(m.encode(ACK), m.encode(ACK))
    inflow.put_frame("pong", b"agent", pong)
    inflow.put_frame("acks", b"fw", acks)
    assert [inflow.take(), inflow.take()] == ["acks", "pong"]
