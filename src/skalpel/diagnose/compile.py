"""torch.compile findings: recompilation in steady state."""

from __future__ import annotations

from ..analysis.compile import compile_events
from . import thresholds
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

_GUARD_HINT = "not recorded in the trace: rerun with TORCH_LOGS=recompiles to print the failing guard"


def _check_recompilation(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.result("compile", lambda: compile_events(ctx.trace, ctx.steps))
    if result is None or not result.used:
        return []  # no torch.compile in this trace: nothing to judge
    if not ctx.steps.marked:
        return NotJudged("no steps marked: cannot tell steady-state recompilation from the first compilation")
    limits = rule.thresholds
    steps = ctx.steps.steps
    step_count = max(len(steps), 1)
    step_ms = sum(step.duration_ms for step in steps)
    steady = result.compilations_after_first_step
    share = pct(steady, step_count)
    evidence = {
        "recompiles_in_steps": steady,
        "recompiling_steps_pct": share,
        "compile_ms": result.compile_ms,
        "compile_share_pct": pct(result.compile_ms, step_ms),
        "compile_ids": list(result.compile_ids),
        "recompiles_seen": result.recompiles,
        "guard": _GUARD_HINT,
    }
    if steady >= limits.floor and share >= limits.share_pct:
        events = list(result.compile_events)
        return [rule.finding(evidence, locations=ctx.locations(events))]
    if result.recompiles >= limits.floor:
        title = (
            f"torch.compile recompiled {result.recompiles} time(s) before the profiled steps "
            f"(compile ids {', '.join(result.compile_ids[:6])})"
        )
        return [rule.finding(evidence, severity="info", title=title)]
    return []


RECOMPILATION = Rule(
    id="recompilation",
    family="compile",
    severity="warning",
    title="torch.compile recompiles in {recompiles_in_steps} profiled step(s) ({recompiling_steps_pct:.0f}% of steps, {compile_ms:.0f} ms compiling)",
    thresholds=thresholds.RECOMPILATION,
    check=_check_recompilation,
    fix="make shapes static (pad or bucket batch sizes and sequence lengths, drop_last=True) or compile with "
    "dynamic=True / torch._dynamo.mark_dynamic(x, 0); keep Python values that guards check constant",
    docs=Docs(
        what="torch.compile compiles again after the first step: compilation ranges (`dynamo`, "
        "`entire_frame_compile`) inside the profiled steps, or compiled regions `Torch-Compiled Region: N/M` "
        "with compile id M >= 1 (the M-th recompilation of frame N).",
        why="Each recompilation costs from hundreds of milliseconds to minutes of Python-side compilation, and "
        "after `cache_size_limit` (8) recompilations the frame silently falls back to eager mode.",
        evidence="Compilations inside the profiled steps and the share of steps that recompiled, time spent "
        "compiling, the compile ids seen, and the failing guard when it is known (the trace itself does not "
        "record it). The location is the user code that calls the compiled function.",
        fix="Keep input shapes static (pad/bucket sequence lengths, `drop_last=True` for the last batch) or mark "
        "the varying dimension dynamic (`torch.compile(dynamic=True)`, `torch._dynamo.mark_dynamic`); avoid "
        "guards on changing Python values (global flags, ints passed as arguments).",
        false_positives="A second compilation for the backward graph or a one-time recompilation when training "
        "switches to evaluation is expected; a profile that records the first steps sees the first compilation "
        "(use warm-up steps).",
    ),
)

RULES = (RECOMPILATION,)
