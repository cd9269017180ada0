"""hot_op: one op holds the step, or a fallback (reference) kernel runs on the hot path.

On a CPU-only run every step is ~100% ``cpu_exec`` in the step breakdown, so the breakdown cannot say that one op
takes three quarters of it. Two cases are judged here:

* a **fallback kernel**: the reference implementation torch runs when no fast library path applies
  (``aten::_slow_conv2d_forward`` when oneDNN or cuDNN cannot take a convolution: float64, the library turned off,
  ...). It fires on any device from a smaller share: the fast path is usually many times faster. On the CPU its
  share is the op's self host time; with a device, the device time of the kernels it launched itself.
* a **dominant op** (CPU-only runs): one op name holding most of the step by its self time. Which op it is decides
  what is known: an op with a known cheaper formulation (``sort`` where ``topk`` would do) names it; a matrix
  multiply or a convolution on its fast kernel is the model's own compute (a healthy step is dominated by it, on a
  CPU as on a GPU) and is only an info note; any other op is named with what a user can check.

The share is of the ledger's host lane (the unit's time less one-time work), and the op must reach it in the typical
unit too (the median of its units' shares): one call the scheduler kept off the core for 16 ms is no op that holds
the step. The op's self times, calls and sources come from ``analysis.held_ops``, its shapes from the op table. On a device run no generic rule fires: a GEMM that
dominates device time is the goal there, not a problem.
"""

from __future__ import annotations

from ..analysis.held_ops import HeldCalls, HeldOp, RankHeldOps
from ..analysis.ledger import RankLedger
from ..result.report import OpRow
from . import thresholds
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

# What makes torch take the library path instead of its reference kernels (trace/opnames.py FALLBACK_KERNELS).
_CONV_CPU = ("oneDNN (mkldnn) has no kernel for this convolution, most often its dtype: float64 (a "
             "torch.set_default_dtype(torch.float64), a .double() model or input) or float16; or mkldnn is off "
             "(torch.backends.mkldnn.enabled=False)")  # fmt: skip
_CONV_GPU = ("cuDNN did not take this convolution: torch.backends.cudnn.enabled=False, or a dtype it lacks "
             "(float64)")  # fmt: skip
_CONV_FIX = ("run the convolution in float32 (model.float() and float32 inputs; or bfloat16 autocast), with "
             "torch.backends.mkldnn / cudnn enabled: the library's kernel is many times faster than the "
             "reference")  # fmt: skip

# Ops with a cheaper formulation for the common way they are misused; said as a question, the script decides.
CHEAPER = {
    "aten::sort": "if only the first k values (or the largest) are used after it, torch.topk(x, k) (or max/amax, "
    "kthvalue) finds them without sorting the whole dimension",
    "aten::argsort": "if only the first k indices are used after it, torch.topk(x, k).indices avoids the full sort",
    "aten::linalg_inv_ex": "if the inverse only multiplies a matrix or vector, torch.linalg.solve(A, B) is cheaper "
    "and more accurate than inv(A) @ B",
    "aten::linalg_pinv": "if the pseudo-inverse only multiplies a matrix, torch.linalg.lstsq(A, B) avoids it",
    "aten::copy_": "a copy this large every step is a tensor materialised (.contiguous(), .clone(), .to(), an "
    "expand made real): keep the view and let broadcasting do the rest, or make it once outside the step",
    "aten::_cdist_backward": "cdist's backward on small point dimensions: compute_mode='use_mm_for_euclid_dist' "
    "takes the matrix-multiply path",
}


def _check_hot_op(ctx: Context, rule: Rule) -> Outcome:
    ledger = ctx.analyses.ledger
    if ledger is None or not ledger.ranks:
        return NotJudged("no steps with host ops")
    if ctx.analyses.has_device:
        return _device_fallbacks(ctx, rule, ledger.ranks)
    held = ctx.analyses.held_ops
    if held is None or not held.ranks:
        return NotJudged("no host ops in the steps")
    findings = []
    for rank, ops in held.ranks.items():
        rank_ledger = ledger.for_rank(rank)
        host = rank_ledger.lane("host") if rank_ledger is not None else None
        if host is None or not ops.ops:
            continue
        found = _cpu_finding(ctx, rule, rank_ledger, ops)
        if found is not None:
            findings.append(found)
    return findings


