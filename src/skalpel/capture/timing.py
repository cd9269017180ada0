"""The capture's own measurements: profiler overhead and noise, from skalpel's step clock.

Overhead: the median recorded step against the median un-profiled step (wait and
warm-up steps), both timed with ``perf_counter`` at the step boundaries. Noise: the
spread between the median step times of the recorded windows (``repeat >= 2``),
relative to their mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..report.model import Report
from .settings import ACTIVE, CaptureSettings

NOISE_NOTE_PCT = 20.0


def step_timing(intervals: list[tuple[int, float]], settings: CaptureSettings) -> dict[str, Any]:
    """Overhead and noise from skalpel's own step clock (CaptureInfo fields)."""
    baseline: list[float] = []
    windows: dict[int, list[float]] = {}
    for step, seconds in intervals:
        phase = settings.phase(step)
        if phase is None:
            continue
        window, kind = phase
        if kind == ACTIVE:
            windows.setdefault(window, []).append(seconds * 1000.0)
        else:
            baseline.append(seconds * 1000.0)
    medians = tuple(round(float(np.median(values)), 4) for _, values in sorted(windows.items()))
    profiled = [value for values in windows.values() for value in values]
    unprofiled_ms = float(np.median(baseline)) if baseline else None
    profiled_ms = float(np.median(profiled)) if profiled else None
    overhead = None
    if unprofiled_ms and profiled_ms is not None:
        overhead = round((profiled_ms / unprofiled_ms - 1.0) * 100.0, 2)
    noise = spread_pct(medians)
    return {
        "overhead_pct": overhead,
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
