"""device_activity_missing: a GPU run whose kernels the trace does not have."""

from __future__ import annotations

from . import thresholds
from .rule import Context, Docs, Outcome, Rule

CANNOT_JUDGE = "device idle time, kernels, copies, launch delays, syncs' cost, attention and communication kernels"


def _check_missing(ctx: Context, rule: Rule) -> Outcome:
    limits = rule.thresholds
    result = ctx.analyses.recording
    findings = []
    for rank, recording in result.ranks.items():
        if recording.launch_calls < limits.floor or recording.missing_pct < limits.share_pct or not recording.linking_works:
            continue
        none = recording.device_events == 0
        evidence = {
            "missing_pct": recording.missing_pct,
            "launch_calls": recording.launch_calls,
            "launch_calls_with_work": recording.launch_calls_with_work,
            "device_events": recording.device_events,
            "device": next((name for name in _device_names(ctx, rank) if name), "unknown"),
            "cannot_judge": CANNOT_JUDGE,
        }
        title = (
            f"A GPU run without its device activity: {recording.launch_calls} kernel launches and copies on the host, "
            + ("no kernel recorded" if none else f"{recording.missing_pct:.0f}% of them without their device work")
        )
        findings.append(rule.finding(evidence, rank=rank, title=title))
    return findings


def _device_names(ctx: Context, rank: int) -> tuple[str, ...]:
    return next((info.device_names for info in ctx.ranks if info.rank == rank), ())


DEVICE_ACTIVITY_MISSING = Rule(
    id="device_activity_missing",
    family="measurement",
    severity="warning",
    title="A GPU run without its device activity: {launch_calls} launches, {missing_pct:.0f}% without device work",
    thresholds=thresholds.DEVICE_ACTIVITY_MISSING,
    check=_check_missing,
    fix="record the device: torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]); "
    "make CUPTI usable (the libcupti of the CUDA toolkit on LD_LIBRARY_PATH; inside containers and for non-root "
    "users allow profiling: NVreg_RestrictProfilingToAdminUsers=0 or run with CAP_SYS_ADMIN); let the profiler "
    "stop normally so that it flushes the device buffers",
    docs=Docs(
        what="Launch calls on the host (`cudaLaunchKernel`, `cuLaunchKernel`, `hipLaunchKernel`, "
        "`cudaMemcpyAsync`, graph launches) whose device work the trace does not have: no kernel, copy or memset "
        "carries their correlation id. The trace then describes a GPU run with its device side missing, and it "
        "is labelled with the GPU its header names, not as a CPU run.",
        why="Without device events every GPU question goes unanswered or is answered wrong: the device looks idle "
        "or absent, host time blocked on the device looks like CPU work, and the report reads like a CPU run's.",
        evidence="The share of launch calls without device work, the counts of launch calls, of those with device "
        "work and of device events, the device the header names, and what therefore cannot be judged.",
        fix="Ask for device activity (`activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]`; skalpel run does); "
        "make CUPTI loadable and permitted (`libcupti` on `LD_LIBRARY_PATH`, profiling allowed for non-admin "
        "users, `CAP_SYS_ADMIN` in containers); stop the profiler normally so that the device buffers are "
        "flushed (a capture cut short loses the last kernels).",
        false_positives="A trace cut on purpose to its host side, or one whose device events were filtered out "
        "afterwards, is reported the same way.",
    ),
)

RULES = (DEVICE_ACTIVITY_MISSING,)
