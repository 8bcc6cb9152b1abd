"""App definitions and constraints: what is accepted and what is refused and why
(that the service's pure modules stay pure is tests/unit/test_architecture.py's)."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

import pytest

from frameworks.service.appdef import (
    AppInvalid, UpgradeStrategy, app_from_stored, app_to_json, normalize_app_id, parse_app,
    stored_app)
from frameworks.service.constraints import (
    Constraint, ConstraintError, check_satisfiable, parse_constraint, unmet)


MINIMAL = {"id": "/web", "cmd": "sleep 100"}


def invalid(body: Any, **kwargs: Any) -> dict[str, str]:
    with pytest.raises(AppInvalid) as info:
        parse_app(body, **kwargs)
    return dict(info.value.details)


def test_defaults_are_marathons() -> None:
    app = parse_app(MINIMAL)
    assert (app.instances, app.cpus, app.mem, app.disk) == (1, 1.0, 128.0, 0.0)
    assert (app.backoff_seconds, app.backoff_factor, app.max_launch_delay_seconds) == \
        (1.0, 1.15, 300.0)
    assert app.upgrade_strategy == UpgradeStrategy(1.0, 1.0)
    assert app.kill_selection == "YOUNGEST_FIRST" and app.ports == ()


@pytest.mark.parametrize("raw,expected", [
    ("web", "/web"), ("/web", "/web"), ("//shop//api/", "/shop/api"), ("a-1/b2", "/a-1/b2")])
def test_ids_are_normalised_paths(raw: str, expected: str) -> None:
    assert normalize_app_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "/", "/Web", "/we_b", "/-web", "/web-", "/a/../b",
                                 "/a/tasks", "/a/restart", "/" + "a" * 300, 7])
def test_bad_ids_are_refused(raw: Any) -> None:
    with pytest.raises(AppInvalid):
        normalize_app_id(raw)


@pytest.mark.parametrize("field,value", [
    ("cpus", -0.1), ("mem", "64"), ("disk", True), ("instances", -1), ("instances", 1.5),
    ("instances", 10**6), ("ports", [70000]), ("ports", "0"), ("env", {"A": 1}),
    ("env", {"A=B": "x"}), ("labels", []), ("backoffFactor", 0.5), ("backoffSeconds", -1),
    ("maxLaunchDelaySeconds", float("inf")), ("killSelection", "RANDOM"),
    ("taskKillGracePeriodSeconds", -3), ("args", []), ("args", [1]), ("cmd", " "),
    ("upgradeStrategy", {"minimumHealthCapacity": 1.5}),
    ("upgradeStrategy", {"maximumOverCapacity": 0.5, "extra": 1}),
    ("healthChecks", [{"protocol": "GOPHER"}]),
    ("healthChecks", [{"protocol": "COMMAND"}]),
    ("healthChecks", [{"protocol": "TCP"}, {"protocol": "TCP"}]),
    ("healthChecks", [{"protocol": "HTTP", "intervalSeconds": 0}]),
    ("portDefinitions", [{"port": 0, "protocol": "sctp"}]),
    ("constraints", [["rack"]]), ("constraints", [["rack", "MAX_PER", "zero"]]),
    ("container", {"type": "DOCKER"}),
])
def test_each_bad_field_is_named(field: str, value: Any) -> None:
    details = invalid({**MINIMAL, field: value, "ports": [0]} if field != "ports"
                      else {**MINIMAL, field: value})
    assert f"/{field}" in details or (field in ("healthChecks",) and "/healthChecks" in details)


def test_every_problem_is_reported_at_once() -> None:
    details = invalid({"cmd": 3, "cpus": -1, "colour": "blue"})
    assert set(details) == {"/id", "/cmd", "/cpus", "/colour"}


def test_cross_field_rules() -> None:
    assert "/cmd" in invalid({"id": "/a"})
    assert "/cmd" in invalid({**MINIMAL, "args": ["x"]})
    assert "/cpus" in invalid({**MINIMAL, "cpus": 0, "mem": 0})
    assert "/ports" in invalid({**MINIMAL, "ports": [31000, 31000]})
    assert "/ports" in invalid({**MINIMAL, "ports": [0], "portDefinitions": [{"port": 5}]})
    assert "/healthChecks" in invalid({**MINIMAL, "healthChecks": [{"protocol": "HTTP"}]})
    assert "/upgradeStrategy" in invalid({**MINIMAL, "instances": 3, "upgradeStrategy": {
        "minimumHealthCapacity": 0.9, "maximumOverCapacity": 0.1}})
    assert "/id" in invalid({**MINIMAL, "id": "/b"}, app_id="/a")


def test_read_only_fields_are_ignored_so_get_output_can_be_put_back() -> None:
    app = parse_app({**MINIMAL, "ports": [0, 0], "healthChecks": [
        {"protocol": "TCP", "portIndex": 1}], "constraints": [["rack", "GROUP_BY", 2]]})
    body = app_to_json(app) | {"version": "x", "tasksRunning": 3, "tasks": [],
                               "deployments": [], "waitingReason": None}
    assert parse_app(body) == app
    assert app_from_stored(stored_app(app)) == app


def test_partial_update_keeps_what_is_not_given() -> None:
    base = parse_app({**MINIMAL, "instances": 2, "env": {"A": "1"}})
    scaled = parse_app({"instances": 5}, app_id="/web", base=base)
    assert scaled.instances == 5 and scaled.env == {"A": "1"} and scaled.same_config(base)
    argv = parse_app({"args": ["sleep", "5"]}, app_id="/web", base=base)
    assert argv.cmd is None and argv.args == ("sleep", "5") and not argv.same_config(base)


def test_upgrade_bounds_round_towards_safety() -> None:
    assert UpgradeStrategy(1.0, 0.5).bounds(3) == (3, 4)
    assert UpgradeStrategy(0.5, 0.0).bounds(3) == (2, 3)
    assert UpgradeStrategy(0.0, 1.0).bounds(0) == (0, 0)
    assert UpgradeStrategy(0.34, 0.34).bounds(3) == (2, 4)


# ---------------------------------------------------------------- constraints


@pytest.mark.parametrize("raw", [["rack", "unique"], ["hostname", "CLUSTER", "a"],
                                 ["rack", "GROUP_BY"], ["rack", "GROUP_BY", 3],
                                 ["rack", "LIKE", "r[12]"], ["rack", "MAX_PER", "2"]])
def test_constraints_parse(raw: list[Any]) -> None:
    assert isinstance(parse_constraint(raw), Constraint)


@pytest.mark.parametrize("raw", [["rack"], "rack:UNIQUE", ["rack", "NEAR"],
                                 ["rack", "UNIQUE", "x"], ["rack", "LIKE"],
                                 ["rack", "LIKE", "[a"], ["rack", "MAX_PER", "0"],
                                 ["ra ck", "UNIQUE"], ["rack", "CLUSTER", ""],
                                 ["rack", "GROUP_BY", "-1"], [1, "UNIQUE"]])
def test_bad_constraints_are_refused(raw: Any) -> None:
    with pytest.raises(ConstraintError):
        parse_constraint(raw)


@pytest.mark.parametrize("constraints,instances", [
    ([["h", "CLUSTER", "a"], ["h", "CLUSTER", "b"]], 1),
    ([["h", "CLUSTER"], ["h", "UNIQUE"]], 2),
    ([["h", "CLUSTER", "a"], ["h", "MAX_PER", "2"]], 3),
    ([["h", "LIKE", "a.*"], ["h", "UNLIKE", "a.*"]], 1),
    ([["h", "CLUSTER", "b"], ["h", "LIKE", "a.*"]], 1),
    ([["h", "CLUSTER", "a1"], ["h", "UNLIKE", "a.*"]], 1),
    ([["h", "CLUSTER", "a"], ["h", "GROUP_BY", "2"]], 2),
])
def test_impossible_combinations_are_refused(constraints: list[Any], instances: int) -> None:
    with pytest.raises(ConstraintError):
        check_satisfiable([parse_constraint(c) for c in constraints], instances)


@pytest.mark.parametrize("raw, reason", [
    (["rack", "MAX_PER", "\u00b2"], "positive whole number"),     # "²".isdigit() is true
    (["rack", "GROUP_BY", "\u0663"], "positive whole number"),    # an Arabic-Indic 3
    (["rack", "MAX_PER", "9" * 5000], "longer than"),             # int() would refuse it
    (["rack", "MAX_PER", "1234567"], "positive whole number"),
    (["rack", "LIKE", "(?=r)r1"], "RE2"),                          # lookahead
    (["rack", "LIKE", "(r)\\1"], "RE2"),                         # backreference
    (["rack", "LIKE", "a" * 257], "longer than 256"),
    (["rack", "CLUSTER", "a" * 257], "longer than 256"),
    (["r" * 129, "UNIQUE"], "at most 128"),
    (["rack", "NEAR" * 1000], "..."),                              # the echo is cut short
])
def test_constraint_input_is_bounded_and_ascii(raw: list[Any], reason: str) -> None:
    with pytest.raises(ConstraintError, match=re.escape(reason)) as caught:
        parse_constraint(raw)
    assert len(str(caught.value)) < 300


def test_constraint_patterns_cannot_take_exponential_time() -> None:
    # Python's re takes hours on this (22 a's: 0.09 s, 30: 24 s); RE2 is linear.
    evil = [parse_constraint(["hostname", "CLUSTER", "a" * 40 + "!"]),
            parse_constraint(["hostname", "LIKE", "(a+)+"])]
    started = time.monotonic()
    with pytest.raises(ConstraintError, match="is not LIKE"):
        check_satisfiable(evil, 1)
    like, unlike = c("h", "LIKE", "(a+)+"), c("h", "UNLIKE", "(a|aa)*b")
    assert unmet(like, "a" * 10_000 + "!", n(), []) is not None
    assert unmet(unlike, "a" * 10_000, n(), []) is None
    assert time.monotonic() - started < 1.0


def test_a_value_that_is_not_unicode_matches_no_pattern() -> None:
    assert unmet(c("h", "LIKE", ".*"), "\ud800", n(), []) is not None
    assert unmet(c("h", "UNLIKE", ".*"), "\ud800", n(), []) is None


def test_huge_numbers_are_refused_not_overflowed() -> None:
    for cpus in (10**309, -10**309, float("inf")):
        with pytest.raises(AppInvalid) as caught:
            parse_app({"id": "/a", "cmd": "x", "cpus": cpus})
        assert [path for path, _ in caught.value.details] == ["/cpus"]


def test_possible_combinations_pass() -> None:
    check_satisfiable([parse_constraint(["h", "CLUSTER", "a"]),
                       parse_constraint(["h", "UNIQUE"])], 1)
    check_satisfiable([parse_constraint(["rack", "GROUP_BY"]),
                       parse_constraint(["hostname", "UNIQUE"])], 5)


def c(*raw: str) -> Constraint:
    return parse_constraint(list(raw))


def n(*values: str) -> Counter[str]:
    return Counter(values)


def test_operator_semantics() -> None:
    assert unmet(c("h", "UNIQUE"), "a", n("b"), []) is None
    assert unmet(c("h", "UNIQUE"), "a", n("a"), []) is not None
    assert unmet(c("h", "UNIQUE"), None, n(), []) is not None
    assert unmet(c("h", "CLUSTER", "a"), "a", n(), []) is None
    assert unmet(c("h", "CLUSTER", "a"), "b", n(), []) is not None
    assert unmet(c("h", "CLUSTER"), "b", n(), []) is None          # first one picks
    assert unmet(c("h", "CLUSTER"), "b", n("a"), []) is not None   # then all follow
    assert unmet(c("h", "LIKE", "r[12]"), "r1", n(), []) is None
    assert unmet(c("h", "LIKE", "r[12]"), "r13", n(), []) is not None
    assert unmet(c("h", "UNLIKE", "r[12]"), "r3", n(), []) is None
    assert unmet(c("h", "UNLIKE", "r[12]"), None, n(), []) is None
    assert unmet(c("h", "UNLIKE", "r[12]"), "r2", n(), []) is not None
    assert unmet(c("h", "MAX_PER", "2"), "a", n("a"), []) is None
    assert unmet(c("h", "MAX_PER", "2"), "a", n("a", "a"), []) is not None


def test_group_by_fills_the_emptiest_group() -> None:
    known = ["r1", "r2", "r3"]
    assert unmet(c("rack", "GROUP_BY"), "r1", n(), known) is None
    assert unmet(c("rack", "GROUP_BY"), "r1", n("r1"), known) is not None
    assert unmet(c("rack", "GROUP_BY"), "r2", n("r1"), known) is None
    assert unmet(c("rack", "GROUP_BY"), "r1", n("r1", "r2", "r3"), known) is None
    # With n: groups not seen yet count as empty.
    assert unmet(c("rack", "GROUP_BY", "3"), "r1", n("r1", "r2"), ["r1", "r2"]) is not None
    assert unmet(c("rack", "GROUP_BY", "2"), "r1", n("r1", "r2"), ["r1", "r2"]) is None
