"""Split a pass's offers to one framework into `Offers` frames under a byte budget.

A frame is capped at `MAX_FRAME_BYTES` (4 MiB) and a driver refuses a larger one,
so one frame for a whole pass leaves a framework with nothing above ~16,000
agents (issue 19). The master packs offers greedily, in allocation order, into
frames of at most `budget` bytes -- a quarter of the cap by default, so a field
added to `Offer` that `offer_bytes` does not count yet cannot push a frame over.

`offer_bytes` is the exact size of an offer's JSON in the frame, computed from
the lengths of its strings without encoding it (encoding the pass twice would
double the master's send cost): an ASCII-printable string without quotes or
backslashes is its own length plus its quotes, and anything else is measured by
`dyad.codec.dumps`, which the codec uses (and so are persistent volumes, which
few offers carry). A test holds it equal to the encoded form.

An offer too large for any frame cannot reach its framework; `pack` hands it back
so the master returns it and says so, rather than sending a frame the driver
must refuse.
"""

from __future__ import annotations

import attrs

from dyad.codec import dumps
from dyad.messages import MAX_FRAME_BYTES, Offer, Offers, encode
from dyad.resources import Resources

DEFAULT_BUDGET = MAX_FRAME_BYTES // 4

# The frame around the offers: {"type":"offers","v":1,"body":{"offers":[...]}}.
_ENVELOPE = len(encode(Offers(offers=[])))
_BLANK = Offer(id="", framework_id="", agent_id="", hostname="", resources=Resources())
# Every field of an offer at its emptiest: strings "", lists [], dicts {}.
_BLANK_BYTES = len(dumps(_BLANK))
COUNTED_FIELDS = ("id", "framework_id", "agent_id", "hostname", "resources", "attributes",
                  "executor_ids", "url", "cached_uris", "revocable", "volumes")


def _text(value: str) -> int:
    """Bytes of `value` as a JSON string, without its quotes."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return len(value)
    return len(dumps(value)) - 2


def _strings(values: list[str]) -> int:
    """Bytes of a JSON list of strings, less its brackets."""
    if not values:
        return 0
    return sum(_text(v) for v in values) + 3 * len(values) - 1  # quotes, commas


# Resources value -> `_text` of its text. Offers repeat a few values (an agent's
# whole free part, the same minus a task's shape), and writing a value's text
# costs several times hashing it; bounded by clearing when full.
_RESOURCES_BYTES: dict[Resources, int] = {}
_RESOURCES_BYTES_MAX = 8192


def _resources_bytes(resources: Resources) -> int:
    if not resources:
        return 0
    size = _RESOURCES_BYTES.get(resources)
    if size is None:
        if len(_RESOURCES_BYTES) >= _RESOURCES_BYTES_MAX:
            _RESOURCES_BYTES.clear()
        size = _RESOURCES_BYTES[resources] = _text(str(resources))
    return size


# agent id -> (hostname, url, attributes, bytes of those and the id): an agent's
# offers repeat them, and measuring them is most of `offer_bytes`. An entry is
# used only while all three still equal the offer's (a re-registered agent may
# change them); bounded like `_RESOURCES_BYTES`.
_AGENT_BYTES: dict[str, tuple[str, str, dict[str, str], int]] = {}
_AGENT_BYTES_MAX = 1 << 16
_last_framework: tuple[str, int] = ("", 0)  # the last framework id measured


def _agent_bytes(offer: Offer) -> int:
    hostname, url, attributes = offer.hostname, offer.url, offer.attributes
    known = _AGENT_BYTES.get(offer.agent_id)
    if known is not None and known[0] == hostname and known[1] == url \
            and known[2] == attributes:
        return known[3]
    size = _text(offer.agent_id) + _text(hostname) + _text(url)
    if attributes:
        size += (sum(_text(k) + _text(v) for k, v in attributes.items())
                 + 6 * len(attributes) - 1)  # "k":"v" and commas
    if len(_AGENT_BYTES) >= _AGENT_BYTES_MAX:
        _AGENT_BYTES.clear()
    _AGENT_BYTES[offer.agent_id] = (hostname, url, dict(attributes), size)
    return size


def offer_bytes(offer: Offer) -> int:
    """The size of `offer`'s JSON inside an `Offers` frame."""
    global _last_framework
    framework_id = offer.framework_id
    if _last_framework[0] == framework_id:
        framework_bytes = _last_framework[1]
    else:
        framework_bytes = _text(framework_id)
        _last_framework = (framework_id, framework_bytes)
    size = (_BLANK_BYTES + _text(offer.id) + framework_bytes + _agent_bytes(offer)
            + _resources_bytes(offer.resources)
            + _strings(offer.executor_ids) + _strings(offer.cached_uris)
            + _resources_bytes(offer.revocable))
    if offer.volumes:  # rare, and small objects: measured as the codec writes them
        size += sum(len(dumps(v))
                    for v in offer.volumes) + len(offer.volumes) - 1
    return size


def frame_bytes(offers: list[Offer]) -> int:
    """The size of the `Offers` frame holding `offers`."""
    return _ENVELOPE + sum(offer_bytes(o) for o in offers) + max(0, len(offers) - 1)


@attrs.frozen
class Packed:
    frames: list[list[Offer]]
    too_large: list[Offer]  # no frame under MAX_FRAME_BYTES can hold them


def pack(offers: list[Offer], budget: int = DEFAULT_BUDGET) -> Packed:
    """Offers in order, in as few frames of at most `budget` bytes as greedy packing
    gives. An offer larger than the budget but within the frame cap goes alone."""
    if not _ENVELOPE < budget <= MAX_FRAME_BYTES:
        raise ValueError(f"an offers frame budget must be in ({_ENVELOPE}, {MAX_FRAME_BYTES}]")
    frames: list[list[Offer]] = []
    too_large: list[Offer] = []
    current: list[Offer] = []
    used = _ENVELOPE
    for offer in offers:
        size = offer_bytes(offer)
        if _ENVELOPE + size > MAX_FRAME_BYTES:
            too_large.append(offer)
            continue
        extra = size + (1 if current else 0)
        if current and used + extra > budget:
            frames.append(current)
            current, used, extra = [], _ENVELOPE, size
        current.append(offer)
        used += extra
    if current:
        frames.append(current)
    return Packed(frames, too_large)
