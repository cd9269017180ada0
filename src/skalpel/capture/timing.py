"""The capture's own measurements: profiler overhead and noise, from skalpel's step clock.

Overhead: the median recorded step against the median un-profiled step, both timed with
``perf_counter`` at the step boundaries. The un-profiled baseline is the script's own speed:
the wait and warm-up steps before the first window, while the process is as the script
alone would have it (the profiler is not recording yet). Not the first of them when
enough are left, since it may carry first-iteration costs. Never the steps after a window:
the profiler can leave the process changed (on a CPU ResNet loop the steps after it ran
10-12% faster than the script alone: the buffers it frees raise glibc's malloc thresholds,
which ``MALLOC_MMAP_THRESHOLD_=33554432`` reproduces), and a baseline taken there made the
overhead read about twice what it was. Holding the threshold for the whole run (as skalpel
once did) made every step faster than the script alone: the baseline is taken before. Those steps are timed still (``after_step_ms``), as a
check of the baseline: a difference out of the noise is said in a note.
The overhead's noise is about two standard errors of the two medians (from their median
absolute deviations), widened to the spread between windows when there are several: an
overhead inside it is not a measured overhead.
Noise: the spread between the median step times of the recorded windows (``repeat >= 2``),
relative to their mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..result.report import Report
from .settings import ACTIVE, WAIT, CaptureSettings

NOISE_NOTE_PCT = 20.0
FEWEST_BASELINE_STEPS = 3  # as result.report's: fewer, and the median is about one step
AFTER_DIFFERS_PCT = 10.0  # steps after the recording this much faster or slower than before it: said


def step_timing(intervals: list[tuple[int, float]], settings: CaptureSettings,
                after: Sequence[float] = ()) -> dict[str, Any]:  # fmt: skip
    """Overhead and noise from skalpel's own step clock (CaptureInfo fields).

    ``intervals`` are (profiler step, seconds) up to the last window; ``after`` the
    seconds of un-profiled steps timed after it.
    """
    later = [seconds * 1000.0 for seconds in after]  # after a window: the check, never the baseline
    before: list[float] = []  # wait and warm-up steps of the first window
    windows: dict[int, list[float]] = {}
    for step, seconds in intervals:
        phase = settings.phase(step)
        if phase is None:
            continue
        window, kind = phase
        if kind == ACTIVE:
            windows.setdefault(window, []).append(seconds * 1000.0)
        elif window > 0:
            if kind == WAIT:
                later.append(seconds * 1000.0)
        else:
            before.append(seconds * 1000.0)
    baseline = before[1:] if len(before) > FEWEST_BASELINE_STEPS else before  # the first may carry one-time costs
    medians = tuple(round(float(np.median(values)), 4) for _, values in sorted(windows.items()))
    profiled = [value for values in windows.values() for value in values]
    unprofiled_ms = float(np.median(baseline)) if baseline else None
    profiled_ms = float(np.median(profiled)) if profiled else None
    overhead = None
    if unprofiled_ms and profiled_ms is not None:
        overhead = round((profiled_ms / unprofiled_ms - 1.0) * 100.0, 2)
    noise = spread_pct(medians)
    overhead_noise = None
    if overhead is not None and unprofiled_ms:
        spread = 2.0 * float(np.hypot(_median_error(profiled), _median_error(baseline)))
        overhead_noise = round(max(spread / unprofiled_ms * 100.0, noise or 0.0), 2)
    after_ms = float(np.median(later)) if later else None
    return {
        "overhead_pct": overhead,
        "overhead_noise_pct": overhead_noise,
        "baseline_steps": len(baseline),
        "noise_pct": noise,
        "unprofiled_step_ms": round(unprofiled_ms, 4) if unprofiled_ms is not None else None,
        "profiled_step_ms": round(profiled_ms, 4) if profiled_ms is not None else None,
        "window_medians_ms": medians,
        "after_step_ms": round(after_ms, 4) if after_ms is not None else None,
        "after_change_pct": _after_change(baseline, later),
    }


def _after_change(baseline: list[float], later: list[float]) -> float | None:
    """How much faster (negative) or slower the un-profiled steps after the recording ran than those before it, in
    percent, when both rest on enough steps and the difference stands out of their noise; else None."""
    if len(baseline) < FEWEST_BASELINE_STEPS or len(later) < FEWEST_BASELINE_STEPS:
        return None
    before_ms, after_ms = float(np.median(baseline)), float(np.median(later))
    change = (after_ms / before_ms - 1.0) * 100.0
    noise = 2.0 * float(np.hypot(_median_error(baseline), _median_error(later))) / before_ms * 100.0
    return round(change, 1) if abs(change) >= max(AFTER_DIFFERS_PCT, noise) else None


def spread_pct(values: tuple[float, ...] | list[float]) -> float | None:
    """The spread of repeated measurements, (max - min) / mean in percent; None with fewer than 2."""
    if len(values) < 2 or min(values) <= 0:
        return None
    return round((max(values) - min(values)) / float(np.mean(values)) * 100.0, 2)


def _median_error(values: list[float]) -> float:
    """Standard error of a median, from the median absolute deviation (robust to one odd step)."""
    if len(values) < 2:
        return float(np.median(values)) if values else 0.0  # one value: as uncertain as it is large
    mad = float(np.median(np.abs(np.asarray(values) - np.median(values))))
    return 1.253 * 1.4826 * mad / len(values) ** 0.5


def with_noise_note(report: Report) -> Report:
    """Add the noise advice as a note, unless a `noisy_measurement` finding already gives it; and the baseline's
    check, when the steps after the recording ran at another speed than those before it."""
    report = _with_after_note(report)
    capture = report.capture
    if capture is None or capture.noise_pct is None or capture.noise_pct <= NOISE_NOTE_PCT:
        return report
    if any(finding.id == "noisy_measurement" for finding in report.findings):
        return report
    note = (
        f"noisy measurement: the recorded windows' median step times differ by {capture.noise_pct:.0f}% "
        "(fix the seed, call torch.set_num_threads(1), stop other loads on the machine, then capture again)"
    )
    return dataclasses.replace(report, warnings=report.warnings + (note,))


def _with_after_note(report: Report) -> Report:
    capture = report.capture
    if capture is None or capture.after_change_pct is None or capture.after_step_ms is None:
        return report
    change = capture.after_change_pct
    note = (
        f"after the recording the script's un-profiled steps ran {abs(change):.0f}% "
        f"{'faster' if change < 0 else 'slower'} "
        f"than before it ({capture.after_step_ms:.1f} vs {capture.unprofiled_step_ms:.1f} ms): the profiler can "
        "leave the process changed (the buffers it frees raise glibc's malloc thresholds, for one); the "
        f"profiler overhead is measured against the {capture.baseline_steps} step(s) before the recording"
    )
    return dataclasses.replace(report, warnings=report.warnings + (note,))
