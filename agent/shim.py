"""The holder of a direct command task's exit status: a few lines of /bin/sh.

A task the agent runs itself (`agent.host_runs`) is not started bare: its
command runs under this shim, the agent's child and the leader of the run's
session. The shim runs the command in the foreground of its own process group,
waits for it, writes its exit status to `STATUS_FILE` in the sandbox, and exits
with it. So the status outlives the agent: a run whose agent died is reaped by
init, but a restarted agent reads the file.

- Signals for a kill go to the whole group (`KillExecutor`): the command gets
  SIGTERM with its default disposition (a trap that runs a command is reset in
  children, unlike an ignored signal), while the shim, trapping it, lives on to
  write the status. SIGKILL ends both; then no status is written, and the core
  knows the end from the kill it asked for.
- A shell reports death by signal n as status 128 + n, which an exit with that
  status cannot be told apart from (the agent's description says both).
- It writes no file but the status: an agent that died between starting it and
  checkpointing its pid finds it after a restart as the process working in the
  run's sandbox (`containerizer.stop_unrecorded`), and stops it.
- Under cgroups it joins the run's cgroups itself (`join`) before it forks the
  command, where any other run is first exec'ed by a joining shell.
- Cost: one dash process (about 1 MiB resident, under a millisecond of CPU,
  measured by `benchmarks.launch`) and one fork/exec more than the bare command.

Pure: the core builds the wrapped command; the shell reads the file.
"""

from __future__ import annotations

from dyad.messages import CommandInfo

STATUS_FILE = ".dyad-exit-status"
SHELL = "/bin/sh"
# $0 is the status file; then the files to write our pid to (the run's cgroups'
# `cgroup.procs`, given by the shell: `join`), "--" and the task's argv.
SCRIPT = ('trap : TERM\n'
          'while [ "$1" != -- ]; do echo $$ >"$1" || exit 126; shift; done\nshift\n'
          '"$@"\ns=$?\necho $s >"$0"\nexit $s\n')
_FIRST_FILE = 4  # where `join` puts the files: after sh, -c, SCRIPT and the status file


def wrap(command: CommandInfo, status_path: str) -> CommandInfo:
    """`command` under the shim; its environment and URIs stay the task's."""
    argv = [SHELL, "-c", command.shell] if command.shell is not None else list(command.argv or ())
    return CommandInfo(argv=[SHELL, "-c", SCRIPT, status_path, "--", *argv],
                       environment=dict(command.environment), uris=list(command.uris),
                       user=command.user)


def join(argv: list[str], files: list[str]) -> list[str]:
    """The shim's `argv` (from `wrap`) that first writes its pid to each of
    `files`: it joins the run's cgroups itself, so the command it forks is born
    in them, and no joining shell is exec'ed before it (one exec fewer a task)."""
    assert argv[2] == SCRIPT and argv[_FIRST_FILE] == "--", argv
    return [*argv[:_FIRST_FILE], *files, *argv[_FIRST_FILE:]]


def parse_status(text: str) -> int | None:
    """The status the shim wrote, or None (nothing written: it was killed first)."""
    text = text.strip()
    if not text.isdigit() or int(text) > 255:
        return None
    return int(text)
