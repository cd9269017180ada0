"""Findings: rules over analysis results that name the bottleneck, prove it, locate it and say the fix.

``diagnose(analyses, capture)`` runs every rule of the registry and returns the findings,
most severe first, followed by notes on what could not be judged and, when no rule fired
at warning or above, a "no bottleneck found" statement with the numbers behind it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING

from ..result.report import SEVERITIES, CaptureInfo, Finding
from . import thresholds
from .registry import BY_ID, REDIRECTS, RULES, judged_rules, lookup
from .rule import Context, NotJudged, Rule
from .verdict import no_bottleneck, not_judged

if TYPE_CHECKING:
    from ..analysis.bundle import Analyses

__all__ = ["BY_ID", "REDIRECTS", "RULES", "Rule", "conclude", "diagnose", "judge", "lookup", "unmet_need"]

NO_DEVICE = "no device activity in the trace; GPU rules apply to GPU runs only"
NOT_RECORDED = "kernels were launched but not recorded (see device_activity_missing): GPU rules cannot judge this GPU run"
NO_STEPS = "no steps marked (call prof.step() per iteration or use skalpel run): cannot judge per step"


def diagnose(analyses: Analyses, capture: CaptureInfo | None = None) -> tuple[Finding, ...]:
    ctx = Context(analyses, capture)
    return conclude(ctx, [(rule, judge(rule, ctx)) for rule in judged_rules()])


def judge(rule: Rule, ctx: Context) -> list[Finding] | NotJudged:
    """One rule's outcome: its findings, or why it could not judge this trace."""
    return unmet_need(rule, ctx) or _run(rule, ctx)


# families judged on a window of one-time work too: the measurement's own findings (cold_start names that work) and
# compile's, whose compilations are one-time work by nature
JUDGED_ON_ONE_TIME = frozenset({"measurement", "verdict", "compile"})


# rules that judge the device's time across the steps (its idle time, its collectives): a file cut off before its
# device events ended reads as a device idle where its work was cut away
JUDGES_DEVICE_TIME = frozenset(
    {"gpu_idle", "launch_bound", "host_device_sync", "communication_bound", "low_comm_overlap"}
)


def device_cut_reason(ctx: Context) -> str | None:
    """Why device time is not judged on a rank file cut off before its device events ended; None otherwise."""
    recording = getattr(ctx.analyses, "recording", None)
    cut = recording.device_cut if recording is not None else None
    if cut is None:
        return None
    return (f"rank {cut.rank}'s file ends mid-way: its launches and device events stop {cut.device_cut_ms:,.1f} ms "
            f"into the window, its host ops run to {cut.host_end_ms:,.1f} ms (Kineto writes them first, so a cut "
            "loses the device's record first): device idle and collective time are not judged")


def unmet_need(rule: Rule, ctx: Context) -> NotJudged | None:
    """Why the rule cannot run at all on this trace (no device, no marked steps, nothing but one-time work); None
    when it can."""
    if rule.family not in JUDGED_ON_ONE_TIME and (share := _one_time_window_pct(ctx)) is not None:
        return NotJudged(f"the window is {share:.0f}% one-time work (see cold_start), with no steady state to judge: "
                         "profile later steps (skalpel run warms up first)")  # fmt: skip
    if rule.needs_device and not ctx.analyses.has_device:
        recording = ctx.analyses.recording
        return NotJudged(NOT_RECORDED if recording is not None and recording.launches_without_work else NO_DEVICE)
    if rule.needs_steps and not ctx.steps.marked:
        return NotJudged(NO_STEPS)
    if rule.id in JUDGES_DEVICE_TIME and (cut := device_cut_reason(ctx)) is not None:
        return NotJudged(cut)
    return None


def _one_time_window_pct(ctx: Context) -> float | None:
    """The share of one-time work of a recording that is nearly all one-time work on every rank; None otherwise."""
    found = ctx.analyses.ledger
    ranks = list(found.ranks.values()) if found is not None else []
    if not ranks or not all(rank.all_one_time for rank in ranks):
        return None
    return min(100.0 * rank.one_time_ms / rank.length_ms for rank in ranks)


def conclude(ctx: Context, outcomes: list[tuple[Rule, list[Finding] | NotJudged]]) -> tuple[Finding, ...]:
    """The findings of every rule's outcome, most severe first, then the verdict and the not-judged notes.

    ``outcomes`` are in registry order; a job analysed rank by rank (``skalpel.job.join``)
    merges its ranks' outcomes per rule and concludes here as a whole trace does.
    """
    findings: list[Finding] = []
    unjudged: dict[str, list[str]] = defaultdict(list)
    for rule, outcome in outcomes:
        if isinstance(outcome, NotJudged):
            if outcome.applies:
                unjudged[outcome.reason].append(rule.id)
        else:
            findings.extend(_borderline(rule, finding, ctx.capture) for finding in outcome)
    findings.sort(key=_order)
    if not any(finding.severity in ("critical", "warning") for finding in findings):
        findings.insert(0, no_bottleneck(ctx))  # the verdict leads; info notes follow it
    findings.extend(not_judged(reason, ids) for reason, ids in unjudged.items())
    return tuple(findings)


def _borderline(rule: Rule, finding: Finding, capture: CaptureInfo | None) -> Finding:
    """A finding whose share passed its threshold by less than the margin says so: identical runs may land on
    either side (launch_bound at 50.07% against 50% fired on 2 of 5 runs of the same command)."""
    threshold, share = rule.thresholds.share_pct, finding.evidence.get("share_pct")
    if threshold is None or not isinstance(share, (int, float)) or rule.thresholds.fires_below:
        return finding
    if not threshold <= share < threshold * (1 + thresholds.BORDERLINE_MARGIN_PCT / 100):
        return finding
    words = f"{share:.1f}% against the {threshold:g}% threshold"
    noise = capture.noise_pct if capture is not None else None
    if noise is not None:
        words += f"; the windows' medians spread +-{noise:.0f}%"
    else:
        words += "; an identical run may fall on either side (--repeat 3 measures the spread)"
    evidence = {**finding.evidence, "borderline": words}
    return replace(finding, title=f"{finding.title} (borderline: {share:.1f}% against {threshold:g}%)", evidence=evidence)


def _run(rule: Rule, ctx: Context) -> list[Finding] | NotJudged:
    """Run one rule; a bug in a rule or a trace it cannot handle becomes a note, never a crash."""
    try:
        return rule.check(ctx, rule)
    except Exception as error:  # noqa: BLE001 - one broken rule must not take the report down
        return NotJudged(f"rule error: {type(error).__name__}: {error}")


# findings that state a symptom whose causes other findings name (gpu_idle's blame leads with them): at equal
# severity the causes come first
_SYMPTOMS = frozenset({"gpu_idle"})


def _order(finding: Finding) -> tuple[int, bool, float]:
    evidence = finding.evidence
    weight = next((float(evidence[key]) for key in ("share_pct", "idle_pct", "overhead_pct") if key in evidence), 0.0)
    return SEVERITIES.index(finding.severity), finding.id in _SYMPTOMS, -weight
