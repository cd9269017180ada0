"""From analyses to the report's parts: a rank's part (``rank_report``), and the Report of a job once its
findings are judged (``assemble_report``). ``job.report_of`` is the road that comes through here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from typing import Any

import numpy as np

from ..analysis import numeric
from ..analysis.bundle import Analyses, JobFacts
from ..analysis.memory import DeviceMemory
from ..analysis.recorded import device_label
from ..analysis.steps import StepSegmentation, UnequalStep
from ..result.report import (
    CaptureInfo,
    Finding,
    GpuSummary,
    KernelRow,
    LedgerLane,
    LedgerSummary,
    LedgerUnitRow,
    MemorySummary,
    MfuSummary,
    OpRow,
    RankReport,
    Report,
    Source,
    StepStats,
)
from ..result.sections import (
    BlameSummary,
    CommSummary,
    CompiledSummary,
    CompileSummary,
    DistributedSummary,
    LaunchSummary,
    ModulesSummary,
    RooflineSummary,
    StepDeviceSummary,
    SyncSummary,
)
from .across import across_ranks
from .summary import job_summary

_NO_STEPS_WARNING = (
    "the trace has no ProfilerStep markers: each rank's whole trace is treated as one step "
    "(call prof.step() once per iteration, or use skalpel.profile())"
)


_STACKS_OFF_WARNING = (
    "Python stacks were not recorded: the script compiles with torch.compile, and recording the compiler's "
    "Python frames would take minutes and gigabytes; compile findings take their lines from dynamo instead"
)


def assemble_report(
    analyses: Analyses, findings: tuple[Finding, ...], ranks: tuple[RankReport, ...], capture: CaptureInfo | None
) -> Report:
    """The Report of a job from its joined analyses (``analyses.job``: rank infos, warnings, has_device, host signs)."""
    job = analyses.job
    assert job is not None, "assemble_report reads a join's analyses"
    warnings = tuple(job.warnings) + (() if analyses.steps.marked else (_NO_STEPS_WARNING,)) + analyses.steps.notes
    if analyses.steps.dropped_tail:
        warnings += (
            f"{analyses.steps.dropped_tail} trailing step(s) left out: the trace lacks (some of) the device work "
            "they launched (the profiler stopped first), as the TensorBoard plugin does",
        )
    if analyses.steps.defective:
        warnings += (
            f"{analyses.steps.defective} step(s) left out as measurement defects: no op inside, or a tenth of the "
            "median step with half its ops (a step boundary marked twice in one iteration); no finding reads them",
        )
    warnings += tuple(_unequal_note(analyses.steps, unequal) for unequal in analyses.steps.unequal)
    if analyses.rank_comparison is not None:
        warnings += analyses.rank_comparison.warnings
    if analyses.compile_log is not None and analyses.compile_log.stacks_off:
        warnings += (_STACKS_OFF_WARNING,)
    warnings = said_once(warnings)
    return Report(
        source=_source(job, analyses),
        steps=_step_stats(analyses),
        ranks=ranks,
        findings=across_ranks(findings, ranks),  # one finding for the ranks that raise it alike
        capture=capture,
        warnings=warnings,
        job=job_summary(ranks),
    )


SAID_ALIKE = 3  # notes alike but for their numbers (a rank, a file): more than this are said once


def said_once(notes: tuple[str, ...]) -> tuple[str, ...]:
    """Each note once: repeats dropped, and notes alike but for their numbers (one per rank of a large job)
    kept as the first of them, with how many more say the same."""
    notes = tuple(dict.fromkeys(notes))
    shapes: dict[str, list[str]] = {}
    for note in notes:
        shapes.setdefault(_DIGITS.sub("#", note), []).append(note)
    kept = []
    for note in notes:
        alike = shapes[_DIGITS.sub("#", note)]
        if len(alike) <= SAID_ALIKE:
            kept.append(note)
        elif note is alike[0]:
            kept.append(f"{note} (and {len(alike) - 1:,} more notes alike but for their numbers: ranks or files)")
    return tuple(kept)


_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def _unequal_note(steps: StepSegmentation, unequal: UnequalStep) -> str:
    """An unequal step, named, and its cost said once."""
    rank = unequal.step.rank
    total_ms = sum(step.duration_ms for step in steps.for_rank(rank))
    total_ms += sum(other.step.duration_ms for other in steps.unequal if other.step.rank == rank)
    share = 100.0 * unequal.extra_ms / total_ms if total_ms > 0 else 0.0
    return (
        f"{unequal.describe()}; it is left out of the step statistics and the per-step figures (the op table "
        f"still holds it), and "
        + (f"costs {unequal.extra_ms:.1f} ms more than a step, {share:.0f}% of the recorded time" if unequal.extra_ms >= 0
           else f"takes {-unequal.extra_ms:.1f} ms less than a step")
    )


def rank_report(analyses: Analyses, rank: int) -> RankReport:
    steps = analyses.steps.for_rank(rank)
    sections = _extra(analyses, rank)
    breakdown = analyses.breakdown.for_rank(rank) if analyses.breakdown else None
    return RankReport(
        rank=rank,
        step_ms=tuple(round(step.duration_ms, 4) for step in steps),
        step_breakdown_pct={name: round(pct, 2) for name, pct in breakdown.pct.items()} if breakdown else {},
        top_ops=_top_ops(analyses, rank, _compiled_names(sections.get("compiled"))),
        top_kernels=_top_kernels(analyses, rank),
        data_wait_ms_per_step=_data_wait(analyses, rank),
        gpu=_gpu_summary(analyses, rank),
        memory=_memory_summary(analyses, rank),
        mfu=_mfu_summary(analyses, rank),
        ledger=_ledger_summary(analyses, rank),
        **sections,
    )


def _data_wait(analyses: Analyses, rank: int) -> float | None:
    """The main thread's wait for data a unit: the ledger's, the account dataloader_bound quotes."""
    found = analyses.ledger.for_rank(rank) if analyses.ledger is not None else None
    return round(found.data_wait_ms_per_unit(), 4) if found is not None else None


def _ledger_summary(analyses: Analyses, rank: int) -> LedgerSummary | None:
    found = analyses.ledger.for_rank(rank) if analyses.ledger is not None else None
    if found is None:
        return None
    lanes = []
    for lane in found.lanes:
        count = max(len(lane.units), 1)
        total = {cause: ms for cause, ms in lane.total_ms.items() if ms > 0}
        lanes.append(LedgerLane(
            lane=lane.name, what=lane.what,
            ms_per_unit={cause: round(ms / count, 4) for cause, ms in total.items()},
            share_pct={cause: round(lane.share_pct(cause), 2) for cause in total},
            units=tuple(LedgerUnitRow(unit.number, round(unit.length_ms, 4),
                                      {cause: round(ms, 4) for cause, ms in unit.ms.items() if ms > 0})
                        for unit in lane.units),
        ))  # fmt: skip
    return LedgerSummary(unit=found.unit, units=found.units, judged_over=found.describe(),
                         length_ms=round(found.length_ms, 4), one_time_ms=round(found.one_time_ms, 4),
                         lanes=tuple(lanes), notes=found.notes)  # fmt: skip


def _gpu_summary(analyses: Analyses, rank: int) -> GpuSummary | None:
    gpu = analyses.gpu_time.for_rank(rank) if analyses.gpu_time else None
    if gpu is None:
        return None
    overlap = gpu.comm_overlap_pct
    return GpuSummary(
        idle_pct=round(gpu.idle_pct, 2),
        compute_pct=round(gpu.compute_pct, 2),
        non_compute_pct=round(gpu.non_compute_pct, 2),
        comm_overlap_pct=round(overlap, 2) if overlap is not None else None,
        idle_breakdown_pct={name: round(pct, 2) for name, pct in gpu.idle_breakdown_pct.items()},
    )


def _mfu_summary(analyses: Analyses, rank: int) -> MfuSummary | None:
    found = next((item for item in analyses.mfu if item.rank == rank), None)
    if found is None:
        return None
    return MfuSummary(
        achieved_tflops=round(found.achieved_tflops, 6), flops_per_step=found.flops_per_step, dtype=found.dtype,
        peak_tflops=found.peak_tflops, mfu_pct=round(found.mfu_pct, 2) if found.mfu_pct is not None else None,
        device=found.device, note=found.note,
    )  # fmt: skip


def _memory_summary(analyses: Analyses, rank: int) -> MemorySummary | None:
    return memory_summary(analyses.memory.main_device(rank) if analyses.memory else None)


def memory_summary(device: DeviceMemory | None, *, shift_us: float = 0.0) -> MemorySummary | None:
    """The report's memory of one rank; ``shift_us`` moves times measured from that rank's own first
    event onto the job's origin (a rank reduced on its own)."""
    if device is None:
        return None
    growth = device.growth_bytes_per_step
    return MemorySummary(
        peak_bytes=device.peak_bytes,
        growth_bytes_per_step=round(growth, 1) if growth is not None else None,
        device=device.device,
        peak_ts_ms=round((device.peak_ts_us + shift_us) / 1000.0, 4),
        curve=_curve_ms(device.curve, shift_us),
    )


