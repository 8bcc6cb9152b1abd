"""How user code and a driver's event loop meet.

Both drivers (`SchedulerDriver`, `ExecutorDriver`) are thin asyncio shells around a
pure core that decides what each message, timer and user call means and answers
with effects. `DriverRuntime` is the part of the shell they share:

- User callbacks may be plain functions or ``async def``. They run one at a time, in
  the order their events arrived, on a worker task of their own, so a slow async
  callback never holds up heartbeats, acknowledgements or message handling.
- An exception in user code is logged with its traceback and reported through the
  user's ``error`` callback. An ``error`` callback that raises is only logged: it is
  never reported to itself.
- Driver methods may be called from callbacks (same loop) or from any thread: they
  hop onto the driver's loop with ``call_soon_threadsafe``. Calls made before the
  loop runs are kept and applied when it starts.
- ``run()`` blocks on a loop of its own, ``start()`` runs that loop on a background
  thread, and ``await run_async()`` uses the caller's loop.
- ``stop`` lets the callback that is running finish (so its implicit
  acknowledgement still goes out) and skips callbacks still queued; ``abort``
  cancels at once, even a callback that never returns.
- Nothing the core sends is dropped (`frameworks.outbox`): a full socket makes the
  send loop wait for it, and a long outbox makes the receive loop wait, so a flood
  slows the peer down instead of losing acknowledgements.
- Drivers share their process's loop fairly: the receive loop yields after
  every frame and the callback worker every `CALLBACKS_PER_TURN` callbacks.
  Awaiting a socket with a frame ready does not suspend, so before this one
  driver's flood of updates held ten drivers' loop for 15 s; their liveness
  checks fired before their frames were read, and the master, hearing no
  heartbeats, tore their frameworks down (issue 19's re-subscriptions).
- The socket loops (and a subclass's own, started with `_spawn`) run under a
  `dyad.supervision.Supervisor`: no frame can end the receive loop (a bad one is
  answered `Rejected`; one the core fails on is counted in `internal_errors` and
  logged at most once per interval), a loop that dies anyway is logged, counted
  and restarted, and one that keeps dying aborts the driver through the user's
  ``error`` callback instead of leaving it deaf.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from dyad.clock import Clock, SystemClock
from dyad.effects import ArmTimer, CancelTimer, Send, TimerFired
from dyad.messages import Batch, Message, Rejected
from dyad.supervision import LogLimiter, Supervisor
from dyad.timers import TimerTable
from dyad.transport import Dealer
from frameworks._security import SecureDealer
from frameworks.driver_core import Callback, DriverStatus, Finish, Received, Started
from frameworks.outbox import DEFAULT_LIMIT, Outbox

# How long a closing socket keeps flushing a farewell (Teardown, Unsubscribe).
_CLOSE_LINGER_MS = 1000
SEND_BATCH = 512
"""Messages sent in one `Batch` frame at most, to a peer that takes batches."""
CALLBACKS_PER_TURN = 64
"""Callbacks run back to back before the worker lets the loop's other tasks run."""


class DriverCore(Protocol):
    """What a driver's pure core offers its runtime: one way in."""

    def handle(self, event: Any, now: float) -> list[Any]: ...


CoreT = TypeVar("CoreT", bound=DriverCore)