def _cpu_finding(ctx: Context, rule: Rule, rank_ledger: RankLedger, held: RankHeldOps):
    limits = rule.thresholds
    host = rank_ledger.lane("host")
    units = max(len(host.units), 1)
    steady_ms = host.steady_ms  # the op's time leaves one-time work out too
    if steady_ms <= 0:
        return None
    fallback = held.reference
    fallback_pct = limits.param("fallback_share_pct")
    if fallback is not None and pct(fallback.ms, steady_ms) >= fallback_pct \
            and fallback.ms / units >= limits.param("fallback_floor_ms") \
            and typical_share_pct(fallback, host) >= fallback_pct:  # fmt: skip
        others = [op for op in held.ops[:4] if not op.reference][:2]
        return _finding(ctx, rule, rank_ledger, fallback, steady_ms, units, others, kind="fallback",
                        fix=f"{_CONV_FIX}; it runs the reference kernel because {_CONV_CPU}")  # fmt: skip
    top = held.ops[0]
    if 100.0 * top.self_ms / steady_ms < limits.share_pct or top.self_ms / units < limits.floor:
        return None
    if typical_share_pct(held.top, host) < limits.share_pct:
        return None  # it holds some units, not the step: a stall (preemption) or a step unlike the others
    kind = "compute" if top.library_compute else "dominant"
    return _finding(ctx, rule, rank_ledger, held.top, steady_ms, units, list(held.ops[1:3]), kind=kind,
                    fix=_dominant_fix(top))  # fmt: skip


def typical_share_pct(held: HeldCalls, host) -> float:
    """The calls' share of the typical unit (``Lane.typical_share_pct``); without per-unit times (none recorded)
    the mean share stands."""
    typical = host.typical_share_pct(held.unit_ms)
    return typical if typical is not None else pct(held.ms, host.steady_ms)


def _finding(ctx, rule, rank_ledger, held: HeldCalls, steady_ms, units, others: list[HeldOp], *, kind, fix):
    lead = held.ops[0]
    share = pct(held.ms, steady_ms)
    row = _row(ctx, rank_ledger.rank, lead)
    evidence = {
        "op": lead,
        "share_pct": share,
        "ms_per_step": held.ms / units,
        "calls_per_step": held.calls / units,
        "kind": kind,
        "ops": list(held.ops),
        "ms_per_call": held.ms / max(held.calls, 1),
        "typical_share_pct": typical_share_pct(held, rank_ledger.lane("host")),
        "step_ms": steady_ms / units,
        "judged_over": rank_ledger.describe(),
        "input_shapes": row.input_shapes if row is not None else None,
        "source": held.source,
        "next_ops": [{"op": op.name, "share_pct": pct(op.self_ms, steady_ms)} for op in others],
    }
    locations = ctx.locations(held.located)
    if kind == "fallback":
        title = (f"A fallback kernel holds the step: torch's reference convolution ({', '.join(held.ops)}) takes "
                 f"{share:.0f}% of it ({held.ms / units:.1f} ms/step, {_calls(held.calls / units)})")
    else:
        title = (f"One op holds the step: {lead} takes {share:.0f}% of it ({held.ms / units:.1f} ms/step, "
                 f"{_calls(held.calls / units)})")
        title += "; the model's own matrix multiplies or convolutions" if kind == "compute" else ""
    module = _module_words(ctx, rank_ledger.rank, list(held.ops), evidence)
    title += module
    where = f" at {locations[0]}" if locations and ".py:" in locations[0] else ""
    shapes = f" (input shapes {evidence['input_shapes']})" if evidence["input_shapes"] else ""
    fix = f"{lead}{where}{shapes}: {fix}"
    severity = "info" if kind == "compute" else rule.severity_for(share)
    return rule.finding(evidence, locations=locations, rank=rank_ledger.rank, title=title, fix=fix, severity=severity)


