"""The CPU side of launch_bound: thousands of tiny host ops per step (framework overhead)."""

from __future__ import annotations

import numpy as np

from ..analysis import numeric
from ..analysis.op_sources import DATA, OPTIMIZER, OpSource
from .common import data_wait_ms, pct, window_of
from .rule import Context, NotJudged, Outcome, Rule


def check_cpu_overhead(ctx: Context, rule: Rule) -> Outcome:
    """Fires when a step runs many ops, most of them tiny, and little of the step is spent in substantial ops."""
    limits = rule.thresholds
    tiny_us = limits.param("tiny_us")
    findings = []
    cpu = ctx.analyses.cpu_ops
    if cpu is None or not cpu.ranks:
        return NotJudged("no host ops in the trace")
    for rank, ops in cpu.ranks.items():
        if len(ops.ops) == 0:
            continue
        window = window_of(ctx, rank)
        tiny = ops.self_us < tiny_us
        per_step = len(ops.ops) / window.count
        heavy_ms = float(ops.self_us[ops.name_median_us >= tiny_us].sum()) / 1000.0 / window.count
        data_ms = data_wait_ms(ctx, rank)
        sources = ops.sources(tiny)
        if sources and sources[0].name == DATA:
            data_ms = 0.0  # a loader busy with most of the tiny ops is framework overhead in process, not a wait
        step_ms = window.mean_step_ms
        comm_ms = ops.collective_ms / window.count  # blocked in a collective: waiting, not dispatch
        overhead = pct(max(step_ms - heavy_ms - data_ms - comm_ms, 0.0), step_ms)
        tiny_pct = pct(float(tiny.sum()), len(ops.ops))
        if per_step < limits.floor or tiny_pct < limits.share_pct or overhead < limits.param("cpu_overhead_pct"):
            continue
        evidence = {
            "ops_per_step": per_step,
            "tiny_op_pct": tiny_pct,
            "op_median_us": numeric.median(ops.self_us),
            "overhead_pct": overhead,
            "step_ms": window.median_step_ms,  # quoted: the median; the shares divide by the mean
        }
        title = (
            f"Framework overhead: {per_step:.0f} host ops/step, {tiny_pct:.0f}% of them under {tiny_us:g} us; "
            f"{overhead:.0f}% of the step is not spent in substantial ops"
        )
        evidence["tiny_ops_by_source_pct"] = {source.name: source.share_pct for source in sources}
        evidence["collective_ms_per_step"] = comm_ms
        fix, events = source_fix(sources, CPU_FIX, limits.param("also_named_pct"))
        findings.append(rule.finding(evidence, locations=ctx.locations(events), rank=rank, title=title, fix=fix))
    return findings


# launch_bound's own fix, without what needs a GPU (CUDA graphs): this trace has no device
CPU_FIX = "fewer, bigger operations: torch.compile (fuses elementwise ops on the CPU too), vectorise Python loops over " \
    "tensors, bigger batches"

_FIXES = {
    DATA: "the loader builds each batch from single samples (Dataset.__getitem__ per sample, then collate): fetch "
    "whole batches (index a TensorDataset with a tensor of indices, or pass a BatchSampler as sampler with "
    "batch_size=None), or keep the data on the device and slice it",
    OPTIMIZER: "the optimizer updates one parameter tensor at a time: torch.optim.Adam(..., foreach=True) or "
    "fused=True (AdamW, SGD likewise)",
}


def source_fix(sources: tuple[OpSource, ...], default: str, also_named_pct: float) -> tuple[str, np.ndarray]:
    """The fix for the largest source of tiny ops (the default for the model), then for each other source with
    ``also_named_pct`` of them or more; and the largest source's ops."""
    if not sources:
        return default, np.zeros(0, dtype=np.int64)
    named = [sources[0], *[source for source in sources[1:] if source.share_pct >= also_named_pct]]
    if len(named) == 1 and named[0].name not in _FIXES:
        return default, sources[0].ops
    parts = [f"{source.share_pct:.0f}% of the tiny ops come from the {source.name}: {_FIXES.get(source.name, default)}"
             for source in named]  # fmt: skip
    return "; ".join(parts), sources[0].ops
