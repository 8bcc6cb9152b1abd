"""The batch framework end to end: real master, agents and batch executors on
loopback, map outputs shuffled over the agents' /files API.

- word count over a generated multi-file corpus, submitted with `dyad-batch`,
  equals `collections.Counter` computed directly;
- an agent SIGKILLed once the maps are done (its map outputs gone, reduces still
  to fetch them) still gives the exact counts;
- a map that fails once succeeds on retry; a job whose reduce always raises fails
  with the error, exit status 1 and no output left behind; a streaming job.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import string
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dyad.local import PROJECT_ROOT, LocalCluster, agent_address
from frameworks.batch import BatchCore, Job, run_job, run_job_async
from frameworks.batch.work import load_module

from .conftest import FAST_MASTER, wait_for

pytestmark = pytest.mark.integration

WORDCOUNT = PROJECT_ROOT / "examples" / "wordcount.py"
words = load_module(WORDCOUNT.read_text(), str(WORDCOUNT)).words


def corpus(directory: Path, files: int, size: int, seed: int = 7) -> list[Path]:
    """`files` files of about `size` bytes of text with Zipf-like word frequencies."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
                  for _ in range(3000)]
    weights = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(vocabulary))))
    directory.mkdir(parents=True)
    paths = []
    for number in range(files):
        lines, written = [], 0
        while written < size:
            line = " ".join(rng.choices(vocabulary, cum_weights=weights, k=rng.randint(3, 14)))
            lines.append(line.capitalize() + rng.choice([".", ",", "", "!"]))
            written += len(lines[-1]) + 1
        path = directory / f"part-{number}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def expected(paths: list[Path]) -> Counter[str]:
    return Counter(w for path in paths for line in path.read_text().splitlines()
                   for w in words(line))


