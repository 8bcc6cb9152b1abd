"""Small process helpers both the agent and executors need (they may not import
each other, so the one copy lives in the shared kernel)."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)


def describe_exit(returncode: int, subject: str) -> str:
    """'Command exited with status 3' or 'Executor terminated by signal SIGKILL'
    (`returncode` < 0 is a signal number, as subprocess reports it)."""
    if returncode >= 0:
        return f"{subject} exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = str(-returncode)
    return f"{subject} terminated by signal {name}"


def leads_a_group(pid: int) -> bool:
    """Whether a live process `pid` leads its own process group. Asked of a
    reaped leader's pid before signalling its group: if it is true, the pid was
    reused, by a new group's leader (the group of that number is not ours) or,
    as rarely, by a process forked within ours; either way the caller does not
    signal the group, and kills only the processes it knows are the run's."""
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a whole process group; a group that is gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already empty
    except PermissionError:
        # Every member exited and the pgid now names someone else's group.
        log.debug("not allowed to signal process group %d", pgid)
