"""Offers in bounded frames: the size of an offer's JSON, packing a pass into frames
under the budget, and what the master does with offers no frame can hold and with
an offers frame a framework refused."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from dyad.effects import TimerFired
from dyad.ids import IdGenerator
from dyad.messages import (
    MAX_FRAME_BYTES, AgentInfo, FrameworkInfo, Offer, Offers, RegisterAgent, Rejected,
    Rescind, Subscribe, decode, encode)
from dyad.resources import Resources
from dyad.volumes import PersistentVolume
from master.model import Allocate, MasterConfig, Received
from master.offer_frames import COUNTED_FIELDS, DEFAULT_BUDGET, frame_bytes, offer_bytes, pack
from master.state import MasterState
from tests.unit.test_master_state import INFO, Harness, messages

texts = st.text(max_size=12)  # any code point: escapes, surrogates' pairs, quotes
resources = st.sampled_from([Resources(), Resources.parse("cpus:4;mem:8192"),
                             Resources.parse("cpus(web):1.5;ports:[31000-31010,32000-32001]")])
offers = st.builds(
    Offer, id=texts, framework_id=texts, agent_id=texts, hostname=texts, resources=resources,
    attributes=st.dictionaries(texts, texts, max_size=3),
    executor_ids=st.lists(texts, max_size=3), url=texts,
    cached_uris=st.lists(texts, max_size=3), revocable=resources,
    volumes=st.lists(st.builds(PersistentVolume, id=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
                               container_path=st.sampled_from(["data", "db/x"]),
                               size=st.sampled_from([1.0, 64.0]), role=st.sampled_from(["web"]),
                               principal=texts), max_size=2))


def agent_offer(n: int) -> Offer:
    return Offer(id=f"O-{n}", framework_id="F-1", agent_id=f"A-{n}", hostname=f"host{n}",
                 resources=Resources.parse("cpus:4;mem:8192;disk:20000;ports:[31000-32000]"),
                 attributes={"rack": f"r{n % 40}"}, url=f"http://10.0.0.{n % 250}:5051")


def test_every_field_of_an_offer_is_counted() -> None:
    assert tuple(f.name for f in attrs.fields(Offer)) == COUNTED_FIELDS, (
        "a new Offer field: count it in master.offer_frames.offer_bytes")


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(offers, max_size=5))
def test_sizes_are_those_of_the_encoded_frame(batch: list[Offer]) -> None:
    assert frame_bytes(batch) == len(encode(Offers(offers=batch)))
    for offer in batch:
        assert offer_bytes(offer) == len(encode(Offers(offers=[offer]))) - frame_bytes([])


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(offers, max_size=30), budget=st.integers(300, 3000))
def test_packing_keeps_order_and_every_frame_under_the_budget(batch: list[Offer],
                                                              budget: int) -> None:
    packed = pack(batch, budget)
    assert packed.too_large == []
    assert [o for frame in packed.frames for o in frame] == batch
    for frame in packed.frames:
        assert frame and (len(frame) == 1 or len(encode(Offers(offers=frame))) <= budget)


def test_an_offer_over_the_budget_goes_alone_and_one_over_the_frame_cap_is_handed_back() -> None:
    big = attrs.evolve(agent_offer(1), attributes={"note": "x" * 5000})
    huge = attrs.evolve(agent_offer(2), attributes={"note": "x" * MAX_FRAME_BYTES})
    packed = pack([agent_offer(0), big, huge, agent_offer(3)], budget=2000)
    assert packed.frames == [[agent_offer(0)], [big], [agent_offer(3)]]
    assert packed.too_large == [huge]


def test_seventeen_thousand_agents_offers_to_one_framework_come_in_frames_under_the_budget() -> None:
    """Issue 19: one frame of 4.47 MB at 17,000 agents, which the driver refused."""
    state = MasterState(MasterConfig(), INFO, IdGenerator("m"), start_time=0.0)
    res = Resources.parse("cpus:4;mem:8192;disk:20000;ports:[31000-32000]")
    for n in range(17_000):
        state.handle(Received(f"agent-{n}", RegisterAgent(agent=AgentInfo(
            hostname=f"host{n:05d}.example.com", port=5051, resources=res, ip=f"10.1.{n // 250}.{n % 250}",
            attributes={"rack": f"r{n % 40}", "zone": "a"}))), 0.0)
    state.handle(Received("driver", Subscribe(framework=FrameworkInfo(name="fw"))), 0.0)
    effects = state.handle(TimerFired(Allocate()), 1.0)
    frames = [encode(e.message) for e in effects if isinstance(getattr(e, "message", None), Offers)]
    assert len(frames) >= 17_000 * 250 // DEFAULT_BUDGET
    assert all(len(frame) <= DEFAULT_BUDGET for frame in frames), max(map(len, frames))
    delivered = [o.agent_id for frame in frames for o in decode(frame).offers]  # type: ignore[attr-defined]
    assert len(delivered) == len(set(delivered)) == 17_000
    assert state.metrics()["master/offers_frames"] == len(frames)
    state.validate()


def test_a_framework_that_refuses_an_offers_frame_gets_its_offers_back_at_once() -> None:
    h = Harness()
    for n in range(3):
        h.register(f"a{n}", hostname=f"h{n}")
    h.subscribe("d")
    held = h.offers_to(h.allocate(), "d")
    assert len(held) == 3
    sends = h.recv("d", Rejected(reason="frame of 5000000 bytes exceeds 4194304"))
    assert sorted(m.offer_id for m in messages(sends, Rescind, to="d")) == sorted(
        o.id for o in held)
    assert messages(sends, Rejected) == []  # a rejection is never answered
    assert h.state.offers == {} and h.metric("master/offers_refused") == 3
    (event,) = [e.fields for e in h.state.events.since(0) if e.kind == "rejected_by_peer"]
    assert event["offers_returned"] == 3 and "exceeds" in event["reason"]
    # Not stranded until the offer timeout: the next pass offers them again.
    assert len(h.offers_to(h.allocate(), "d")) == 3


def test_other_rejections_are_counted_and_change_nothing() -> None:
    h = Harness()
    h.register("a0")
    h.subscribe("d")
    held = h.offers_to(h.allocate(), "d")
    assert h.recv("d", Rejected(reason="bad update", message_type="update")) == []
    assert h.recv("a0", Rejected(reason="bad kill", message_type="kill_task")) == []
    assert list(h.state.offers) == [held[0].id]
    assert h.metric("master/rejections_received") == 2


def test_an_offer_no_frame_can_hold_is_returned_filtered_and_recorded() -> None:
    h = Harness()
    h.register("a0", attributes={"note": "x" * MAX_FRAME_BYTES})
    h.register("a1", hostname="h1")
    h.subscribe("d")
    offered = h.offers_to(h.allocate(), "d")
    assert [o.hostname for o in offered] == ["h1"]
    assert h.metric("master/offers_too_large") == 1
    (event,) = [e.fields for e in h.state.events.since(0) if e.kind == "offer_too_large"]
    assert event["bytes"] > MAX_FRAME_BYTES
    assert h.offers_to(h.allocate(), "d") == []  # filtered for the refuse interval
