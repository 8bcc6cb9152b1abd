"""`dyad-agent`'s flags: sizes, fractions, counts, and which resources it detects."""

from __future__ import annotations

import argparse

import pytest

from agent.main import _count, _fraction, _options, _parser, _size


def test_sizes_fractions_and_counts_are_parsed_or_refused() -> None:
    assert [_size(t) for t in ("10MB", "512kb", "2G", "100", "1.5MB")] == [
        10 * 2 ** 20, 512 * 2 ** 10, 2 * 2 ** 30, 100, int(1.5 * 2 ** 20)]
    assert _fraction("0.1") == 0.1 and _count("3") == 3
    for parse, text in ((_size, "ten"), (_size, "-1MB"), (_fraction, "1.5"), (_count, "-1")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_what_the_operator_leaves_out_counts_as_detected() -> None:
    args = _parser().parse_args(["--master", "m:5050", "--resources", "cpus:2;mem:512",
                                 "--log-max-size", "1MB", "--gc-delay", "2days"])
    options = _options(args)
    assert options.detected_resources == {"disk", "ports"}
    assert options.log_max_size == 2 ** 20 and options.gc_delay == 2 * 86400
    assert _options(_parser().parse_args(["--master", "m:5050"])).detected_resources == {
        "cpus", "mem", "disk", "ports"}


def test_status_update_retries_are_set_by_flags() -> None:
    from agent.main import _config
    parser = _parser()
    full = ["--master", "m:5050", "--resources", "cpus:2;mem:512;disk:100;ports:[31000-31001]"]
    config = _config(parser, parser.parse_args(full))
    assert (config.status_update_backoff, config.status_update_backoff_max) == (10.0, 600.0)
    config = _config(parser, parser.parse_args(
        full + ["--status-update-retry", "2s", "--status-update-retry-max", "1min"]))
    assert (config.status_update_backoff, config.status_update_backoff_max) == (2.0, 60.0)
    with pytest.raises(SystemExit):
        _config(parser, parser.parse_args(full + ["--status-update-retry", "20mins"]))


def test_command_tasks_run_directly_unless_told_to_use_the_command_executor() -> None:
    from agent.main import _config
    parser = _parser()
    full = ["--master", "m:5050", "--resources", "cpus:2;mem:512;disk:100;ports:[31000-31001]"]
    assert _config(parser, parser.parse_args(full)).command_tasks == "direct"
    assert _config(parser, parser.parse_args(
        full + ["--command-tasks", "executor"])).command_tasks == "executor"
    with pytest.raises(SystemExit):
        parser.parse_args(full + ["--command-tasks", "sometimes"])


def test_containerizers_and_docker_flags() -> None:
    args = _parser().parse_args(["--master", "m:5050", "--containerizers", "process,docker",
                                 "--docker-socket", "/run/d.sock", "--docker-pull-timeout",
                                 "90s", "--docker-volume-root", "/data"])
    options = _options(args)
    assert options.containerizers == ("process", "docker")
    assert (options.docker_socket, options.docker_pull_timeout) == ("/run/d.sock", 90.0)
    assert _options(_parser().parse_args(["--master", "m:5050"])).containerizers is None
    for bad in ("docker", "process,rkt"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["--master", "m:5050", "--containerizers", bad])
