"""Moving-window recommenders: one resource, one set of parameters, samples in, a
limit out.

- CPU (`CpuRecommender`): a high percentile of a decaying histogram of the cores
  used per sample, times ``1 + margin``. A short peak is cheap for CPU (the task is
  throttled a moment, not killed), so a percentile rather than the peak.
- Memory (`MemoryRecommender`): the peak seen within the window, times
  ``1 + margin``. Going over a memory limit kills the task, so only a peak is safe;
  the window lets an old peak stop counting once it is `window` seconds old. With
  `spike` room, the limit is at least ``calm × (1 + rise)`` (times the margin),
  `calm` the peak of the samples that were no jump and `rise` sized from the
  jumps in the window (`jumps.JumpLog`: rises of a sample over its level beyond
  `jitter`): by default ``spike × (largest - jitter)``, one factor for every app;
  `learned`, ``largest × (1 + spike / n)`` for n jumps in the window, so an app
  that has shown many jumps gets room close to its largest, one that has shown
  few gets more (the largest of n draws falls short of the top by about 1/n).
  With a `prior` q, the rise is at least the app's own largest jump and the q
  quantile of the largest jumps of the other apps the autopilot follows
  (`fleet.FleetJumps`): one app's few jumps are thin evidence of how far it may
  go. An app that jumped 20% once, even at a quiet hour far below its peak, may
  jump further next time, and at its usual top. Steady use, daily cycles, growth and
  leaks move slowly and never jump, so they pay nothing for it.

Both answer None until they have seen a sample. Bounds, evidence thresholds and
hysteresis are not theirs: they belong to the policy (`core.Autopilot`), which
treats every variant the same way.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from frameworks.autopilot.fleet import FleetJumps
from frameworks.autopilot.histogram import DecayingHistogram, Scale
from frameworks.autopilot.jumps import JumpLog
from frameworks.autopilot.seasonal import Seasonal
from frameworks.autopilot.shape import Drift, Swing, swing_class
from frameworks.autopilot.window import SlidingPeak

CPU_SCALE = Scale(low=0.001, high=1024.0, ratio=1.05)
"""Cores: a thousandth of a core up to a large machine, within 5%."""
_positive = attrs.validators.gt(0.0)
_nonnegative = attrs.validators.ge(0.0)
_fraction = [_nonnegative, attrs.validators.le(1.0)]


@attrs.frozen
class CpuVariant:
    """CPU limit = `percentile` of usage (weights halving every `half_life` s), ×(1+margin)."""

    name: str
    half_life: float = attrs.field(validator=_positive)
    percentile: float = attrs.field(validator=[_positive, attrs.validators.le(100.0)])
    margin: float = attrs.field(default=0.0, validator=_nonnegative)

    def build(self) -> CpuRecommender:
        return CpuRecommender(self)


@attrs.frozen
class MemoryVariant:
    """Memory limit = max(peak, calm peak × (1 + rise)) × (1 + margin) over the last
    `window` s; `rise` = spike × (the largest jump - `jitter`), or with `learned`
    the largest jump × (1 + spike / the number of jumps); with a `prior` q, at least
    the largest jump and the fleet's q quantile of apps' largest jumps; with
    `first_rate`, that quantile also for an app that has not jumped while the apps
    like it (`first_alike`: of its swing class) first jump at that rate or more per
    `first_horizon`, the rate scaled with `first_size` s by (the app's calm peak /
    the median of the fleet's)^s; with `prior_size` s, the quantile's share above
    it, 1 - q, is scaled by the same ratio^s (in steps of 1%, at least the p1);
    with `double` b, room for two jumps at once, (1 + rise)² - 1,
    for an app with `double_after` jumps in the window, if among the cheapest such
    apps whose added room sums to at most b of the fleet's calm peaks; with `drift`,
    the margin grows by the calm peak's rise over
    `drift` seconds, at most `drift_cap` (the cap until the rise is known); with
    `season` (seconds, a block of the day), at most the peak and calm peak of the
    same clock times on previous days (`seasonal.Seasonal`: the block holding now and
    `season_lead` after it), grown by the calm peak's rise over `drift`, in the
    same formula, and never under the peak of the last `season_lead` seconds, all
    times the margin; with `season_double`, for an app that has jumped (by
    `prior_from`), the clock's calm peak gets room for two jumps at once,
    (1 + rise)², as the window's rule keeps (never more than that rule: the clock
    only cuts), unless `double` gave it that room already (the rise is then
    for two; doubled again it would be for four); with `season_double_after` k,
    only once it has jumped k times in the window; with `season_once`, the clock
    counts the calm peak's rise once, in its growth: its margin is `margin` alone."""

    name: str
    window: float = attrs.field(validator=_positive)
    margin: float = attrs.field(default=0.1, validator=_nonnegative)
    spike: float = attrs.field(default=0.0, validator=_nonnegative)
    jitter: float = attrs.field(default=0.05, validator=_nonnegative)
    learned: bool = False
    prior: float = attrs.field(default=0.0, validator=_fraction)
    prior_from: float = attrs.field(default=0.0, validator=_nonnegative)
    first_rate: float = attrs.field(default=0.0, validator=_fraction)
    first_horizon: float = attrs.field(default=86400.0, validator=_positive)
    drift: float = attrs.field(default=0.0, validator=_nonnegative)
    drift_cap: float = attrs.field(default=0.05, validator=_nonnegative)
    first_alike: bool = False
    first_size: float = attrs.field(default=0.0, validator=_nonnegative)
    prior_size: float = attrs.field(default=0.0, validator=_nonnegative)
    double: float = attrs.field(default=0.0, validator=_fraction)
    double_after: int = attrs.field(default=6, validator=attrs.validators.ge(1))
    season: float = attrs.field(default=0.0, validator=_nonnegative)
    season_lead: float = attrs.field(default=3600.0, validator=_nonnegative)
    season_double: bool = False
    season_double_after: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    season_once: bool = False

    def __attrs_post_init__(self) -> None:
        if self.season > 0:
            Seasonal(self.window, self.season, self.season_lead)  # raises if it cannot be

    def build(self, fleet: FleetJumps | None = None, app: str = "") -> MemoryRecommender:
        """`fleet`: the jumps of the other apps (`prior` needs one), `app` this one's
        name in it."""
        return MemoryRecommender(self, fleet, app)


