"""Short pauses for the cyclic garbage collector in a process with a large, long-lived heap.

CPython's full (generation 2) collection walks every tracked object. A master with
10,000 agents and tens of thousands of task records has millions, and each full
collection stopped its event loop for 100-440 ms under a launch flood (measured in
`benchmarks.master`, a `gc.callbacks` probe): every task in flight waited, and
those pauses were the p99 of accept -> TASK_RUNNING (issue 19).

`install()` freezes (`gc.freeze`) what survives each full collection, so the next
one walks only what was made since: objects that live long are walked once, not
at every full collection. Frozen objects are still freed by reference counting
the moment nothing refers to them; only garbage *cycles* among them would stay.
To bound that, once the frozen heap has doubled since the last complete walk it
is unfrozen, so the next full collection walks everything once (one long pause,
at most once per doubling of the heap), and what survives it is frozen again. So
memory held by cyclic garbage stays under the live heap's size, and pauses are
long only while the heap doubles.

`install()` also collects the young generation every `YOUNG` allocations, not
CPython's 700 (as the agent's holder and the simulator do): a busy master makes
and drops objects by the thousand per processing batch, and at 700 its young
and middle collections, and the full ones they trigger every hundred young ones,
took 2.5-3.3 s of the master's 26-31 s of CPU in a `benchmarks.master` run at
10,000 agents (a `gc.callbacks` probe); at 10,000, 1.0 s, with young pauses of
~15 ms and no full collection inside the run (issue 19).

The agent installs it too: in `benchmarks.launch` (one agent, 500 tasks at once,
quiet, 6 pairs back to back against the agent without it) the agent spent 0.8-1.2
ms of CPU a task against 0.8-1.4, and the run reached 0.23-0.30 of fork/exec's rate
against 0.20-0.29, higher in 6 of 6 pairs.
"""

from __future__ import annotations

import gc

YOUNG = 10_000
"""Allocations (less deallocations) between young collections, at least."""
FLOOR = 100_000
"""Frozen objects below which no complete walk is forced (a small heap's full
collections are short anyway)."""


class _Policy:
    def __init__(self) -> None:
        self.base = 0  # frozen after the last complete walk
        self.complete_next = False
        self.complete_walks = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        if self.complete_next:  # this one walked everything
            self.complete_next = False
            self.complete_walks += 1
            gc.freeze()
            self.base = gc.get_freeze_count()
        elif gc.get_freeze_count() > max(2 * self.base, FLOOR):
            gc.unfreeze()  # the next full collection walks all, frozen cycles too
            self.complete_next = True
        else:
            gc.freeze()


_installed: _Policy | None = None


def install() -> None:
    """Freeze what survives full collections, and collect the young generation
    every `YOUNG` allocations at least, from now on (idempotent)."""
    global _installed
    young, *older = gc.get_threshold()
    if 0 < young < YOUNG:  # 0: collection is off, and stays so
        gc.set_threshold(YOUNG, *older)
    if _installed is None:
        _installed = _Policy()
        gc.callbacks.append(_installed)


def settle() -> None:
    """Now is a good time for one long pause (a process that has just built its
    long-lived state, before it serves): collect everything once and freeze what
    survives, so later full collections walk only what comes after."""
    gc.collect()
    gc.freeze()
    if _installed is not None:
        _installed.base = gc.get_freeze_count()
        _installed.complete_next = False


def complete_walks() -> int:
    """Complete walks done since `install` (for tests and metrics)."""
    return 0 if _installed is None else _installed.complete_walks
