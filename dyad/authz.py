"""Who may do what: access control lists, decided in one pure function.

A request is a triple: a *principal* (who, as `dyad.auth` authenticated it, or
None when nobody authenticated), an *action*, and an *object* whose meaning
depends on the action:

| action | object |
|---|---|
| `register_agent`, `drain_agent` | the agent's hostname |
| `register_framework`, `set_quota`, `set_weights` | a role |
| `run_task` | the operating-system user the task would run as |
| `kill_task`, `acknowledge`, `reconcile`, `teardown_framework`, `read_sandbox` | the principal that registered the framework concerned |
| `view_state` | "" (no object) |

The ACL file is JSON, a list of rules and a default::

    {"permissive": false,
     "rules": [
       {"effect": "allow", "principals": ["ops"], "actions": ["*"]},
       {"effect": "allow", "principals": ["batch"], "actions": ["register_framework"],
        "objects": ["batch", "batch/*"]},
       {"effect": "deny", "principals": ["*"], "actions": ["run_task"], "objects": ["root"]}]}

Patterns: ``"*"`` matches anything, ``"eng/*"`` matches every role below
``eng`` (not ``eng`` itself), anything else matches itself. `objects` defaults
to ``["*"]``. In `principals`, ``"*"`` means any authenticated principal in an
allow rule, and anyone at all, authenticated or not, in a deny rule.

The decision does not depend on the order of the rules:

1. a matching `deny` rule refuses, whatever else matches;
2. else a matching `allow` rule admits;
3. else a framework's own principal may act on its own tasks and sandboxes (the
   owner actions above, object == principal);
4. else `permissive` decides: false when an ACL file is given and says nothing,
   true only for `Acls.open()`, the insecure default that admits everyone.

An unauthenticated request (principal None) matches no allow rule and owns
nothing, so only permissive ACLs admit it, and a deny rule for ``"*"`` still
refuses it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs

from dyad import bounded_json


class Action(enum.StrEnum):
    REGISTER_AGENT = "register_agent"
    REGISTER_FRAMEWORK = "register_framework"
    RUN_TASK = "run_task"
    KILL_TASK = "kill_task"
    ACKNOWLEDGE = "acknowledge"
    RECONCILE = "reconcile"
    TEARDOWN_FRAMEWORK = "teardown_framework"
    SET_QUOTA = "set_quota"
    SET_WEIGHTS = "set_weights"
    DRAIN_AGENT = "drain_agent"
    READ_SANDBOX = "read_sandbox"
    VIEW_STATE = "view_state"


OWNER_ACTIONS = frozenset({Action.KILL_TASK, Action.ACKNOWLEDGE, Action.RECONCILE,
                           Action.TEARDOWN_FRAMEWORK, Action.READ_SANDBOX})
"""Actions whose object is a framework's principal, which may do them itself."""

ANY = "*"
_RULE_KEYS = {"effect", "principals", "actions", "objects"}


class AclError(ValueError):
    """An ACL document is not usable; the message names the bad part."""


@attrs.frozen
class Decision:
    allowed: bool
    reason: str

    def __bool__(self) -> bool:
        return self.allowed


@attrs.frozen
class Permission:
    """One thing a request needs: `action` on `object`."""

    action: Action
    object: str = ""


def matches(pattern: str, value: str) -> bool:
    if pattern == ANY or pattern == value:
        return True
    return pattern.endswith("/*") and value.startswith(pattern[:-1])


@attrs.frozen
class Rule:
    allow: bool
    principals: tuple[str, ...]
    actions: frozenset[Action]
    objects: tuple[str, ...] = (ANY,)

    def applies(self, principal: str | None, action: Action, obj: str) -> bool:
        if principal is None:  # "*" denies strangers too, but allows only principals
            who = not self.allow and ANY in self.principals
        else:
            who = any(p in (ANY, principal) for p in self.principals)
        return who and action in self.actions and any(
            matches(pattern, obj) for pattern in self.objects)

    def describe(self) -> str:
        return (f"{'allow' if self.allow else 'deny'} {','.join(self.principals)} "
                f"{','.join(sorted(self.actions))} on {','.join(self.objects)}")

    def to_json(self) -> dict[str, Any]:
        actions = [ANY] if self.actions == frozenset(Action) else sorted(self.actions)
        return {"effect": "allow" if self.allow else "deny",
                "principals": list(self.principals), "actions": actions,
                "objects": list(self.objects)}