def _curve_ms(curve, shift_us: float) -> tuple[tuple[float, int], ...]:
    """The curve's times in ms from the job's origin, rounded as ``round(ms, 4)`` (``numeric.rounded``)."""
    if not len(curve):
        return ()
    times = getattr(curve, "times", None)  # a rank's summary in the driver: columns (job.transfer.PackedCurve)
    if times is not None:
        return tuple(zip(numeric.rounded((times + shift_us) / 1000.0, 4), curve.values.tolist()))
    times = np.array([ts for ts, _ in curve], np.float64)
    return tuple(zip(numeric.rounded((times + shift_us) / 1000.0, 4), (value for _, value in curve)))


def _extra(analyses: Analyses, rank: int) -> dict[str, Any]:
    """Further per-rank analyses, by their RankReport field (result/sections.py), from each one's plain figures."""
    sections: dict[str, Any] = {}
    launch = analyses.launches.for_rank(rank) if analyses.launches else None
    if launch is not None:
        sections["launch"] = LaunchSummary.from_dict(_rounded(launch.to_dict()), check=False)
    in_steps = analyses.step_device.for_rank(rank) if analyses.step_device else None
    if in_steps is not None:
        figures = _rounded({**in_steps.to_dict(), "marked": analyses.step_device.marked})
        sections["step_device"] = StepDeviceSummary.from_dict(figures, check=False)
    blamed = analyses.blame.for_rank(rank) if analyses.blame is not None else None
    if blamed is not None and blamed.idle_ms > 0:  # the steps' idle time by cause
        sections["blame"] = BlameSummary.from_dict(blamed.to_dict(), check=False)
    sync = analyses.syncs.for_rank(rank) if analyses.syncs else None
    if sync is not None:
        sections["syncs"] = SyncSummary.from_dict(_rounded(sync.to_dict()), check=False)
    if analyses.compile is not None and analyses.compile.used:
        sections["compile"] = CompileSummary.from_dict(_rounded(analyses.compile.to_dict()), check=False)
    compiled = _compiled(analyses, rank)
    if compiled:
        sections["compiled"] = CompiledSummary.from_dict(compiled, check=False)
    comm = analyses.comm.for_rank(rank) if analyses.comm else None
    if comm is not None and comm.collectives:
        sections["comm"] = CommSummary.from_dict(comm.to_summary(), check=False)
    modules = analyses.modules.for_rank(rank) if analyses.modules is not None else None
    if modules is not None:
        sections["modules"] = _modules_summary(modules)
    roof = analyses.roofline.for_rank(rank) if analyses.roofline is not None else None
    if roof is not None and roof.rows:
        sections["roofline"] = RooflineSummary.from_dict(
            {"roofs": roof.roofs, "ops": [_sig(dataclasses.asdict(row)) for row in roof.rows],
             "modules": [_sig({**dataclasses.asdict(item), "path": list(item.path)}) for item in roof.modules],
             "modules_why": roof.modules_why}, check=False)  # fmt: skip
    if analyses.rank_comparison is not None:
        figures = analyses.rank_comparison.summary_of(rank)
        sections["distributed"] = DistributedSummary.from_dict(figures, check=False)
    return sections


