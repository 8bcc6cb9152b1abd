"""What to start and what to kill next, for one app: the rolling-upgrade rule.

`plan_deployment` is called after every event for each app with a deployment, on
the app's live (non-terminal) tasks. With ``N`` target instances and the app's
upgrade strategy giving ``least = ceil(minimumHealthCapacity x N)`` and
``most = floor((1 + maximumOverCapacity) x N)``:

- tasks of another config version are *old*; those of the target's are *new*;
- kill, in this order: old tasks that are not ready (they count for nothing),
  surplus new tasks that are not ready, then ready old tasks and surplus ready new
  ones, but only while the ready tasks left stay at or above ``least``;
- start ``min(N - new, most - live)`` new tasks, where *live* still counts tasks
  being killed (they hold resources until their terminal update arrives);
- the deployment is done when exactly ``N`` new tasks are ready and nothing else
  is left.

So the framework's own actions never take the app below ``least`` ready tasks nor
above ``most`` tasks; failures can, and the rule then only refills. A strategy of
minimumHealthCapacity 0 kills every old task first; 1 with maximumOverCapacity 1
starts a full new set before touching the old one.

`plan_steady` keeps an app without a deployment at ``instances`` live tasks.
Which task goes first when there is a choice: not-ready before ready, other
versions before the current one, then the app's ``killSelection`` (youngest first
by default), then task id so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from frameworks.service.appdef import OLDEST_FIRST, AppDefinition
from frameworks.service.records import AppTask


@attrs.frozen
class Plan:
    start: int
    kill: tuple[AppTask, ...]
    done: bool


def kill_order(tasks: Sequence[AppTask], current_version: str,
               selection: str) -> list[AppTask]:
    """`tasks` with the first to kill first."""
    sign = 1 if selection == OLDEST_FIRST else -1
    return sorted(tasks, key=lambda t: (t.ready, t.config_version == current_version,
                                        sign * t.staged_at, t.task_id))


def plan_deployment(target: AppDefinition | None, tasks: Sequence[AppTask]) -> Plan:
    """The next step of a deployment to `target` (None: delete the app)."""
    active = [t for t in tasks if not t.killing]
    if target is None:
        return Plan(start=0, kill=tuple(active), done=not tasks)
    n = target.instances
    least, most = target.upgrade_strategy.bounds(n)
    version = target.config_version
    new = [t for t in active if t.config_version == version]
    old = [t for t in active if t.config_version != version]
    # Sorting is only needed where there is a choice to make (a big app mostly has none).
    surplus = kill_order(new, version, target.kill_selection)[:len(new) - n] if len(new) > n else []
    old = kill_order(old, version, target.kill_selection) if old else []
    candidates = ([t for t in old if not t.ready] + [t for t in surplus if not t.ready]
                  + [t for t in old if t.ready] + [t for t in surplus if t.ready])
    budget = sum(t.ready for t in active) - least
    kill = []
    for task in candidates:
        if task.ready:
            if budget <= 0:
                continue
            budget -= 1
        kill.append(task)
    new_kept = len(new) - sum(1 for t in kill if t.config_version == version)
    start = max(0, min(n - new_kept, most - len(tasks)))
    done = (len(tasks) == n and len(new) == n and all(t.ready for t in new)
            and not kill)
    return Plan(start=start, kill=tuple(kill), done=done)


def plan_steady(app: AppDefinition, tasks: Sequence[AppTask]) -> Plan:
    """Keep `app.instances` live tasks: start the missing ones, kill the extra ones."""
    active = [t for t in tasks if not t.killing]
    extra = len(active) - app.instances
    if extra <= 0:
        return Plan(start=-extra, kill=(), done=True)
    kill = kill_order(active, app.config_version, app.kill_selection)[:extra]
    return Plan(start=0, kill=tuple(kill), done=True)
