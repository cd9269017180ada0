"""The capture's own measurements: profiler overhead and noise, from skalpel's step clock.

Overhead: the median recorded step against the median un-profiled step, both timed
with ``perf_counter`` at the step boundaries. The un-profiled baseline is steady state:
the steps after the last window (the script runs on; skalpel times a few more) and the
wait steps of later windows, never the first steps, which carry first-iteration costs
and the profiler's start. Only without any of those does it fall back on the wait and
warm-up steps after the first one. The overhead's noise is about two standard errors of
the two medians (from their median absolute deviations), widened to the spread between
windows when there are several: an overhead inside it is not a measured overhead.
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


def step_timing(intervals: list[tuple[int, float]], settings: CaptureSettings,
                after: Sequence[float] = ()) -> dict[str, Any]:  # fmt: skip
    """Overhead and noise from skalpel's own step clock (CaptureInfo fields).

    ``intervals`` are (profiler step, seconds) up to the last window; ``after`` the
    seconds of un-profiled steps timed after it.
    """
    steady = [seconds * 1000.0 for seconds in after]
    early: list[float] = []  # wait and warm-up steps of the first window, after its first step
    windows: dict[int, list[float]] = {}
    for step, seconds in intervals:
        phase = settings.phase(step)
        if phase is None:
            continue
        window, kind = phase
        if kind == ACTIVE:
            windows.setdefault(window, []).append(seconds * 1000.0)
        elif window > 0 and kind == WAIT:
            steady.append(seconds * 1000.0)
        elif step > 0:
            early.append(seconds * 1000.0)
    baseline = steady or early
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
    return {
        "overhead_pct": overhead,
        "overhead_noise_pct": overhead_noise,
        "baseline_steps": len(baseline),
        "noise_pct": noise,
        "unprofiled_step_ms": round(unprofiled_ms, 4) if unprofiled_ms is not None else None,
        "profiled_step_ms": round(profiled_ms, 4) if profiled_ms is not None else None,
        "window_medians_ms": medians,
    }


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
    """Add the noise advice as a note, unless a `noisy_measurement` finding already gives it."""
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
