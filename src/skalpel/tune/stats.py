"""Step time of a set of runs, and whether a candidate's differs from the baseline's beyond the machine's noise.

A run's step time is the mean of its timed steps (the window's time over its steps): with
DataLoader workers, steps alternate between waiting and not, and the median of such steps
is one of the two modes, not the throughput. The session interleaves baseline runs with the
candidates' runs, so the baseline's runs measure the machine's own drift over the session.

The verdict (``compare``), from the runs' step times (each run one sample):

- change: the ratio of the candidate's run times to the baseline's (in logs: the mean log run
  time of each side); its 95% interval is where a repeat of the whole measurement (as many runs
  again, as a hand check of the fix would time) would land: Student's t (runs on both sides less
  2 degrees of freedom) times the spread between runs (the larger of the two sides', and at least
  a run's own step noise) times sqrt(2 (1/m + 1/n)), so more runs narrow it;
- the line: the larger of ``TUNE_MIN_EFFECT_PCT`` and the baseline's drift (the spread between
  its runs, as ``skalpel run --repeat`` measures it);
- ``faster`` when the whole interval is beyond the line on the faster side, ``slower`` beyond it on
  the slower side, else ``no_gain``; a ``no_gain`` whose interval straddles the faster line is
  ``undecided``: more runs could settle it (the session adds them within its budget).

The speed-up shown is the interval's centre (baseline / candidate), with the speed-ups at its ends.
A pure function of the samples: the same samples give the same verdict.

A short script (fewer steps than the window) gets its warm-up judged from what it ran
(``steady``): the steps much slower than the later half's median are warm-up, and a note says
when the rest never settled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..capture.timing import spread_pct
from ..diagnose.thresholds import (
    TUNE_MIN_EFFECT_PCT,
    TUNE_STEADY_MIN_STEPS,
    TUNE_STEADY_TREND_PCT,
    TUNE_WARMUP_RATIO,
)

CLEARLY_WORSE_PCT = 25.0  # a first run this much slower, beyond the noise, ends a candidate early
# Student's t, two-sided 95%, by degrees of freedom (runs on both sides less 2): few runs, a wide interval.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 30: 2.04}  # fmt: skip


@dataclass(frozen=True)
class Timing:
    median_ms: float  # median over runs of each run's mean step time
    noise_pct: float | None  # spread between the runs' step times; None with one run
    run_ms: tuple[float, ...]
    steps: int  # timed steps over all runs


@dataclass(frozen=True)
class Comparison:
    change_pct: float  # (candidate - baseline) / baseline, at the interval's centre (in logs)
    speedup: float  # baseline / candidate at the centre
    band_pct: float  # the line: max(minimum effect, the baseline's drift)
    ci_low_pct: float  # the change's interval
    ci_high_pct: float
    speedup_low: float  # the speed-ups at the interval's ends (low: the slower end)
    speedup_high: float
    drift_pct: float | None  # the baseline's spread between runs; None with one baseline run
    verdict: str  # faster | no_gain | slower
    undecided: bool = False  # no_gain, but the interval straddles the faster line: more runs could settle it


@dataclass(frozen=True)
class Steady:
    steps: list[float]  # the steady-state steps to time
    warmup: int  # steps left out before them
    reached: bool  # False: the steps still changed to the end (a short script)
    judged: bool  # True when the warm-up was judged from the steps (a script shorter than the window)


def timing(runs: list[list[float]]) -> Timing | None:
    """None when no run has a timed step."""
    runs = [steps for steps in runs if steps]
    if not runs:
        return None
    run_ms = tuple(round(float(np.mean(steps)), 4) for steps in runs)
    return Timing(round(float(np.median(run_ms)), 4), spread_pct(run_ms), run_ms, sum(len(s) for s in runs))


def compare(baseline_runs: list[list[float]], candidate_runs: list[list[float]], *,
            min_effect_pct: float = TUNE_MIN_EFFECT_PCT) -> Comparison | None:  # fmt: skip
    """The verdict of the candidate's runs against the baseline's (see the module docstring); None without steps."""
    base_runs = [s for s in baseline_runs if s]
    cand_runs = [s for s in candidate_runs if s]
    if not base_runs or not cand_runs:
        return None
    b = np.array([float(np.mean(s)) for s in base_runs])
    c = np.array([float(np.mean(s)) for s in cand_runs])
    if b.min() <= 0 or c.min() <= 0:
        return None
    # In logs: a ratio's interval stays positive, and its centre is the same speed-up either way round.
    log_b, log_c = np.log(b), np.log(c)
    centre = float(log_c.mean() - log_b.mean())
    run_sd = max(_sd(log_b), _sd(log_c), _within_run_sd(base_runs + cand_runs))
    # where a repeat of the whole measurement (as many runs again) would land: what a hand check of the fix sees
    half = t95(len(b) + len(c) - 2) * run_sd * math.sqrt(2 * (1 / len(b) + 1 / len(c)))
    change, low, high = (_pct(centre), _pct(centre - half), _pct(centre + half))
    spread = spread_pct(tuple(float(x) for x in b)) if len(b) >= 2 else None
    drift = None if spread is None else float(spread)
    line = max(min_effect_pct, drift or 0.0)
    if high < -line:
        verdict = "faster"
    elif low > line:
        verdict = "slower"
    else:
        verdict = "no_gain"
    undecided = verdict == "no_gain" and low < -line <= high
    return Comparison(round(change, 2), round(math.exp(-centre), 3), round(line, 2), round(low, 2), round(high, 2),
                      round(math.exp(-(centre + half)), 3), round(math.exp(-(centre - half)), 3), drift, verdict,
                      undecided)  # fmt: skip


def _pct(log_ratio: float) -> float:
    """A log ratio of step times as a change in percent."""
    return (math.exp(log_ratio) - 1) * 100


def _sd(values: np.ndarray) -> float:
    """The sample standard deviation (of logs: a relative spread); 0 for one value."""
    return float(np.std(values, ddof=1)) if len(values) >= 2 else 0.0


def _within_run_sd(runs: list[list[float]]) -> float:
    """What one run's mean is uncertain by from its own steps (relative standard error): the floor of the spread."""
    errors = [float(np.std(s, ddof=1)) / math.sqrt(len(s)) / float(np.mean(s)) for s in runs
              if len(s) >= 2 and np.mean(s) > 0]  # fmt: skip
    return float(np.median(errors)) if errors else 0.0


