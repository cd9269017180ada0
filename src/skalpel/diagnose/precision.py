"""Precision: matmuls in a dtype the hardware runs slowly, or in fp32 where it has a faster path.

* ``slow_low_precision``: a CPU-only run whose matmuls run in bf16 (autocast, or a .bfloat16() model) on a CPU
  where skalpel measured a bf16 matmul slower than an fp32 one (no AMX / AVX-512 BF16, or oneDNN held below them):
  the finding quotes the measured ratio. A stored trace without skalpel's measurement is not judged.
* ``fast_precision_unused``: fp32 GEMM kernels on the CUDA cores (no TF32) holding device time on a GPU with TF32 tensor
  cores, with the gain the datasheet peaks bound; on a CPU where skalpel measured bf16 faster, an info note.

Both read ``analysis.precision`` (the matmuls' dtypes and the machine's measurement) and the ledger's lanes.
"""

from __future__ import annotations

from ..analysis.precision import RankPrecision
from . import thresholds
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

_CAST = "torch.autocast(\"cpu\", dtype=torch.bfloat16)"


def _steady_ms(ctx: Context, rank: int, lane_name: str) -> tuple[float, int] | None:
    """The lane's steady time per unit (one-time work out) and its units; None without the lane."""
    found = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
    lane = found.lane(lane_name) if found is not None else None
    if lane is None or not lane.units:
        return None
    return (lane.steady_ms_per_unit, len(lane.units)) if lane.steady_ms > 0 else None


def _check_slow(ctx: Context, rule: Rule) -> Outcome:
    found = ctx.analyses.precision
    if found is None or ctx.analyses.has_device:
        return NotJudged("a CPU-only question: the dtype of the matmuls on the host", applies=False)
    findings, unmeasured = [], False
    limits = rule.thresholds
    for rank, facts in found.ranks.items():
        low_ms = facts.matmul_ms.get("bf16", 0.0)
        step = _steady_ms(ctx, rank, "host")
        if low_ms <= 0 or step is None:
            continue
        share = min(pct(low_ms, step[0]), 100.0)
        if share < limits.share_pct or low_ms < limits.floor:
            continue
        ratio = facts.bf16_over_fp32
        if ratio is None:
            unmeasured = True
            continue
        if ratio < limits.param("slower_ratio"):
            continue
        findings.append(_slow_finding(ctx, rule, facts, share, low_ms, ratio))
    if not findings and unmeasured:
        return NotJudged("bf16 matmuls hold the step, but the trace has no measurement of this machine's bf16 and "
                         "fp32 matmul speeds (skalpel run measures them)")  # fmt: skip
    return findings


def _slow_finding(ctx: Context, rule: Rule, facts: RankPrecision, share: float, low_ms: float, ratio: float):
    measured = facts.measured or {}
    why = ("oneDNN is held below the CPU's bf16 instructions (ONEDNN_MAX_CPU_ISA="
           f"{measured.get('onednn_max_isa')})") if measured.get("onednn_max_isa") else (
          "the CPU has no native bf16 matmul path (no AMX or AVX-512 BF16 among its flags)")  # fmt: skip
    shape = "x".join(str(size) for size in measured.get("shape", ()))
    evidence = {
        "dtype": "bf16", "share_pct": share, "ms_per_step": low_ms,
        "calls_per_step": facts.matmul_calls.get("bf16", 0.0),
        "measured_ratio": ratio, "measured_ms": measured.get("ms"), "measured_shape": shape,
        "measured_threads": measured.get("threads"), "native_bf16": measured.get("native_bf16"),
        "cpu_flags": measured.get("flags"), "onednn_max_isa": measured.get("onednn_max_isa"),
        "fp32_estimate_ms_per_step": low_ms / ratio,
    }  # fmt: skip
    title = (f"bf16 matmuls run {ratio:.1f}x slower than fp32 on this CPU and hold {share:.0f}% of the step "
             f"({low_ms:.1f} ms/step)")  # fmt: skip
    fix = (f"run the matmuls in float32: drop {_CAST} (or .bfloat16()) around this model; {why}, so a bf16 matmul "
           f"took {ratio:.1f}x an fp32 one here ({shape}, {measured.get('threads')} thread(s)): the step's matmuls "
           f"would take about {low_ms / ratio:.1f} ms instead of {low_ms:.1f}; keep bf16 for a CPU with AMX or "
           "AVX-512 BF16")  # fmt: skip
    located = facts.located.get("bf16", ())
    locations = ctx.locations(located) if located else ()
    return rule.finding(evidence, locations=locations, rank=facts.rank, title=title, fix=fix,
                        severity=rule.severity_for(share))  # fmt: skip


