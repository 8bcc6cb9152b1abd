"""The registry: what a master must know after a failover that agents cannot tell it.

Agents report their own tasks when they re-register, and frameworks re-subscribe
by themselves, so the registry holds only what nobody else remembers: which agents
were admitted (the new leader waits for them before it calls them gone), which were
unreachable (so their tasks can be killed if they return after their frameworks
were told the tasks were lost), the operator's role weights and quota, and each
agent's dynamic reservations and persistent volumes (`dynamic`; the agents
checkpoint them too, and the newer copy wins: dyad/volumes.py). Mesos keeps
similar facts in its replicated-log registry. `snapshot_of(state)` and
`master.restore.restore(state, data, now)` move them between a `MasterState` and
`RegistryData`.

Two stores, one contract (`recover()` once, then `store()` as often as the data
changes; both may raise `RegistryError`):

- `FileRegistry`: standalone masters, a JSON file under `--work-dir`, replaced
  atomically, guarded by an exclusive lock so two masters cannot share it.
- `ZooKeeperRegistry`: HA masters, a znode at the root's sibling path
  (`/dyad-registry`). `recover()` reads it and writes it straight back: that bumps
  the znode version, and every later write is checked against the version we
  last wrote *and* against the existence of our own contender znode, in one
  transaction. A deposed leader's write therefore always fails
  (`RegistryFenced`), whoever wrote in between.

The znode holds zlib-compressed JSON: ZooKeeper refuses znodes over 1 MiB
(`jute.maxbuffer`), and a thousand agents' JSON is about 250 KB raw, 25 KB
compressed.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

import attrs

from dyad.codec import CodecError, from_json, to_json
from dyad.messages import AgentInfo
from dyad.volumes import DynamicResources
from dyad.zk import VersionConflict, ZkError, ZkSession
from master.model import UnreachableAgent

if TYPE_CHECKING:
    from master.state import MasterState

FORMAT = 1


class RegistryError(Exception):
    """The registry cannot be read or written; a master cannot lead without it."""


class RegistryFenced(RegistryError):
    """Another master has taken over the registry: we are no longer the leader."""


@attrs.frozen(kw_only=True)
class QuotaEntry:
    """One role's quota: guarantee and limit, in milli-units by resource kind."""

    guarantee: dict[str, int] = attrs.field(factory=dict)
    limit: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RegistryData:
    """Everything the registry holds."""

    format: int = FORMAT
    agents: list[AgentInfo] = attrs.field(factory=list)
    unreachable: list[UnreachableAgent] = attrs.field(factory=list)
    weights: dict[str, float] = attrs.field(factory=dict)
    quota: dict[str, QuotaEntry] = attrs.field(factory=dict)
    dynamic: dict[str, DynamicResources] = attrs.field(factory=dict)  # by agent id
    # agent id -> the principal that registered it (master/authorization.py)
    agent_owners: dict[str, str] = attrs.field(factory=dict)


def snapshot_of(state: MasterState) -> RegistryData:
    """What `state` must leave to its successor."""
    return RegistryData(
        agents=state.admitted_agents(), unreachable=state.unreachable_agents(),
        weights=dict(state.weights),
        quota={role: QuotaEntry(guarantee=dict(q.guarantee), limit=dict(q.limit))
               for role, q in state.quota.items()},
        dynamic=state.dynamic_resources(),
        agent_owners=state.authorizer.owners_of([*state.agents, *state.recovering,
                                                 *state.unreachable]))


def encode(data: RegistryData) -> bytes:
    return json.dumps(to_json(data), separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> RegistryData:
    """Parse a registry document; `RegistryError` says what is wrong with it."""
    try:
        data = from_json(RegistryData, json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError, CodecError) as exc:
        raise RegistryError(f"the registry is not valid: {exc}") from None
    if data.format != FORMAT:
        raise RegistryError(f"registry format {data.format} is not {FORMAT}; "
                            "this master is too old or too new for it")
    return data


class Registry(Protocol):
    async def recover(self) -> RegistryData:
        """Read the registry (empty if there is none) and take it over."""

    async def store(self, data: RegistryData) -> None:
        """Replace the registry's content; `RegistryFenced` if we lost it."""

    async def close(self) -> None: ...


class FileRegistry:
    """The standalone master's registry: `<work_dir>/registry.json`."""

    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / "registry.json"
        self._lock_path = work_dir / "registry.lock"
        self._lock: IO[bytes] | None = None

    async def recover(self) -> RegistryData:
        self._take_lock()
        try:
            return decode(await asyncio.to_thread(self.path.read_bytes))
        except FileNotFoundError:
            return RegistryData()
        except (OSError, RegistryError) as exc:
            await self.close()  # a master that cannot recover does not hold the dir
            if isinstance(exc, RegistryError):
                raise
            raise RegistryError(f"cannot read {self.path}: {exc}") from None

    def _take_lock(self) -> None:
        """Two standalone masters on one work dir would overwrite each other."""
        try:
            lock = open(self._lock_path, "ab")
        except OSError as exc:
            raise RegistryError(f"cannot open {self._lock_path}: {exc}") from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise RegistryError(f"{self.path.parent} is in use by another master") from None
        self._lock = lock

    async def store(self, data: RegistryData) -> None:
        if self._lock is None:
            raise RegistryError("store() before recover()")
        try:
            await asyncio.to_thread(self._write, encode(data))
        except OSError as exc:
            raise RegistryError(f"cannot write {self.path}: {exc}") from None

    def _write(self, raw: bytes) -> None:
        """Write a temporary file, flush it to disk, rename it over the old one: a
        crash leaves either the old registry or the new one, never half of one."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    async def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


class ZooKeeperRegistry:
    """The HA masters' registry: one znode at `path`, written only by the leader
    whose contender znode is `guard`."""

    def __init__(self, session: ZkSession, path: str, guard: str) -> None:
        self._session = session
        self.path = path
        self._guard = guard
        self._version: int | None = None

    async def recover(self) -> RegistryData:
        try:
            await self._session.create_if_missing(self.path, _compress(RegistryData()))
            raw, version = await self._session.get(self.path)
        except ZkError as exc:
            raise RegistryError(f"cannot read {self.path}: {exc}") from None
        data = decode(_decompress(raw))
        # Write it back at once: the version bump fences any earlier leader.
        self._version = await self._set(raw, version)
        return data

    async def store(self, data: RegistryData) -> None:
        if self._version is None:
            raise RegistryError("store() before recover()")
        self._version = await self._set(_compress(data), self._version)

    async def _set(self, raw: bytes, version: int) -> int:
        try:
            return await self._session.set_checked(self.path, raw, version, guard=self._guard)
        except VersionConflict as exc:
            raise RegistryFenced(f"{self.path} was taken over: {exc}") from None
        except ZkError as exc:
            raise RegistryError(f"cannot write {self.path}: {exc}") from None

    async def close(self) -> None:
        self._version = None


def _compress(data: RegistryData) -> bytes:
    return zlib.compress(encode(data), 6)


def _decompress(raw: bytes) -> bytes:
    try:
        return zlib.decompress(raw)
    except zlib.error as exc:
        raise RegistryError(f"the registry znode is not zlib-compressed JSON: {exc}") from None
