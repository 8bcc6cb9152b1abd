"""Parsing of the small textual formats operators type: durations and attributes."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|secs?|m|mins?|h|hrs?|d|days?)?\s*$")
_UNIT_SECONDS = {
    None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0,
    "mins": 60.0, "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "d": 86400.0,
    "day": 86400.0, "days": 86400.0,
}


def parse_duration(text: str) -> float:
    """'30s', '1.5s', '200ms', '10mins', '2h' or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (try 30s, 200ms, 10mins)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_attributes(text: str) -> dict[str, str]:
    """'rack:r1;zone:a' -> {'rack': 'r1', 'zone': 'a'}."""
    result: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition(":")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"invalid attribute {part!r} (expected name:value)")
        result[name.strip()] = value.strip()
    return result
