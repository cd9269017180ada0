"""Findings: rules over analysis results that name the bottleneck, prove it, locate it and say the fix.

``diagnose(analyses, capture)`` runs every rule of the registry and returns the findings,
most severe first, followed by notes on what could not be judged and, when no rule fired
at warning or above, a "no bottleneck found" statement with the numbers behind it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..report.model import SEVERITIES, CaptureInfo, Finding
from .registry import BY_ID, REDIRECTS, RULES, judged_rules, lookup
from .rule import Context, NotJudged, Rule
from .verdict import no_bottleneck, not_judged

__all__ = ["BY_ID", "REDIRECTS", "RULES", "Rule", "diagnose", "lookup"]

NO_DEVICE = "no device activity in the trace; GPU rules apply to GPU runs only"
NOT_RECORDED = "kernels were launched but not recorded (see device_activity_missing): GPU rules cannot judge this GPU run"
NO_STEPS = "no steps marked (call prof.step() per iteration or use skalpel run): cannot judge per step"


def diagnose(analyses: Any, capture: CaptureInfo | None = None) -> tuple[Finding, ...]:
    ctx = Context(analyses, capture)
    findings: list[Finding] = []
    unjudged: dict[str, list[str]] = defaultdict(list)
    has_device = analyses.trace.has_device
    recording = getattr(analyses, "recording", None)
    no_device = NOT_RECORDED if recording is not None and recording.launches_without_work else NO_DEVICE
    for rule in judged_rules():
        if rule.needs_device and not has_device:
            unjudged[no_device].append(rule.id)
            continue
        if rule.needs_steps and not analyses.steps.marked:
            unjudged[NO_STEPS].append(rule.id)
            continue
        outcome = _run(rule, ctx)
        if isinstance(outcome, NotJudged):
            if outcome.applies:
                unjudged[outcome.reason].append(rule.id)
        else:
            findings.extend(outcome)
    findings.sort(key=_order)
    if not any(finding.severity in ("critical", "warning") for finding in findings):
        findings.insert(0, no_bottleneck(ctx))  # the verdict leads; info notes follow it
    findings.extend(not_judged(reason, ids) for reason, ids in unjudged.items())
    return tuple(findings)


def _run(rule: Rule, ctx: Context) -> list[Finding] | NotJudged:
    """Run one rule; a bug in a rule or a trace it cannot handle becomes a note, never a crash."""
    try:
        return rule.check(ctx, rule)
    except Exception as error:  # noqa: BLE001 - one broken rule must not take the report down
        return NotJudged(f"rule error: {type(error).__name__}: {error}")


def _order(finding: Finding) -> tuple[int, float]:
    evidence = finding.evidence
    weight = next((float(evidence[key]) for key in ("share_pct", "idle_pct", "overhead_pct") if key in evidence), 0.0)
    return SEVERITIES.index(finding.severity), -weight
