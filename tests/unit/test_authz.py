"""`dyad.authz`: the ACL rules as properties (deny wins, order does not matter,
nothing is allowed by default, owners act on their own), and the ACL file format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyad import keys_cli
from dyad.authz import (
    ANY,
    OWNER_ACTIONS,
    AclError,
    Acls,
    Action,
    Decision,
    Permission,
    Rule,
    loads_acls,
    matches,
    parse_acls,
)

PRINCIPALS = ["ops", "batch", "service", "agent"]
OBJECTS = ["", "eng", "eng/ml", "eng/ml/deep", "ops", "batch", "root", "nobody", "host1"]
PATTERNS = OBJECTS[1:] + [ANY, "eng/*", "eng/ml/*"]

principals = st.sampled_from(PRINCIPALS)
who = st.none() | principals
actions = st.sampled_from(list(Action))
objects = st.sampled_from(OBJECTS)
rules = st.builds(
    Rule, allow=st.booleans(),
    principals=st.lists(st.sampled_from(PRINCIPALS + [ANY]), min_size=1, max_size=3,
                        unique=True).map(tuple),
    actions=st.frozensets(actions, min_size=1, max_size=4),
    objects=st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3,
                     unique=True).map(tuple))
acls = st.builds(Acls, rules=st.lists(rules, max_size=6).map(tuple), permissive=st.booleans())


@given(acls, who, actions, objects)
def test_a_matching_deny_rule_refuses_whatever_else_allows(
        base: Acls, principal: str | None, action: Action, obj: str) -> None:
    deny = Rule(False, (ANY,), frozenset({action}), (obj or ANY,))
    for position in (0, len(base.rules)):
        rules = base.rules[:position] + (deny,) + base.rules[position:]
        decision = Acls(rules, permissive=True).authorize(principal, action, obj)
        assert not decision.allowed


@given(who, actions, objects)
def test_no_rules_and_not_permissive_refuses_all_but_owners(
        principal: str | None, action: Action, obj: str) -> None:
    decision = Acls().authorize(principal, action, obj)
    owner = principal is not None and action in OWNER_ACTIONS and obj == principal
    assert decision.allowed == owner


@given(acls, who, actions, objects, st.randoms(use_true_random=False))
def test_the_order_of_rules_does_not_change_the_decision(
        base: Acls, principal: str | None, action: Action, obj: str, rng: object) -> None:
    shuffled = list(base.rules)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    assert base.authorize(principal, action, obj).allowed == \
        Acls(tuple(shuffled), base.permissive).authorize(principal, action, obj).allowed


@given(acls, rules, who, actions, objects)
def test_an_allow_rule_never_refuses_and_a_deny_rule_never_admits(
        base: Acls, extra: Rule, principal: str | None, action: Action, obj: str) -> None:
    before = base.authorize(principal, action, obj).allowed
    after = Acls(base.rules + (extra,), base.permissive).authorize(principal, action, obj)
    if extra.allow:
        assert after.allowed or not before
    else:
        assert before or not after.allowed


@given(acls, actions, objects)
def test_an_unauthenticated_peer_is_admitted_only_by_permissive_silence(
        base: Acls, action: Action, obj: str) -> None:
    denied_to_all = any(not rule.allow and ANY in rule.principals
                        and rule.applies("anyone", action, obj) for rule in base.rules)
    assert base.authorize(None, action, obj).allowed == (base.permissive and not denied_to_all)


@given(who, actions, objects)
def test_open_acls_admit_everyone(principal: str | None, action: Action, obj: str) -> None:
    assert Acls.open().authorize(principal, action, obj).allowed


@given(acls)
def test_acls_round_trip_through_json(original: Acls) -> None:
    assert loads_acls(json.dumps(original.to_json())) == original


def test_role_patterns() -> None:
    assert matches("eng/*", "eng/ml") and matches("eng/*", "eng/ml/deep")
    assert not matches("eng/*", "eng") and not matches("eng/*", "engineering/x")
    assert matches(ANY, "") and matches("root", "root") and not matches("root", "roots")


OPS_AND_BATCH = parse_acls({"rules": [
    {"effect": "allow", "principals": ["ops"], "actions": ["*"]},
    {"effect": "allow", "principals": ["batch"], "actions": ["register_framework"],
     "objects": ["batch", "batch/*"]},
    {"effect": "allow", "principals": ["batch", "service"], "actions": ["run_task"]},
    {"effect": "deny", "principals": ["*"], "actions": ["run_task"], "objects": ["root"]},
]})


@pytest.mark.parametrize("principal, action, obj, allowed, reason", [
    ("ops", Action.SET_QUOTA, "eng", True, "rule 1"),
    ("batch", Action.SET_QUOTA, "batch", False, "no rule lets batch set_quota 'batch'"),
    ("batch", Action.REGISTER_FRAMEWORK, "batch/nightly", True, "rule 2"),
    ("batch", Action.REGISTER_FRAMEWORK, "service", False, "no rule"),
    ("batch", Action.RUN_TASK, "nobody", True, "rule 3"),
    ("ops", Action.RUN_TASK, "root", False, "rule 4 (deny *"),
    ("batch", Action.KILL_TASK, "batch", True, "own principal"),
    ("batch", Action.KILL_TASK, "service", False, "no rule lets batch kill_task 'service'"),
    ("service", Action.READ_SANDBOX, "batch", False, "no rule"),
    ("ops", Action.READ_SANDBOX, "batch", True, "rule 1"),
    (None, Action.VIEW_STATE, "", False, "an unauthenticated peer"),
])
def test_decisions_say_why(principal: str | None, action: Action, obj: str,
                           allowed: bool, reason: str) -> None:
    decision = OPS_AND_BATCH.authorize(principal, action, obj)
    assert decision.allowed == allowed and bool(decision) == allowed
    assert reason in decision.reason


def test_authorize_all_returns_the_first_refusal() -> None:
    needs = [Permission(Action.REGISTER_FRAMEWORK, "batch"), Permission(Action.RUN_TASK, "root"),
             Permission(Action.RUN_TASK, "nobody")]
    decision = OPS_AND_BATCH.authorize_all("batch", needs)
    assert not decision.allowed and "'root'" in decision.reason
    assert OPS_AND_BATCH.authorize_all("batch", []) == Decision(True, "nothing to check")


@pytest.mark.parametrize("doc, reason", [
    ([], "must be"),
    ({"rules": [], "default": "allow"}, "must be"),
    ({"permissive": "no"}, "permissive"),
    ({"rules": {}}, "rules: expected a list"),
    ({"rules": [{"effect": "allow", "principals": ["a"]}]}, r"rules\[0\]"),
    ({"rules": [{"effect": "maybe", "principals": ["a"], "actions": ["*"]}]}, "effect"),
    ({"rules": [{"effect": "allow", "principals": [], "actions": ["*"]}]}, "principals"),
    ({"rules": [{"effect": "allow", "principals": ["a"], "actions": ["kil_task"]}]},
     "unknown kil_task"),
    ({"rules": [{"effect": "allow", "principals": ["a"], "actions": ["*"], "objects": [""]}]},
     "objects"),
    ({"rules": [{"effect": "allow", "principals": ["a"], "actions": ["*"], "who": 1}]},
     r"rules\[0\]"),
])
def test_bad_acl_documents_are_refused_with_a_reason(doc: object, reason: str) -> None:
    with pytest.raises(AclError, match=reason):
        parse_acls(doc)


def test_an_acl_file_that_is_not_json_is_refused() -> None:
    with pytest.raises(AclError, match="not JSON"):
        loads_acls(b"{")


def test_a_file_given_without_permissive_denies_by_default() -> None:
    assert parse_acls({"rules": []}).permissive is False


def test_the_acls_dyad_keys_writes_load(tmp_path: Path) -> None:
    keys_cli.generate(tmp_path / "c", hosts=["localhost"])
    generated = loads_acls((tmp_path / "c" / "acls.json").read_bytes())
    assert generated.authorize("agent", Action.REGISTER_AGENT, "host1")
    assert not generated.authorize("batch", Action.REGISTER_AGENT, "host1")
    assert generated.authorize("batch", Action.REGISTER_FRAMEWORK, "batch")
    assert not generated.authorize("batch", Action.KILL_TASK, "service")
    assert generated.authorize("operator", Action.TEARDOWN_FRAMEWORK, "service")
    assert generated.authorize("service", Action.VIEW_STATE)
