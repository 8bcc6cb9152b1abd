"""Putting a task's URIs into its sandbox before it starts, with a per-agent cache.

For each `URI` of the executor's (or command task's) `CommandInfo`, in order:

1. *Get it.* ``http://`` and ``https://`` are downloaded (streamed to disk);
   ``file://`` URIs and absolute paths are copied, but only from under the
   directories the operator allows (``--fetcher-allowed-paths``, default none):
   a task must not have the agent copy ``/etc/shadow`` into its sandbox and read
   it there. The file is opened beneath its allowed directory without following
   symlinks (`dyad.beneath`), after its real path was checked, so a link swapped
   in meanwhile is refused too. Anything else fails.
2. *Cache it* when ``uri.cache``: the first fetch stores the file under the cache
   directory, later fetches copy it from there without touching the network. The
   cache is bounded (``--fetcher-cache-size``): least recently used entries go
   first. Concurrent fetches of one URI download it once. The cache survives agent
   restarts (``index.json`` beside the files).
3. *Place it* in the sandbox as ``output_file`` or the URI's last path segment, and
   make it executable when ``uri.executable``.
4. *Extract it* when ``uri.extract`` and it is a ``.tar[.gz|.bz2|.xz]``, ``.tgz``
   or ``.zip``: into the sandbox, refusing members that would land outside it
   (absolute paths, ``..``, links out) -- a package must not write over the agent.

A failure raises `FetchError` with the URI and the cause; the agent fails the
task with ``REASON_FETCH_FAILED``. The agent tells the master which URIs its cache
holds (`cached_uris`) so schedulers can prefer agents that already have a package.

Limits, honestly: no checksums, no resumable downloads, no per-URI size limit, and
an archive may expand to any size inside the sandbox.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import tarfile
import time
import urllib.parse
import zipfile
from typing import Callable, Iterable

import aiohttp
import attrs

from dyad.beneath import NotBeneath, open_beneath
from dyad.messages import URI

from agent import sandbox_dirs

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")
INDEX = "index.json"


class FetchError(Exception):
    """A URI could not be fetched; the message names it and says why."""


@attrs.define
class _Entry:
    uri: str
    size: int
    used: float


class FetcherCache:
    """Cached files by URI, least recently used evicted past `capacity` bytes.
    Bookkeeping only; the `Fetcher` moves the bytes."""

    def __init__(self, directory: str, capacity: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self._entries: dict[str, _Entry] = {}  # by file name (hash of the URI)
        self.evictions = 0

    @staticmethod
    def name(uri: str) -> str:
        return hashlib.sha256(uri.encode()).hexdigest()

    def path(self, uri: str) -> str:
        return os.path.join(self.directory, self.name(uri))

    def load(self) -> None:
        """Adopt what an earlier run left, dropping entries whose file is gone and
        files no entry names (a download interrupted by a crash)."""
        os.makedirs(self.directory, exist_ok=True)
        try:
            with open(os.path.join(self.directory, INDEX)) as handle:
                raw = json.load(handle)
            entries = {name: _Entry(**fields) for name, fields in raw.items()}
        except (OSError, ValueError, TypeError):
            entries = {}
        self._entries = {name: entry for name, entry in entries.items()
                         if os.path.isfile(os.path.join(self.directory, name))}
        for name in os.listdir(self.directory):
            if name != INDEX and name not in self._entries:
                _remove(os.path.join(self.directory, name))
        self._save()

    @property
    def uris(self) -> list[str]:
        return sorted(entry.uri for entry in self._entries.values())

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self._entries.values())

    def lookup(self, uri: str) -> str | None:
        """The cached file of `uri` (marked as just used), or None."""
        entry = self._entries.get(self.name(uri))
        path = self.path(uri)
        if entry is None or not os.path.isfile(path):
            return None
        entry.used = time.time()
        self._save()
        return path

    def add(self, uri: str, size: int) -> bool:
        """Record a file just placed at `path(uri)`; evict the least recently used
        others until everything fits. False (and the file is not kept) when it
        alone exceeds the capacity."""
        if size > self.capacity:
            return False
        name = self.name(uri)
        self._entries[name] = _Entry(uri, size, time.time())
        for victim in sorted(self._entries, key=lambda n: self._entries[n].used):
            if self.size <= self.capacity:
                break
            if victim != name:
                log.info("fetcher cache full: evicting %s", self._entries[victim].uri)
                del self._entries[victim]
                _remove(os.path.join(self.directory, victim))
                self.evictions += 1
        self._save()
        return True

    def _save(self) -> None:
        temporary = os.path.join(self.directory, f".{INDEX}.tmp")
        with open(temporary, "w") as handle:
            json.dump({name: attrs.asdict(entry) for name, entry in self._entries.items()},
                      handle)
        os.replace(temporary, os.path.join(self.directory, INDEX))


class Fetcher:
    """Fetches URIs into sandboxes (see the module docstring)."""

    def __init__(self, cache: FetcherCache, timeout: float = 600.0,
                 allowed_paths: Iterable[str] = ()) -> None:
        self.cache = cache
        self._timeout = timeout
        self.allowed_paths = tuple(os.path.realpath(path) for path in allowed_paths)
        self._locks: dict[str, asyncio.Lock] = {}
        self.counters = {"fetcher/cache_hits": 0, "fetcher/cache_misses": 0,
                         "fetcher/downloads": 0, "fetcher/failures": 0,
                         "fetcher/bytes_downloaded": 0}

    def metrics(self) -> dict[str, float]:
        return {**self.counters, "fetcher/cache_evictions": self.cache.evictions,
                "fetcher/cache_bytes": self.cache.size,
                "fetcher/cache_entries": len(self.cache.uris)}

    async def fetch(self, uris: Iterable[URI], sandbox: str) -> None:
        """Fetch every URI into `sandbox` (created); raises `FetchError`."""
        await asyncio.to_thread(sandbox_dirs.make, sandbox)
        for uri in uris:
            try:
                await self._fetch_one(uri, sandbox)
            except FetchError:
                self.counters["fetcher/failures"] += 1
                raise

    async def _fetch_one(self, uri: URI, sandbox: str) -> None:
        target = _target(uri, sandbox)
        if _local_path(uri.value) is not None:
            self._allowed(uri.value)  # also before a cache hit: the rule may have changed
        if uri.cache:
            async with self._locks.setdefault(uri.value, asyncio.Lock()):
                cached = self.cache.lookup(uri.value)
                kept = True
                if cached is None:
                    self.counters["fetcher/cache_misses"] += 1
                    cached = await self._into_cache(uri)
                    kept = self.cache.add(uri.value, os.path.getsize(cached))
                else:
                    self.counters["fetcher/cache_hits"] += 1
                await _in_thread(shutil.copyfile, cached, target, uri=uri.value)
                if not kept:
                    _remove(cached)  # too big to keep: fetched, not cached
        else:
            await self._get(uri.value, target)
        if uri.executable:
            await _in_thread(os.chmod, target, 0o755, uri=uri.value)
        if uri.extract and target.endswith(ARCHIVES):
            await _in_thread(extract, target, sandbox, uri=uri.value)
        log.info("fetched %s into %s", uri.value, target)

    async def _into_cache(self, uri: URI) -> str:
        path = self.cache.path(uri.value)
        temporary = f"{path}.part"
        try:
            await self._get(uri.value, temporary)
            os.replace(temporary, path)
        finally:
            _remove(temporary)
        return path

    async def _get(self, value: str, target: str) -> None:
        parsed = urllib.parse.urlparse(value)
        if parsed.scheme in ("http", "https"):
            await self._download(value, target)
        elif _local_path(value) is not None:
            root, relative = self._allowed(value)
            await _in_thread(_copy_beneath, root, relative, target, uri=value)
        else:
            raise FetchError(f"cannot fetch {value}: unsupported scheme "
                             f"{parsed.scheme or '(none)'!r} (use http, https, file or an "
                             "absolute path)")

    def _allowed(self, value: str) -> tuple[str, str]:
        """(allowed directory, path beneath it) of a local URI; `FetchError`
        unless its real path lies under one of `allowed_paths`."""
        path = _local_path(value)
        assert path is not None
        real = os.path.realpath(path)
        for root in self.allowed_paths:
            if real.startswith(root.rstrip(os.sep) + os.sep):
                return root, real[len(root):]
        raise FetchError(
            f"cannot fetch {value}: {path} is not under a directory this agent may copy "
            f"from (--fetcher-allowed-paths: {', '.join(self.allowed_paths) or 'none'})")

    async def _download(self, url: str, target: str) -> None:
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.get(url) as response:
                if response.status >= 400:
                    raise FetchError(f"cannot fetch {url}: HTTP {response.status} "
                                     f"{response.reason or ''}".rstrip())
                with open(target, "wb") as handle:
                    async for chunk in response.content.iter_chunked(CHUNK):
                        handle.write(chunk)
                        self.counters["fetcher/bytes_downloaded"] += len(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise FetchError(f"cannot fetch {url}: {exc or type(exc).__name__}") from exc
        self.counters["fetcher/downloads"] += 1


def _local_path(value: str) -> str | None:
    """The host path a ``file://`` URI or an absolute path names; None for others."""
    parsed = urllib.parse.urlparse(value)
    if parsed.scheme == "file" or (not parsed.scheme and value.startswith("/")):
        return urllib.parse.unquote(parsed.path)
    return None