async def invoke(callback: Callable[..., Any], *args: Any) -> Any:
    """Call `callback(*args)` and await the result if it is awaitable."""
    result = callback(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class DriverRuntime(Generic[CoreT]):
    """Lifecycle, threading, timers, sockets and the callback worker of a driver.

    Every event goes to `core.handle(event, clock.now())` (through `_handle`), and
    the runtime carries out the effects that come back. Subclasses may extend
    `_open`, `_close`, `_perform_other`, `_callback_returned`, `_farewell`.
    """

    OUTBOX_LIMIT = DEFAULT_LIMIT

    def __init__(self, target: object, log: logging.Logger, core: CoreT,
                 clock: Clock | None = None, credentials: Any = None) -> None:
        self._target = target
        self._core = core
        self._clock: Clock = clock or SystemClock()
        self._log = log
        self._status = DriverStatus.NOT_STARTED
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._early: list[Callable[[], None]] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._callbacks: asyncio.Queue[Callback | Finish] = asyncio.Queue()
        self._outbox = Outbox(self.OUTBOX_LIMIT)
        self._timers = TimerTable(self._clock.now, self._fire)
        self._loops = Supervisor(self._loops_failed, self._count_internal_error,
                                 logger=self._log)
        self._errors = LogLimiter(self._log)
        self._worker: asyncio.Task[Finish] | None = None
        self._stopping = False
        self._dealer: Dealer | None = None
        self._secure: SecureDealer | None = None
        self._credentials = credentials  # dyad.auth.ClientCredentials, or None
        self.messages_invalid = 0
        """Frames from the peer that failed to decode (each answered with Rejected)."""
        self.internal_errors = 0
        """Frames the core failed on, and deaths of the driver's loops (bugs, logged)."""
        self.send_waits = 0
        """Sends that found the socket's queue full and waited for room."""
        self.peer_batches = False
        """The peer has sent us a `Batch`, so it takes them: what queues for it
        goes in batches (a subclass resets this when the peer changes)."""
        self.batches_sent = 0
        """Batch frames sent (a counter; their messages are counted one by one
        nowhere else)."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def status(self) -> DriverStatus:
        return self._status

    def run(self) -> DriverStatus:
        """Run on a new event loop in this thread until the driver stops."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async())
        raise RuntimeError("run() blocks its thread; inside asyncio use `await driver.run_async()`")

    def start(self) -> DriverStatus:
        """Run the driver on a background (daemon) thread; returns at once."""
        with self._lock:
            if self._thread is not None or self._status is not DriverStatus.NOT_STARTED:
                raise RuntimeError("a driver can be started only once")
            self._thread = threading.Thread(
                target=self.run, name=type(self).__name__, daemon=True)
        self._thread.start()
        return DriverStatus.RUNNING

    def join(self, timeout: float | None = None) -> DriverStatus:
        """Block until the driver has stopped (or `timeout` passes); return its status,
        which is still ``DRIVER_RUNNING`` if the timeout passed first."""
        if self._loop_thread == threading.get_ident() and self._loop is not None:
            raise RuntimeError("join() from the driver's own loop would never return")
        with self._lock:
            if self._status is DriverStatus.NOT_STARTED and self._thread is None:
                return self._status
        self._done.wait(timeout)
        return self._status

    def abort(self) -> DriverStatus:
        """End the driver now, without telling the peer; a running callback is cancelled."""
        self._on_loop("abort", self._abort_now)
        return DriverStatus.ABORTED

    async def run_async(self) -> DriverStatus:
        """Run on the current event loop until the driver stops; return how it ended."""
        early = self._claim()
        status = DriverStatus.ABORTED
        secure = SecureDealer(self._credentials, self._auth_refused)
        self._dealer, self._secure = secure.dealer, secure
        try:
            self._worker = asyncio.create_task(self._run_callbacks())
            await self._open()
            self._loops.loop("driver-send", self._send_forever)
            self._loops.loop("driver-receive", self._receive_forever)
            self._handle(Started())
            for call in early:
                call()
            await asyncio.wait([self._worker])
            if not self._worker.cancelled():
                status = self._worker.result().status
                await self._flush(self._farewell() if status is DriverStatus.STOPPED else [])
        finally:
            await self._shutdown_tasks()
            await self._close()
            await secure.close(_CLOSE_LINGER_MS)
            with self._lock:
                self._status = status
                self._loop = None
            self._done.set()
        return status

    def _auth_refused(self, reason: str) -> None:
        """A CURVE handshake failed (a wrong key on either side): tell the user."""
        self._log.error("connection refused: %s", reason)
        self._callbacks.put_nowait(Callback("error", (f"connection refused: {reason}",)))

    def _claim(self) -> list[Callable[[], None]]:
        with self._lock:
            if self._status is not DriverStatus.NOT_STARTED:
                raise RuntimeError("a driver runs only once; create a new one")
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            self._status = DriverStatus.RUNNING
            early, self._early = self._early, []
        return early

    def _spawn(self, coro: Any) -> None:
        """Run a subclass's task until the driver ends; if it raises, the driver aborts."""
        self._loops.once(getattr(coro, "__name__", "driver-task"), coro)

    def down(self) -> list[str]:
        """The driver's loops that are not running (empty while it is healthy)."""
        return self._loops.down()

    def _count_internal_error(self) -> None:
        self.internal_errors += 1

    def _loops_failed(self, reason: str) -> None:
        """A loop kept dying (or a one-shot task failed): a deaf driver helps
        nobody, so it tells the user and aborts."""
        self._apply([Callback("error", (f"driver loop failed: {reason}",)),
                     Finish(DriverStatus.ABORTED)])

    async def _shutdown_tasks(self) -> None:
        self._timers.cancel_all()
        await self._loops.stop()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    async def _flush(self, farewell: Iterable[Message]) -> None:
        """Send what is still queued, then the farewell, before the socket closes;
        waiting for room at most `_CLOSE_LINGER_MS` in all."""
        await self._loops.stop()
        assert self._dealer is not None
        try:
            async with asyncio.timeout(_CLOSE_LINGER_MS / 1000):
                while self._outbox:
                    await self._dealer.send_waiting(self._outbox.pop())
                for message in farewell:
                    await self._dealer.send_waiting(message)
        except TimeoutError:
            self._log.warning("stopped with messages unsent (%d queued): the peer is "
                              "not reading", len(self._outbox))

    # ------------------------------------------------------- calls from anywhere

    def _on_loop(self, what: str, call: Callable[[], None]) -> None:
        """Run `call` on the driver's loop: now if we are on it, else thread-safely;
        kept for later before the loop runs, dropped (with a warning) after it ended."""
        with self._lock:
            if self._loop is None:
                if self._status is DriverStatus.NOT_STARTED:
                    self._early.append(call)
                else:
                    self._log.warning("%s ignored: the driver has stopped", what)
                return
            if threading.get_ident() != self._loop_thread:
                self._loop.call_soon_threadsafe(call)
                return
        call()

    def _request_stop(self, status: DriverStatus = DriverStatus.STOPPED) -> None:
        """On the loop: finish after the running callback; skip the queued ones."""
        if not self._stopping:
            self._stopping = True
            self._callbacks.put_nowait(Finish(status))

    def _abort_now(self) -> None:
        self._stopping = True
        if self._worker is not None:
            self._worker.cancel()

    # ------------------------------------------------------------------- effects

    def _handle(self, event: Any) -> None:
        """On the loop: hand `event` to the core and carry out what it decides."""
        self._apply(self._core.handle(event, self._clock.now()))

    def _apply(self, effects: Iterable[Any]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self._outbox.put(effect.message)
            elif isinstance(effect, (Callback, Finish)):
                self._callbacks.put_nowait(effect)
            elif isinstance(effect, (ArmTimer, CancelTimer)):
                self._timers.perform(effect)
            else:
                self._perform_other(effect)

    def _fire(self, key: Hashable) -> None:
        self._handle(TimerFired(key))

    async def _send_forever(self) -> None:
        """Send the outbox in order: one frame per message, or, to a peer that
        takes batches, whatever has queued up (at most `SEND_BATCH` messages and
        about `MAX_BATCH_BYTES`) in one frame."""
        assert self._dealer is not None
        while True:
            await self._outbox.peek()
            frame, carried, held = self._outbox.next_frame(SEND_BATCH, self.peer_batches)
            if not self._dealer.send_frame(frame):
                self.send_waits += 1
                await self._dealer.send_frame_waiting(frame)
            if held > 1:
                self.batches_sent += 1
            for _ in range(carried):
                self._outbox.pop()

    async def _receive_forever(self) -> None:
        assert self._dealer is not None
        while True:
            await self._outbox.room()  # backpressure: read no more than we can answer
            inbound = await self._dealer.recv()
            if inbound.error is not None:
                # The contract: answer a bad frame with Rejected, count it, carry on.
                self.messages_invalid += 1
                self._log.warning("invalid frame: %s", inbound.error.reason)
                self._outbox.put(Rejected(
                    reason=inbound.error.reason, message_type=inbound.error.type_name))
            elif isinstance(inbound.message, Batch):
                self.peer_batches = True
                for message in inbound.message.messages:  # as if each had come alone
                    self._received(message)
            elif inbound.message is not None:
                self._received(inbound.message)
            # Awaiting a socket that has a frame ready does not suspend: without
            # this a flood of frames kept the loop to this task, starving the
            # other drivers of the process, their heartbeats and their liveness
            # checks, which then fired before their frames were read (issue 19).
            await asyncio.sleep(0)

    def _received(self, message: Message) -> None:
        try:
            self._handle(Received(message))
        except Exception:  # the core's bug: this message is lost, not the loop
            self.internal_errors += 1
            self._errors.exception(message.TYPE, "the driver failed to handle a %s "
                                   "message", message.TYPE)

    # ----------------------------------------------------------- user callbacks

    async def _run_callbacks(self) -> Finish:
        ran = 0
        while True:
            item = await self._callbacks.get()
            if isinstance(item, Finish):
                return item
            if self._stopping:
                continue
            if await self._invoke(item.name, *item.args):
                self._callback_returned(item)
            ran += 1
            if ran % CALLBACKS_PER_TURN == 0:
                await asyncio.sleep(0)  # a queue of thousands must not hold the loop

    async def _invoke(self, name: str, *args: Any) -> bool:
        """Call the user's callback; True if it returned, False if it raised."""
        try:
            await invoke(getattr(self._target, name), self, *args)
            return True
        except Exception as exc:
            self._log.exception("%s.%s raised", type(self._target).__name__, name)
            if name != "error":
                await self._invoke("error", f"{name} raised {exc!r}")
            return False

    # --------------------------------------------------------- subclass hooks

    async def _open(self) -> None:
        """Connect and start the subclass's own tasks (with `_spawn`)."""

    async def _close(self) -> None:
        """Release what `_open` acquired (sockets are closed by the runtime)."""

    def _perform_other(self, effect: Any) -> None:
        raise TypeError(f"unknown effect {effect!r}")

    def _callback_returned(self, callback: Callback) -> None:
        """Called after a callback returned without raising."""

    def _farewell(self) -> list[Message]:
        """Messages to send when the driver stops normally."""
        return []
