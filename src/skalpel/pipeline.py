"""From a loaded trace to a Report: run the analyses, then the findings, then assemble.

This is the one place that knows which analyses feed the report; the CLI, the
Python API and the capture layer all come through here.
"""

from __future__ import annotations

import numpy as np

from .analysis.bundle import Analyses, run_analyses
from .report.model import CaptureInfo, Finding, RankReport, Report, Source, StepStats
from .trace.model import Trace

_NO_STEPS_WARNING = (
    "the trace has no ProfilerStep markers: each rank's whole trace is treated as one step "
    "(call prof.step() once per iteration, or use skalpel.profile())"
)


def build_report(trace: Trace, *, capture: CaptureInfo | None = None) -> Report:
    analyses = run_analyses(trace)
    findings = _diagnose(analyses, capture)
    warnings = tuple(trace.warnings) + (() if analyses.steps.marked else (_NO_STEPS_WARNING,))
    return Report(
        source=_source(trace),
        steps=_step_stats(analyses),
        ranks=tuple(_rank_report(analyses, rank) for rank in trace.rank_ids),
        findings=findings,
        capture=capture,
        warnings=warnings,
    )


def _diagnose(analyses: Analyses, capture: CaptureInfo | None) -> tuple[Finding, ...]:
    return ()


def _rank_report(analyses: Analyses, rank: int) -> RankReport:
    steps = analyses.steps.for_rank(rank)
    return RankReport(
        rank=rank,
        step_ms=tuple(round(step.duration_ms, 4) for step in steps),
        step_breakdown_pct={},
    )


def _step_stats(analyses: Analyses) -> StepStats:
    durations = analyses.steps.durations_ms
    median = float(np.median(durations)) if len(durations) else 0.0
    mean = float(durations.mean()) if len(durations) else 0.0
    return StepStats(
        count=len(durations),
        median_ms=round(median, 4),
        p90_ms=round(float(np.percentile(durations, 90)), 4) if len(durations) else 0.0,
        cv=round(float(durations.std() / mean), 4) if mean > 0 else 0.0,
        marked=analyses.steps.marked,
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
