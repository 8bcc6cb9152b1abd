"""`dyad apps` against the real API on loopback (the API's fixture), including a
standby that points the CLI at its leader."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from dyad import apps_cli
from dyad.cli import build_parser, main
from frameworks.service.api import ServiceApi
from tests.unit.test_service_api import WEB, Client, client  # noqa: F401  (fixture)


async def dyad_apps(client: Client, *argv: str) -> str:
    args = build_parser().parse_args(["apps", "--service", client.base, *argv])
    return await asyncio.to_thread(apps_cli.execute, args)


async def test_add_list_show_scale_restart_remove(client: Client, tmp_path: Path) -> None:
    definition = tmp_path / "web.json"
    definition.write_text(json.dumps(WEB))
    assert (await dyad_apps(client, "add", str(definition))).startswith("created /web")
    client.offer("agent0", "agent1")
    client.run_tasks()
    listing = await dyad_apps(client, "list")
    assert listing.splitlines()[0].split()[:4] == ["ID", "INSTANCES", "RUNNING", "HEALTHY"]
    assert listing.splitlines()[1].split()[:6] == ["/web", "2", "2", "2", "0", "no"]
    shown = await dyad_apps(client, "show", "web")
    assert "instances  2 (running 2" in shown and shown.count("  task web.") == 2
    assert json.loads(await dyad_apps(client, "show", "/web", "--json"))["id"] == "/web"
    assert "scaling /web to 3: deployment" in await dyad_apps(client, "scale", "/web", "3")
    with pytest.raises(apps_cli.ApiError) as info:
        await dyad_apps(client, "restart", "/web")
    assert info.value.status == 409 and "force=true" in info.value.message
    assert "restarting /web" in await dyad_apps(client, "--force", "restart", "/web")
    assert "restart /web" in await dyad_apps(client, "deployments")
    assert "removing /web" in await dyad_apps(client, "--force", "remove", "/web")
    with pytest.raises(apps_cli.ApiError) as info:
        await dyad_apps(client, "show", "/web")
    assert info.value.status == 404


async def test_invalid_definitions_show_every_detail(client: Client, tmp_path: Path) -> None:
    definition = tmp_path / "bad.json"
    definition.write_text(json.dumps({**WEB, "cpus": -1, "instances": "x"}))
    with pytest.raises(apps_cli.ApiError) as info:
        await dyad_apps(client, "add", str(definition))
    assert info.value.status == 422
    assert "/cpus" in info.value.message and "/instances" in info.value.message


async def test_a_standby_sends_the_cli_to_its_leader(client: Client) -> None:
    async def leader() -> str:
        return client.base.removeprefix("http://")

    standby = TestServer(ServiceApi(leader).app)
    await standby.start_server()
    try:
        args = build_parser().parse_args(
            ["apps", "--service", f"127.0.0.1:{standby.port}", "list"])
        assert (await asyncio.to_thread(apps_cli.execute, args)).startswith("ID")
    finally:
        await standby.close()


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["apps", "--service", "127.0.0.1:1", "list"]) == 2
    assert "no dyad-service at http://127.0.0.1:1" in capsys.readouterr().err
    assert main(["apps", "--service", "127.0.0.1:1", "add", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["apps", "--service", "127.0.0.1:1", "scale", "/web", "-1"]) == 2


async def test_api_errors_exit_1(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["apps", "--service", client.base, "remove", "/nope"])
    assert await asyncio.to_thread(apps_cli.run, args) == 1
    assert "App '/nope' does not exist" in capsys.readouterr().err


def test_recommend_prints_the_instance_count_of_a_horizontal_app() -> None:
    answer = {"appId": "/web", "autopilot": {"mode": "auto"}, "current": {"cpus": 0.5, "mem": 256},
              "recommendation": {
                  "ready": True, "cpus": 0.5, "mem": 64, "cpuVariant": "cpu-p95-6h",
                  "memVariant": "mem-clock-7d", "samples": 40, "ooms": 0,
                  "slackRemoved": {"cpus": 0, "mem": 192}, "reasons": ["peak memory ..."],
                  "instances": {"ready": True, "current": 2, "recommended": 4,
                                "reason": "1.2 cores over 2 live task(s)"}}}
    shown = apps_cli.format_recommendation(answer)
    assert "  instances            2             4" in shown
    assert "  - instances: 1.2 cores over 2 live task(s)" in shown
    del answer["recommendation"]["instances"]  # type: ignore[attr-defined]
    assert "instances" not in apps_cli.format_recommendation(answer)
