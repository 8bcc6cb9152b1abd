"""The main demo: both shipped frameworks sharing one cluster.

    dyad local --agents 3 --port 0 --run examples/demo.py

1. starts the service framework (`dyad-service`) and asks it for an app of two
   `python3 -m http.server` instances with an HTTP health check, on two hosts;
2. while that service runs, runs a word count with the batch framework over
   `examples/data/*.txt` and prints the top words;
3. shows the app's tasks answering HTTP, then stops the service framework
   (its tasks are killed when the framework is torn down).

Exit status 0 when every step worked. Needs `DYAD_MASTER` (set by `dyad local`).
Under `dyad local --secure` the service framework runs as principal `service`
with the cluster's credentials (`DYAD_KEYS_DIR`), and every HTTP call carries
this program's token over TLS (`DYAD_CA`, `DYAD_TOKEN_FILE`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from frameworks.batch import Job, run_job

KEYS = Path(os.environ["DYAD_KEYS_DIR"]) if os.environ.get("DYAD_KEYS_DIR") else None

HERE = Path(__file__).resolve().parent
APP = {
    "id": "/demo/web",
    "cmd": "exec python3 -m http.server --bind $HOST $PORT0",
    "instances": 2, "cpus": 0.1, "mem": 96, "ports": [0],
    "constraints": [["hostname", "UNIQUE"]],
    "healthChecks": [{"protocol": "HTTP", "path": "/", "portIndex": 0,
                      "gracePeriodSeconds": 10, "intervalSeconds": 2,
                      "maxConsecutiveFailures": 3, "delaySeconds": 1}],
}


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    if KEYS is not None:
        from dyad.auth import ClientCredentials
        opened = ClientCredentials.from_env().urlopen(request, 5)
    else:
        opened = urllib.request.urlopen(request, timeout=5)
    with opened as response:
        return json.loads(response.read() or b"null")


def wait(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise SystemExit(f"demo: timed out waiting for {what}")


def start_service(master: str, work: Path) -> tuple[subprocess.Popen[str], str]:
    log = open(work / "service.log", "w")
    env, secure = dict(os.environ), []
    if KEYS is not None:  # the service framework is a principal of its own
        env.update(DYAD_CURVE_KEY=str(KEYS / "curve" / "service.key_secret"),
                   DYAD_TOKEN_FILE=str(KEYS / "tokens" / "service.token"))
        secure = ["--credentials", str(KEYS / "credentials.json"),
                  "--acls", str(KEYS / "acls.json"),
                  "--tls-cert", str(KEYS / "tls" / "server.pem"),
                  "--tls-key", str(KEYS / "tls" / "server-key.pem")]
    service = subprocess.Popen(
        [sys.executable, "-m", "frameworks.service.main", "--master", master, "--port", "0",
         "--work-dir", str(work / "service"), "--failover-timeout", "0s", *secure],
        stdout=log, stderr=subprocess.STDOUT, text=True, env=env)

    def url() -> str | None:
        found = re.search(r"listening on (https?://\S+)", (work / "service.log").read_text())
        return found.group(1) if found else None

    return service, wait("the service framework to listen", url, 30)


def main() -> int:
    master = os.environ.get("DYAD_MASTER")
    if not master:
        print("demo: set DYAD_MASTER=host:port (dyad local --run does)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="dyad-demo-"))
    service, api = start_service(master, work)
    try:
        print(f"demo: service framework API at {api}")
        http("POST", f"{api}/v2/apps", APP)
        print("demo: asked for app /demo/web (2 instances, HTTP health check)")
        app = wait("2 healthy instances", lambda: (
            lambda a: a if a["tasksHealthy"] >= 2 else None)(
            http("GET", f"{api}/v2/apps/demo/web")["app"]), 90)
        print(f"demo: app running={app['tasksRunning']} healthy={app['tasksHealthy']}")

        print("demo: running a word count with the batch framework...")
        result = run_job(Job(module=str(HERE / "wordcount.py"),
                             inputs=str(HERE / "data"), output=str(work / "wordcount"),
                             reducers=2, map_cpus=0.2, map_mem=64, reduce_cpus=0.2,
                             reduce_mem=64), master=master)
        if not result.succeeded:
            print(f"demo: word count failed: {result.error}", file=sys.stderr)
            return 1
        counts: list[tuple[int, str]] = []
        for path in result.output_files:
            for line in Path(path).read_text().splitlines():
                word, _, n = line.partition("\t")
                counts.append((int(n), word))
        top = ", ".join(f"{w} {n}" for n, w in sorted(counts, reverse=True)[:5])
        print(f"demo: word count done in {result.elapsed:.1f}s; top words: {top}")

        for task in http("GET", f"{api}/v2/apps/demo/web/tasks")["tasks"]:
            url = f"http://{task['host']}:{task['ports'][0]}/"
            with urllib.request.urlopen(url, timeout=5) as response:
                print(f"demo: task {task['id']} on {task['host']} answers {url}: "
                      f"HTTP {response.status}")
        return 0
    finally:
        service.terminate()
        service.wait(20)
        print(f"demo: stopped the service framework; logs in {work}")


if __name__ == "__main__":
    sys.exit(main())