def _check_fp32(ctx: Context, rule: Rule) -> Outcome:
    found = ctx.analyses.precision
    if found is None:
        return NotJudged("no matmuls recorded", applies=False)
    findings = []
    for rank, facts in found.ranks.items():
        judged = _gpu_fp32(ctx, rule, facts) if ctx.analyses.has_device else _cpu_fp32(ctx, rule, facts)
        if judged is not None:
            findings.append(judged)
    return findings


def _gpu_fp32(ctx: Context, rule: Rule, facts: RankPrecision):
    limits = rule.thresholds
    step = _steady_ms(ctx, facts.rank, "device")
    if step is None or facts.fp32_simt_ms < limits.floor:
        return None
    share = min(pct(facts.fp32_simt_ms, step[0]), 100.0)
    tensor_cores = facts.compute_major is not None and facts.compute_major >= limits.param("tf32_from_compute_major")
    peaks = facts.peaks()
    if share < limits.share_pct or not (tensor_cores or peaks):
        return None
    evidence = {"share_pct": share, "ms_per_step": facts.fp32_simt_ms, "kernels": list(facts.fp32_simt_kernels),
                "device": facts.device, "compute_major": facts.compute_major}  # fmt: skip
    gain = ""
    if peaks:
        bound = peaks[1] / peaks[0]
        evidence.update(peak_fp32_tflops=peaks[0], peak_tf32_tflops=peaks[1], kernel_speedup_bound=bound,
                        step_gain_bound_pct=share * (1 - 1 / bound))  # fmt: skip
        gain = (f": the datasheet's TF32 peak is {bound:.0f}x its FP32 peak ({peaks[1]:g} vs {peaks[0]:g} TFLOP/s), "
                f"so these kernels can run up to {bound:.0f}x faster and the step up to {share * (1 - 1 / bound):.0f}% "
                "shorter")  # fmt: skip
    title = (f"fp32 matmuls on the CUDA cores hold {share:.0f}% of the device time ({facts.fp32_simt_ms:.1f} ms/step) "
             f"on a GPU with TF32 tensor cores")  # fmt: skip
    fix = ("let the fp32 matmuls use TF32 tensor cores: torch.backends.cuda.matmul.allow_tf32 = True (or "
           "torch.set_float32_matmul_precision(\"high\")) at the start of the script, or run the forward under "
           "torch.autocast(\"cuda\", dtype=torch.bfloat16)" + gain + "; TF32 keeps fp32's range with a 10-bit "
           "mantissa: watch the loss curve")  # fmt: skip
    return rule.finding(evidence, rank=facts.rank, title=title, fix=fix, severity=rule.severity_for(share))


def _cpu_fp32(ctx: Context, rule: Rule, facts: RankPrecision):
    limits = rule.thresholds
    fp32_ms, ratio = facts.matmul_ms.get("fp32", 0.0), facts.bf16_over_fp32
    step = _steady_ms(ctx, facts.rank, "host")
    if step is None or ratio is None or fp32_ms < limits.floor or facts.matmul_ms.get("bf16", 0.0) > 0:
        return None
    share = min(pct(fp32_ms, step[0]), 100.0)
    if share < limits.param("cpu_share_pct") or 1.0 / ratio < limits.param("faster_ratio"):
        return None
    measured = facts.measured or {}
    shape = "x".join(str(size) for size in measured.get("shape", ()))
    evidence = {"share_pct": share, "ms_per_step": fp32_ms, "measured_ratio": ratio, "measured_ms": measured.get("ms"),
                "measured_shape": shape, "cpu_flags": measured.get("flags"), "device": "cpu"}  # fmt: skip
    title = (f"fp32 matmuls hold {share:.0f}% of the step ({fp32_ms:.1f} ms/step); this CPU ran a bf16 matmul "
             f"{1 / ratio:.1f}x faster")  # fmt: skip
    fix = (f"if bf16's 8-bit mantissa suits the model, run the forward under {_CAST}: a {shape} matmul took "
           f"{measured.get('ms', {}).get('bf16')} ms in bf16 against {measured.get('ms', {}).get('fp32')} ms in fp32 "
           "here (the CPU's AMX / AVX-512 BF16 path); check the loss curve")  # fmt: skip
    located = facts.located.get("fp32", ())
    return rule.finding(evidence, rank=facts.rank, title=title, fix=fix, severity="info",
                        locations=ctx.locations(located) if located else ())  # fmt: skip