def _module_words(ctx: Context, rank: int, ops: list[str], evidence: dict) -> str:
    """Where the ops sit among the modules (analysis/modules.py), into the evidence, and as the title's words:
    ``, in Block > FeedForward > Linear ×8 (65% of its time, model.py:40 in forward)``. The first of ``ops`` (the
    lead, then the group's others: a backward kernel runs outside any module, its forward twin inside one) that one
    module class path holds MODULE_SHARE_PCT of; empty without module frames or where none does."""
    tree = ctx.analyses.modules.for_rank(rank) if ctx.analyses.modules is not None else None
    places = [tree.places.get(op) for op in ops] if tree is not None else []
    place = next((found for found in places if found is not None and found.share_pct >= MODULE_SHARE_PCT), None)
    if place is None:
        return ""
    evidence.update(module=place.module, module_op=place.op, module_instances=place.instances,
                    module_share_pct=place.share_pct, module_location=place.location)  # fmt: skip
    times = f" ×{place.instances}" if place.instances > 1 else ""
    line = f", {place.location}" if place.location else ""
    whose = "its" if place.op == ops[0] else f"{place.op}'s"
    return f", in {place.module}{times} ({place.share_pct:.0f}% of {whose} time{line})"


MODULE_SHARE_PCT = 25.0  # an op's share in one module class path below which the title names no module


def _row(ctx: Context, rank: int, op: str) -> OpRow | None:
    """The op's row of the rank's op table (its most frequent input shapes)."""
    table = ctx.analyses.ops.for_rank(rank) if ctx.analyses.ops is not None else None
    return next((item for item in table.rows if item.name == op), None) if table is not None else None


def _calls(per_step: float) -> str:
    return f"{per_step:g} call{'' if per_step == 1 else 's'}/step"


def _dominant_fix(op: HeldOp) -> str:
    if op.library_compute:
        return ("the step is the model's matrix multiplies or convolutions on their fast kernels: nothing in the "
                "loop to fix; a faster step needs fewer FLOPs (smaller layers, a smaller batch per step) or a "
                "faster kernel (bfloat16 where the CPU has it, more intra-op threads on free cores)")  # fmt: skip
    known = CHEAPER.get(op.name)
    generic = ("the step's speed is this op's: check its input shapes are the ones intended (a broadcast or a "
               "missing batch dimension makes it do more work), whether a cheaper op gives the same result, and that "
               "its dtype has a fast kernel on this device (float32 or bfloat16 on a CPU)")  # fmt: skip
    return f"{known}; if not, check its input shapes and dtype" if known else generic


def _device_fallbacks(ctx: Context, rule: Rule, ranks: dict[int, RankLedger]) -> Outcome:
    """With a device: only fallback kernels, by the device time they launched; a dominant GEMM is healthy there."""
    limits = rule.thresholds
    held = ctx.analyses.held_ops
    if ctx.analyses.ops is None or held is None:
        return NotJudged("no op table")
    findings = []
    for rank, rank_ledger in ranks.items():
        lane = rank_ledger.lane("device")
        rank_held = held.for_rank(rank)
        if lane is None or rank_held is None or rank_held.reference is None:
            continue
        slow = rank_held.reference
        units = max(len(lane.units), 1)
        steady_ms = lane.steady_ms
        share = min(pct(slow.ms, steady_ms), 100.0)  # the op table spans the trace, the lane its steps
        if share < limits.param("fallback_share_pct") or slow.ms / units < limits.param("fallback_floor_ms"):
            continue
        lead = slow.ops[0]
        row = _row(ctx, rank, lead)
        locations = ctx.locations(slow.located)
        evidence = {"op": lead, "share_pct": share, "ms_per_step": slow.ms / units,
                    "calls_per_step": slow.calls / units, "kind": "fallback",
                    "ops": list(slow.ops),
                    "step_ms": steady_ms / units, "judged_over": rank_ledger.describe(),
                    "input_shapes": row.input_shapes if row is not None else None, "time": "device"}  # fmt: skip
        title = (f"A fallback kernel holds the device: {lead} (reference convolution) launches {share:.0f}% of "
                 f"the step's device time ({slow.ms / units:.1f} ms/step)")  # fmt: skip
        title += _module_words(ctx, rank, list(slow.ops), evidence)
        where = f" at {locations[0]}" if locations and ".py:" in locations[0] else ""
        fix = f"{lead}{where}: {_CONV_FIX}; it runs the reference kernel because {_CONV_GPU}"
        findings.append(rule.finding(evidence, locations=locations, rank=rank, title=title, fix=fix,
                                     severity=rule.severity_for(share)))  # fmt: skip
    return findings


