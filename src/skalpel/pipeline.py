"""From a loaded trace to a Report: run the analyses, then the findings.

This is the one place that knows which analyses feed the report; the CLI, the
Python API and the capture layer all come through here.
"""

from __future__ import annotations

import numpy as np

from .analysis.steps import StepSegmentation, segment_steps
from .report.model import CaptureInfo, RankReport, Report, Source, StepStats
from .trace.model import Trace


def build_report(trace: Trace, *, capture: CaptureInfo | None = None) -> Report:
    segmentation = segment_steps(trace)
    ranks = tuple(_rank_report(trace, segmentation, rank) for rank in trace.rank_ids)
    report = Report(
        source=_source(trace),
        steps=_step_stats(segmentation),
        ranks=ranks,
        capture=capture,
        warnings=tuple(trace.warnings) + (() if segmentation.marked else (_NO_STEPS_WARNING,)),
    )
    return report


_NO_STEPS_WARNING = (
    "the trace has no ProfilerStep markers: each rank's whole trace is treated as one step "
    "(call prof.step() once per iteration, or use skalpel.profile())"
)


def _rank_report(trace: Trace, segmentation: StepSegmentation, rank: int) -> RankReport:
    steps = segmentation.for_rank(rank)
    return RankReport(
        rank=rank,
        step_ms=tuple(round(step.duration_ms, 4) for step in steps),
        step_breakdown_pct={},
    )


def _step_stats(segmentation: StepSegmentation) -> StepStats:
    durations = segmentation.durations_ms
    median = float(np.median(durations)) if len(durations) else 0.0
    mean = float(durations.mean()) if len(durations) else 0.0
    return StepStats(
        count=len(durations),
        median_ms=round(median, 4),
        p90_ms=round(float(np.percentile(durations, 90)), 4) if len(durations) else 0.0,
        cv=round(float(durations.std() / mean), 4) if mean > 0 else 0.0,
        marked=segmentation.marked,
    )


def _source(trace: Trace) -> Source:
    device_names = sorted({name for info in trace.ranks for name in info.device_names if name})
    if trace.has_device:
        device = device_names[0] if device_names else "gpu"
    else:
        device = "cpu"
    torch_versions = sorted({info.versions["torch"] for info in trace.ranks if "torch" in info.versions})
    world_sizes = {info.world_size for info in trace.ranks if info.world_size}
    return Source(
        paths=tuple(info.path for info in trace.ranks),
        torch_version=torch_versions[0] if torch_versions else None,
        device=device,
        world_size=max(world_sizes) if world_sizes else len(trace.ranks),
    )
