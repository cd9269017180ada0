"""attention_hotspot on scaled_dot_product_attention: which backend SDPA ran, its device time, and why not flash.

``aten::scaled_dot_product_attention`` dispatches to one backend per call, visible as the op
inside it: ``_scaled_dot_product_flash_attention`` / ``_cudnn_attention`` (fused, fast),
``_scaled_dot_product_efficient_attention`` (fused, memory-efficient), or
``_scaled_dot_product_attention_math`` (the eager fallback: bmm + softmax + bmm, the full
score matrix in memory). The device time of a call is that of the kernels launched inside
it (forward only: the backward runs as autograd ops). The reasons are read from the
recorded input shapes; dtypes are not in the trace, so fp32 is named as a usual reason.
"""

from __future__ import annotations

import json

import numpy as np

from ..result.report import Finding
from ..analysis.timeline import device_mask
from ..trace.kinds import Kind
from .rule import Context, Rule

SDPA = "aten::scaled_dot_product_attention"
_BACKENDS = (  # (part of the inner op's name, backend)
    ("attention_math", "math (eager fallback)"),
    ("efficient_attention", "memory-efficient"),
    ("flash_attention", "flash"),
    ("cudnn_attention", "cuDNN"),
)
_SLOW = ("math (eager fallback)", "memory-efficient")


def check_sdpa(ctx: Context, rule: Rule, rank: int, steps: int, device_ms: float) -> list[Finding]:
    """One finding per slow backend that takes a large share of the rank's device time."""
    trace = ctx.trace
    calls = np.flatnonzero((trace.name == trace.name_id(SDPA)) & (trace.rank == rank))
    if len(calls) == 0 or device_ms <= 0:
        return []
    by_backend: dict[str, list[int]] = {}
    for call in calls:
        by_backend.setdefault(_backend(trace, int(call)), []).append(int(call))
    kernel_ms = _kernel_ms_inside(ctx, rank)
    findings = []
    for backend, events in by_backend.items():
        if backend not in _SLOW:
            continue
        ms = sum(kernel_ms(event) for event in events)
        share = 100.0 * ms / device_ms
        if share < rule.thresholds.share_pct or ms / steps < rule.thresholds.floor:
            continue
        head_dim, mask = _inputs(trace, events[0])
        evidence = {
            "backend": backend,
            "share_pct": share,
            "ms_per_step": ms / steps,
            "calls": len(events),
            "head_dim": head_dim,
            "explicit_mask": mask,
            "reasons": _reasons(backend, head_dim, mask),
            "fused_attention_seen": any(b not in _SLOW for b in by_backend),
        }
        title = (
            f"scaled_dot_product_attention ran its {backend} path: {share:.0f}% of device time "
            f"({ms / steps:.1f} ms/step, {len(events)} calls)"
        )
        severity = "warning" if backend.startswith("math") else "info"
        fix = "get SDPA onto its flash kernel: " + "; ".join(evidence["reasons"])
        findings.append(rule.finding(evidence, locations=ctx.locations(events), severity=severity, rank=rank, title=title, fix=fix))
    return findings


def _backend(trace, call: int) -> str:
    inside = np.flatnonzero(
        (trace.rank == trace.rank[call]) & (trace.tid == trace.tid[call]) & (trace.kind == Kind.CPU_OP)
        & (trace.ts >= trace.ts[call]) & (trace.end <= trace.end[call])
    )  # fmt: skip
    names = [trace.name_of(index) for index in inside]
    for part, backend in _BACKENDS:
        if any(part in name for name in names):
            return backend
    return "unknown"


def _kernel_ms_inside(ctx: Context, rank: int):
    """ms of the device work launched by ops inside a host call (on its thread, within its time range)."""
    trace = ctx.trace
    device = np.flatnonzero(device_mask(trace) & (trace.rank == rank))
    launcher = trace.launcher[device]
    device, launcher = device[launcher >= 0], launcher[launcher >= 0]

    def kernel_ms(call: int) -> float:
        inside = (trace.tid[launcher] == trace.tid[call]) & (trace.ts[launcher] >= trace.ts[call]) & (trace.end[launcher] <= trace.end[call])
        return float(trace.dur[device[inside]].sum()) / 1000.0

    return kernel_ms


def _inputs(trace, call: int) -> tuple[int, bool]:
    """(head dim of the query, whether an attn_mask was passed) from the recorded input shapes."""
    if trace.shapes[call] < 0:
        return 0, False
    try:
        dims = json.loads(trace.names[trace.shapes[call]])
    except ValueError:
        return 0, False
    query = dims[0] if dims and isinstance(dims[0], list) else []
    mask = len(dims) > 3 and isinstance(dims[3], list) and len(dims[3]) > 0
    return (int(query[-1]) if query else 0), mask


def _reasons(backend: str, head_dim: int, mask: bool) -> list[str]:
    reasons = []
    if mask:
        reasons.append("an explicit attn_mask rules out flash (pass is_causal=True for causal masks, or no mask)")
    if head_dim > 256:
        reasons.append(f"head dim {head_dim} is above flash's limit of 256")
    elif head_dim and head_dim % 8:
        reasons.append(f"head dim {head_dim} is not a multiple of 8")
    reasons.append("fp32 inputs: flash needs fp16/bf16 (torch.autocast or model.half())")
    if backend.startswith("math"):
        reasons.append("dropout_p > 0 had no fused kernel before torch 2.1; check with "
                       "torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION), which raises with the reason")  # fmt: skip
    return reasons
