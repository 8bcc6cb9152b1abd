"""The agent's ids: UUID-shaped, unique within a process and between processes."""

from __future__ import annotations

import uuid

from agent import unique_ids
from agent.executor_api_core import uuid_bytes, uuid_text
from agent.unique_ids import UniqueIds


def test_ids_are_canonical_version_4_uuid_text_and_round_trip_as_16_bytes() -> None:
    ids = UniqueIds()
    for _ in range(3):
        made = ids()
        parsed = uuid.UUID(made)
        assert str(parsed) == made
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert uuid_text(uuid_bytes(made)) == made  # a v1 executor's 16 bytes


def test_ids_of_one_generator_never_repeat_and_share_a_random_prefix() -> None:
    ids = UniqueIds()
    made = [ids() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert len({m[:24] for m in made}) == 1


def test_two_generators_draw_different_prefixes() -> None:
    # A restarted agent (or a second one on the host) is a new generator.
    prefixes = {UniqueIds()()[:24] for _ in range(200)}
    assert len(prefixes) == 200


def test_a_new_prefix_is_drawn_before_the_counter_runs_out(monkeypatch) -> None:
    monkeypatch.setattr(unique_ids, "COUNTER_BITS", 2)
    ids = UniqueIds()
    made = [ids() for _ in range(9)]
    assert len(set(made)) == 9
    assert len({m[:24] for m in made}) == 3  # 4 ids a prefix
