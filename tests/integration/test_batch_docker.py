"""A MapReduce job whose executors run in a Docker image (`--executor-image`), on
real agents with a private engine: the counts equal those of a Counter, so map
outputs written inside containers were fetched through the agents' /files at the
paths the agents see.

No registry is reachable and the busybox test image holds no Python, so the test
lends the container this machine's interpreter and Dyad by read-only bind mounts
(`--executor-volume`); a real image would have them installed instead."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyad.local import LocalCluster
from frameworks.batch import Job, run_job
from frameworks.batch.job import EXECUTOR_ID

from .conftest import FAST_MASTER
from .docker_engine import TEST_IMAGE, DockerEngine, docker_engine  # noqa: F401 (fixture)
from .test_batch import WORDCOUNT, corpus, counts, expected

pytestmark = pytest.mark.integration

PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
# What the host interpreter needs inside a busybox root: its prefix (and a venv's),
# the shared libraries and loader, and Dyad's source.
LENT = sorted({sys.base_prefix, sys.prefix, "/usr", "/lib", "/lib64", PROJECT_ROOT})


@pytest.fixture
def cluster(docker_engine: DockerEngine, tmp_path: Path) -> Iterator[LocalCluster]:
    roots = [arg for root in [str(tmp_path), *LENT] for arg in ("--docker-volume-root", root)]
    cluster = LocalCluster(work_dir=tmp_path / "cluster", agents=2,
                           resources="cpus:2;mem:2048;disk:1000", master_args=FAST_MASTER,
                           agent_args=["--containerizers", "process,docker",
                                       "--docker-socket", docker_engine.socket_path, *roots])
    cluster.start()
    yield cluster
    cluster.stop()


def test_wordcount_with_executors_in_an_image_equals_counter(cluster: LocalCluster,
                                                             tmp_path: Path) -> None:
    paths = corpus(tmp_path / "data", files=4, size=100_000)
    job = Job(module=str(WORDCOUNT), inputs=[str(p) for p in paths],
              output=str(tmp_path / "out"), reducers=3, split_size=64 * 1024,
              executor_image=TEST_IMAGE, executor_python=os.path.realpath(sys.executable),
              executor_volumes=[f"{path}:{path}:ro" for path in LENT if os.path.exists(path)],
              executor_env={"PYTHONPATH": PROJECT_ROOT}, map_mem=128, reduce_mem=128)
    result = run_job(job, cluster.master_address, timeout=120)
    assert result.succeeded, result.summary()
    assert counts(tmp_path / "out") == expected(paths)
    # The executors really ran in containers: the agents say so.
    # The job has torn its framework down; the agents may still be ending it.
    executors = [e for agent in cluster.agent_children
                 for state in [cluster.get(f"{agent.url}/state")]
                 for framework in state["frameworks"] + state["completed_frameworks"]
                 for e in framework["executors"] + framework["completed_executors"]
                 if e["id"] == EXECUTOR_ID]
    assert executors and all(e["container_id"] for e in executors), executors
