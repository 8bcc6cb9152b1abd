"""How a container's end becomes its task's, and what a restarted agent does with
the containers it finds (`agent.container_runs`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.container_runs import Ending, Listed, Recovery, ending, recover
from agent.container_spec import ContainerLabels
from agent.docker_wire import ContainerState
from dyad.messages import Reason, TaskState


def stopped(exit_code: int, oom: bool = False, error: str = "") -> ContainerState:
    return ContainerState(id="0123456789abcdef", status="exited", running=False,
                          exit_code=exit_code, oom_killed=oom, error=error, pid=0, labels={})


@pytest.mark.parametrize("container, killed, expected", [
    (stopped(0), False, Ending(TaskState.TASK_FINISHED, "", "Container exited with status 0")),
    (stopped(3), False, Ending(TaskState.TASK_FAILED, "", "Container exited with status 3")),
    (stopped(143), True, Ending(TaskState.TASK_KILLED, "", "Killed: Container exited with "
                                "status 143 (signal 15, or an exit with that status)")),
    (stopped(137, oom=True), True, Ending(
        TaskState.TASK_FAILED, Reason.CONTAINER_LIMITATION_MEMORY,
        "Memory limit exceeded: the kernel killed container 0123456789ab at its limit "
        "of 16.0 MiB")),
    (stopped(127, error="exec: \"nope\": executable file not found in $PATH"), False,
     Ending(TaskState.TASK_FAILED, Reason.CONTAINER_LAUNCH_FAILED,
            "Container failed: exec: \"nope\": executable file not found in $PATH")),
])
def test_a_containers_end_is_its_tasks(container: ContainerState, killed: bool,
                                       expected: Ending) -> None:
    assert ending(container, killed, mem_limit_bytes=16 * 1024 * 1024) == expected


def labelled(agent: str, run: str, container_id: str, running: bool = True) -> Listed:
    return Listed(container_id, ContainerLabels(agent, "F", "E", run).to_labels(), running)


def test_recovery_adopts_ends_loses_and_removes() -> None:
    known = {("F", "E", "r1"): "c1", ("F", "E", "r2"): "c2", ("F", "E", "r3"): "c3",
             ("F", "E", "r4"): None}
    found = [labelled("A", "r1", "c1"), labelled("A", "r2", "c2", running=False),
             labelled("A", "r4", "c4"), labelled("A", "r9", "c9"),
             labelled("B", "r5", "c5"), Listed("c6", {"other": "label"}, True)]
    assert recover("A", known, found) == Recovery(
        adopt=((("F", "E", "r1"), "c1"), (("F", "E", "r4"), "c4")),
        ended=((("F", "E", "r2"), "c2"),),
        vanished=(("F", "E", "r3"),),
        orphans=("c9",))


def test_a_known_id_is_not_matched_by_labels() -> None:
    """The checkpoint names container c1; a c2 with the same run's labels (made by
    hand, or a bug) is not taken for it."""
    assert recover("A", {("F", "E", "r1"): "c1"}, [labelled("A", "r1", "c2")]) == Recovery(
        vanished=(("F", "E", "r1"),), orphans=("c2",))


runs = st.sampled_from(["r1", "r2", "r3", "r4"])
ids = st.sampled_from(["c1", "c2", "c3", "c4", "c5"])


@given(st.dictionaries(runs, ids | st.none(), max_size=4),
       st.lists(st.tuples(st.sampled_from(["A", "B"]), runs, ids, st.booleans()),
                max_size=6, unique_by=lambda t: t[2]))
def test_every_run_and_every_container_gets_exactly_one_fate(
        known_runs: dict[str, str | None], listed: list[tuple[str, str, str, bool]]) -> None:
    known = {("F", "E", run): container for run, container in known_runs.items()}
    found = [labelled(*item) for item in listed]
    result = recover("A", known, found)
    fates = [key for key, _ in result.adopt + result.ended] + list(result.vanished)
    assert sorted(fates) == sorted(known)
    ours = {item.container_id for item in found if item.labels["dyad.agent_id"] == "A"}
    taken = [c for _, c in result.adopt + result.ended] + list(result.orphans)
    assert sorted(taken) == sorted(ours)
    running = {item.container_id: item.running for item in found}
    assert all(running[c] for _, c in result.adopt)
    assert not any(running[c] for _, c in result.ended)
