from __future__ import annotations

import pytest

from dyad.local import agent_resources
from dyad.resources import Resources
from dyad.units import parse_attributes, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30.0), ("1.5s", 1.5), ("200ms", 0.2), ("10mins", 600.0), ("2h", 7200.0),
    ("5", 5.0), (" 1d ", 86400.0),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "-1s", "3 parsecs", "1/10s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_attributes() -> None:
    assert parse_attributes("rack:r1; zone:a;") == {"rack": "r1", "zone": "a"}
    with pytest.raises(ValueError, match="name:value"):
        parse_attributes("rack")


def test_local_agents_get_disjoint_ports() -> None:
    first = Resources.parse(agent_resources("cpus:1;mem:64", 0))
    second = Resources.parse(agent_resources("cpus:1;mem:64", 1))
    assert first.ranges("ports") and second.ranges("ports")
    assert not set(range(*first.ranges("ports")[0])) & set(range(*second.ranges("ports")[0]))
    assert agent_resources("cpus:1;ports:[1-2]", 5) == "cpus:1;ports:[1-2]"
