"""The fetcher with local files: placing, extracting (and refusing escapes), the
executable bit, the LRU cache and its index across restarts. HTTP downloads are in
tests/integration/test_agent_tasks.py."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from agent.fetcher import Fetcher, FetcherCache, FetchError, extract
from dyad.messages import URI


def make_fetcher(tmp_path: Path, capacity: int = 1000) -> Fetcher:
    """A fetcher allowed to copy local files from under `tmp_path`."""
    cache = FetcherCache(str(tmp_path / "cache"), capacity)
    cache.load()
    return Fetcher(cache, allowed_paths=[str(tmp_path)])


def tarball(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as bundle:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            bundle.addfile(info)
    return path


async def test_files_are_placed_extracted_and_made_executable(tmp_path: Path) -> None:
    fetcher = make_fetcher(tmp_path)
    sandbox = tmp_path / "sandbox"
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    bundle = tarball(tmp_path / "pkg.tar.gz", {"pkg/data.txt": b"hello"})
    await fetcher.fetch([URI(value=str(script), executable=True, extract=False),
                         URI(value=f"file://{bundle}"),
                         URI(value=str(bundle), extract=False, output_file="copy/p.tgz")],
                        str(sandbox))
    assert os.access(sandbox / "run.sh", os.X_OK)
    assert (sandbox / "pkg" / "data.txt").read_bytes() == b"hello"
    assert (sandbox / "pkg.tar.gz").exists() and (sandbox / "copy" / "p.tgz").exists()
    assert not (sandbox / "copy" / "pkg").exists()


async def test_failures_name_the_uri(tmp_path: Path) -> None:
    fetcher = make_fetcher(tmp_path)
    sandbox = str(tmp_path / "sandbox")
    for uri, why in ((URI(value="ftp://host/x"), "unsupported scheme 'ftp'"),
                     (URI(value="relative/x"), "unsupported scheme '(none)'"),
                     (URI(value=str(tmp_path / "missing")), "No such file"),
                     (URI(value=str(tmp_path), output_file="../../etc/x"), "outside")):
        with pytest.raises(FetchError) as error:
            await fetcher.fetch([uri], sandbox)
        assert uri.value in str(error.value) and why in str(error.value)
    assert fetcher.metrics()["fetcher/failures"] == 4


async def test_archives_cannot_write_outside_the_sandbox(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    for name, members, links in (("dots", {"../escape": b"x"}, None),
                                 ("link", {}, {"out": "/etc"})):
        evil = tarball(tmp_path / f"{name}.tar.gz", members, links)
        with pytest.raises(tarfile.TarError):
            extract(str(evil), str(sandbox))
        with pytest.raises(FetchError, match=f"cannot fetch {evil}"):
            await make_fetcher(tmp_path).fetch([URI(value=str(evil))], str(sandbox))
    extract(str(tarball(tmp_path / "abs.tar.gz", {"/tmp/abs-escape": b"x"})), str(sandbox))
    assert (sandbox / "tmp" / "abs-escape").exists()  # made relative: lands inside
    zipped = tmp_path / "evil.zip"
    with zipfile.ZipFile(zipped, "w") as bundle:
        bundle.writestr("../../escape.txt", "x")
    with pytest.raises(FetchError, match="outside the sandbox"):
        extract(str(zipped), str(sandbox))
    assert not (tmp_path / "escape").exists() and not (tmp_path / "escape.txt").exists()


async def test_cached_uris_are_fetched_once_and_evicted_least_recently_used(
        tmp_path: Path) -> None:
    fetcher = make_fetcher(tmp_path, capacity=250)
    sources = {}
    for name in "abc":
        sources[name] = tmp_path / f"{name}.bin"
        sources[name].write_bytes(name.encode() * 100)
    uri = {name: URI(value=str(path), cache=True) for name, path in sources.items()}
    await fetcher.fetch([uri["a"]], str(tmp_path / "s1"))
    sources["a"].write_bytes(b"changed")  # the cache, not the source, serves it now
    await fetcher.fetch([uri["a"]], str(tmp_path / "s2"))
    assert (tmp_path / "s2" / "a.bin").read_bytes() == b"a" * 100
    await fetcher.fetch([uri["b"]], str(tmp_path / "s3"))
    await fetcher.fetch([uri["a"]], str(tmp_path / "s4"))  # a is now fresher than b
    await fetcher.fetch([uri["c"]], str(tmp_path / "s5"))  # 300 > 250: evict b
    assert fetcher.cache.uris == sorted([str(sources["a"]), str(sources["c"])])
    metrics = fetcher.metrics()
    assert (metrics["fetcher/cache_hits"], metrics["fetcher/cache_misses"]) == (2, 3)
    assert metrics["fetcher/cache_evictions"] == 1 and metrics["fetcher/cache_bytes"] == 200

    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 400)  # larger than the whole cache: fetched, never kept
    await fetcher.fetch([URI(value=str(big), cache=True)], str(tmp_path / "s6"))
    assert (tmp_path / "s6" / "big.bin").stat().st_size == 400
    assert str(big) not in fetcher.cache.uris

    # A restarted agent finds the cache as it was; stray files are cleaned up.
    (tmp_path / "cache" / "stray.part").write_bytes(b"half a download")
    again = FetcherCache(str(tmp_path / "cache"), 250)
    again.load()
    assert again.uris == fetcher.cache.uris
    assert not (tmp_path / "cache" / "stray.part").exists()


async def test_local_files_are_copied_only_from_under_the_allowed_directories(
        tmp_path: Path) -> None:
    """Issue 17: a task had the agent copy a host file (`file:///etc/passwd`) into
    its sandbox and then read it there."""
    allowed, other = tmp_path / "packages", tmp_path / "private"
    allowed.mkdir()
    other.mkdir()
    (allowed / "tool.sh").write_text("ok")
    (other / "secret").write_text("SECRET")
    os.symlink(other / "secret", allowed / "link-out")
    os.symlink(allowed / "tool.sh", allowed / "link-in")
    cache = FetcherCache(str(tmp_path / "cache"), 1000)
    cache.load()
    fetcher = Fetcher(cache, allowed_paths=[str(allowed)])
    sandbox = tmp_path / "sandbox"
    await fetcher.fetch([URI(value=f"file://{allowed}/tool.sh"),
                         URI(value=str(allowed / "link-in"), output_file="same.sh")],
                        str(sandbox))
    assert (sandbox / "tool.sh").read_text() == (sandbox / "same.sh").read_text() == "ok"
    for value in ("file:///etc/passwd", "/etc/passwd", str(other / "secret"),
                  str(allowed / "link-out"), f"file://{allowed}/../private/secret",
                  f"file://{allowed}"):
        with pytest.raises(FetchError, match="may copy from") as error:
            await fetcher.fetch([URI(value=value)], str(sandbox))
        assert value in str(error.value) and str(allowed) in str(error.value)
    nothing = Fetcher(cache)  # the default: no local file at all
    with pytest.raises(FetchError, match=r"--fetcher-allowed-paths: none"):
        await nothing.fetch([URI(value=f"file://{allowed}/tool.sh")], str(sandbox))
    assert not (sandbox / "passwd").exists() and not (sandbox / "secret").exists()
