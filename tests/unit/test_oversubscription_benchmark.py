"""The oversubscription benchmark's cell stays runnable and tells the truth in
small: lending raises measured usage, never allocation, and never overfills an
agent."""

from __future__ import annotations

from benchmarks.oversubscription import measure


def test_lending_raises_usage_not_allocation_and_overfills_nothing() -> None:
    off = measure(agents=2, hours=0.75, overdeclare=3.0, surge=300.0, oversubscription=False)
    on = measure(agents=2, hours=0.75, overdeclare=3.0, surge=300.0, oversubscription=True)
    assert on["alloc"] == off["alloc"]
    assert on["usage"] > off["usage"] and on["lent"] > 0 == off["lent"]
    assert on["oom"] == off["oom"] == 0
    assert on == measure(agents=2, hours=0.75, overdeclare=3.0, surge=300.0,
                         oversubscription=True)  # deterministic