def counts(output: Path) -> Counter[str]:
    result: Counter[str] = Counter()
    for part in sorted(output.glob("part-r-*")):
        for line in part.read_text().splitlines():
            word, count = line.split("\t")
            assert word not in result, f"{word} in two part files"
            result[word] = int(count)
    return result


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests that leave it whole (starting one costs seconds)."""
    shared = LocalCluster(work_dir=tmp_path_factory.mktemp("batch-cluster"), agents=3,
                          resources="cpus:2;mem:2048;disk:1000", master_args=FAST_MASTER)
    shared.start()
    yield shared
    shared.stop()


def dyad_batch(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([sys.executable, "-m", "frameworks.batch.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_wordcount_submitted_with_the_cli_equals_counter(cluster: LocalCluster,
                                                         tmp_path: Path) -> None:
    paths = corpus(tmp_path / "data", files=6, size=400_000)
    # Each file "lives" on one agent: the scheduler should run its maps there.
    inputs = [f"{agent_address(number % 3)}:{path}" for number, path in enumerate(paths)]
    jobs = str(tmp_path / "jobs")
    done = dyad_batch("submit", "--master", cluster.master_address, str(WORDCOUNT),
                      "--input", *inputs, "--output", str(tmp_path / "out"),
                      "--reducers", "4", "--split-size", "256k", "--jobs-dir", jobs,
                      "--timeout", "80s")
    assert done.returncode == 0, done.stderr
    assert counts(tmp_path / "out") == expected(paths)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_SUCCESS", *(f"part-r-{i:05d}" for i in range(4))]
    assert "SUCCEEDED" in done.stdout and "12/12 maps, 4/4 reduces" in done.stdout
    assert "maps 12/12" in done.stderr  # plain progress lines: stderr is not a terminal
    assert "\r" not in done.stderr
    listed = dyad_batch("list", "--jobs-dir", jobs, timeout=20)
    assert "SUCCEEDED" in listed.stdout and "wordcount" in listed.stdout
    job_id = listed.stdout.splitlines()[1].split()[0]
    shown = dyad_batch("status", job_id, "--jobs-dir", jobs, timeout=20)
    assert "state     SUCCEEDED" in shown.stdout and "reduces 4/4" in shown.stdout
    # The job tore its framework down: the master no longer lists it as active.
    deadline = time.monotonic() + 10
    while [f for f in cluster.state()["frameworks"] if f["name"].startswith("dyad-batch")]:
        assert time.monotonic() < deadline, cluster.state()["frameworks"]
        time.sleep(0.05)


SLOW_REDUCE = '''
import time
from wordcount import map, combine
_slept = False

def reduce(word, counts):
    global _slept
    if not _slept:  # keep reduces busy for a moment, so the agent dies before they end
        _slept = True
        time.sleep(1.5)
    yield word, sum(counts)
'''


async def test_agent_killed_mid_job_still_gives_the_exact_counts(make_cluster: Any,
                                                                 tmp_path: Path) -> None:
    cluster = make_cluster(agents=3, resources="cpus:2;mem:2048;disk:1000")
    paths = corpus(tmp_path / "data", files=3, size=300_000, seed=11)
    module = tmp_path / "slow_wordcount.py"
    module.write_text(SLOW_REDUCE)
    (tmp_path / "wordcount.py").write_text(WORDCOUNT.read_text())
    cores: list[BatchCore] = []
    job = Job(module=str(module), inputs=[str(p) for p in paths], output=str(tmp_path / "out"),
              reducers=3, split_size=100_000, locality_wait=0.0)
    running = asyncio.ensure_future(run_job_async(job, cluster.master_address, timeout=80,
                                                  core_hook=cores.append))
    await wait_for(lambda: cores and cores[0].progress().maps_done == 9 or running.done(),
                   timeout=60, what="every map to finish")
    assert not running.done(), running.result()
    by_host = cores[0].outputs_by_host()
    victim = max(by_host, key=lambda host: by_host[host])
    hosts = [agent_address(index) for index in range(3)]
    cluster.stop_child(cluster.agent_children[hosts.index(victim)], signal.SIGKILL)
    result = await asyncio.wait_for(running, 85)
    assert result.succeeded, result.error
    assert counts(tmp_path / "out") == expected(paths)
    assert result.progress.maps_rerun >= 1  # the victim's outputs were made again
    assert victim not in result.outputs_by_host


FLAKY_MAP = '''
import os
from wordcount import words, combine, reduce

def map(offset, line):
    marker = os.path.join(os.path.dirname(__file__), "failed-once")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        raise RuntimeError("planned failure")
    for word in words(line):
        yield word, 1
'''

BROKEN_REDUCE = '''
def map(offset, line):
    yield line, 1

def reduce(key, values):
    return 1 / 0
'''


def test_a_failed_map_is_retried_and_a_broken_job_fails_cleanly(cluster: LocalCluster,
                                                                 tmp_path: Path) -> None:
    paths = corpus(tmp_path / "data", files=2, size=50_000, seed=3)
    (tmp_path / "wordcount.py").write_text(WORDCOUNT.read_text())
    (tmp_path / "flaky.py").write_text(FLAKY_MAP)
    result = run_job(Job(module=str(tmp_path / "flaky.py"), inputs=[str(p) for p in paths],
                         output=str(tmp_path / "out"), reducers=2), cluster.master_address,
                     timeout=60)
    assert result.succeeded, result.error
    assert result.progress.failed_attempts == 1
    assert counts(tmp_path / "out") == expected(paths)

    (tmp_path / "broken.py").write_text(BROKEN_REDUCE)
    done = dyad_batch("submit", "--master", cluster.master_address, str(tmp_path / "broken.py"),
                      "--input", str(paths[0]), "--output", str(tmp_path / "broken-out"),
                      "--max-attempts", "2", "--quiet", "--jobs-dir", str(tmp_path / "jobs"),
                      "--timeout", "60s")
    assert done.returncode == 1, done.stderr
    assert "failed 2 times" in done.stdout and "ZeroDivisionError" in done.stdout
    assert not (tmp_path / "broken-out").exists()

    result = run_job(Job(map_command="tr -cs 'A-Za-z' '\\n' | tr A-Z a-z | grep . | "
                                     "sed 's/$/\\t1/'",
                         reduce_command="awk -F'\\t' '{c[$1]+=$2} END "
                                        "{for (w in c) print w \"\\t\" c[w]}'",
                         inputs=[str(p) for p in paths], output=str(tmp_path / "streamed"),
                         reducers=2), cluster.master_address, timeout=60)
    assert result.succeeded, result.error
    assert counts(tmp_path / "streamed") == Counter(
        w.lower() for p in paths for w in "".join(
            c if c.isalpha() and c.isascii() else " " for c in p.read_text()).split())
