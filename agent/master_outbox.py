"""The agent's sends to the master, in `Batch` frames once the master sends them.

Under a flood, the effects of one core batch (`agent.server.CORE_BATCH` events)
hold hundreds of sends to the master (a `TASK_RUNNING` or a `TASK_FINISHED` for
each task). Each frame costs the agent a ZeroMQ send and the master a receive.
Held until the end of the core batch, they go as a few `Batch` frames instead
(closed at about `MAX_BATCH_BYTES`), handled by the master one by one, in order,
as if each had come alone (docs/protocol.md). Only to a master that has sent
this agent a batch since the agent detected it and last registered, as the
scheduler driver does: an older master (or one restarted on the same address,
which the agent registers with again) never sees one.
"""

from __future__ import annotations

from typing import Callable

from dyad.messages import MAX_BATCH_BYTES, Message, RegisterAgent, encode, encode_batch


class MasterOutbox:
    """`send_frame(frame) -> bool` queues one frame to the master (False: its
    queue is full and the frame is dropped, which updates' retries cover)."""

    def __init__(self, send_frame: Callable[[bytes], bool]) -> None:
        self._send_frame = send_frame
        self.batching = False  # the master we talk to sends batches itself
        self._frames: list[bytes] = []
        self._size = 0
        self.batch_frames_sent = 0
        self.messages_sent_batched = 0

    def send(self, message: Message) -> None:
        frame = encode(message)
        if isinstance(message, RegisterAgent):  # a new conversation (the master may
            self.flush()                       # be another, restarted on the address):
            self.batching = False              # single frames until it batches again
        if not self.batching:
            self._send_frame(frame)
            return
        self._frames.append(frame)
        self._size += len(frame)
        if self._size >= MAX_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Send what is held, in the order it was given."""
        frames, self._frames, self._size = self._frames, [], 0
        if len(frames) == 1:
            self._send_frame(frames[0])
        elif frames:
            self._send_frame(encode_batch(frames))
            self.batch_frames_sent += 1
            self.messages_sent_batched += len(frames)

    def new_master(self) -> None:
        """Another master (or the same one again) was detected: single frames
        until it sends a batch itself."""
        self.flush()
        self.batching = False
