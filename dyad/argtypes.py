"""argparse `type=` functions for the flags every Dyad command shares, so that a
duration, a port or a fraction is read (and refused) the same way everywhere."""

from __future__ import annotations

import argparse

from dyad.units import parse_duration


def duration(text: str) -> float:
    """'30s', '200ms', '10mins', '2h' or bare seconds; 0 allowed."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration {text!r} must be longer than 0s")
    return seconds


def port(text: str) -> int:
    """A TCP port; 0 picks a free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0 picks a free port)")
    return value


def host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' (port as `port` reads it); the host is the text before the last ':'."""
    host, colon, number = text.rpartition(":")
    if not colon or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, port(number)


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]")
    return value