HOT_OP = Rule(
    id="hot_op",
    family="device",
    severity="warning",
    title="One op holds the step: {op} takes {share_pct:.0f}% of it ({ms_per_step:.1f} ms/step)",
    thresholds=thresholds.HOT_OP,
    check=_check_hot_op,
    fix="name the op's line and shapes; a cheaper formulation, or the dtype/layout that takes the fast kernel",
    docs=Docs(
        what="One op holds the step. Either a fallback kernel (the reference implementation torch runs when no "
        "library path applies: aten::_slow_conv2d_forward / _backward, slow_conv_dilated2d, slow_conv_transpose2d, "
        "thnn_conv2d, slow_conv3d) takes fallback_share_pct of the step or more, on any device; or, on a CPU-only "
        "run, a single op name takes share_pct of the step or more by its self time. A matrix multiply or a "
        "convolution on its fast kernel dominating a CPU step is the model's own compute: an info note, no warning.",
        why="On a CPU-only run the step breakdown is all cpu_exec, so without this the verdict reads \"no "
        "bottleneck\" while one op takes three quarters of every step: a sort where topk would do, or a float64 "
        "convolution on the reference kernel (on torch 2.13's CPU several times slower than oneDNN's float32 "
        "one). A fix to one line then speeds up the whole step.",
        evidence="`op` and `ops` (the fallback kernels counted), `kind` (fallback, dominant or compute), "
        "`share_pct` of the step (the ledger's host lane less one-time work; on a device run, the device time the "
        "fallback kernels launched against the device lane), `typical_share_pct` (CPU-only: the median over the "
        "units of the op's share of each, which must pass the threshold too: one call stalled by the scheduler "
        "inflates the mean share from one unit), `ms_per_step`, `calls_per_step`, `ms_per_call`, "
        "`input_shapes` (the op table's most frequent), `source` (model, optimizer step or data loading) and "
        "`next_ops` (the next largest ops, to show it stands alone). The locations are the user's lines calling "
        "its heavier calls.",
        fix="A fallback convolution: float32 (or bfloat16) weights and inputs, mkldnn / cudnn enabled, so that the "
        "library kernel takes it. A dominant op: an op with a known cheaper formulation is named (sort -> topk, "
        "inv -> solve); otherwise check its shapes (a broadcast doing more work than meant), a cheaper op giving the "
        "same result, and its dtype. skalpel does not know why an op is slow: the fix says what to check.",
        false_positives="A step that really is one op (a model that is one big embedding bag or one FFT) is its "
        "workload: nothing to fix but the op itself. A float16 convolution on a CPU runs aten::convolution_backward "
        "(a name shared with the fast path) and is not named as a fallback. The backward of a dilated or "
        "transposed fallback convolution runs inside aten::convolution_backward and is not counted in its share. "
        "On a device run only fallback kernels are judged. An op that holds fewer than half of the units and little of "
        "the others (an evaluation every few steps inside the window) is not said to hold the step.",
    ),
)

RULES = (HOT_OP,)
