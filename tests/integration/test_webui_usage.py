"""The web UI's usage page in a real headless Chromium against a real cluster with
tasks running: the chart of used against limit is drawn from the master's usage
store, the per-group rows and the allocation change show, and the ad-hoc box
charts a valid group-by and shows the engine's error for bad SQL."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dyad.resources import Resources
from frameworks import CommandInfo, FrameworkInfo, TaskInfo

from .conftest import Recorder, wait_for
from .test_webui import _chromium, _require_browser

pytestmark = pytest.mark.integration

APP = "/webui-app"
WEBUI_URL = "http://127.0.0.1:9"  # never fetched: the page only links to it
# Holds ~24 MiB and wakes often, so both charts have something measured to show.
BUSY = ("exec python3 -c 'import time\nb = bytearray(24 << 20)\n"
        "while True: sum(range(20000)); time.sleep(0.02)'")
SIZES = {"usage-a": "cpus:0.1;mem:64", "usage-b": "cpus:0.2;mem:96"}
BY_APP = "SELECT app, count(*) AS samples, max(mem_rss_bytes) AS peak FROM task_usage GROUP BY app"
OVER_TIME = ("SELECT bucket(ts, 2) AS t, task_id, avg(mem_rss_bytes) AS rss FROM task_usage "
             "GROUP BY ALL ORDER BY ALL")


async def test_usage_page_in_headless_chromium(make_cluster: Any, drivers: Any,
                                               tmp_path: Path) -> None:
    _require_browser()
    cluster = make_cluster(agents=2, agent_args=["--usage-report-interval", "0.5s"])
    recorder = Recorder()
    launched: list[str] = []

    def on_offers(driver: Any, offers: list[Any]) -> None:
        if launched:
            for offer in offers:
                driver.decline_offer(offer.id)
            return
        launched.extend(SIZES)
        # Two sizes of one app: the second launch is an allocation change.
        driver.launch_tasks([offers[0].id], [TaskInfo(
            task_id=task, name=task, agent_id=offers[0].agent_id,
            resources=Resources.parse(size), command=CommandInfo(shell=BUSY),
            labels={"DYAD_APP_ID": APP}) for task, size in SIZES.items()])

    recorder.on_offers = on_offers
    runner = drivers(recorder, FrameworkInfo(name="webui-usage", roles=["eng"],
                                             webui_url=WEBUI_URL), cluster.master_address)
    await runner.registered()
    for task in SIZES:
        # A minute: executors start slowly on this shared, loaded machine.
        await wait_for(lambda task=task: "TASK_RUNNING" in recorder.states(task), 60,
                       f"{task} running")
    # The chart of OVER_TIME draws a task's line once it has two time buckets.
    async def two_buckets_each() -> bool:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{cluster.master.url}/usage/query",
                                 json={"sql": OVER_TIME}) as response:
                rows = (await response.json())["rows"]
        per_task = Counter(row[1] for row in rows)
        return all(per_task[task] >= 2 for task in SIZES)

    await wait_for(two_buckets_each, 60, "two time buckets of each task's usage")
    screenshot = await asyncio.to_thread(_usage_tour, cluster.master.url, tmp_path)
    print(f"usage page screenshot: {screenshot}")


def _usage_tour(master_url: str, tmp_path: Path) -> Path:
    from selenium.webdriver.support.ui import Select

    with _chromium(tmp_path) as (browser, until, text, act):
        def count(css: str) -> int:
            return int(browser.execute_script(
                "return document.querySelectorAll(arguments[0]).length", css))

        def attribute(css: str, name: str) -> float:
            value = browser.execute_script(
                "const e = document.querySelector(arguments[0]);"
                "return e ? e.getAttribute(arguments[1]) : null", css, name)
            return float(value or 0)

        browser.get(master_url + "/#usage")
        # The view refreshes every 10 s; the tasks' first samples may land after the first.
        until(lambda _: "eng" in text("#u-rows") and "latest:" in text("#u-mem-caption"))
        assert attribute("#u-mem", "data-max-used") > 20  # MiB: the tasks' bytearrays
        assert count("#u-cpu polygon.used") == count("#u-cpu polygon.slack") == 1
        assert count("#u-mem polyline.limit") == 1
        assert "slack" in text("#u-mem-caption")

        act("#u-by", lambda select: Select(select).select_by_value("app"))
        until(lambda _: APP in text("#u-rows"))
        link = browser.execute_script(
            "return document.querySelector('#u-rows a[target=_blank]').href")
        assert link == f"{WEBUI_URL}/v2/apps{APP}/recommendation"
        until(lambda _: "cpus 0.1 → 0.2, mem 64 → 96 MiB" in text("#u-events"))
        act(f"#u-rows [data-ugroup='{APP}']", lambda group: group.click())
        until(lambda _: APP in text("#u-focus") and "latest:" in text("#u-cpu-caption"))
        assert count("#u-cpu line.mark") >= 1  # the allocation change, marked on the chart

        def ask(sql: str) -> None:
            act("#q-sql", lambda box: (box.clear(), box.send_keys(sql)))
            act("#q-run", lambda button: button.click())

        ask(BY_APP)
        until(lambda _: APP in text("#q-result") and count("#q-chart rect.bar") >= 2)
        assert text("#q-error") == ""
        ask("SELEKT app FROM task_usage")
        until(lambda _: "syntax error" in text("#q-error").lower())
        assert count("#q-chart rect.bar") == 0 and text("#q-result") == ""
        ask(OVER_TIME)
        until(lambda _: count("#q-chart polyline.line") == len(SIZES))
        assert text("#q-error") == ""
        screenshot = tmp_path / "webui-usage.png"
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(str(screenshot))
        browser.execute_script("document.getElementById('q-sql').scrollIntoView()")
        browser.save_screenshot(str(tmp_path / "webui-usage-ask.png"))
        return screenshot
