"""Running one health check: the I/O half of `agent.health` (which decides when).

COMMAND runs the check's command with ``/bin/sh -c`` (or its argv) in the task's
sandbox, with the task's environment, in a session of its own (a timed-out check is
killed with everything it started); exit 0 is healthy. HTTP GETs
``scheme://HOST:port/path`` without following redirects; 2xx and 3xx are
healthy (certificates are not verified: the point is liveness, not identity). TCP
opens and closes a connection to ``HOST:port``. Tasks share the agent's network,
and HOST is the agent's own address (`--ip`; loopback when it binds every
address), which is where a task bound to its host (`$HOST`) listens.

Every probe answers within the check's `timeout` (0: no limit) and never raises:
failures come back as an unhealthy `HealthCheckResult` saying why.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import aiohttp

from agent import users
from agent.health import HealthCheckResult, RunHealthCheck
from dyad.messages import HealthCheck, HealthCheckType

def probe_host(agent_ip: str) -> str:
    """Where HTTP and TCP checks connect for an agent bound to `agent_ip`."""
    return "127.0.0.1" if agent_ip in ("", "0.0.0.0") else agent_ip


async def probe(effect: RunHealthCheck, base_env: dict[str, str],
                host: str = "127.0.0.1", switch_user: bool = False) -> HealthCheckResult:
    check = effect.check
    try:
        healthy, message = await asyncio.wait_for(_probe(effect, base_env, host, switch_user),
                                                  check.timeout or None)
    except asyncio.TimeoutError:
        healthy, message = False, f"no answer within {check.timeout:g}s"
    return HealthCheckResult(effect.key, healthy, message)


async def _probe(effect: RunHealthCheck, base_env: dict[str, str],
                 host: str, switch_user: bool) -> tuple[bool, str]:
    check = effect.check
    if check.type == HealthCheckType.HTTP:
        return await _http(check, host)
    if check.type == HealthCheckType.TCP:
        return await _tcp(check, host)
    return await _command(effect, base_env, switch_user)


async def _http(check: HealthCheck, host: str) -> tuple[bool, str]:
    url = f"{check.scheme}://{host}:{check.port}{check.path}"
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(url, allow_redirects=False, ssl=False) as response:
            ok = 200 <= response.status < 400
            return ok, f"HTTP {response.status}"
    except (aiohttp.ClientError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


async def _tcp(check: HealthCheck, host: str) -> tuple[bool, str]:
    assert check.port is not None
    try:
        _, writer = await asyncio.open_connection(host, check.port, family=socket.AF_INET)
    except OSError as exc:
        return False, f"cannot connect: {exc.strerror or exc}"
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass  # connected is all we asked
    return True, "connected"


async def _command(effect: RunHealthCheck, base_env: dict[str, str],
                   switch_user: bool) -> tuple[bool, str]:
    command = effect.check.command
    assert command is not None
    argv = command.argv if command.argv is not None else ["/bin/sh", "-c", command.shell or ""]
    env = {**base_env, **effect.env, **command.environment}
    try:  # as the task's user, never root on its behalf
        run_as = users.resolve(effect.user, switch_user)
        if run_as is not None:
            argv = users.command(run_as, argv)
            env.update(users.environment(run_as))
    except users.UserError as exc:
        return False, f"cannot run the check: {exc}"
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=effect.sandbox_dir, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
    except OSError as exc:
        return False, f"cannot run {argv[0]}: {exc}"
    try:
        _, stderr = await process.communicate()
    finally:
        if process.returncode is None:  # timed out: take its whole session down
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await process.wait()
    if process.returncode == 0:
        return True, "exit status 0"
    last = stderr.decode(errors="replace").strip().splitlines()[-1:] if stderr else []
    return False, f"exit status {process.returncode}" + (f": {last[0]}" if last else "")
