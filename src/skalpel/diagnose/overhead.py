"""The CPU side of launch_bound: thousands of tiny host ops per step (framework overhead)."""

from __future__ import annotations

import numpy as np

from ..analysis.breakdown import step_breakdown
from ..analysis.ops import self_times
from ..trace.kinds import Kind
from .common import events_of, pct, windows
from .rule import Context, NotJudged, Outcome, Rule


def check_cpu_overhead(ctx: Context, rule: Rule) -> Outcome:
    """Fires when a step runs many ops, most of them tiny, and little of the step is spent in substantial ops."""
    limits = rule.thresholds
    tiny_us = limits.param("tiny_us")
    breakdown = ctx.result("breakdown", lambda: step_breakdown(ctx.trace, ctx.steps))
    findings = []
    all_windows = windows(ctx)
    if not all_windows:
        return NotJudged("no host ops in the trace")
    for window in all_windows:
        ops = events_of(ctx, window, ctx.trace.kind == Kind.CPU_OP)
        if len(ops) == 0:
            continue
        self_us = self_times(ctx.trace, ops)
        tiny = self_us < tiny_us
        per_step = len(ops) / window.count
        heavy_ms = float(self_us[_substantial(ctx.trace.name[ops], self_us, tiny_us)].sum()) / 1000.0 / window.count
        rank_breakdown = breakdown.for_rank(window.rank) if breakdown is not None else None
        data_ms = rank_breakdown.ms_per_step.get("dataloader", 0.0) if rank_breakdown is not None else 0.0
        step_ms = window.mean_step_ms
        overhead = pct(max(step_ms - heavy_ms - data_ms, 0.0), step_ms)
        tiny_pct = pct(float(tiny.sum()), len(ops))
        if per_step < limits.floor or tiny_pct < limits.share_pct or overhead < limits.param("cpu_overhead_pct"):
            continue
        evidence = {
            "ops_per_step": per_step,
            "tiny_op_pct": tiny_pct,
            "op_median_us": float(np.median(self_us)),
            "overhead_pct": overhead,
            "step_ms": step_ms,
        }
        title = (
            f"Framework overhead: {per_step:.0f} host ops/step, {tiny_pct:.0f}% of them under {tiny_us:g} us; "
            f"{overhead:.0f}% of the step is not spent in substantial ops"
        )
        findings.append(rule.finding(evidence, locations=ctx.locations(ops[tiny]), rank=window.rank, title=title))
    return findings


def _substantial(names: np.ndarray, self_us: np.ndarray, tiny_us: float) -> np.ndarray:
    """Calls of ops whose median self time (by name) reaches ``tiny_us``: real work, not dispatch.

    Judged per name, so a tiny op that a busy machine preempted once does not count as work.
    """
    ids, group = np.unique(names, return_inverse=True)
    medians = np.array([np.median(self_us[group == g]) for g in range(len(ids))])
    return medians[group] >= tiny_us