def t95(freedom: int) -> float:
    """Student's t for a two-sided 95% interval; ``freedom`` below 1 (one run a side) counts as 1."""
    known = [df for df in _T95 if df <= max(1, freedom)]
    return _T95[max(known)] if freedom <= 30 else 1.96


def clearly_worse(comparison: Comparison | None) -> bool:
    return comparison is not None and comparison.verdict == "slower" and comparison.change_pct > max(
        CLEARLY_WORSE_PCT, 2 * comparison.band_pct
    )


def steady(steps_ms: list[float], warmup: int, window: int) -> Steady:
    """The steps to time. A run that reached the window times the window after ``warmup``; a shorter one
    has its warm-up judged from its steps: the leading steps slower than ``TUNE_WARMUP_RATIO`` times the
    median of its later half, and steady state when enough steps follow with no trend between their halves."""
    if len(steps_ms) >= warmup + window:
        return Steady(steps_ms[warmup : warmup + window], warmup, True, False)
    if len(steps_ms) < 2:
        return Steady(list(steps_ms), 0, False, True)
    later = float(np.median(steps_ms[len(steps_ms) // 2 :]))
    start = next((i for i, step in enumerate(steps_ms) if step <= TUNE_WARMUP_RATIO * later), 0)
    start = min(max(start, 1 if len(steps_ms) > TUNE_STEADY_MIN_STEPS else 0), len(steps_ms) - 1)
    kept = list(steps_ms[start:])
    reached = len(kept) >= TUNE_STEADY_MIN_STEPS and trend_pct(kept) <= TUNE_STEADY_TREND_PCT
    return Steady(kept, start, reached, True)


def trend_pct(steps: list[float]) -> float:
    """How far the second half's mean step is from the first half's, in percent of the first."""
    if len(steps) < 2:
        return 0.0
    half = len(steps) // 2
    if half >= 2:
        half -= half % 2  # whole pairs: steps that alternate (a wait, then none) compare like with like
    first, second = float(np.mean(steps[:half])), float(np.mean(steps[-half:]))
    return abs(second - first) / first * 100 if first > 0 else 0.0
