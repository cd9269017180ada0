"""attention_hotspot on scaled_dot_product_attention: which backend SDPA ran, its device time, and why not flash.

The backend of each call and the device time of the kernels it launched are ``analysis.attention``'s. The
reasons are read from the recorded input shapes; dtypes are not in the trace, so fp32 is named as a usual reason.
"""

from __future__ import annotations

from ..analysis.attention import RankAttention
from ..result.report import Finding
from .rule import Context, Rule


def check_sdpa(ctx: Context, rule: Rule, rank: RankAttention, steps: int) -> list[Finding]:
    """One finding per slow backend that takes a large share of the rank's device time."""
    backends = rank.sdpa or ()
    if len(backends) == 0 or rank.device_ms <= 0:
        return []
    findings = []
    for found in backends:
        if not found.slower_than_flash or found.kernel_ms is None:
            continue
        backend, ms, events = found.backend, found.kernel_ms, list(found.calls)
        share = 100.0 * ms / rank.device_ms
        if share < rule.thresholds.share_pct or ms / steps < rule.thresholds.floor:
            continue
        evidence = {
            "backend": backend,
            "share_pct": share,
            "ms_per_step": ms / steps,
            "calls": len(events),
            "head_dim": found.head_dim,
            "explicit_mask": found.explicit_mask,
            "reasons": _reasons(rule, backend, found.head_dim, found.explicit_mask),
            "fused_attention_seen": any(not other.slower_than_flash for other in backends),
        }
        title = (
            f"scaled_dot_product_attention ran its {backend} path: {share:.0f}% of device time "
            f"({ms / steps:.1f} ms/step, {len(events)} calls)"
        )
        severity = "warning" if backend.startswith("math") else "info"
        fix = "get SDPA onto its flash kernel: " + "; ".join(evidence["reasons"])
        findings.append(rule.finding(evidence, locations=ctx.locations(events), severity=severity, rank=rank.rank,
                                     title=title, fix=fix))  # fmt: skip
    return findings


def _reasons(rule: Rule, backend: str, head_dim: int, mask: bool) -> list[str]:
    most, multiple = int(rule.thresholds.param("flash_max_head_dim")), int(rule.thresholds.param("flash_head_dim_multiple"))
    reasons = []
    if mask:
        reasons.append("an explicit attn_mask rules out flash (pass is_causal=True for causal masks, or no mask)")
    if head_dim > most:
        reasons.append(f"head dim {head_dim} is above flash's limit of {most}")
    elif head_dim and head_dim % multiple:
        reasons.append(f"head dim {head_dim} is not a multiple of {multiple}")
    reasons.append("fp32 inputs: flash needs fp16/bf16 (torch.autocast or model.half())")
    if backend.startswith("math"):
        reasons.append("dropout_p > 0 had no fused kernel before torch 2.1; check with "
                       "torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION), which raises with the reason")  # fmt: skip
    return reasons
