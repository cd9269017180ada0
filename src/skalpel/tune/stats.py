"""Step time of a set of runs, and whether a candidate's differs from the baseline's beyond the machine's noise.

A run's step time is the mean of its timed steps (the window's time over its steps): with
DataLoader workers, steps alternate between waiting and not, and the median of such steps
is one of the two modes, not the throughput. The session runs in rounds, each candidate once and
then the baseline once, so every candidate run has a baseline run beside it in time: its pair.

The verdict (``compare``), from paired rounds:

- each candidate run over its paired baseline run is one ratio: the machine's drift over the
  session, and a disturbance that slows a whole round, weigh on both sides of a pair alike;
- change: the median of the paired ratios (in logs); its interval is the 10th to 90th percentile of
  the ratios (up to four pairs, their range), widened by twice the runs' own step noise and, with two
  or three pairs (too few to show their spread), by a pair's share of the baseline's noise: the robust
  spread of its runs (1.4826 x the median absolute deviation of their logs), which one disturbed
  baseline run does not set (max - min would); a single pair is never ``faster``: faster in one
  round is ``undecided`` until more rounds settle it;
- the line: ``TUNE_MIN_EFFECT_PCT``, the smallest change worth a verdict: the machine's drift over the
  session cancels within each pair, and its noise widens the interval instead;
- ``faster`` when the whole interval is beyond the line on the faster side, ``slower`` beyond it on
  the slower side, else ``no_gain``; a ``no_gain`` whose interval straddles the faster line is
  ``undecided``: more rounds could settle it (the session adds them within its budget).

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

from ..diagnose.thresholds import (
    TUNE_MIN_EFFECT_PCT,
    TUNE_STEADY_MIN_STEPS,
    TUNE_STEADY_TREND_PCT,
    TUNE_WARMUP_RATIO,
)

CLEARLY_WORSE_PCT = 25.0  # a first run this much slower, beyond the noise, ends a candidate early
MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample times this is its standard deviation
OUTER_PERCENTILE = 10.0  # the interval: this percentile of the paired ratios to its mirror
FEW_PAIRS = 4  # below this many pairs, their range covers the median too rarely (1 - 2^(1-n): 50%, 75%)


@dataclass(frozen=True)
class Timing:
    median_ms: float  # median over runs of each run's mean step time
    noise_pct: float | None  # robust spread between the runs' step times (noise_pct); None with one run
    run_ms: tuple[float, ...]
    steps: int  # timed steps over all runs


@dataclass(frozen=True)
class Comparison:
    change_pct: float  # (candidate - baseline) / baseline, at the median paired ratio
    speedup: float  # baseline / candidate at the centre
    band_pct: float  # the line: the minimum effect
    ci_low_pct: float  # the change's interval
    ci_high_pct: float
    speedup_low: float  # the speed-ups at the interval's ends (low: the slower end)
    speedup_high: float
    drift_pct: float | None  # the baseline's robust noise between runs; None with one baseline run
    verdict: str  # faster | no_gain | slower
    undecided: bool = False  # no_gain, but the interval straddles the faster line: more runs could settle it
    ratios: tuple[float, ...] = ()  # each candidate run over its paired baseline run


@dataclass(frozen=True)
class Steady:
    steps: list[float]  # the steady-state steps to time
    warmup: int  # steps left out before them
    reached: bool  # False: the steps still changed to the end (a short script)
    judged: bool  # True when the warm-up was judged from the steps (a script shorter than the window)


def noise_pct(values: list[float] | tuple[float, ...]) -> float | None:
    """The robust spread of repeated run times, in percent: 1.4826 x the median absolute deviation of their logs
    (a standard deviation that one disturbed run cannot set); None with fewer than two or a non-positive one."""
    if len(values) < 2 or min(values) <= 0:
        return None
    logs = np.log(np.asarray(values, dtype=float))
    return round(float(MAD_TO_SD * np.median(np.abs(logs - np.median(logs)))) * 100.0, 2)


def timing(runs: list[list[float]]) -> Timing | None:
    """None when no run has a timed step."""
    runs = [steps for steps in runs if steps]
    if not runs:
        return None
    run_ms = tuple(round(float(np.mean(steps)), 4) for steps in runs)
    return Timing(round(float(np.median(run_ms)), 4), noise_pct(run_ms), run_ms, sum(len(s) for s in runs))


def compare(baseline_runs: list[list[float]], candidate_runs: list[list[float]], *, pairs: list[int] | None = None,
            min_effect_pct: float = TUNE_MIN_EFFECT_PCT) -> Comparison | None:  # fmt: skip
    """The verdict of the candidate's runs against the baseline's (see the module docstring); None without steps.
    ``pairs[i]``: the index in ``baseline_runs`` of the run paired with candidate run ``i`` (its round's: the
    nearest in time); by default the ``i``-th (the last for runs beyond them)."""
    pairs = list(pairs) if pairs is not None else [min(i, len(baseline_runs) - 1) for i in range(len(candidate_runs))]
    kept = [(baseline_runs[j], steps) for steps, j in zip(candidate_runs, pairs)
            if steps and 0 <= j < len(baseline_runs) and baseline_runs[j]]  # fmt: skip
    base_runs = [s for s in baseline_runs if s]
    if not kept or not base_runs:
        return None
    b = np.array([float(np.mean(s)) for s in base_runs])
    paired_b = np.array([float(np.mean(base)) for base, _ in kept])
    c = np.array([float(np.mean(cand)) for _, cand in kept])
    if b.min() <= 0 or c.min() <= 0 or paired_b.min() <= 0:
        return None
    ratios = np.log(c) - np.log(paired_b)  # in logs: a ratio's interval stays positive, its centre the same either way
    centre = float(np.median(ratios))
    noise = noise_pct(tuple(float(x) for x in b))
    machine = (noise or 0.0) / 100.0
    own = math.sqrt(2) * _within_run_sd([s for pair in kept for s in pair])  # a pair's own step noise
    # two or three pairs show too little of their spread: the baseline's robust noise (one pair's, sqrt 2 runs')
    # widens their range; from four on, their own spread is the interval
    widen = 2 * own + (math.sqrt(2) * machine if len(ratios) < FEW_PAIRS else 0.0)
    if len(ratios) >= 2:  # up to four pairs: their range; more: the outer percentiles, so one odd round does not set it
        outer = OUTER_PERCENTILE if len(ratios) >= 5 else 0.0
        low_log = float(np.percentile(ratios, outer)) - widen
        high_log = float(np.percentile(ratios, 100 - outer)) + widen
    else:  # one pair shows no spread of its own: the machine's noise between identical runs stands in for it
        half = 2 * math.hypot(own, math.sqrt(2) * machine)
        low_log, high_log = centre - half, centre + half
    low_log, high_log = min(low_log, centre), max(high_log, centre)
    change, low, high = (_pct(centre), _pct(low_log), _pct(high_log))
    line = min_effect_pct  # the machine's drift cancels within pairs; its noise is in the interval, not the line
    if high < -line and len(ratios) >= 2:  # faster in one round only is not yet faster: more rounds settle it
        verdict = "faster"
    elif low > line:
        verdict = "slower"
    else:
        verdict = "no_gain"
    undecided = verdict == "no_gain" and (low < -line <= high or (len(ratios) < 2 and high < -line))
    return Comparison(round(change, 2), round(math.exp(-centre), 3), round(line, 2), round(low, 2), round(high, 2),
                      round(math.exp(-high_log), 3), round(math.exp(-low_log), 3), noise, verdict, undecided,
                      tuple(round(float(math.exp(r)), 4) for r in ratios))  # fmt: skip


def _pct(log_ratio: float) -> float:
    """A log ratio of step times as a change in percent."""
    return (math.exp(log_ratio) - 1) * 100


def _within_run_sd(runs: list[list[float]]) -> float:
    """What one run's mean is uncertain by from its own steps (relative standard error): the floor of the spread."""
    errors = [float(np.std(s, ddof=1)) / math.sqrt(len(s)) / float(np.mean(s)) for s in runs
              if len(s) >= 2 and np.mean(s) > 0]  # fmt: skip
    return float(np.median(errors)) if errors else 0.0


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