class Recommender(Protocol):
    name: str

    def add(self, at: float, value: float) -> None: ...

    def value(self, now: float) -> float | None: ...

    def explain(self, now: float) -> str: ...


class CpuRecommender:
    def __init__(self, variant: CpuVariant) -> None:
        self.variant = variant
        self.name = variant.name
        self._histogram = DecayingHistogram(CPU_SCALE, variant.half_life)

    def add(self, at: float, value: float) -> None:
        self._histogram.add(at, value)

    def value(self, now: float) -> float | None:
        usage = self._histogram.percentile(self.variant.percentile)
        return None if usage is None else usage * (1 + self.variant.margin)

    def explain(self, now: float) -> str:
        v = self.variant
        usage = self._histogram.percentile(v.percentile)
        return (f"p{v.percentile:g} of cores used (half-life {v.half_life:g}s) = "
                f"{usage if usage is None else round(usage, 4)}, margin {v.margin:.0%}")


class MemoryRecommender:
    def __init__(self, variant: MemoryVariant, fleet: FleetJumps | None = None,
                 app: str = "") -> None:
        self.variant = variant
        self.name = variant.name
        self._peak = SlidingPeak(variant.window)
        self._jumps = (JumpLog(variant.window, variant.jitter)
                       if variant.spike > 0 or variant.prior > 0 else None)
        self._fleet = fleet if variant.prior > 0 else None
        self._app = app
        self._first: float | None = None
        self._drift = Drift(variant.drift) if variant.drift > 0 else None
        self._swing = Swing() if variant.first_alike and self._jumps is not None else None
        self._season = (Seasonal(variant.window, variant.season, variant.season_lead)
                        if variant.season > 0 else None)
        self._recent = SlidingPeak(variant.season_lead or 1.0) if variant.season > 0 else None
        # The last answer and what it was for (the time asked, the samples added):
        # a step asks the same several times.
        self._answer: tuple[tuple[float, int, int], float | None] | None = None

    def add(self, at: float, value: float) -> None:
        v = self.variant
        self._peak.add(at, value)
        if self._jumps is not None:
            self._jumps.add(at, value)
            if self._fleet is not None:
                top = self._jumps.largest(at)[0]
                self._fleet.report(self._app, top)
                self._fleet.seen(self._app, at, self._alike(at))
                if top > 0 and top >= v.prior_from:
                    self._fleet.jumped(self._app, at)
                if v.double > 0 or v.first_size > 0 or v.prior_size > 0:
                    self._report_cover(at, top)
            if self._swing is not None and not self._jumps.jumping:
                self._swing.add(at, value)
        if self._drift is not None:
            # Calm peaks only where jumps are told apart: a jump is no climb.
            self._drift.add(at, (self._peak.peak(at) if self._jumps is None
                                 else self._jumps.calm(at)) or 0.0)
        if self._season is not None and self._recent is not None:
            self._season.add(at, value, self._jumps is None or not self._jumps.jumping)
            self._recent.add(at, value)
        if self._first is None or at < self._first:
            self._first = at

    def forget(self) -> None:
        """The app is no longer followed: its jumps leave the fleet's."""
        if self._fleet is not None:
            self._fleet.forget(self._app)

    def _room(self, now: float) -> tuple[float, float]:
        """The rise to make room for over the calm peak, and that peak (0, 0 without
        spike room or jumps)."""
        if self._jumps is None:
            return 0.0, 0.0
        top, second = self._jumps.largest(now)
        v = self.variant
        if top == 0 or top < v.prior_from:
            if self._unproven(now):
                return max(top, self._prior(now)), self._jumps.calm(now)
            if top == 0:
                return 0.0, 0.0
        if v.learned:
            # The largest of n jumps drawn alike falls short of the largest possible
            # by about 1/n of it: the fewer jumps seen, the more room beyond the top.
            rise = top * (1 + v.spike / max(1, self._jumps.count(now)))
        else:
            rise = v.spike * (top - v.jitter)
        if v.prior > 0:
            # The fleet's jumps say how far an app that has jumped may go; alone, it
            # has only its own largest.
            # A rise barely past the jitter (a cycle's turn, noise) is no evidence
            # of a spiky app: its own size only.
            rise = max(rise, top, self._prior(now) if top >= v.prior_from else 0.0)
            if self._doubled(now):
                # Room for two jumps at once: their factors multiply.
                rise = (1 + rise) ** 2 - 1
        return rise, self._jumps.calm(now)

    def _unproven(self, now: float) -> bool:
        """Whether an app that has not jumped (by `prior_from`) gets the fleet's room
        anyway: while the apps of its age that had not jumped a horizon earlier
        jumped since at `first_rate` or more, a quiet app may be one yet to jump."""
        v = self.variant
        if v.first_rate <= 0 or self._fleet is None or self._first is None:
            return False
        rate = self._fleet.first_jump_rate(
            now, now - self._first, v.first_horizon,
            None if self._swing is None else self._alike(now))
        return rate >= self._first_threshold(now)

    def _first_threshold(self, now: float) -> float:
        """`first_rate`, scaled with `first_size` by the app's calm peak against the
        fleet's median: room costs bytes and a kill costs an app, so a small app
        keeps its room before a first jump longer and a large one less."""
        v = self.variant
        return v.first_rate * self._sized(now, v.first_size)

    def _sized(self, now: float, power: float) -> float:
        """(This app's calm peak / the median of the fleet's)^power; 1 without
        `power`, a fleet or a calm peak."""
        if power <= 0 or self._fleet is None or self._jumps is None:
            return 1.0
        typical, calm = self._fleet.typical_calm(now), self._jumps.calm(now)
        return (calm / typical) ** power if typical > 0 and calm > 0 else 1.0

    def _report_cover(self, at: float, top: float) -> None:
        """Tell the fleet this app's calm peak and, once it has jumped `double_after`
        times in the window, what room for two jumps at once would add over it (sized
        at the larger of its largest jump and the fleet's prior)."""
        assert self._fleet is not None and self._jumps is not None
        v, calm = self.variant, self._jumps.calm(at)
        if v.double > 0 and self._jumps.count(at) >= v.double_after:
            rise = max(top, self._prior(at))
            self._fleet.calm(self._app, calm, rise * (1 + rise))
        else:
            self._fleet.calm(self._app, calm)

    def _doubled(self, now: float) -> bool:
        """Whether this app gets room for two jumps at once: it has jumped at least
        `double_after` times in the window (one that spikes often is the one whose
        spikes overlap) and is among the cheapest the fleet's `double` budget covers."""
        v = self.variant
        if v.double <= 0 or self._fleet is None or self._jumps is None:
            return False
        return (self._jumps.count(now) >= v.double_after and self._prior(now) > 0
                and self._fleet.covered(self._app, now, v.double))

    def _seasonal(self, now: float, rise: float, calm: float) -> float | None:
        """The limit from the same clock times on previous days (None without
        `season`, or while a day of them is not seen or the growth is not known):
        their peak and, where there is room for a jump, their calm peak times it,
        grown by the calm peak's rise over `drift`, never under the recent peak."""
        if self._season is None or self._recent is None:
            return None
        ahead = self._season.ahead(now)
        growth = self._season_growth()
        recent = self._recent.peak(now)
        if ahead is None or growth is None or recent is None:
            return None
        (peak, usual), (grown, margin) = ahead, growth
        # The room was sized over the window's calm peak; here over the clock's.
        jumps = 2 if calm > 0 and self._season_doubled(now) else 1  # their factors multiply
        room = usual * (1 + rise) ** jumps if calm > 0 else 0.0
        return max(recent, max(peak, room) * (1 + grown)) * (1 + margin)

    def _season_growth(self) -> tuple[float, float] | None:
        """The clock's growth over a day and its margin (None: the trend is not known
        yet, so the clock waits). The previous days' peaks are grown by the calm
        peak's rise over `drift`; `_margin` adds that rise too, for the window's
        rule, whose peak is of the past. With `season_once` the rise is counted
        once, in the growth, and the margin is the variant's own."""
        grown = 0.0 if self._drift is None else self._drift.rise()
        if grown is None:
            return None
        return grown, self.variant.margin if self.variant.season_once else self._margin()

    def _season_doubled(self, now: float) -> bool:
        """Whether the clock's room is for two jumps at once (`season_double`): the app
        has jumped (by `prior_from`), at least `season_double_after` times in the
        window (one that spikes often is the one whose spikes overlap), and its rise
        is not for two already (`double`). Two spikes meeting at a quiet block were
        killed under the clock's limit where the window's rule held them
        (docs/autopilot-journal.md, "Why spiky apps are still killed")."""
        v = self.variant
        if not v.season_double or self._jumps is None:
            return False
        top = self._jumps.largest(now)[0]
        return (top > 0 and top >= v.prior_from
                and self._jumps.count(now) >= v.season_double_after
                and not self._doubled(now))

    def _margin(self) -> float:
        """The margin, plus, for an app setting new calm peaks (growth, a leak), how
        far they rose over the last `drift` seconds, at most `drift_cap` (the cap
        while the trend is not known yet: an app may be growing until seen not to)."""
        v = self.variant
        if self._drift is None:
            return v.margin
        rise = self._drift.rise()
        return v.margin + (v.drift_cap if rise is None else min(v.drift_cap, rise))

    def _alike(self, now: float) -> int:
        return 0 if self._swing is None else swing_class(self._swing.swing(now))

    def _prior(self, now: float) -> float:
        return 0.0 if self._fleet is None else self._fleet.quantile(self._prior_quantile(now))

    def _prior_quantile(self, now: float) -> float:
        """`prior`, moved with `prior_size` by the app's calm peak against the fleet's
        median: the share of the fleet's largest jumps above it, 1 - prior, times
        (calm / median)^prior_size, so a small app gets room for more of the jumps the
        fleet makes and a large one for fewer, where each byte buys less (as
        `_first_threshold`). In steps of 1% (the fleet keeps an answer per quantile),
        at least the p1."""
        v = self.variant
        if v.prior_size <= 0:
            return v.prior
        return min(1.0, max(0.01, round(1 - (1 - v.prior) * self._sized(now, v.prior_size), 2)))

    def value(self, now: float) -> float | None:
        # Another app's jumps can move the prior: its version is part of the key.
        key = (now, self._peak.samples, 0 if self._fleet is None else self._fleet.version)
        if self._answer is not None and self._answer[0] == key:
            return self._answer[1]
        peak = self._peak.peak(now)
        if peak is None:
            answer = None
        else:
            rise, calm = self._room(now)
            # A jump multiplies the usual level: room for a bigger one on the usual top.
            answer = max(peak, calm * (1 + rise)) * (1 + self._margin())
            seasonal = self._seasonal(now, rise, calm)
            if seasonal is not None:
                answer = min(answer, seasonal)
        self._answer = (key, answer)
        return answer

    def explain(self, now: float) -> str:
        v = self.variant
        peak = self._peak.peak(now)
        shown = "none" if peak is None else f"{peak / 2**20:.1f} MiB"
        text = f"peak memory over {v.window:g}s = {shown}"
        if self._jumps is not None:
            rise, calm = self._room(now)
            top = self._jumps.largest(now)[0]
            n = max(1, self._jumps.count(now))
            ways = []
            if v.spike > 0:
                ways.append(f"the largest of {n} jumps in the window, {top:.0%}, x "
                            f"(1 + {v.spike:g}/{n})" if v.learned else
                            f"{v.spike:g} x the largest jump over the usual level beyond "
                            f"{v.jitter:.0%} (a jump of {top:.0%})")
            if v.prior > 0:
                fleet = 0 if self._fleet is None else len(self._fleet)
                ways.append(f"its largest jump in the window, {top:.0%}" if top > 0 else
                            "no jump in the window: no room")
                unproven = (top == 0 or top < v.prior_from) and self._unproven(now)
                if unproven:
                    rate = (f"{self._first_threshold(now):.1%} ({v.first_rate:.0%} x (its "
                            f"calm peak / the fleet's median)^{v.first_size:g})"
                            if v.first_size > 0 else f"{v.first_rate:.0%}")
                    ways.append(f"not jumped yet, but apps like it that had not jumped "
                                f"{v.first_horizon:g}s before its age have since at "
                                f"{rate} or more")
                if (top >= v.prior_from and top > 0) or unproven:
                    q = self._prior_quantile(now)
                    scaled = (f" (p{v.prior * 100:g} moved by its calm peak against the "
                              f"fleet's median)" if q != v.prior else "")
                    ways.append(f"the p{q * 100:g}{scaled} of the largest jumps of the "
                                f"{fleet} apps that jumped, {self._prior(now):.0%}")
            how = ", or ".join(ways) + (", whichever is more" if len(ways) > 1 else "")
            if self._doubled(now):
                how += (f"; doubled for two jumps at once (at least {v.double_after} jumps "
                        f"in the window; among the apps the fleet's {v.double:.0%} budget "
                        f"covers, cheapest first)")
            text += (f", or the peak of calm use {calm / 2**20:.1f} MiB x (1 + {rise:.0%}: "
                     f"{how}), whichever is more")
        margin = f"; margin {v.margin:.0%}"
        if self._drift is not None:
            margin += (f" + {self._margin() - v.margin:.1%} for the calm peak's rise over "
                       f"{v.drift:g}s (at most {v.drift_cap:.0%})")
        if self._season is not None:
            text += self._explain_season(now)
        return text + margin

    def _explain_season(self, now: float) -> str:
        assert self._season is not None
        start, end = self._season.span(now)
        hours = f"{start % 86400 / 3600:05.2f}h-{end % 86400 / 3600:05.2f}h UTC"
        rise, calm = self._room(now)
        seasonal = self._seasonal(now, rise, calm)
        if seasonal is None:
            return f"; the same clock times on previous days ({hours}): not seen yet"
        peak, usual = self._season.ahead(now) or (0.0, 0.0)
        room = "room"
        if self._season_doubled(now):
            after = self.variant.season_double_after
            room = "room for two jumps at once" + (
                f" (at least {after} jumps in the window)" if after > 1 else "")
        return (f"; at most what the same clock times on previous days ({hours}) need: "
                f"their peak {peak / 2**20:.1f} MiB (calm {usual / 2**20:.1f} MiB, with the "
                f"{room}), grown by {self._explain_growth()}, at least the peak of the last "
                f"{self.variant.season_lead:g}s, {seasonal / 2**20:.1f} MiB with the margin")

    def _explain_growth(self) -> str:
        if not self.variant.season_once:
            return "the calm peak's rise"
        return f"the calm peak's rise, counted once (a margin of {self.variant.margin:.0%} here)"


