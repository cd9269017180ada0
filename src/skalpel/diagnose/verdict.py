"""The notes the dispatcher writes itself: rules that could not judge, and "no bottleneck found"."""

from __future__ import annotations

from ..analysis import numeric
from ..result.report import Finding
from . import thresholds
from .rule import Context, Docs, Rule


def _written_by_dispatcher(ctx: Context, rule: Rule) -> list[Finding]:
    return []


NOT_JUDGED = Rule(
    id="not_judged",
    family="verdict",
    severity="info",
    title="Not judged ({reason}): {rules}",
    thresholds=thresholds.NOT_JUDGED,
    check=_written_by_dispatcher,
    fix="",
    docs=Docs(
        what="Rules that could not answer on this trace, grouped by the reason: no steps marked, no memory "
        "events, no device activity, no stacks.",
        why="Silence is not a clean bill of health: a rule that cannot look must say so, so that the user knows "
        "which questions the trace cannot answer and what to record to answer them.",
        evidence="The reason and the ids of the rules it stopped.",
        fix="Record what is missing: `prof.step()` each iteration (or skalpel run), `profile_memory=True`, "
        "`with_stack=True`, CUDA activities on a GPU machine.",
        false_positives="None: it reports what the trace lacks, not a problem of the workload.",
    ),
)

NO_BOTTLENECK = Rule(
    id="no_bottleneck",
    family="verdict",
    severity="info",
    title="No bottleneck found: median step {median_step_ms:.2f} ms, largest share {largest_category} {largest_pct:.0f}%",
    thresholds=thresholds.NO_BOTTLENECK,
    check=_written_by_dispatcher,
    fix="",
    docs=Docs(
        what="No rule fired at warning or critical level: every threshold was checked and none was crossed.",
        why="It is a statement with numbers behind it (step time and where it goes), so it can be checked, and "
        "it tells the user the remaining speed-ups are in the model's own math, not in the loop around it.",
        evidence="The median step time, the largest category of the step-time breakdown and its share, and the "
        "GPU idle share when there is a device (of the marked steps; without markers, of the device's span).",
        fix="Nothing in the training loop; speed-ups now come from the model (mixed precision, fused or "
        "cheaper ops, torch.compile) or a bigger batch.",
        false_positives="Rules that could not judge this trace (see not_judged notes) were not checked.",
    ),
)

RULES = (NOT_JUDGED, NO_BOTTLENECK)


def not_judged(reason: str, rule_ids: list[str]) -> Finding:
    return NOT_JUDGED.finding({"reason": reason, "rules": ", ".join(rule_ids)})


def no_bottleneck(ctx: Context) -> Finding:
    durations = ctx.steps.durations_ms
    evidence: dict = {
        "median_step_ms": numeric.median(durations) if len(durations) else 0.0,
        "steps": len(durations),
        "largest_category": "unknown",
        "largest_pct": 0.0,
    }
    breakdown = ctx.analyses.breakdown
    if breakdown is not None and breakdown.ranks:
        shares = breakdown.ranks[0].pct
        if shares:
            name = max(shares, key=shares.get)
            evidence.update(largest_category=name, largest_pct=shares[name], breakdown_pct=shares)
    gpu = ctx.analyses.step_device if ctx.steps.marked else ctx.analyses.gpu_time  # the steps the user waits for
    if gpu is not None:
        idle = [rank.idle_pct for rank in gpu.ranks.values() if rank is not None]
        if idle:
            evidence["gpu_idle_pct"] = max(idle)
    return NO_BOTTLENECK.finding(evidence)