def _sig(values: dict) -> dict:
    """Floats to 4 significant digits (FLOPs, bytes and rates span twelve orders of magnitude)."""
    return {key: float(f"{value:.4g}") if isinstance(value, float) else value for key, value in values.items()}


def _modules_summary(modules) -> ModulesSummary:
    """The module tree as the report keeps it: figures rounded, FLOPs to 4 significant digits."""
    nodes = [{"path": list(node.path), "calls": round(node.calls, 3), "host_ms": round(node.host_ms, 4),
              "host_self_ms": round(node.host_self_ms, 4), "device_ms": round(node.device_ms, 4),
              "device_self_ms": round(node.device_self_ms, 4), "flops": float(f"{node.flops:.4g}"),
              "flops_self": float(f"{node.flops_self:.4g}"), "location": node.location, "defined_at": node.defined_at,
              "backward_host_ms": round(node.backward_host_ms, 4),
              "backward_host_self_ms": round(node.backward_host_self_ms, 4),
              "backward_device_ms": round(node.backward_device_ms, 4),
              "backward_device_self_ms": round(node.backward_device_self_ms, 4),
              "backward_flops": float(f"{node.backward_flops:.4g}"), "params": node.params,
              "output_bytes": node.output_bytes}
             for node in modules.nodes]  # fmt: skip
    figures = _rounded({
        "unit": modules.unit, "units": modules.units, "unit_ms": modules.unit_ms, "host_ms": modules.host_ms,
        "host_unattributed_ms": modules.host_unattributed_ms, "device_ms": modules.device_ms,
        "device_in_modules_ms": modules.device_in_modules_ms, "device_unattributed_ms": modules.device_unattributed_ms,
        "ranked_by": "device" if modules.has_device else "host",
        "backward_host_ms": modules.backward_host_ms, "backward_device_ms": modules.backward_device_ms,
        "sizes": "recorded" if modules.sizes_recorded else "not recorded",
    })  # fmt: skip
    return ModulesSummary.from_dict({**figures, "nodes": nodes}, check=False)


