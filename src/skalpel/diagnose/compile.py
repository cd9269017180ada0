"""torch.compile findings: recompilation in steady state, graph breaks, compile time in the steps.

The trace shows that compilation happened (``dynamo`` ranges, compile ids); why it happened
comes from the compile log ``skalpel run`` writes into the trace header (the failed guard,
the graph-break reasons and lines, the recompile limit). Without it (a trace from elsewhere)
the rules say what the trace shows and how to get the cause.
"""

from __future__ import annotations

import re

from ..analysis.compile import CompileLog, GraphBreaks, LoggedCompilation
from . import thresholds
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

_GUARD_HINT = "not recorded in the trace: run it under `skalpel run` (or with TORCH_LOGS=recompiles) for the failing guard"

# The failed guard, in torch's words, decides the fix (first match wins).
_GUARD_FIXES = (
    ("shape", re.compile(r"size mismatch|stride mismatch|dim mismatch|rank mismatch|ndim|sizes? of|\.size\(\)", re.I),
     "the input shape changed: mark the varying dimension dynamic (torch._dynamo.mark_dynamic(x, dim) or "
     "torch.compile(dynamic=True)) or pad batches and sequence lengths to a few bucket sizes (drop_last=True for "
     "the last batch)"),
    ("grad_mode", re.compile(r"grad_mode|GLOBAL_STATE|no_grad|inference_mode", re.I),
     "the grad mode changed around the compiled model (evaluation under torch.no_grad()): keep train/eval and "
     "no-grad switches outside the compiled region: compile the evaluation path separately (a second "
     "torch.compile of the eval function) or run evaluation eagerly on the uncompiled model"),
    ("training", re.compile(r"\.training\b|training ==|'training'", re.I),
     "module.train()/eval() flipped the `training` flag the graph was specialised on: evaluate with a separately "
     "compiled function (or the uncompiled model) instead of switching the compiled one"),
    ("dtype_device", re.compile(r"dtype|device|requires_grad|dispatch key", re.I),
     "an input's dtype, device or requires_grad changed: keep them the same on every call (cast once, outside)"),
    ("python_value", re.compile(r"==|ID_MATCH|TYPE_MATCH|EQUALS_MATCH|___check_obj_id|len\(", re.I),
     "a Python value the graph was specialised on changed (a number, a flag, an object): pass it as a tensor, "
     "keep it constant, or move it out of the compiled function"),
)
_GENERIC_FIX = (
    "make shapes static (pad or bucket batch sizes and sequence lengths, drop_last=True) or compile with "
    "dynamic=True / torch._dynamo.mark_dynamic(x, 0); keep Python values that guards check constant"
)


def _check_recompilation(ctx: Context, rule: Rule) -> Outcome:
    result, log = ctx.analyses.compile, ctx.analyses.compile_log
    used = (result is not None and result.used) or (log is not None and bool(log.compilations))
    if not used:
        return []  # no torch.compile in this trace: nothing to judge
    if not ctx.steps.marked:
        return NotJudged("no steps marked: cannot tell steady-state recompilation from the first compilation")
    limits = rule.thresholds
    step_count = max(len(ctx.steps.steps), 1)
    step_ms = sum(step.duration_ms for step in ctx.steps.steps)
    recompiles = log.recompiles if log is not None else ()
    in_window = [item for item in recompiles if item.in_window]
    steady = len({(item.rank, item.step) for item in in_window}) if log is not None else result.compilations_after_first_step
    share = pct(steady, step_count)
    shown = in_window or list(recompiles)
    guard = shown[0].recompile_reason if shown else None
    kind, fix = _fix_for(guard)
    evidence = {
        "recompiles_in_steps": steady,
        "recompiling_steps_pct": share,
        "compile_ms": result.compile_ms if result is not None else 0.0,
        "compile_share_pct": pct(result.compile_ms, step_ms) if result is not None else 0.0,
        "compile_ids": sorted({item.compile_id for item in recompiles} | set(result.compile_ids if result else ())),
        "recompiles_seen": max(len(recompiles), result.recompiles if result is not None else 0),
        "guard": _short(guard) if guard else _GUARD_HINT,
        "guard_kind": kind,
        "recompiled": [_described(item) for item in shown[:8]],
    }
    if shown:
        evidence["function"] = shown[0].location
    locations = _locations(ctx, shown, result)
    if steady >= limits.floor and share >= limits.share_pct:
        title = f"torch.compile recompiles in {steady} profiled step(s) ({share:.0f}% of steps)" + (
            f": {_short(guard, 90)}" if guard else f", {evidence['compile_ms']:.0f} ms compiling"
        )
        return [rule.finding(evidence, locations=locations, fix=fix, title=title)]
    if evidence["recompiles_seen"] >= limits.floor:
        title = f"torch.compile recompiled {evidence['recompiles_seen']} time(s) before the profiled steps" + (
            f": {_short(guard, 90)}" if guard else f" (compile ids {', '.join(evidence['compile_ids'][:6])})"
        )
        return [rule.finding(evidence, severity="info", title=title, locations=locations, fix=fix)]
    return []


