"""Who may talk to an agent: its executors (a CURVE key per run) and HTTP
clients (sandboxes by framework).

Executors. With CURVE on, the agent makes a key pair for every executor run
just before starting it (after its URIs are fetched, so nobody can register in
its place while it is fetched) and hands it over privately: a 0600 file under
``SANDBOX/.dyad/`` named by ``$DYAD_CURVE_KEY``, with the agent's public key in
``$DYAD_MASTER_KEY``, which `frameworks.ExecutorDriver` reads like any client.
ZAP admits exactly those keys, each as principal ``executor:F/E/R``, and a
registration is accepted only from the principal of that framework, executor
and current run: one task's executor cannot pose as another's. ``.dyad`` is
never served by ``/files``.

HTTP. ``/files`` needs `read_sandbox` on the principal of the framework whose
sandbox the path lies in (by default a framework may read only its own),
``POST /drain`` needs `drain_agent` on this agent's hostname, and every other
GET `view_state`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import zmq
import zmq.auth
from aiohttp import web

from agent import files
from agent.model import RunKey
from agent.records import Records
from dyad.auth import DYAD_CURVE_KEY, DYAD_MASTER_KEY, CurveKeys
from dyad.authz import Acls, Action
from dyad.messages import Message, RegisterExecutor, ReregisterExecutor

PREFIX = "executor:"
KEY_DIR = ".dyad"


def principal(key: RunKey) -> str:
    framework_id, executor_id, run_id = key
    return f"{PREFIX}{framework_id}/{executor_id}/{run_id}"


def registration_refusal(who: str | None, message: Message, records: Records) -> str | None:
    """Why a frame from an executor connection named `who` must not reach the
    core (None: it may). Only registrations need checking: every other executor
    message is accepted from the connection that registered."""
    if not isinstance(message, RegisterExecutor | ReregisterExecutor):
        return None
    executor = records.executor(message.framework_id, message.executor_id)
    if executor is None:
        return None  # the core refuses unknown executors itself
    wanted = principal((executor.framework_id, executor.executor_id, executor.run_id))
    if who != wanted:
        return (f"executor {message.executor_id} of framework {message.framework_id} "
                "must register with the key its agent gave its run")
    return None


def _write_public(path: Path, public: bytes) -> None:
    path.write_text(f'metadata\ncurve\n    public-key = "{public.decode()}"\n')


def _write_secret(path: Path, public: bytes, secret: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f'metadata\ncurve\n    public-key = "{public.decode()}"\n'
                     f'    secret-key = "{secret.decode()}"\n')


class ExecutorKeys:
    """The executor runs' public keys, as ZAP asks about them (`KeyLookup`)."""

    def __init__(self, agent_keys: CurveKeys) -> None:
        self.agent_keys = agent_keys
        self._by_key: dict[bytes, str] = {}
        self._by_run: dict[RunKey, bytes] = {}

    def principal_for_key(self, z85_public_key: bytes) -> str | None:
        return self._by_key.get(z85_public_key)

    def issue(self, key: RunKey, sandbox: str) -> dict[str, str]:
        """A new key pair for run `key`, written under its sandbox; the variables
        that tell its executor where. Blocking file I/O: run it off the loop."""
        directory = Path(sandbox) / KEY_DIR
        directory.mkdir(mode=0o700, exist_ok=True)
        public, secret = zmq.curve_keypair()
        _write_secret(directory / "executor.key_secret", public, secret)
        _write_public(directory / "agent.key", self.agent_keys.public)
        self._remember(key, public)
        return {DYAD_CURVE_KEY: str(directory / "executor.key_secret"),
                DYAD_MASTER_KEY: str(directory / "agent.key")}

    def recover(self, key: RunKey, sandbox: str) -> None:
        """After an agent restart: admit the key a still-running executor holds."""
        path = Path(sandbox) / KEY_DIR / "executor.key_secret"
        try:
            public, _ = zmq.auth.load_certificate(os.fspath(path))
        except (OSError, ValueError):
            return  # started without CURVE: it cannot reconnect now, and is replaced
        self._remember(key, public)

    def forget(self, key: RunKey) -> None:
        public = self._by_run.pop(key, None)
        if public is not None:
            self._by_key.pop(public, None)

    def _remember(self, key: RunKey, public: bytes) -> None:
        self.forget(key)
        self._by_run[key] = public
        self._by_key[public] = principal(key)


# ---------------------------------------------------------------------- HTTP

def sandbox_framework(work_dir: str, path: str) -> str | None:
    """The framework whose sandboxes `path` names, as `/files` will open it
    (`agent.files` follows no symlink below the root, so the path as written is
    what is read); "" for the root itself, None outside the sandboxes."""
    try:
        _, relative = files.under_sandboxes(work_dir, path)
    except files.FilesError:
        return None  # /files refuses it itself
    parts = [part for part in relative.split("/") if part]
    if KEY_DIR in parts:
        raise PermissionError(f"{KEY_DIR} is not served")
    return parts[0] if parts else ""


class HttpAccess:
    """`dyad.security.Authorize` for an agent's HTTP API."""

    def __init__(self, acls: Acls, work_dir: str, hostname: str, records: Callable[[], Records]) -> None:
        self.acls = acls
        self.work_dir = work_dir
        self.hostname = hostname
        self._records = records  # -> the agent's current Records

    async def __call__(self, request: web.Request, who: str | None) -> str | None:
        if request.path.startswith("/files/"):
            return await self._sandbox(request.query.get("path", ""), who)
        if request.method == "POST" and request.path == "/drain":
            decision = self.acls.authorize(who, Action.DRAIN_AGENT, self.hostname)
        elif request.method in ("GET", "HEAD"):
            decision = self.acls.authorize(who, Action.VIEW_STATE)
        else:
            return None
        return None if decision else decision.reason

    async def _sandbox(self, path: str, who: str | None) -> str | None:
        try:
            framework_id = sandbox_framework(self.work_dir, path)
        except PermissionError as exc:
            return str(exc)
        if framework_id is None:
            return None
        owner = self._owner(framework_id) if framework_id else ""
        decision = self.acls.authorize(who, Action.READ_SANDBOX, owner)
        return None if decision else decision.reason

    def _owner(self, framework_id: str) -> str:
        records: Records = self._records()
        framework = records.frameworks.get(framework_id)
        if framework is None:
            framework = next((f for f in records.completed_frameworks
                              if f.info.id == framework_id), None)
        return framework.info.principal if framework is not None else ""
