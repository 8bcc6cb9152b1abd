"""Bad input never silences a socket: the quick profile of the fuzz suite
(`tests/fuzzing.py`) against a real master, agent and `dyad-service`. The long
run is `python -m benchmarks.fuzz` (>= 100,000 inputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.fuzzing import KNOWN_BAD_FRAMES, FuzzCluster, Tally, batch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzCluster]:
    cluster = FuzzCluster(tmp_path_factory.mktemp("fuzz"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.mark.timeout(120)
def test_every_known_bad_frame_is_answered_counted_and_survived(fuzzed: FuzzCluster) -> None:
    tally = Tally()
    fuzzed.fuzz(tally, KNOWN_BAD_FRAMES * 3, {})
    fuzzed.check(tally)
    assert not tally.failures(), tally.failures()
    for name, (counted, sent, answered) in fuzzed.exact_counts().items():
        assert counted == answered >= sent, (name, counted, sent, answered)


@pytest.mark.timeout(300)
def test_fuzzed_frames_and_requests_leave_every_loop_serving(fuzzed: FuzzCluster) -> None:
    tally = Tally()
    for seed in (1, 2):
        frames, requests = batch(seed, frames_count=250, requests_count=120)
        fuzzed.fuzz(tally, frames, requests)
        fuzzed.check(tally, honest_task=seed == 2)
    assert not tally.failures(), tally.failures()
    assert tally.total > 1000
    for name, (counted, sent, answered) in fuzzed.exact_counts().items():
        assert counted == answered >= sent, (name, counted, sent, answered)
