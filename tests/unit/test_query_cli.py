"""`dyad query`'s output shapes (dyad/query_cli.py), over a canned master answer:
a drawn table by default, the master's JSON with --json, CSV with --csv."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import pytest

from dyad import query_cli

ANSWER = {"columns": ["app", "kills", "note"], "types": ["VARCHAR", "BIGINT", "VARCHAR"],
          "rows": [["/web", 3, "[red]not markup[/red]"], ["/a-much-longer-app-name", 12, None]],
          "truncated": True, "elapsed_ms": 4.2}


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, Any]]:
    calls: list[tuple[str, str, Any]] = []

    def call(base: str, method: str, path: str, body: Any = None) -> Any:
        calls.append((method, path, body))
        return ANSWER
    monkeypatch.setattr(query_cli, "call", call)
    return calls


def run(*argv: str) -> str:
    parser = argparse.ArgumentParser()
    query_cli.add_parser(parser.add_subparsers())
    out = io.StringIO()
    query_cli.execute(parser.parse_args(["query", "--master", "m:5050", *argv]), out)
    return out.getvalue()


def test_the_default_is_a_drawn_table_with_numbers_right_aligned(
        asked: list[Any]) -> None:
    text = run("SELECT 1", "--max-rows", "2")
    assert asked == [("POST", "/usage/query", {"sql": "SELECT 1", "max_rows": 2})]
    lines = text.splitlines()
    header = next(line for line in lines if "app" in line and "kills" in line)
    web = next(line for line in lines if "/web" in line)
    longer = next(line for line in lines if "/a-much-longer-app-name" in line)
    assert len(header) == len(web) == len(longer)  # one grid: every row as wide
    # Right-aligned: the digits end in the same column.
    assert web.index("3 ") == longer.index("12 ") + 1
    assert "[red]not markup[/red]" in web  # data, never rich markup
    assert "2 rows in 4 ms (truncated" in lines[-1]


def test_json_and_csv_stay_as_they_were(asked: list[Any]) -> None:
    assert json.loads(run("SELECT 1", "--json")) == ANSWER
    assert run("SELECT 1", "--csv").splitlines() == [
        "app,kills,note", "/web,3,[red]not markup[/red]", "/a-much-longer-app-name,12,"]
