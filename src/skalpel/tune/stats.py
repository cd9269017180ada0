"""Step time of a set of runs, and whether a candidate's differs from the baseline's beyond the noise.

A run's step time is the mean of its timed steps (the window's time over its steps): with
DataLoader workers, steps alternate between waiting and not, and the median of such steps
is one of the two modes, not the throughput. A candidate's or the baseline's step time is
the median over its runs. Its noise is the spread between those runs (``spread_pct``, as
``skalpel run --repeat`` measures it): machine drift between runs, which interleaving spreads
over both sides.

The verdict follows ``skalpel diff``: the change must exceed a noise band (the two sides'
run spreads combined, at least ``min_band_pct``) and a bootstrap interval over the steps
(of the mean) must exclude zero; ``faster`` or ``slower`` then, else ``no_gain``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..capture.timing import spread_pct
from ..result.diff import DiffOptions, bootstrap_change_interval

CLEARLY_WORSE_PCT = 25.0  # a first run this much slower, beyond the noise, ends a candidate early


@dataclass(frozen=True)
class Timing:
    median_ms: float  # median over runs of each run's mean step time
    noise_pct: float | None  # spread between the runs' step times; None with one run
    run_ms: tuple[float, ...]
    steps: int  # timed steps over all runs


@dataclass(frozen=True)
class Comparison:
    change_pct: float  # (candidate - baseline) / baseline
    speedup: float  # baseline / candidate
    band_pct: float
    ci_low_pct: float | None
    ci_high_pct: float | None
    verdict: str  # faster | no_gain | slower


def timing(runs: list[list[float]]) -> Timing | None:
    """None when no run has a timed step."""
    runs = [steps for steps in runs if steps]
    if not runs:
        return None
    run_ms = tuple(round(float(np.mean(steps)), 4) for steps in runs)
    return Timing(round(float(np.median(run_ms)), 4), spread_pct(run_ms), run_ms, sum(len(s) for s in runs))


def compare(baseline_runs: list[list[float]], candidate_runs: list[list[float]],
            options: DiffOptions | None = None) -> Comparison | None:  # fmt: skip
    options = options or DiffOptions()
    base, cand = timing(baseline_runs), timing(candidate_runs)
    if base is None or cand is None or base.median_ms <= 0 or cand.median_ms <= 0:
        return None
    change = (cand.median_ms - base.median_ms) / base.median_ms * 100
    noises = [n for n in (base.noise_pct, cand.noise_pct) if n is not None]
    band = max(options.min_band_pct, math.sqrt(sum(n * n for n in noises)))
    b = np.concatenate([np.asarray(s, dtype=float) for s in baseline_runs if s])
    a = np.concatenate([np.asarray(s, dtype=float) for s in candidate_runs if s])
    low = high = None
    if min(len(b), len(a)) >= options.min_steps_for_interval:
        low, high = bootstrap_change_interval(b, a, options, statistic=np.mean)
    inside = abs(change) <= band or (low is not None and high is not None and low <= 0 <= high)
    verdict = "no_gain" if inside else ("slower" if change > 0 else "faster")
    return Comparison(round(change, 2), round(base.median_ms / cand.median_ms, 3), round(band, 2),
                      None if low is None else round(low, 2), None if high is None else round(high, 2), verdict)  # fmt: skip


def clearly_worse(comparison: Comparison | None) -> bool:
    return comparison is not None and comparison.verdict == "slower" and comparison.change_pct > max(
        CLEARLY_WORSE_PCT, 2 * comparison.band_pct
    )