DEFAULT_CPU_VARIANTS = (
    CpuVariant("cpu-p95-6h", half_life=6 * 3600.0, percentile=95.0, margin=0.1),
    CpuVariant("cpu-p98-12h", half_life=12 * 3600.0, percentile=98.0, margin=0.1),
    CpuVariant("cpu-p90-1h", half_life=3600.0, percentile=90.0, margin=0.15),
    CpuVariant("cpu-p99-24h", half_life=24 * 3600.0, percentile=99.0, margin=0.05),
)
DEFAULT_MEMORY_VARIANTS = (
    MemoryVariant("mem-clock-7d", window=7 * 86400.0, margin=0.02, jitter=0.05, prior=0.75,
                  prior_from=0.10, drift=86400.0, drift_cap=0.03, double=0.01,
                  double_after=6, first_rate=0.03, first_horizon=86400.0, first_alike=True,
                  first_size=0.5, season=4 * 3600.0, season_lead=3600.0,
                  season_double=True, season_once=True),
)
"""Variants the meta-recommender chooses among by default. CPU: fast decay follows
change quickly (and pays more margin for it); slow decay is steadier. Memory has
one variant, each part there for a kill it prevents or slack it frees:

- a week's window: a spike is remembered for a week (a day's window forgot
  Tuesday's spike by Thursday, and the next one killed);
- room, once an app has jumped by 10% or more, for the larger of its own largest
  jump and the p75 of the largest jumps of the apps the autopilot follows
  (`fleet`): without room no variant is charged for jumps that stayed under its
  limit, so the tightest wins until the first bigger jump kills;
- a margin of 2% plus the calm peak's rise over the last day, at most 3% (the 3%
  until a day's trend is known), for growth and leaks;
- the daily cycle (`season`, 4 h blocks): an app whose memory swings with the day
  is not held at its top all day; the slack that frees pays for
- room before a first jump (the fleet's p75 while 3% of the apps of its swing
  class, scaled by the square root of its calm peak against the fleet's median,
  first jump within a day of its age: a kill costs an app, room costs bytes) and
- room for two jumps at once (`double`, 1% of the fleet's calm peaks; in the
  clock's rule for any app that has jumped, `season_double`), the clock counting
  the calm peak's rise once (`season_once`).

Figures, per seed, and what was tried and not kept: docs/autopilot.md ("Current
figures") and docs/autopilot-journal.md."""

FLAT_FIRST_ROOM_VARIANTS = tuple(
    attrs.evolve(v, name="mem-clock-flat-7d", first_rate=0.05, first_size=0.0)
    for v in DEFAULT_MEMORY_VARIANTS)
"""The default with the room before a first jump given whatever the app's size,
while 5% of the apps like it first jump within a day (session 35's rule): for a
fleet where a large app's kill weighs more than a small one's (about 0.3 points
more slack on the tuning seeds; `dyad-service --autopilot-first-room flat`)."""
