"""Malformed input for every boundary of a running cluster, and the accounting
that proves nothing was lost.

One set of hypothesis strategies serves the quick profile in the default suite
(`tests/integration/test_fuzz.py`) and the long run (`python -m benchmarks.fuzz`):

- ZMQ frames for the master's ROUTER and an agent's executor ROUTER: random bytes,
  JSON that is not an envelope, envelopes of every message type in
  `dyad.messages.MESSAGE_TYPES` with bodies of the wrong shape, versions that are
  not the integer 1 (`true`, `1.0`, `"1"`), deep nesting, numbers of thousands of
  digits, lone surrogates, plus the seeded corpus `KNOWN_BAD_FRAMES`.
- HTTP requests for every route of the master, the agent and the service
  framework: every method, path parameters and query strings of arbitrary bytes
  (`%0A`, invalid UTF-8), and bodies from the same JSON-ish generator.

Frames that `decode` refuses are "counted": each must be answered with exactly one
`Rejected` and raise the receiver's `messages_invalid` by one. Frames that decode
(a well-formed `Kill` of a task nobody has) are "junk": sent on their own socket,
answered or not, and only their `Rejected` answers are counted. Messages that would
make the fuzzer a member of the cluster (subscribe, register an agent or an
executor) are left out, so an honest framework can still be offered every agent.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import attrs
import hypothesis
import psutil
import zmq
from hypothesis import strategies as st

from dyad.local import LocalCluster
from dyad.messages import MESSAGE_TYPES, MessageError, decode

MEMBERSHIP = {"subscribe", "register_agent", "register_executor", "reregister_executor"}
"""Types the fuzzer never sends decodable: they would enrol it as a framework, an
agent or an executor, which is not bad input but a (strange) member."""

KNOWN_BAD_FRAMES: list[bytes] = [
    b"[" * 1000 + b"]" * 1000,
    b'{"type":"acknowledge","v":' + b"1" * 4301 + b',"body":{}}',
    b'{"type":"ping","v":true,"body":{"agent_id":"a"}}',
    b'{"type":"ping","v":1.0,"body":{"agent_id":"a"}}',
    b'{"type":"kill","v":1,"body":{"framework_id":"\\ud800","task_id":"t","agent_id":null}}',
    b'{"type":"decline","v":1,"body":{"framework_id":"f","offer_ids":["o"],'
    b'"filters":{"refuse_seconds":1e999}}}',
    b'{"type":"decline","v":1,"body":{"framework_id":"f","offer_ids":["o"],'
    b'"filters":{"refuse_seconds":1' + b"0" * 309 + b"}}}",
    b'{"type":"nonsense","v":1,"body":{}}',
    b"\xff\xfe\x00",
    b"",
    b"null",
    b'{"type":' + b'{"a":' * 40 + b"1" + b"}" * 40 + b"}",
]

_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
            | st.text(max_size=30) | st.sampled_from(["", "\n", "\ud800", "1" * 5000]))
json_ish = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20)


def _dumps(value: Any) -> bytes:
    # Lone surrogates must reach the peer as JSON escapes, not as broken UTF-8.
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    type_name = draw(st.sampled_from(sorted(MESSAGE_TYPES)) | st.text(max_size=12))
    cls = MESSAGE_TYPES.get(type_name)
    fields = [f.name for f in attrs.fields(cls)] if cls is not None else []
    body = {name: draw(json_ish) for name in fields if draw(st.booleans())}
    body.update(draw(st.dictionaries(st.text(max_size=8), json_ish, max_size=2)))
    envelope: dict[str, Any] = {"type": type_name,
                                "v": draw(st.sampled_from([1, 1, 1, True, 1.0, "1", 2, None])),
                                "body": body}
    if draw(st.integers(0, 9)) == 0:
        del envelope[draw(st.sampled_from(["type", "v", "body"]))]
    return _dumps(envelope)


@st.composite
def nested(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(20, 3000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    core = b"1" if opener != b"[" else b""
    return opener * depth + core + closer * depth


frames = st.one_of(
    envelopes(), envelopes(), envelopes(),
    json_ish.map(_dumps),
    st.binary(max_size=200),
    nested(),
    st.integers(300, 6000).map(lambda n: b'{"type":"ping","v":1,"body":{"agent_id":' +
                               b"9" * n + b"}}"),
    st.sampled_from(KNOWN_BAD_FRAMES),
)


def classify(frame: bytes) -> str:
    """'counted' (must be refused, answered and counted), 'silent' (refused but
    never answered: a bad `rejected` frame, so two peers cannot loop), 'junk'
    (decodes), or 'skip' (decodes as a membership message)."""
    try:
        message = decode(frame)
    except MessageError as exc:
        return "silent" if exc.type_name == "rejected" else "counted"
    except Exception:  # noqa: BLE001 - the bug we hunt; the receiver must survive it too
        return "counted"
    return "skip" if message.TYPE in MEMBERSHIP else "junk"


@attrs.define
class Tally:
    """What one fuzz run did and saw."""

    tried: Counter[str] = attrs.field(factory=Counter)
    rejected: Counter[str] = attrs.field(factory=Counter)
    server_errors: list[str] = attrs.field(factory=list)
    hangs: list[str] = attrs.field(factory=list)
    crashes: list[str] = attrs.field(factory=list)
    dead_loops: list[str] = attrs.field(factory=list)

    def merge_rejections(self, target: str, replies: int) -> None:
        self.rejected[target] += replies

    @property
    def total(self) -> int:
        return sum(self.tried.values())

    def failures(self) -> list[str]:
        return [*self.server_errors[:20], *self.hangs[:20], *self.crashes, *self.dead_loops]


class ZmqTarget:
    """Two DEALER sockets on one ROUTER endpoint: `counted` carries only frames
    the receiver must refuse (so its answers and counter can be checked exactly),
    `junk` the rest."""

    def __init__(self, context: zmq.Context[Any], name: str, endpoint: str) -> None:
        self.name = name
        self.sockets = {kind: self._connect(context, endpoint) for kind in ("counted", "junk")}
        self.sent = Counter[str]()
        self.answers = Counter[str]()

    @staticmethod
    def _connect(context: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(endpoint)
        return sock

    def send(self, frame: bytes, tally: Tally) -> None:
        kind = classify(frame)
        if kind == "skip":
            return
        self.sockets["junk" if kind == "silent" else kind].send(frame)
        self.sent[kind] += 1
        tally.tried[f"{self.name} zmq"] += 1
        self.drain()

    def drain(self) -> None:
        for kind, sock in self.sockets.items():
            while sock.poll(0):
                reply = sock.recv()
                try:
                    message = decode(reply)
                except MessageError:
                    continue
                if message.TYPE == "rejected":
                    self.answers[kind] += 1

    def settle(self, deadline: float) -> bool:
        """Wait until every counted frame has been answered; False on timeout."""
        while time.monotonic() < deadline:
            self.drain()
            if self.answers["counted"] >= self.sent["counted"]:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(0)


@attrs.frozen
class Route:
    method: str
    path: str
    """Template; `{}` marks a parameter the fuzzer fills with arbitrary bytes."""


MASTER_ROUTES = [Route(m, p) for m, p in [
    ("GET", "/"), ("GET", "/master/info"), ("GET", "/state"), ("GET", "/health"),
    ("GET", "/metrics/snapshot"), ("GET", "/metrics"), ("GET", "/events?limit={}"),
    ("POST", "/tasks/kill"), ("GET", "/redirect"), ("GET", "/weights"),
    ("PUT", "/weights"), ("GET", "/quota"), ("PUT", "/quota"), ("POST", "/machine/drain"),
    ("GET", "/{}"), ("DELETE", "/weights"),
]]
AGENT_ROUTES = [Route(m, p) for m, p in [
    ("GET", "/state"), ("GET", "/health"), ("GET", "/metrics/snapshot"), ("GET", "/metrics"),
    ("GET", "/monitor/statistics"), ("PUT", "/drain"), ("GET", "/files/browse?path={}"),
    ("GET", "/files/read?path={}&offset={}&length={}"), ("GET", "/files/download?path={}"),
    ("GET", "/{}"),
]]
SERVICE_ROUTES = [Route(m, p) for m, p in [
    ("GET", "/ping"), ("GET", "/v2/info"), ("GET", "/v2/leader"), ("GET", "/metrics"),
    ("GET", "/v2/apps?embed={}"), ("POST", "/v2/apps"), ("GET", "/v2/apps/{}/tasks"),
    ("DELETE", "/v2/apps/{}/tasks"), ("DELETE", "/v2/apps/{}/tasks/{}"),
    ("POST", "/v2/apps/{}/restart"), ("GET", "/v2/apps/{}"), ("PUT", "/v2/apps/{}"),
    ("DELETE", "/v2/apps/{}?force={}"), ("GET", "/v2/tasks"), ("GET", "/v2/deployments"),
    ("DELETE", "/v2/deployments/{}"), ("GET", "/v2/queue"), ("DELETE", "/v2/queue/{}/delay"),
]]

NEVER_SENT = {("POST", "/drain")}
"""The agent drains itself on any POST /drain (that is its API, and it takes no
body), after which no honest task could run; its bad input is covered in
tests/integration/test_agent_shell.py."""

_param_bytes = st.one_of(
    st.binary(max_size=20), st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\n", b"a\r\nX-Injected: 1", b"\xed\xa0\x80", b"../../../etc/passwd",
                     b"/proc/self/fd/0", b"-1", b"1" * 400, b"%", b"web", b""]))

# Bodies: JSON-ish values, app-definition-shaped objects with hostile fields, the
# shapes each operator route expects with values of every kind, and raw bytes.
_app_shaped = st.fixed_dictionaries({"id": st.text(max_size=12) | st.just("/fuzz")}, optional={
    "cmd": st.text(max_size=20), "cpus": json_ish, "mem": json_ish, "instances": json_ish,
    "constraints": st.lists(st.lists(st.text(max_size=40) | st.sampled_from(
        ["hostname", "CLUSTER", "LIKE", "UNLIKE", "MAX_PER", "UNIQUE", "(a+)+", "²"]),
        max_size=3), max_size=3),
    "healthChecks": json_ish, "upgradeStrategy": json_ish, "ports": json_ish,
})
_operator_shaped = st.one_of(
    st.dictionaries(st.text(max_size=10), json_ish, max_size=3),  # /weights
    st.lists(st.fixed_dictionaries({}, optional={"role": json_ish, "weight": json_ish,
                                                 "guarantee": json_ish, "limit": json_ish}),
             max_size=3),
    st.fixed_dictionaries({}, optional={"task_id": json_ish, "agent_id": json_ish,
                                        "framework_id": json_ish}),
)
bodies = st.one_of(
    st.none(), json_ish.map(_dumps), _app_shaped.map(_dumps), _operator_shaped.map(_dumps),
    nested(), st.binary(max_size=100), st.sampled_from(KNOWN_BAD_FRAMES),
)


@st.composite
def requests(draw: st.DrawFn, routes: list[Route]) -> tuple[str, str, bytes | None]:
    route = draw(st.sampled_from(routes))
    method = draw(st.sampled_from([route.method] * 6 + ["GET", "POST", "PUT", "DELETE",
                                                        "PATCH"]))
    path = route.path
    while "{}" in path:
        path = path.replace("{}", urllib.parse.quote(draw(_param_bytes), safe=""), 1)
    if (method, path) in NEVER_SENT:
        method = "PUT"
    return method, path, draw(bodies)


class HttpTarget:
    """One HTTP server under fuzz, over a kept-alive connection that is reopened
    whenever the server (rightly) closes it."""

    def __init__(self, name: str, url: str, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.name = name
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def send(self, request: tuple[str, str, bytes | None], tally: Tally) -> None:
        method, path, body = request
        tally.tried[f"{self.name} http"] += 1
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in range(2):
            conn = self._conn or http.client.HTTPConnection(self.host, self.port,
                                                            timeout=self.timeout)
            self._conn = conn
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
            except TimeoutError:
                tally.hangs.append(f"{self.name}: {method} {path} no answer in {self.timeout}s")
                self.close()
                return
            except (http.client.HTTPException, ConnectionError, OSError) as exc:
                self.close()
                if attempt == 1:
                    tally.crashes.append(f"{self.name}: {method} {path}: {exc!r}")
                continue
            if response.status >= 500:
                tally.server_errors.append(f"{self.name}: {method} {path} {body!r:.120} -> "
                                           f"{response.status}")
            elif response.status >= 400:
                tally.rejected[f"{self.name} http"] += 1
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return

    def get_json(self, path: str) -> tuple[int, Any]:
        return self.call("GET", path)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        """One request on a fresh connection; (status, JSON or text)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=body)
            response = conn.getresponse()
            raw = response.read()
            try:
                return response.status, json.loads(raw or b"null")
            except ValueError:
                return response.status, raw.decode(errors="replace")
        finally:
            conn.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def send_all(targets: Iterable[tuple[Any, Iterable[Any]]], tally: Tally) -> None:
    """Send each target its inputs, interleaved one by one across targets."""
    pending = [(target, iter(items)) for target, items in targets]
    while pending:
        still = []
        for target, items in pending:
            item = next(items, None)
            if item is not None:
                target.send(item, tally)
                still.append((target, items))
        pending = still