def _compiled(analyses: Analyses, rank: int) -> dict:
    """Compiled regions in the user's terms and what the compile log says, for the tables."""
    from ..analysis.compiled_regions import compiled_regions

    log = analyses.compile_log
    regions = compiled_regions(analyses.trace, rank, log) if analyses.compile is not None and analyses.compile.regions else ()
    if not regions and log is None:
        return {}
    summary: dict = {"regions": [row.to_dict() for row in regions[:_TOP_ROWS]]}
    if log is not None:
        mine = [item for item in log.compilations if item.rank == rank]
        summary.update(
            compilations=len(mine),
            recompilations=sum(1 for item in log.recompiles if item.rank == rank),
            compile_ms=round(sum(item.duration_ms for item in mine), 3),
            graph_breaks=len(log.graph_breaks),
            limits_reached=len(log.limits),
            stacks_off=log.stacks_off,
            sources=list(log.sources),
            events=[_compilation_row(item) for item in mine if not item.backward][:_TOP_ROWS],
        )
    return summary


def _compilation_row(item) -> dict:
    """One compilation as the JSON lists it: what, where, when, how long, and why (the guard that failed)."""
    return {
        "compile_id": item.compile_id, "function": item.location, "call_site": item.call_site,
        "duration_ms": round(item.duration_ms, 3), "step": item.step, "in_profiled_steps": item.in_window,
        "guard": item.recompile_reason, "failed": item.failed,
    }  # fmt: skip


def _rounded(values: dict) -> dict:
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in values.items()}


_TOP_ROWS = 15


def _top_ops(analyses: Analyses, rank: int, names: dict[str, str] | None = None) -> tuple[OpRow, ...]:
    """The op table's first rows: by self device time when the rank has device activity, else by self host time.

    ``names`` gives compiled regions and generated graphs the user's function ("... (model.py:30 in forward)").
    """
    table = analyses.ops.for_rank(rank) if analyses.ops else None
    if table is None:
        return ()
    names = names or {}
    return tuple(replace(row, name=names.get(row.name, row.name), self_ms=round(row.self_ms, 4),
                         total_ms=round(row.total_ms, 4), device_ms=round(row.device_ms, 4))
                 for row in table.top(_TOP_ROWS))  # fmt: skip


def _compiled_names(compiled: CompiledSummary | None) -> dict[str, str]:
    """Op name -> the same name with the function it compiles, for regions and their generated graphs.

    Regions come largest first: a resume function's region runs inside its caller's, whose graphs
    therefore include the inner one's; the inner region, later, names its own graphs last.
    """
    names: dict[str, str] = {}
    for row in compiled.regions if compiled is not None else ():
        if not row.location:
            continue
        names[f"Torch-Compiled Region: {row.region}"] = f"Torch-Compiled Region: {row.region} ({row.location})"
        for graph in row.graphs:
            names[f"## Call CompiledFxGraph {graph} ##"] = f"## Call CompiledFxGraph {graph} ## ({row.location})"
    return names


def _top_kernels(analyses: Analyses, rank: int) -> tuple[KernelRow, ...]:
    table = analyses.kernels.for_rank(rank) if analyses.kernels else None
    if table is None:
        return ()
    return tuple(replace(row, total_ms=round(row.total_ms, 4), mean_us=round(row.mean_us, 3),
                         share_pct=round(row.share_pct, 2))
                 for row in table.top(_TOP_ROWS))  # fmt: skip


def _step_stats(analyses: Analyses) -> StepStats:
    durations = analyses.steps.durations_ms
    median = numeric.median(durations) if len(durations) else 0.0
    mean = float(durations.mean()) if len(durations) else 0.0
    return StepStats(
        count=len(durations),
        median_ms=round(median, 4),
        p90_ms=round(numeric.percentile(durations, 90), 4) if len(durations) else 0.0,
        cv=round(float(durations.std() / mean), 4) if mean > 0 else 0.0,
        marked=analyses.steps.marked,
    )


def _source(job: JobFacts, analyses: Analyses) -> Source:
    device_names = sorted({name for info in job.ranks for name in info.device_names if name})
    signs = job.host_signs  # the job's ranks' signs, merged
    # kernels launched but not recorded make a GPU run, whatever its (missing) device events say
    launched = analyses.recording is not None and analyses.recording.launches_without_work
    device = device_label(device_names, job.has_device, launched, signs)
    torch_versions = sorted({info.versions["torch"] for info in job.ranks if "torch" in info.versions})
    world_sizes = {info.world_size for info in job.ranks if info.world_size}
    return Source(
        paths=tuple(info.path for info in job.ranks),
        torch_version=torch_versions[0] if torch_versions else None,
        device=device,
        world_size=max(world_sizes) if world_sizes else len(job.ranks),
    )
