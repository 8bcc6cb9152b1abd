"""What bounded parsing costs the wire: decode time per frame for typical frames.

    python -m benchmarks.codec [--seconds 0.3]

For each typical frame (a heartbeat, a status update, an accept launching one
task, ten offers, an agent re-registering with 50 tasks) it prints the size, the
time of `dyad.bounded_json.loads` and of bare `json.loads` (the reference, which
has no limits) on the same bytes and their ratio; then the whole
`dyad.messages.decode` (parse plus validation into attrs objects) against the
same validation behind bare `json.loads`, and that ratio: what a receiver pays.
Then `encode` (msgspec, issue 19) against `json.dumps` of the codec's `to_json`
(the writer before it) on the same message. Each figure is the best of five runs of at least `--seconds`, ours and the
reference taking turns, with the garbage collector off.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any, Callable

from dyad import bounded_json
from dyad import messages as m
from dyad.codec import from_json, to_json
from dyad.resources import Resources

RES = Resources.parse("cpus:2;mem:2048;disk:10000;ports:[31000-31999]")


def typical_frames() -> dict[str, bytes]:
    framework = m.FrameworkInfo(name="service", roles=["*"], id="F-0001",
                                failover_timeout=604800, checkpoint=True)
    command = m.CommandInfo(shell="exec python3 -m http.server $PORT0",
                            environment={"PORT0": "31000", "HOST": "127.0.0.2"})
    task = m.TaskInfo(task_id="web.5f2e9c1e-0b7d-4c1e-9a57-3c6f5f0e2a11", name="web",
                      agent_id="A-0003", resources=Resources.parse("cpus:0.1;mem:32;ports:[31000-31000]"),
                      command=command, labels={"DYAD_APP_ID": "/web"})
    status = m.TaskStatus(task_id=task.task_id, state=m.TaskState.TASK_RUNNING,
                          source=m.Source.EXECUTOR, agent_id="A-0003", executor_id=task.task_id,
                          uuid="9b1f3c2a4d5e6f708192a3b4c5d6e7f8", healthy=True,
                          timestamp=1764578451.25)
    offers = [m.Offer(id=f"O-{i}", framework_id="F-0001", agent_id=f"A-{i:04d}",
                      hostname=f"127.0.0.{i + 2}", resources=RES, attributes={"rack": "r1"},
                      url=f"http://127.0.0.{i + 2}:40001") for i in range(10)]
    records = [m.Task(task_id=f"t{i}", framework_id="F-0001", agent_id="A-0003",
                      executor_id=f"t{i}", name="web", state=m.TaskState.TASK_RUNNING,
                      resources=Resources.parse("cpus:0.1;mem:32"),
                      status_uuid="9b1f3c2a4d5e6f708192a3b4c5d6e7f8") for i in range(50)]
    agent = m.AgentInfo(hostname="127.0.0.3", port=40001, resources=RES,
                        attributes={"rack": "r2"}, id="A-0003", ip="127.0.0.3")
    samples: list[m.Message] = [
        m.Heartbeat(),
        m.StatusUpdate(framework_id="F-0001", status=status),
        m.Accept(framework_id="F-0001", offer_ids=["O-1"],
                 operations=[m.Operation(type="LAUNCH", tasks=[task])]),
        m.Offers(offers=offers),
        m.RegisterAgent(agent=agent, version="0.1.0", tasks=records, frameworks=[framework]),
    ]
    return {f"{msg.TYPE}": m.encode(msg) for msg in samples}


def reference_encode(msg: m.Message) -> bytes:
    """`encode` as it was before msgspec: `json.dumps` of the codec's `to_json`."""
    return json.dumps({"type": msg.TYPE, "v": m.WIRE_VERSION, "body": to_json(msg)},
                      separators=(",", ":")).encode()


def reference_decode(frame: bytes) -> m.Message:
    """`decode` as it was before bounded parsing: bare `json.loads`, same validation."""
    envelope = json.loads(frame)
    return from_json(m.MESSAGE_TYPES[envelope["type"]], envelope.get("body", {}))


def _batch(fn: Callable[[bytes], Any], frame: bytes, seconds: float) -> int:
    """A number of calls that takes about `seconds`."""
    calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(calls):
            fn(frame)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds / 10:
            return max(1, int(calls * seconds / elapsed))
        calls *= 2


def best_us(fns: list[Callable[[bytes], Any]], frame: bytes, seconds: float) -> list[float]:
    """Per function, the best of five runs in microseconds per call; the functions
    take turns in each round, so a busy machine slows them alike."""
    batches = [_batch(fn, frame, seconds) for fn in fns]
    best = [float("inf")] * len(fns)
    for _ in range(5):
        for index, (fn, calls) in enumerate(zip(fns, batches)):
            started = time.perf_counter()
            for _ in range(calls):
                fn(frame)
            best[index] = min(best[index], (time.perf_counter() - started) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="minimum time per run")
    args = parser.parse_args()
    print(f"{'frame':<16}{'bytes':>7}{'bounded':>9}{'json':>8}{'ratio':>7}"
          f"{'decode':>9}{'ref':>8}{'ratio':>7}{'encode':>9}{'ref':>8}{'ratio':>7}"
          "   (us per frame)")
    gc.disable()
    try:
        for name, frame in typical_frames().items():
            message = m.decode(frame)
            assert message == reference_decode(frame)
            assert json.loads(m.encode(message)) == json.loads(reference_encode(message))
            ours, reference, whole, whole_reference = best_us(
                [bounded_json.loads, json.loads, m.decode, reference_decode], frame,
                args.seconds)
            out, out_reference = best_us(
                [lambda _: m.encode(message), lambda _: reference_encode(message)], frame,
                args.seconds)
            print(f"{name:<16}{len(frame):>7}{ours:>9.2f}{reference:>8.2f}"
                  f"{ours / reference:>7.2f}{whole:>9.2f}{whole_reference:>8.2f}"
                  f"{whole / whole_reference:>7.2f}{out:>9.2f}{out_reference:>8.2f}"
                  f"{out / out_reference:>7.2f}")
    finally:
        gc.enable()
    print("ratios: ours / reference on the same frame (1.00: bounded parsing costs nothing)")


if __name__ == "__main__":
    main()