def _copy_beneath(root: str, relative: str, target: str) -> None:
    """Copy the regular file at `relative` under `root` to `target`, following no
    symlink below `root`."""
    with open_beneath(root, relative) as fd:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", root + relative)
        with open(os.dup(fd), "rb") as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, CHUNK)


def _target(uri: URI, sandbox: str) -> str:
    """Where `uri` lands: `output_file` or its last path segment, inside `sandbox`."""
    name = uri.output_file or os.path.basename(
        urllib.parse.unquote(urllib.parse.urlparse(uri.value).path)) or "download"
    target = os.path.normpath(os.path.join(sandbox, name))
    if os.path.isabs(uri.output_file) or not target.startswith(os.path.normpath(sandbox) + os.sep):
        raise FetchError(f"cannot fetch {uri.value}: output file {name!r} is outside "
                         "the sandbox")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    return target


def extract(archive: str, directory: str) -> None:
    """Unpack a tar or zip archive into `directory`, refusing escapes."""
    root = os.path.realpath(directory)
    if archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as bundle:
            for member in bundle.namelist():
                where = os.path.realpath(os.path.join(root, member))
                if where != root and not where.startswith(root + os.sep):
                    raise FetchError(f"archive member {member!r} would land outside "
                                     "the sandbox")
            bundle.extractall(root)
        return
    with tarfile.open(archive) as bundle:
        bundle.extractall(root, filter="data")


async def _in_thread(function: Callable[..., object], *args: object, uri: str) -> None:
    """Run blocking file work in a thread; its failures name the URI."""
    try:
        await asyncio.to_thread(function, *args)
    except FetchError:
        raise
    except (OSError, NotBeneath, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise FetchError(f"cannot fetch {uri}: {exc}") from exc


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
