"""The flags of link shards refuse what would open the cluster to anyone
(docs/security.md), before anything binds."""

from __future__ import annotations

import pytest

from master import link_shard, main as master_main


def test_a_master_refuses_a_shard_port_beyond_loopback_without_curve() -> None:
    assert master_main.main(["--shard-port", "0", "--shard-ip", "0.0.0.0",
                             "--work-dir", "/nonexistent/never-made"]) == 1


def test_a_shard_refuses_to_listen_beyond_loopback_without_credentials() -> None:
    assert link_shard.main(["--listen", "0.0.0.0:0", "--master", "tcp://127.0.0.1:1"]) == 1


def test_a_shard_serves_master_info_only_knowing_the_master() -> None:
    with pytest.raises(SystemExit):
        link_shard.main(["--master", "tcp://127.0.0.1:1", "--http", "127.0.0.1:0"])


@pytest.mark.parametrize("text", ["5056", "host:", ":5056", "host:99999"])
def test_listen_wants_host_and_port(text: str) -> None:
    with pytest.raises(SystemExit):
        link_shard.build_parser().parse_args(["--master", "tcp://x:1", "--listen", text])


def test_a_master_http_address_without_a_port_is_refused_as_the_flags_are_read() -> None:
    with pytest.raises(SystemExit) as exit_:  # not a traceback once the shard starts
        link_shard.build_parser().parse_args(
            ["--master", "tcp://x:1", "--http", "127.0.0.1:0", "--master-http", "nohost"])
    assert exit_.value.code == 2