def _fix_for(guard: str | None) -> tuple[str, str]:
    if guard:
        for kind, pattern, fix in _GUARD_FIXES:
            if pattern.search(guard):
                return kind, fix
    return "unknown", _GENERIC_FIX


def _described(item: LoggedCompilation) -> dict:
    return {"compile_id": item.compile_id, "step": item.step, "function": item.frame, "guard": _short(item.recompile_reason or "")}


def _locations(ctx: Context, items: list[LoggedCompilation], result) -> tuple[str, ...]:
    """The user's lines that called the compiled code when it recompiled, then the compiled function."""
    found: list[str] = []
    for item in items:
        for location in (item.call_site, item.location):
            if location and location not in found:
                found.append(location)
    if found:
        return tuple(found[:3])
    return ctx.locations(list(result.compile_events)) if result is not None else ()


def _short(text: str | None, limit: int = 240) -> str:
    """The guard's first part: torch appends the source line and a user stack after ' # ' and ' | '."""
    text = (text or "").split(" | ", 1)[0]
    text = re.sub(r"\s{2,}#.*$", "", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- graph breaks ----------------------------------------------------------------------------------
def _check_graph_break(ctx: Context, rule: Rule) -> Outcome:
    log, found = ctx.analyses.compile_log, ctx.analyses.graph_breaks
    if found is None:
        return []
    if log is None:
        return _graph_break_from_regions(ctx, rule, found)
    steps = ctx.steps.steps
    step_ms = sum(step.duration_ms for step in steps) or 1.0
    step_count = max(len(steps), 1)
    time = found.time
    breaks = log.graph_breaks
    evidence = {
        "graph_breaks": len(breaks),
        "reasons": [item.reason for item in breaks[:8]],
        "lines": [item.location for item in breaks[:8]],
        **_break_cost(time, step_ms, step_count),
    }
    hints = sorted({hint for item in breaks for hint in item.hints})
    fix = "remove what breaks the graph from the compiled code: " + "; ".join(
        f"{item.location}: {_short(item.reason, 100)}" for item in breaks[:3]
    ) + (f" ({hints[0]})" if hints else "") + "; or move it outside the compiled function (fullgraph=True makes a break an error)"
    first = breaks[0]
    title_tail = f"{_short(first.reason, 80)} at {first.location}"
    ran = time.calls > 0 and len(breaks) >= rule.thresholds.floor
    if ran and _judged_share(evidence) >= rule.thresholds.share_pct:
        title = f"torch.compile graph break{'s' if len(breaks) > 1 else ''} {_cost_text(evidence)}: {title_tail}"
        return [rule.finding(evidence, locations=[item.location for item in breaks[:3]], fix=fix, title=title)]
    title = f"torch.compile graph break{'s' if len(breaks) > 1 else ''} ({len(breaks)}): {title_tail}"
    return [rule.finding(evidence, severity="info", locations=[item.location for item in breaks[:3]], fix=fix, title=title)]


def _break_cost(time, step_ms: float, step_count: int) -> dict:
    """What the breaks cost the steps: the split functions' region time, the eager code between their graphs and,
    on a GPU, the device's idle time inside the regions (the cost a device-bound step feels)."""
    idle = time.device_idle_ms
    return {
        "region_ms_per_step": time.region_ms / step_count,
        "share_pct": pct(time.region_ms, step_ms),
        "eager_ms_per_step": time.eager_ms / step_count if time.measured else None,
        "eager_share_pct": pct(time.eager_ms, step_ms) if time.measured else None,
        "device_idle_ms_per_step": idle / step_count if idle is not None else None,
        "device_idle_share_pct": pct(idle, step_ms) if idle is not None else None,
        "split_calls_per_step": time.calls / step_count,
    }


def _judged_share(evidence: dict) -> float:
    """The share the threshold judges: the device's idle inside the regions on a GPU, else the region's share."""
    idle = evidence["device_idle_share_pct"]
    return idle if idle is not None else evidence["share_pct"]


def _cost_text(evidence: dict) -> str:
    if evidence["device_idle_share_pct"] is not None:
        return (f"leave the device idle {evidence['device_idle_share_pct']:.0f}% of the step "
                f"({evidence['device_idle_ms_per_step']:.2f} ms/step) inside the split functions")  # fmt: skip
    eager = evidence["eager_share_pct"]
    return f"split {evidence['share_pct']:.0f}% of the step" + (
        f", {eager:.1f}% of the step eager between graphs" if eager is not None else "")


_NO_REASON = "why is not in the trace: run it under `skalpel run` (or with TORCH_LOGS=graph_breaks) for the reason and the line"


def _graph_break_from_regions(ctx: Context, rule: Rule, found: GraphBreaks) -> Outcome:
    """Without the compile log: compiled frames that ran inside another frame's region are the breaks' resume frames.

    One frame, or frames side by side (a compiled model and a compiled loss), show no break and stay quiet.
    """
    split, time = found.split, found.time
    if time is None:
        return []
    steps = ctx.steps.steps
    step_ms = sum(step.duration_ms for step in steps) or 1.0
    step_count = max(len(steps), 1)
    breaks = len(split.inner)
    located = ctx.user_lines(list(split.events))
    evidence = {
        "graph_breaks": breaks,
        "reasons": [_NO_REASON],
        "lines": list(located),
        "frames": list(split.pairs[:8]),
        "nested_calls": split.nested_calls,
        **_break_cost(time, step_ms, step_count),
    }
    where = located[0] if located else f"compiled frame {split.pairs[0].split(' inside ')[1]}"
    plural = "s" if breaks > 1 else ""
    tail = f"{breaks} resume frame{plural} ran inside {where} ({', '.join(split.pairs[:3])})"
    fix = (
        f"{_NO_REASON}; then remove what breaks the graph from the compiled code (`.item()`, `print`, data-dependent "
        "`if`, an unsupported call) or move it outside the compiled function (fullgraph=True makes a break an error)"
    )
    locations = located or tuple(f"Torch-Compiled Region: {pair.split(' inside ')[0]}" for pair in split.pairs[:3])
    if time.calls > 0 and _judged_share(evidence) >= rule.thresholds.share_pct:
        title = f"torch.compile graph break{plural} {_cost_text(evidence)}: {tail}"
        return [rule.finding(evidence, locations=locations, fix=fix, title=title)]
    title = f"torch.compile graph break{plural} ({breaks}): {tail}"
    return [rule.finding(evidence, severity="info", locations=locations, fix=fix, title=title)]


# -- compile time inside the steps, the recompile limit ---------------------------------------------
def _check_compile_overhead(ctx: Context, rule: Rule) -> Outcome:
    result, log = ctx.analyses.compile, ctx.analyses.compile_log
    if (result is None or not result.used) and log is None:
        return []
    findings = []
    if log is not None and log.limits:
        limit = log.limits[-1]
        evidence = {
            "limit": limit.limit, "limit_value": limit.value, "function": limit.function,
            "last_guard": _short(limit.last_reason), "in_profiled_steps": limit.in_window, "share_pct": 100.0,
        }  # fmt: skip
        kind, fix = _fix_for(limit.last_reason)
        title = (
            f"torch.compile hit {limit.limit} ({limit.value}) for {limit.function}: it now runs eagerly "
            f"(last guard: {_short(limit.last_reason, 80)})"
        )
        fix = f"{fix}; raising torch._dynamo.config.{limit.limit} only hides the recompilations"
        findings.append(rule.finding(evidence, title=title, fix=fix, locations=_limit_locations(log)))
    steps = ctx.steps.steps
    step_ms = sum(step.duration_ms for step in steps) or 1.0
    traced = ctx.analyses.compile_in_steps
    logged = [item for item in (log.compilations if log else ()) if item.in_window] if ctx.steps.marked else []
    logged_ms = sum(item.duration_ms for item in logged)
    compile_ms = max(traced.ms, logged_ms)
    share = pct(compile_ms, step_ms)
    if compile_ms < rule.thresholds.floor or share < rule.thresholds.share_pct:
        return findings
    # Steady state: compilation after each rank's first profiled step (a recompilation), or logged in one.
    steady = traced.steady_ms >= rule.thresholds.floor or any(item.step != _first_step(ctx, item.rank) for item in logged)
    evidence = {"compile_ms": compile_ms, "share_pct": share, "steps": len(steps), "step_ms": step_ms,
                "steady_state_ms": max(traced.steady_ms, sum(i.duration_ms for i in logged if i.step != _first_step(ctx, i.rank))),
                "compilations": max(len(traced.events), len(logged)), "steps_marked": ctx.steps.marked}  # fmt: skip
    where = "inside the profiled steps" if ctx.steps.marked else "in the profiled window (no steps marked)"
    title = f"torch.compile compiles for {compile_ms:.0f} ms {where} ({share:.0f}% of their time)"
    locations = _locations(ctx, logged, result) if logged else ctx.locations(list(traced.events))
    locations = locations or ((traced.first_name,) if traced.first_name is not None else ())
    if steady:
        findings.append(rule.finding(evidence, title=title, locations=locations))
    elif not ctx.steps.marked:  # first compilation or recompilations: without steps the trace cannot tell
        fix = ("warm the compiled model up (run it on a few batches) before profiling, and mark the steps "
               "(prof.step() each iteration, or skalpel run) so that a recompilation can be told from the first "
               "compilation, which each process pays once")  # fmt: skip
        findings.append(rule.finding(evidence, title=title, locations=locations, fix=fix))
    else:
        title += ": the first profiled step only, a one-time cost that distorts the measurement"
        fix = "warm up before measuring: profile from a later step (schedule(wait=1, warmup=1, ...)) so compilation is done"
        findings.append(rule.finding(evidence, severity="info", title=title, locations=locations, fix=fix))
    return findings


def _first_step(ctx: Context, rank: int) -> int | None:
    numbers = [step.number for step in ctx.steps.for_rank(rank)]
    return min(numbers) if numbers else None


def _limit_locations(log: CompileLog) -> tuple[str, ...]:
    found = [item.call_site for item in log.recompiles if item.call_site] + [item.location for item in log.recompiles]
    return tuple(dict.fromkeys(found))[:3]


RECOMPILATION = Rule(
    id="recompilation",
    family="compile",
    severity="warning",
    title="torch.compile recompiles in {recompiles_in_steps} profiled step(s) ({recompiling_steps_pct:.0f}% of steps, {compile_ms:.0f} ms compiling)",
    thresholds=thresholds.RECOMPILATION,
    check=_check_recompilation,
    fix=_GENERIC_FIX,
    docs=Docs(
        what="torch.compile compiles again after the first step: the compile log of `skalpel run` (dynamo's "
        "compilation metrics) reports a recompilation with its failed guard inside the profiled steps, or the "
        "trace has compilation ranges (`dynamo`, `entire_frame_compile`) there, or compiled regions "
        "`Torch-Compiled Region: N/M` with compile id M >= 1 (the M-th recompilation of frame N).",
        why="Each recompilation costs from hundreds of milliseconds to minutes of Python-side compilation, and "
        "after `recompile_limit` (8) recompilations the frame silently falls back to eager mode.",
        evidence="Recompiling steps and their share, time spent compiling, the compile ids, the guard that failed "
        "in torch's words (e.g. `tensor 'x' size mismatch at index 0. expected 8, actual 9`, `GLOBAL_STATE "
        "changed: grad_mode`) and its kind (shape, grad_mode, training, dtype_device, python_value). The locations "
        "are the user's line that called the compiled code and the compiled function.",
        fix="The fix follows the guard: for sizes, `torch._dynamo.mark_dynamic` / `dynamic=True` or padding to "
        "buckets; for grad mode or train/eval, keep those switches outside the compiled region (compile the "
        "evaluation separately); for Python values, pass them as tensors or keep them constant.",
        false_positives="A second compilation for the backward graph or a one-time recompilation when training "
        "switches to evaluation is expected; a profile that records the first steps sees the first compilation "
        "(use warm-up steps).",
    ),
)

GRAPH_BREAK = Rule(
    id="graph_break",
    family="compile",
    severity="warning",
    title="torch.compile graph breaks ({graph_breaks})",
    thresholds=thresholds.GRAPH_BREAK,
    check=_check_graph_break,
    fix="remove what breaks the graph from the compiled code, or move it outside the compiled function",
    docs=Docs(
        what="Dynamo could not trace part of a compiled function (`.item()`, `print`, data-dependent control "
        "flow, an unsupported call) and split it into several graphs with eager Python between them. Read from "
        "the compile log `skalpel run` writes (dynamo's graph_breaks log and compilation metrics); without it, "
        "from the trace: a compiled frame's `Torch-Compiled Region: K/0` inside another frame's region is the "
        "resume frame a break leaves (the reason is then unknown).",
        why="Each break ends a graph: no fusion across it, a guard check and a Python call per piece on every "
        "call, and often a host-device sync (`.item()`). On a GPU the device idles while the host runs the eager "
        "part.",
        evidence="How many breaks, their reasons in torch's words and the user's lines; the time per step in the "
        "split functions' compiled regions and its share of the step; the eager time between the graphs (the "
        "regions minus the graphs run inside them, with AOTAutograd backends such as Inductor); on a GPU the device's "
        "idle time inside the regions, which is what the threshold judges there: the host's region and eager times "
        "include its waits for the device (a break on a tensor's value syncs), so a device-bound step loses only "
        "that idle (an H200 run: eager 59% of the step, device idle 4.2%; removing the break saved 3.5%). Without "
        "a device, the region's share of the step is judged.",
        fix="Remove the break: keep `.item()`, `print` and logging out of the compiled function (return the "
        "tensor and read it outside), replace data-dependent `if` with `torch.where`, or set "
        "`torch._dynamo.config.capture_scalar_outputs = True` for `.item()`. `fullgraph=True` turns a break "
        "into an error so it cannot come back.",
        false_positives="A break in a function that is a small part of the step (below the share) is reported "
        "as info only; breaks the user accepts on purpose (a debugging print) still show as info.",
    ),
)

COMPILE_OVERHEAD = Rule(
    id="compile_overhead",
    family="compile",
    severity="warning",
    title="torch.compile compiles for {compile_ms:.0f} ms inside the profiled steps",
    thresholds=thresholds.COMPILE_OVERHEAD,
    check=_check_compile_overhead,
    fix="make the compiled code stable across steps (see the recompilation finding), and warm up before measuring",
    docs=Docs(
        what="Compilation inside the profiled steps (the whole window when none are marked), from the trace's "
        "compilation ranges (`(dynamo_timed)` ranges, dynamo's and inductor's compile functions in the Python "
        "stacks) or the compile log's durations; only the first profiled step compiling is info; and dynamo reaching its recompile limit (`recompile_limit`, "
        "`cache_size_limit` before torch 2.6), after which the function runs eagerly, without a word.",
        why="Compiling costs from tenths of a second to minutes; inside the steps it dominates their time. A "
        "function past the recompile limit loses the speed-up of compiling at all while still paying for guard "
        "checks.",
        evidence="Milliseconds compiling inside the profiled steps and their share of the steps' time; for a "
        "limit reached, the limit, its value, the function and the last guard that failed.",
        fix="Remove the cause of the recompilations (the recompilation finding names the guard and its fix); "
        "compile before measuring (warm-up steps). Raising the recompile limit only hides the problem.",
        false_positives="A one-time compilation of an evaluation path inside the window is real time spent, but "
        "it will not repeat; lazy backward compilation in the first profiled step of a run without warm-up.",
    ),
)

RULES = (RECOMPILATION, GRAPH_BREAK, COMPILE_OVERHEAD)
