"""Whom a run is for (`agent.launch.run_user`), whether the agent can be that
user (`agent.users`), and a COMMAND health check run as it."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import pytest

from agent import users
from agent.health import HealthRound, RunHealthCheck
from agent.launch import run_user
from agent.model import AgentExecutor
from agent.probes import probe
from dyad.messages import (
    CommandInfo,
    ExecutorInfo,
    HealthCheck,
    HealthCheckType,
    TaskInfo,
)
from dyad.resources import Resources

NOBODY = pwd.getpwnam("nobody")


def executor(is_command: bool, user: str = "") -> AgentExecutor:
    info = ExecutorInfo(executor_id="e", command=CommandInfo(shell="run-executor", user=user))
    return AgentExecutor("F1", info, "r1", "/sandbox", is_command)


def task(user: str | None) -> TaskInfo:
    command = CommandInfo(shell="true", user=user) if user is not None else None
    return TaskInfo(task_id="t", name="t", agent_id="S1", resources=Resources.parse("cpus:1"),
                    command=command)


@pytest.mark.parametrize("is_command, executor_user, task_user, framework_user, wanted", [
    (True, "", "app", "fw", "app"),       # a command task's own user
    (True, "", "", "fw", "fw"),           # else its framework's
    (False, "svc", None, "fw", "svc"),    # a custom executor's command's user
    (False, "", None, "fw", "fw"),
    (True, "", "", "", ""),               # nobody named: the agent's own
])
def test_the_run_is_for_the_commands_user_else_the_frameworks(
        is_command: bool, executor_user: str, task_user: str | None, framework_user: str,
        wanted: str) -> None:
    assert run_user(executor(is_command, executor_user), task(task_user), framework_user) == wanted


def test_no_switch_when_off_unnamed_or_already_that_user() -> None:
    assert users.resolve("nobody", switch=False, euid=0) is None
    assert users.resolve("", switch=True, euid=0) is None
    assert users.resolve("nobody", switch=True, euid=NOBODY.pw_uid) is None


def test_root_switches_to_an_existing_user() -> None:
    run_as = users.resolve("nobody", switch=True, euid=0)
    assert run_as == users.RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid, NOBODY.pw_dir)
    assert users.environment(run_as) == {"HOME": NOBODY.pw_dir, "USER": "nobody",
                                         "LOGNAME": "nobody"}
    argv = users.command(run_as, ["/bin/sh", "-c", "id"])
    assert argv[1:] == [f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}",
                        "--init-groups", "--", "/bin/sh", "-c", "id"]


def test_a_missing_user_or_an_agent_that_is_not_root_refuses_with_the_reason() -> None:
    with pytest.raises(users.UserError, match="'no-such-user-x' does not exist"):
        users.resolve("no-such-user-x", switch=True, euid=0)
    with pytest.raises(users.UserError, match="not root, and cannot switch to user 'nobody'"):
        users.resolve("nobody", switch=True, euid=4242)


def test_without_setpriv_switching_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    run_as = users.RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid, NOBODY.pw_dir)
    with pytest.raises(users.UserError, match="setpriv"):
        users.command(run_as, ["true"])


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_the_sandbox_is_handed_over_without_following_links(tmp_path: Path) -> None:
    sandbox, outside, linked = tmp_path / "sandbox", tmp_path / "outside", tmp_path / "linked"
    (sandbox / "sub").mkdir(parents=True)
    (sandbox / "sub" / "file").write_text("x")
    outside.write_text("root's")
    linked.write_text("root's too")
    (sandbox / "link").symlink_to(outside)
    (sandbox / "hard").hardlink_to(linked)
    users.hand_over(users.RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid, "/"), str(sandbox))
    for path in (sandbox, sandbox / "sub", sandbox / "sub" / "file", sandbox / "link"):
        assert path.lstat().st_uid == NOBODY.pw_uid, path
    assert outside.stat().st_uid == 0 and linked.stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
@pytest.mark.parametrize("user, healthy, said", [
    ("nobody", True, ""),
    ("no-such-user-x", False, "'no-such-user-x' does not exist"),
])
def test_command_health_checks_run_as_the_tasks_user(
        tmp_path: Path, user: str, healthy: bool, said: str) -> None:
    check = HealthCheck(type=HealthCheckType.COMMAND, timeout=10,
                        command=CommandInfo(shell='test "$(id -un)" = nobody'))
    effect = RunHealthCheck(HealthRound("F1", "t", 1), check, str(tmp_path), {}, user)
    result = asyncio.run(probe(effect, dict(os.environ), switch_user=True))
    assert result.healthy is healthy and said in result.message
