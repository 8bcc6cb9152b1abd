"""The master's web UI in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by Selenium) against a real local cluster: what an
operator sees, not what the JSON says.

Without the browser packages the browser test skips and names the fix, unless
`DYAD_WEBUI_REQUIRED=1` (set by `.ci/run` once it has installed them): then a
missing browser is a failure, so CI cannot pass without really running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dyad.local import LocalCluster
from dyad.resources import Resources
from frameworks import CommandInfo, FrameworkInfo, TaskInfo, TaskState

from .conftest import FAST_MASTER, Recorder, wait_for
from .zookeeper import ZooKeeperServer, zookeeper  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MARKER = "hello-from-the-webui-task"
NO_MATCH = "no-such-task"
BROWSER_TIMEOUT = 15.0  # the page refreshes every 2 s; a few refreshes are plenty


def _browser_missing() -> str | None:
    """Why no browser test can run here, or None."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -e '.[test]')"
    return None


def _require_browser() -> None:
    reason = _browser_missing()
    if reason is None:
        return
    if os.environ.get("DYAD_WEBUI_REQUIRED") == "1":
        pytest.fail(f"DYAD_WEBUI_REQUIRED=1 but {reason}")
    pytest.skip(reason)


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, dict(response.headers), response.read()


async def _running_task(cluster: Any, drivers: Any) -> tuple[Recorder, str]:
    """A framework with one task that prints MARKER and keeps running; returns
    the recorder and the task's agent URL."""
    recorder = Recorder()
    runner = drivers(recorder, FrameworkInfo(name="webui-fw"), cluster.master_address)
    await runner.registered()
    await wait_for(lambda: recorder.offers, what="an offer")
    offer = recorder.offers[0]
    runner.driver.launch_tasks([offer.id], [TaskInfo(
        task_id="web-task", name="web-task", agent_id=offer.agent_id,
        resources=Resources.parse("cpus:0.1;mem:32"),
        command=CommandInfo(shell=f"echo {MARKER}; exec sleep 120"))])
    await wait_for(lambda: "TASK_RUNNING" in recorder.states("web-task"), 20, "web-task running")
    return recorder, offer.url


async def test_master_serves_the_page_and_agents_allow_cross_origin_reads(
        make_cluster: Any, drivers: Any) -> None:
    cluster = make_cluster(agents=1)
    for path in ("/", "/index.html"):
        status, headers, body = _get(cluster.master.url + path)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"<title>Dyad</title>" in body
    _, agent_url = await _running_task(cluster, drivers)
    for path in ("/state", "/health", "/monitor/statistics", "/files/browse?path=/"):
        try:
            _, headers, _ = _get(agent_url + path)
        except urllib.error.HTTPError as error:  # /files/browse outside a sandbox: 403
            assert error.code == 403
            headers = dict(error.headers)
        assert headers.get("Access-Control-Allow-Origin") == "*", path
    _, headers, _ = _get(agent_url + "/metrics/snapshot")
    assert "Access-Control-Allow-Origin" not in headers


async def test_webui_in_headless_chromium(make_cluster: Any, drivers: Any, tmp_path: Path) -> None:
    _require_browser()
    cluster = make_cluster(agents=2)
    recorder, _ = await _running_task(cluster, drivers)
    assert recorder.states("web-task")[-1] == TaskState.TASK_RUNNING.name
    # Selenium blocks; the scheduler driver must keep running in this loop meanwhile.
    screenshot = await asyncio.to_thread(_tour, cluster.master.url, tmp_path)
    print(f"web UI screenshot: {screenshot}")


async def test_standby_sends_the_browser_to_the_leader(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    _require_browser()
    cluster = LocalCluster(work_dir=tmp_path / "ha", agents=1, masters=2, zk=zookeeper.url(),
                           resources="cpus:1;mem:256;disk:100",
                           master_args=FAST_MASTER + ["--zk-session-timeout", "2s"])
    try:
        await asyncio.to_thread(cluster.start)
        leader = cluster.leader()
        standby = next(m for m in cluster.master_children if m is not leader)
        await asyncio.to_thread(_standby_redirect, standby.url, leader.url, tmp_path)
    finally:
        await asyncio.to_thread(cluster.stop)


@contextlib.contextmanager
def _chromium(tmp_path: Path) -> Iterator[tuple[Any, Callable[..., Any], Callable[[str], str],
                                                Callable[..., None]]]:
    """A headless Chromium with a throwaway profile: (driver, wait-until, text-of-css,
    act-on-css). The page re-renders every 2 s, so an element found a moment ago
    may be gone: reading one that went stale counts as "not yet", and an action on
    one is retried on its fresh copy."""
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 "--window-size=1280,900"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))

    wait = WebDriverWait(browser, BROWSER_TIMEOUT, poll_frequency=0.1)

    def text(css: str) -> str:
        try:
            found = browser.find_elements(By.CSS_SELECTOR, css)
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            return ""

    def act(css: str, action: Callable[[Any], object], index: int = 0) -> None:
        def attempt(_: Any) -> bool:
            try:
                found = browser.find_elements(By.CSS_SELECTOR, css)
                if len(found) <= index:
                    return False
                action(found[index])
                return True
            except StaleElementReferenceException:
                return False
        wait.until(attempt)

    try:
        yield browser, wait.until, text, act
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _tour(master_url: str, tmp_path: Path) -> Path:
    """Every page, asserting on what is shown; returns the tasks page's screenshot."""
    from selenium.webdriver.common.keys import Keys

    with _chromium(tmp_path) as (browser, until, text, act):
        browser.get(master_url + "/")
        until(lambda _: text("#agent-count") == "2")
        until(lambda _: "TASK_RUNNING" in text("#task-states"))
        assert "leading master" in text("#leader")

        browser.get(master_url + "/#tasks")
        until(lambda _: "web-task" in text("#tasks") and "TASK_RUNNING" in text("#tasks"))
        act("#tasks [data-log$='|stdout']", lambda link: link.click())
        until(lambda _: MARKER in text("#log") and "sandbox" in text("#log-head"))
        # The filter hides what does not match, live.
        act("#f-text", lambda field: field.send_keys(NO_MATCH))
        until(lambda _: "web-task" not in text("#tasks"))
        # Real keystrokes (each an input event), not clear(): the filter follows them.
        act("#f-text", lambda field: field.send_keys(Keys.BACKSPACE * len(NO_MATCH) + "web"))
        until(lambda _: "web-task" in text("#tasks"))
        screenshot = tmp_path / "webui-tasks.png"
        browser.save_screenshot(str(screenshot))

        browser.get(master_url + "/#frameworks")
        until(lambda _: "webui-fw" in text("#frameworks"))
        browser.get(master_url + "/#agents")
        until(lambda _: text("#agents"))
        listed = []  # each agent's sandboxes, read by the browser from the agent
        for index in range(2):
            act("#agents [data-sandboxes]", lambda link: link.click(), index)
            until(lambda _: text("#sandboxes").startswith("Sandboxes on"))
            listed.append(text("#sandboxes"))
        assert any("web-task" in sandboxes for sandboxes in listed), listed
        browser.get(master_url + "/#roles")
        until(lambda _: "webui-fw" in text("#roles"))
        return screenshot


def _standby_redirect(standby_url: str, leader_url: str, tmp_path: Path) -> None:
    with _chromium(tmp_path) as (browser, until, text, _):
        browser.get(standby_url + "/#agents")
        until(lambda _: text("#agents"))
        assert browser.current_url == leader_url + "/#agents"
        port = leader_url.rsplit(":", 1)[1]
        assert f"leading master 127.0.0.1:{port}" in text("#leader")