@attrs.frozen
class Acls:
    rules: tuple[Rule, ...] = ()
    permissive: bool = False

    @classmethod
    def open(cls) -> Acls:
        """No ACLs at all: everyone may do everything (security off)."""
        return cls((), permissive=True)

    def authorize(self, principal: str | None, action: Action, obj: str = "") -> Decision:
        who = principal if principal is not None else "an unauthenticated peer"
        applying = [(n, rule) for n, rule in enumerate(self.rules, 1)
                    if rule.applies(principal, action, obj)]
        for n, rule in applying:
            if not rule.allow:
                return Decision(False, f"{who} may not {action} {obj!r}: "
                                       f"rule {n} ({rule.describe()})")
        if applying:  # every applying rule allows
            n, rule = applying[0]
            return Decision(True, f"rule {n} ({rule.describe()})")
        if action in OWNER_ACTIONS and principal is not None and obj == principal:
            return Decision(True, "a framework's own principal")
        if self.permissive:
            return Decision(True, "permissive ACLs")
        return Decision(False, f"no rule lets {who} {action} {obj!r}")

    def authorize_all(self, principal: str | None,
                      permissions: Iterable[Permission]) -> Decision:
        """The first refusal among `permissions`, or an admission if none refuses."""
        decision = Decision(True, "nothing to check")
        for permission in permissions:
            decision = self.authorize(principal, permission.action, permission.object)
            if not decision.allowed:
                return decision
        return decision

    def to_json(self) -> dict[str, Any]:
        return {"permissive": self.permissive, "rules": [r.to_json() for r in self.rules]}


def parse_acls(doc: Any) -> Acls:
    """ACLs from their JSON document (see the module doc); `AclError` otherwise."""
    if not isinstance(doc, dict) or not set(doc) <= {"permissive", "rules"}:
        raise AclError('ACLs must be {"permissive": bool, "rules": [...]}')
    permissive = doc.get("permissive", False)
    if not isinstance(permissive, bool):
        raise AclError("permissive: expected true or false")
    rules = doc.get("rules", [])
    if not isinstance(rules, list):
        raise AclError("rules: expected a list")
    return Acls(tuple(_rule(rule, f"rules[{n}]") for n, rule in enumerate(rules)), permissive)


def loads_acls(data: bytes | str) -> Acls:
    """ACLs from the bytes of an ACL file (the shell reads it)."""
    try:
        return parse_acls(bounded_json.loads(data))
    except bounded_json.JsonInputError as exc:
        raise AclError(f"not JSON: {exc.reason}") from None


def _rule(doc: Any, where: str) -> Rule:
    if not isinstance(doc, dict) or not {"effect", "principals", "actions"} <= set(doc) \
            or not set(doc) <= _RULE_KEYS:
        raise AclError(f"{where}: expected effect, principals, actions and optional objects")
    if doc["effect"] not in ("allow", "deny"):
        raise AclError(f"{where}.effect: expected 'allow' or 'deny'")
    principals = _names(doc["principals"], f"{where}.principals")
    objects = _names(doc.get("objects", [ANY]), f"{where}.objects")
    names = _names(doc["actions"], f"{where}.actions")
    if ANY in names:
        actions = frozenset(Action)
    else:
        unknown = sorted(set(names) - {a.value for a in Action})
        if unknown:
            raise AclError(f"{where}.actions: unknown {', '.join(unknown)} (known: "
                           f"{', '.join(a.value for a in Action)} or *)")
        actions = frozenset(Action(name) for name in names)
    return Rule(doc["effect"] == "allow", principals, actions, objects)


def _names(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value \
            or not all(isinstance(v, str) and v for v in value):
        raise AclError(f"{where}: expected a non-empty list of non-empty strings")
    return tuple(value)
