"""allocator_churn: the device allocator is called in steady state (the caching allocator is off or defeated)."""

from __future__ import annotations

from . import thresholds
from .rule import Context, Docs, Outcome, Rule


def _check_churn(ctx: Context, rule: Rule) -> Outcome:
    limits = rule.thresholds
    result = ctx.analyses.allocator
    findings = []
    for rank, calls in result.ranks.items():
        if calls.calls < limits.floor or calls.share_pct < limits.share_pct or calls.total_ms < limits.param("min_ms"):
            continue
        if calls.spread_pct < limits.param("min_spread_pct"):
            continue  # a burst (the pool growing once, the cache freed at exit), not churn
        evidence = {
            "calls": calls.calls,
            "ms": calls.total_ms,
            "share_pct": calls.share_pct,
            "window_ms": calls.window_ms,
            "steady_state": calls.steady_state,
            "spread_pct": calls.spread_pct,
            "by_name": calls.by_name,
        }
        findings.append(rule.finding(evidence, locations=ctx.locations(list(calls.events)), rank=rank))
    return findings


ALLOCATOR_CHURN = Rule(
    id="allocator_churn",
    family="memory",
    severity="warning",
    title="{calls} device allocator calls in steady state take {ms:.1f} ms ({share_pct:.0f}% of {steady_state}): "
    "the caching allocator is off or emptied",
    thresholds=thresholds.ALLOCATOR_CHURN,
    check=_check_churn,
    fix="let the caching allocator keep its memory: no torch.cuda.empty_cache() in the loop, unset "
    "PYTORCH_NO_CUDA_MEMORY_CACHING, and against fragmentation PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    docs=Docs(
        what="`cudaMalloc`/`cudaFree` (`hipMalloc`/`hipFree`, `cuMemAlloc`/`cuMemFree`) runtime calls inside "
        "steady-state work: the marked steps after the first; without markers, the iterations after the first "
        "inferred from DataLoader fetches or optimizer steps, or else the whole window cut into 8 equal slices. "
        "Calls inside one-time work (see cold_start) are left out. The calls must recur in `min_spread_pct` of the steps (slices) "
        "or more: a pool that grows during the first iterations, or frees its cache once at exit, is a burst.",
        why="PyTorch's caching allocator keeps freed blocks and reuses them, so after the first step it should "
        "not call the driver at all. A driver allocation costs 0.1-10 ms and a free synchronises the device; in "
        "the loop they stall host and device on every step. They appear when caching is disabled "
        "(`PYTORCH_NO_CUDA_MEMORY_CACHING=1`), when `torch.cuda.empty_cache()` runs in the loop, or when "
        "fragmentation or changing shapes make the pool grow and shrink.",
        evidence="Steady-state calls, their time and share of the steady-state window, what the window was, and "
        "the calls by name. The locations are the user code around the longest calls.",
        fix="Remove `torch.cuda.empty_cache()` from the loop; unset `PYTORCH_NO_CUDA_MEMORY_CACHING`; set "
        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation; keep input shapes fixed (pad "
        "or bucket them).",
        false_positives="A step that really needs more memory than before (a longer sequence, a bigger batch) "
        "grows the pool once; memory-saving code that frees the cache on purpose between phases (evaluation) "
        "pays it knowingly.",
    ),
)

RULES = (ALLOCATOR_CHURN,)
