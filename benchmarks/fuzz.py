"""The long fuzz run: >= 100,000 malformed inputs against a real master, agent
and `dyad-service`, in batches, with every check of `tests.fuzzing` after each.

    python -m benchmarks.fuzz [--inputs 100000] [--seed 1] [--work-dir DIR]

Prints inputs tried and refused per boundary, answers of 5xx, hangs, crashes and
silently dead loops (all must be 0), whether each receiver's invalid-input
counter equals what it was sent, the master's and agent's RSS before and after
(within 20 MB), and the rate against a reference measured in the same run: the
same frames decoded in-process by `dyad.messages.decode` alone."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from dyad.messages import MessageError, decode
from tests.fuzzing import KNOWN_BAD_FRAMES, FuzzCluster, Tally, batch

BATCH_FRAMES = 2_000
BATCH_REQUESTS = 600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="dyad-fuzz-"))
    cluster = FuzzCluster(work_dir)
    cluster.start()
    tally = Tally()
    try:
        cluster.fuzz(tally, KNOWN_BAD_FRAMES * 10, {})
        cluster.check(tally)
        rss_before = cluster.rss_mib()
        started = time.perf_counter()
        decode_seconds = 0.0
        seed = args.seed
        while tally.total < args.inputs and not tally.crashes:
            frames, requests = batch(seed, BATCH_FRAMES, BATCH_REQUESTS)
            t0 = time.perf_counter()
            for frame in frames:
                try:
                    decode(frame)
                except MessageError:
                    pass
            decode_seconds += (time.perf_counter() - t0) * len(cluster.zmq)
            cluster.fuzz(tally, frames, requests)
            cluster.check(tally, honest_task=seed % 5 == 0)
            print(f"  batch {seed - args.seed + 1}: {tally.total:,} inputs, "
                  f"{len(tally.failures())} failures, "
                  f"{tally.total / (time.perf_counter() - started):,.0f} inputs/s",
                  flush=True)
            seed += 1
        cluster.check(tally)
        elapsed = time.perf_counter() - started
        rss_after = cluster.rss_mib()
        counts = cluster.exact_counts()
    finally:
        cluster.stop()
    zmq_inputs = sum(v for k, v in tally.tried.items() if k.endswith("zmq"))
    print(f"\ninputs tried: {tally.total:,} in {elapsed:.0f} s "
          f"({tally.total / elapsed:,.0f}/s; work dir {work_dir})")
    for name in sorted(tally.tried):
        print(f"  {name:14} tried {tally.tried[name]:>8,}  refused {tally.rejected[name]:>8,}")
    print(f"answers of 5xx: {len(tally.server_errors)}")
    print(f"hangs:          {len(tally.hangs)}")
    print(f"crashes:        {len(tally.crashes)}")
    print(f"dead loops:     {len(tally.dead_loops)}")
    exact = True
    for name, (counted, sent, answered) in counts.items():
        ok = counted == answered >= sent
        exact &= ok
        print(f"{name} invalid counter {counted:,.0f}, refused frames sent {sent:,}, "
              f"Rejected answers {answered:,}: {'exact' if ok else 'MISMATCH'}")
    rss_ok = True
    for name in rss_before:
        grew = rss_after[name] - rss_before[name]
        rss_ok &= grew <= 20
        print(f"{name} RSS {rss_before[name]:.1f} MiB -> {rss_after[name]:.1f} MiB "
              f"({grew:+.1f} MiB)")
    if decode_seconds:
        print(f"reference: decode() alone in-process {zmq_inputs / decode_seconds:,.0f} frames/s;"
              f" over real sockets with every check {zmq_inputs / elapsed:,.0f} frames/s "
              f"(ratio {decode_seconds / elapsed:.3f})")
    for failure in tally.failures()[:30]:
        print(f"  FAILURE {failure}")
    failed = tally.failures() or not exact or not rss_ok or tally.total < args.inputs
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
