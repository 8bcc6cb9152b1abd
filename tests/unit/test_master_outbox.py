"""The agent's sends to the master: single frames until the master sends a batch,
then the sends of a core batch in `Batch` frames, in order, bounded in size."""

from __future__ import annotations

from agent.master_outbox import MasterOutbox
from dyad.messages import MAX_BATCH_BYTES, AgentInfo, Batch, Pong, RegisterAgent, decode, encode
from dyad.resources import Resources


def _pongs(count: int, size: int = 0) -> list[Pong]:
    return [Pong(agent_id=f"a{n}" + "x" * size) for n in range(count)]


def _messages(frames: list[bytes]) -> list[object]:
    out: list[object] = []
    for frame in frames:
        message = decode(frame)
        out += message.messages if isinstance(message, Batch) else [message]
    return out


def _batching() -> tuple[list[bytes], MasterOutbox]:
    """An outbox whose master has sent a batch, and what it sends."""
    sent: list[bytes] = []
    outbox = MasterOutbox(lambda frame: sent.append(frame) or True)
    outbox.batching = True
    return sent, outbox


def test_until_the_master_batches_every_send_is_a_frame_of_its_own_at_once() -> None:
    sent: list[bytes] = []
    outbox = MasterOutbox(lambda frame: sent.append(frame) or True)
    for pong in _pongs(3):
        outbox.send(pong)
    assert sent == [encode(pong) for pong in _pongs(3)]
    outbox.flush()
    assert len(sent) == 3 and outbox.batch_frames_sent == 0


def test_once_it_does_a_core_batch_goes_in_one_frame_in_order() -> None:
    sent, outbox = _batching()
    for pong in _pongs(5):
        outbox.send(pong)
    assert sent == []  # held to the end of the core batch
    outbox.flush()
    assert len(sent) == 1 and _messages(sent) == _pongs(5)
    assert (outbox.batch_frames_sent, outbox.messages_sent_batched) == (1, 5)
    outbox.send(_pongs(1)[0])
    outbox.flush()
    assert sent[-1] == encode(_pongs(1)[0])  # one alone is no batch
    outbox.flush()
    assert len(sent) == 2  # nothing held: nothing sent


def test_a_batch_is_closed_at_about_the_size_limit() -> None:
    sent, outbox = _batching()
    pongs = _pongs(40, size=MAX_BATCH_BYTES // 16)
    for pong in pongs:
        outbox.send(pong)
    outbox.flush()
    assert len(sent) >= 3
    assert all(len(frame) < 2 * MAX_BATCH_BYTES for frame in sent)
    assert _messages(sent) == pongs


def test_a_new_master_gets_what_was_held_then_single_frames() -> None:
    sent, outbox = _batching()
    for pong in _pongs(2):
        outbox.send(pong)
    outbox.new_master()
    assert _messages(sent) == _pongs(2)
    outbox.send(_pongs(1)[0])
    assert sent[-1] == encode(_pongs(1)[0])


def test_registering_again_goes_alone_and_ends_the_batching() -> None:
    # A master restarted on the same address is not "detected" anew, but the agent
    # registers with it again: it may be an older one.
    sent, outbox = _batching()
    outbox.send(_pongs(1)[0])
    register = RegisterAgent(agent=AgentInfo(hostname="h", port=1, resources=Resources.parse("cpus:1")))
    outbox.send(register)
    assert _messages(sent) == [_pongs(1)[0], register] and not outbox.batching
