"""Running an executor run as the Unix user its task names (``--switch-user``).

The user is the task's `CommandInfo.user` (a custom executor's own command's),
else `FrameworkInfo.user` (`agent.launch.run_user`); the master's `run_task` ACLs
decided whether the framework's principal may ask for it. An agent running as
root runs the whole run -- executor and tasks -- as that user: it hands the
sandbox over (ownership, recursively; symlinks and files with other hard links
are not followed), sets ``HOME``, ``USER`` and ``LOGNAME``, and starts the run
through ``setpriv``, which drops to the user's uid, gid and groups *after* the
isolator's wrapper has put the run in its cgroup (that needs root). A user that does not exist, or an agent that is
not root and asked to be someone else, refuses the launch with the reason
(`UserError`), which the run's tasks fail with.

The run's interpreter and code must be readable by the user: the command
executor runs the agent's Python (``sys.executable``) and Dyad's source.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat

import attrs

SETPRIV = "setpriv"  # util-linux


class UserError(Exception):
    """The run cannot be started as the user it names; says why."""


@attrs.frozen
class RunAs:
    name: str
    uid: int
    gid: int
    home: str


def resolve(user: str, switch: bool, euid: int | None = None) -> RunAs | None:
    """Whom to run as: None for the agent's own user (no user named, switching
    off, or the user is the agent's); `UserError` if the user cannot be had."""
    if not switch or not user:
        return None
    euid = os.geteuid() if euid is None else euid
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise UserError(f"user {user!r} does not exist on this agent") from None
    if entry.pw_uid == euid:
        return None
    if euid != 0:
        raise UserError(f"the agent runs as uid {euid}, not root, and cannot switch to user "
                        f"{user!r} (--switch-user needs root; or run the agent with "
                        "--no-switch-user to run every task as the agent's user)")
    return RunAs(user, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def command(run_as: RunAs, argv: list[str]) -> list[str]:
    """`argv` started as `run_as` (goes inside the isolator's wrapper)."""
    setpriv = shutil.which(SETPRIV)
    if setpriv is None:
        raise UserError(f"cannot switch to user {run_as.name!r}: {SETPRIV} (util-linux) "
                        "is not installed")
    return [setpriv, f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--init-groups",
            "--", *argv]


def environment(run_as: RunAs) -> dict[str, str]:
    return {"HOME": run_as.home, "USER": run_as.name, "LOGNAME": run_as.name}


def hand_over(run_as: RunAs, sandbox: str) -> None:
    """Give `sandbox` and everything in it to `run_as` (blocking: off the loop).
    Symlinks are changed themselves, never what they point at; a file with
    other hard links is left as it is, since its other names may lie outside."""
    os.chown(sandbox, run_as.uid, run_as.gid, follow_symlinks=False)
    for root, dirs, files in os.walk(sandbox):
        for name in (*dirs, *files):
            path = os.path.join(root, name)
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
                continue
            os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
