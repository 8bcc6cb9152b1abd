"""`dyad.local`'s choices for local agents: addresses of their own, and task port
ranges outside the kernel's ephemeral range (issue 11, papercuts 2 and 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyad.local import (DEFAULT_EPHEMERAL_RANGE, EPHEMERAL_RANGE_FILE, MAX_LOCAL_AGENTS,
                        PORTS_PER_AGENT, ClusterError, agent_address, agent_resources,
                        ephemeral_port_range, port_ranges)
from dyad.resources import Resources


def _outside(block: tuple[int, int], ephemeral: tuple[int, int]) -> bool:
    return block[1] < ephemeral[0] or block[0] > ephemeral[1]


def test_the_default_agents_get_ports_outside_this_machines_ephemeral_range() -> None:
    ephemeral = ephemeral_port_range()
    assert ephemeral == tuple(map(int, Path(EPHEMERAL_RANGE_FILE).read_text().split()))
    blocks = []
    for index in range(3):
        (block,) = Resources.parse(agent_resources("cpus:1;mem:64", index)).ranges("ports")
        blocks.append(tuple(block))
    assert all(_outside(block, ephemeral) for block in blocks), (blocks, ephemeral)
    assert blocks[0] == (31000, 31999) or not _outside((31000, 31999), ephemeral)
    assert len(set(blocks)) == 3


@pytest.mark.parametrize("ephemeral", [(32768, 60999), (49152, 65535), (15000, 40000),
                                       (32768, 32768)])
def test_port_ranges_are_disjoint_blocks_outside_the_ephemeral_range(
        ephemeral: tuple[int, int]) -> None:
    count = 20
    blocks = port_ranges(count, ephemeral)
    assert len(blocks) == count
    ports: set[int] = set()
    for low, high in blocks:
        assert high - low + 1 == PORTS_PER_AGENT and 10000 <= low and high <= 65535
        assert _outside((low, high), ephemeral)
        assert not ports & set(range(low, high + 1))
        ports |= set(range(low, high + 1))


def test_too_many_agents_for_the_ports_left_is_a_clear_error() -> None:
    assert len(port_ranges(26, (32768, 60999))) == 26
    with pytest.raises(ClusterError, match="outside the ephemeral range 32768-60999"):
        port_ranges(27, (32768, 60999))
    with pytest.raises(ClusterError, match="give the agents ports"):
        port_ranges(1, (1024, 65535))


def test_given_ports_are_kept() -> None:
    assert Resources.parse(agent_resources("cpus:1;ports:[5000-5009]", 7)).ranges("ports") \
        == [(5000, 5009)]


def test_unreadable_range_falls_back_to_linux_default(tmp_path: Path) -> None:
    assert ephemeral_port_range(str(tmp_path / "missing")) == DEFAULT_EPHEMERAL_RANGE
    (tmp_path / "garbage").write_text("not numbers\n")
    assert ephemeral_port_range(str(tmp_path / "garbage")) == DEFAULT_EPHEMERAL_RANGE
    (tmp_path / "range").write_text("20000\t29999\n")
    assert ephemeral_port_range(str(tmp_path / "range")) == (20000, 29999)


def test_each_agent_has_its_own_loopback_address() -> None:
    addresses = [agent_address(i) for i in range(MAX_LOCAL_AGENTS)]
    assert addresses[0] == "127.0.0.2" and addresses[-1] == "127.0.0.254"
    assert len(set(addresses)) == MAX_LOCAL_AGENTS
    with pytest.raises(ClusterError, match="at most 253 agents"):
        agent_address(MAX_LOCAL_AGENTS)