# ----------------------------------------------------------------- the cluster

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class FuzzCluster:
    """A real master, a real agent and a real `dyad-service` under fuzz, with the
    checks that say whether they came through: alive, healthy, counters exact, and
    an honest framework still running a task to completion."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.cluster = LocalCluster(work_dir=work_dir / "cluster", agents=1,
                                    resources="cpus:2;mem:1024;disk:1000",
                                    master_args=["--allocation-interval", "0.1s"])
        self.service: subprocess.Popen[bytes] | None = None
        self.context: zmq.Context[Any] = zmq.Context()
        self.zmq: list[ZmqTarget] = []
        self.http: dict[str, HttpTarget] = {}
        self._invalid_before: dict[str, float] = {}

    def start(self) -> None:
        self.cluster.start()
        master, agent = self.cluster.master, self.cluster.agent_children[0]
        assert master is not None
        self.zmq = [ZmqTarget(self.context, "master", master.zmq),
                    ZmqTarget(self.context, "agent", agent.zmq)]
        log_path = self.work_dir / "service.log"
        with open(log_path, "wb") as log:
            self.service = subprocess.Popen(
                [sys.executable, "-m", "frameworks.service.main", "--port", "0",
                 "--master", self.cluster.master_address,
                 "--work-dir", str(self.work_dir / "service")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)), start_new_session=True)
        deadline = time.monotonic() + 30
        url = None
        while url is None:
            text = log_path.read_text()
            found = re.findall(r"listening on (http://\S+)", text)
            url = found[-1] if found and "dyad-service leading" in text else None
            assert self.service.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "dyad-service did not start"
            time.sleep(0.05)
        self.http = {"master": HttpTarget("master", master.url),
                     "agent": HttpTarget("agent", agent.url),
                     "service": HttpTarget("service", url)}
        self._invalid_before = self.invalid_counts()

    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        assert self.cluster.master is not None and self.service is not None
        return {"master": self.cluster.master.process,
                "agent": self.cluster.agent_children[0].process, "service": self.service}

    def rss_mib(self) -> dict[str, float]:
        return {name: psutil.Process(p.pid).memory_info().rss / 2**20
                for name, p in self.processes().items() if name != "service"}

    def invalid_counts(self) -> dict[str, float]:
        return {"master": self.http["master"].get_json("/metrics/snapshot")[1]
                ["master/messages_invalid"],
                "agent": self.http["agent"].get_json("/metrics/snapshot")[1]
                ["agent/messages_invalid"]}

    def fuzz(self, tally: Tally, frames_per_target: list[bytes],
             requests_per_target: dict[str, list[tuple[str, str, bytes | None]]]) -> None:
        send_all([*((target, frames_per_target) for target in self.zmq),
                  *((self.http[name], items) for name, items in requests_per_target.items())],
                 tally)

    def check(self, tally: Tally, honest_task: bool = True) -> None:
        """After a batch: every process alive, every loop answering, each counted
        frame answered once and counted once, and (optionally) a task run."""
        for name, process in self.processes().items():
            if process.poll() is not None:
                tally.crashes.append(f"{name} exited with {process.returncode}")
        if tally.crashes:
            return
        for target in self.zmq:
            if not target.settle(time.monotonic() + 30):
                tally.dead_loops.append(
                    f"{target.name} zmq answered {target.answers['counted']} of "
                    f"{target.sent['counted']} refused frames")
        for name in ("master", "agent"):
            status, body = self.http[name].get_json("/health")
            if status != 200 or not body.get("healthy", False):
                tally.dead_loops.append(f"{name} /health: {status} {body}")
        if self.http["service"].get_json("/ping")[0] != 200:
            tally.dead_loops.append("service /ping does not answer 200")
        counts = self.invalid_counts()
        for target in self.zmq:
            expected = target.answers["counted"] + target.answers["junk"] + target.sent["silent"]
            seen = counts[target.name] - self._invalid_before[target.name]
            # Bad frames are counted by the receiver; every refusal it answered
            # with a `Rejected` counted too, and so did each broken `rejected`
            # frame (refused without an answer).
            if seen < expected:
                tally.dead_loops.append(f"{target.name} counted {seen:.0f} invalid frames, "
                                        f"answered {expected}")
            tally.rejected[f"{target.name} zmq"] = target.answers["counted"] + \
                target.answers["junk"]
        if honest_task:
            self.undo_valid_changes()
            self.run_honest_task(tally)

    def exact_counts(self) -> dict[str, tuple[float, int, int]]:
        """Per ZMQ target: (invalid counted by the receiver, refused frames sent,
        refusals seen: Rejected answers plus broken `rejected` frames, which are
        refused without an answer)."""
        counts = self.invalid_counts()
        return {t.name: (counts[t.name] - self._invalid_before[t.name],
                         t.sent["counted"] + t.sent["silent"],
                         t.answers["counted"] + t.answers["junk"] + t.sent["silent"])
                for t in self.zmq}

    def undo_valid_changes(self) -> None:
        """Some fuzzed requests are valid and change the cluster as they should (an
        app created, a role given quota); an operator would undo them, and so do
        we, so that the honest task measures liveness, not the fuzzer's apps."""
        service = self.http["service"]
        for app in service.get_json("/v2/apps")[1].get("apps", []):
            service.call("DELETE", f"/v2/apps/{urllib.parse.quote(app['id'])}?force=true")
        master = self.http["master"]
        for quota in master.get_json("/quota")[1].get("quota", []):
            master.call("PUT", "/quota", json.dumps({"role": quota["role"]}).encode())

    def run_honest_task(self, tally: Tally) -> None:
        hello = subprocess.run(
            [sys.executable, str(PROJECT_ROOT / "examples" / "hello.py"),
             "--master", self.cluster.master_address, "--timeout", "60"],
            capture_output=True, text=True, timeout=90,
            env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
        if hello.returncode != 0:
            tally.dead_loops.append(f"an honest framework's task did not finish: "
                                    f"{hello.stdout[-500:]} {hello.stderr[-500:]}")

    def stop(self) -> None:
        for target in self.zmq:
            target.close()
        for target in self.http.values():
            target.close()
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(15)
            except subprocess.TimeoutExpired:
                self.service.kill()
        self.cluster.stop()
        self.context.term()


def generate(strategy: st.SearchStrategy[Any], count: int, seed: int) -> list[Any]:
    """`count` inputs drawn from `strategy`, the same ones for the same seed."""
    drawn: list[Any] = []

    @hypothesis.settings(max_examples=count, database=None, deadline=None,
                         phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.seed(seed)
    @hypothesis.given(strategy)
    def collect(item: Any) -> None:
        drawn.append(item)

    collect()
    return drawn[:count]


def batch(seed: int, frames_count: int, requests_count: int
          ) -> tuple[list[bytes], dict[str, list[tuple[str, str, bytes | None]]]]:
    """One batch of inputs: frames for each ZMQ target, requests for each HTTP one."""
    frame_list = generate(frames, frames_count, seed)
    routes = {"master": MASTER_ROUTES, "agent": AGENT_ROUTES, "service": SERVICE_ROUTES}
    return frame_list, {name: generate(requests(table), requests_count, seed + i + 1)
                        for i, (name, table) in enumerate(routes.items())}
