"""benchmarks.autopilot's fleet generator and scoring run, deterministically, and
the scores mean what they say (a tiny fleet over a short week)."""

from __future__ import annotations

import attrs
import pytest

from benchmarks import autopilot as bench
from frameworks.autopilot import MIB, Limits


def test_the_fleet_is_seeded_and_mixes_every_kind() -> None:
    fleet = bench.fleet(80, 2, seed=3)
    assert fleet == bench.fleet(80, 2, seed=3) and fleet != bench.fleet(80, 2, seed=4)
    assert {app.kind for app in fleet} == set(bench.KINDS)
    for app in fleet:
        assert app.user.cpus in bench.NICE_CPUS and app.user.mem_bytes % MIB == 0
        assert (app.leak > 0) == (app.kind == "leak")
        assert bool(app.spikes) <= (app.kind == "spiky")
    generous = sum(app.user.mem_bytes > app.mem_base * (1 + app.mem_amp) for app in fleet)
    assert generous > len(fleet) / 2  # people over-provision, mostly


def test_scoring_counts_slack_and_kills_against_fixed_limits() -> None:
    steady = attrs.evolve(bench.fleet(1, 1, seed=1)[0], kind="steady", cpu_base=1.0,
                          mem_base=100 * MIB, cpu_amp=0.0, mem_amp=0.0, growth=0.0,
                          leak=0.0, noise=0.0, spikes=())
    loose = bench.Score()
    bench.replay(attrs.evolve(steady, user=Limits(2.0, 200 * MIB)), 1, None, loose, seed=1)
    assert abs(loose.mem_slack - 0.5) < 1e-9 and abs(loose.cpu_slack - 0.5) < 1e-9
    assert loose.ooms == 0 and loose.throttled == 0
    short = bench.Score()
    bench.replay(attrs.evolve(steady, user=Limits(0.5, 50 * MIB)), 1, None, short, seed=1)
    assert short.oom_apps == 1 and short.mem_slack == 0 and abs(short.throttled - 0.5) < 1e-9


def test_a_run_compares_every_approach_and_the_autopilot_cuts_slack() -> None:
    scores = bench.run(6, 1, seed=2)
    assert list(scores) == list(bench.approaches())
    assert scores == bench.run(6, 1, seed=2)  # deterministic
    assert scores["meta"].mem_slack < scores["user"].mem_slack
    assert all(s.apps == 6 for s in scores.values())
    # Split over processes, the same figures (sums in another order).
    parallel = bench.run(6, 1, seed=2, chosen=bench.select("meta"), jobs=2)
    assert list(parallel) == ["user", "meta"]
    for name, score in parallel.items():
        alone = scores[name]
        assert (score.apps, score.oom_apps, score.ooms, score.changes) == \
            (alone.apps, alone.oom_apps, alone.ooms, alone.changes)
        assert score.mem_slack == pytest.approx(alone.mem_slack)
        assert score.cpu_slack == pytest.approx(alone.cpu_slack)
        assert score.kind_slack("spiky") == pytest.approx(alone.kind_slack("spiky"))
    with pytest.raises(SystemExit, match="unknown approach"):
        bench.select("meta,nope")


def test_foresight_is_each_apps_own_peak_demand_held_all_week() -> None:
    app = attrs.evolve(bench.fleet(1, 1, seed=1)[0], kind="spiky", mem_base=100 * MIB,
                       mem_amp=0.0, growth=0.0, leak=0.0, noise=0.0,
                       spikes=(bench.Spike(bench.DAY + 3600, 600, 1.0, 1.5),))
    limit, idle = bench.foresight([app], 1, seed=1)
    samples = bench.DAY / bench.STEP
    assert limit == pytest.approx(150 * MIB * samples)
    assert idle == pytest.approx(50 * MIB * (samples - 2))  # a 2-sample spike at the peak


def test_apps_replayed_in_step_are_replayed_alone_unless_the_rule_learns_from_the_fleet() -> None:
    models = bench.fleet(8, 1, seed=5)
    every = bench.approaches()
    assert bench.learns_from_fleet(every["meta"])  # the default memory rule has a prior
    assert not bench.learns_from_fleet(every["user"])
    peak = every["cpu-p99-24h+mem-peak-24h"]
    assert not bench.learns_from_fleet(peak)
    together, alone = bench.Score(), bench.Score()
    bench.replay_fleet(models, 1, peak, together, seed=5)
    for model in models:
        bench.replay(model, 1, peak, alone, seed=5)
    # The same figures (the sums in another order).
    assert (together.ooms, together.oom_apps, together.changes, together.oom_kinds) == \
        (alone.ooms, alone.oom_apps, alone.changes, alone.oom_kinds)
    assert together.mem_slack == pytest.approx(alone.mem_slack, rel=1e-12)
    assert together.cpu_slack == pytest.approx(alone.cpu_slack, rel=1e-12)
    assert together.throttled == pytest.approx(alone.throttled, rel=1e-12)


def test_first_spikes_count_spiky_apps_whose_first_spike_is_scored_and_kills_a_calm_limit() -> None:
    calm = attrs.evolve(bench.fleet(1, 1, seed=1)[0], kind="spiky", mem_base=100 * MIB,
                        mem_amp=0.0, growth=0.0, leak=0.0, noise=0.0)
    week = bench.WARM_IN + 2 * bench.DAY

    def spiky(at: float, factor: float) -> bench.AppModel:
        return attrs.evolve(calm, spikes=(bench.Spike(at, 600.0, 2.0, factor),
                                          bench.Spike(at + 3600.0, 600.0, 2.0, 1.5)))

    assert bench.first_spikes([spiky(bench.WARM_IN + 3600.0, 1.3)], 2, seed=1) == (1, 1)
    # Within the margin over what it showed: no kill to count.
    assert bench.first_spikes([spiky(bench.WARM_IN + 3600.0, 1.01)], 2, seed=1) == (1, 0)
    # First spiked in the warm-in day (not scored) or after the week: not counted.
    assert bench.first_spikes([spiky(3600.0, 1.3), spiky(week + 3600.0, 1.3)], 2, 1) == (0, 0)
    # Another kind's apps never count.
    assert bench.first_spikes([attrs.evolve(spiky(bench.WARM_IN + 3600.0, 1.3),
                                            kind="daily")], 2, seed=1) == (0, 0)


def test_the_history_benchmark_feeds_every_row_it_decodes(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import autopilot_history

    assert autopilot_history.main(["--tasks", "3", "--every", "5", "--hours", "1"]) == 0
    out = capsys.readouterr().out
    assert "2,160 rows of 3 tasks" in out and "feeding / decoding:" in out