SLOW_LOW_PRECISION = Rule(
    id="slow_low_precision",
    family="device",
    severity="warning",
    title="bf16 matmuls run {measured_ratio:.1f}x slower than fp32 on this CPU and hold {share_pct:.0f}% of the step",
    thresholds=thresholds.SLOW_LOW_PRECISION,
    check=_check_slow,
    fix="run the matmuls in float32 on this CPU: it has no native bf16 path",
    docs=Docs(
        what="A CPU-only run whose matrix multiplies (aten::mm, addmm, bmm, baddbmm, convolution) run in bf16 (their "
        "recorded input types: bf16 autocast or a .bfloat16() model) and hold share_pct of the step's host time, on "
        "a CPU where skalpel run measured a bf16 matmul slower_ratio times slower than an fp32 one or more.",
        why="Without AMX or AVX-512 BF16 (or with oneDNN held below them, ONEDNN_MAX_CPU_ISA), a CPU converts bf16 "
        "to fp32 and back around every matmul: bf16 made the step slower, not faster. On this project's Xeon with "
        "ONEDNN_MAX_CPU_ISA=AVX512_CORE a 256x256x256 bf16 matmul took 5x the fp32 one.",
        evidence="The matmuls' share of the step and ms per step, and the measurement: a 256x256x256 matmul's "
        "median time in fp32 and in bf16 at the script's thread count (cached per machine), their ratio, the CPU's "
        "flags and the oneDNN ISA limit; the lines calling the matmuls.",
        fix="Run the forward in float32 (drop the autocast or the .bfloat16()); keep bf16 for a CPU with AMX or "
        "AVX-512 BF16, or lift the ISA limit.",
        false_positives="Only skalpel run measures the machine: a stored trace is not judged (it may come from "
        "another CPU). The measured shape is fixed; a model of much smaller matmuls may lose less. On a CPU with a "
        "native path bf16 is faster and nothing fires (fast_precision_unused may suggest it instead).",
    ),
)

FAST_PRECISION_UNUSED = Rule(
    id="fast_precision_unused",
    family="device",
    severity="warning",
    title="fp32 matmuls hold {share_pct:.0f}% of the step where the hardware has a faster path",
    thresholds=thresholds.FAST_PRECISION_UNUSED,
    check=_check_fp32,
    fix="TF32 on the GPU (torch.backends.cuda.matmul.allow_tf32 = True) or bf16 autocast",
    docs=Docs(
        what="On a GPU: fp32 GEMM kernels on the CUDA cores (ampere_sgemm_*, volta_sgemm_*, cutlass simt sgemm, "
        "Hopper's xmma f32 GEMMs without tf32) hold share_pct of the device time, on a device with TF32 tensor cores "
        "(compute capability tf32_from_compute_major or more, or a TF32 peak in the datasheet table). On a CPU-only "
        "skalpel run: fp32 matmuls hold cpu_share_pct of the step on a CPU where a bf16 matmul measured "
        "faster_ratio times faster (an info note).",
        why="PyTorch leaves TF32 off for matmuls by default (allow_tf32 False since 1.12): an fp32 matmul on an "
        "A100 or H100 runs on the CUDA cores at the FP32 peak (19.5 / 67 TFLOP/s) instead of TF32's (156 / 495).",
        evidence="The kernels' share of the device time and ms per step, their names, the device, and from the "
        "datasheet peaks the bound on their speed-up and on the step's gain (share x (1 - FP32/TF32 peak)). On a "
        "CPU: the measured bf16 and fp32 matmul times.",
        fix="torch.backends.cuda.matmul.allow_tf32 = True or torch.set_float32_matmul_precision(\"high\"), or bf16 "
        "autocast; on a CPU with AMX, torch.autocast(\"cpu\", dtype=torch.bfloat16). Check the loss curve.",
        false_positives="A model that needs full fp32 mantissa (some scientific codes) should stay in fp32. GEMMs "
        "already on tensor cores (tensorop_s1688, tf32 kernels) and AMD's kernels (their names do not say) are not "
        "counted. The bound is the datasheet's: memory-bound GEMMs gain less.",
    ),
)

RULES = (SLOW_LOW_PRECISION, FAST_PRECISION_UNUSED)
