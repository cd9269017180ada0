"""The CPU side of launch_bound: thousands of tiny host ops per step (framework overhead)."""

from __future__ import annotations

import numpy as np

from ..analysis import intervals, numeric
from ..analysis.breakdown import step_breakdown
from ..analysis.ops import self_times
from ..trace.kinds import Kind
from ..trace.model import isin_few
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
        sources = tiny_op_sources(ctx, window.rank, ops[tiny])
        if sources and sources[0][0] == DATA:
            data_ms = 0.0  # a loader busy with most of the tiny ops is framework overhead in process, not a wait
        step_ms = window.mean_step_ms
        comm_ms = _collective_ms(ctx, window) / window.count  # blocked in a collective: waiting, not dispatch
        overhead = pct(max(step_ms - heavy_ms - data_ms - comm_ms, 0.0), step_ms)
        tiny_pct = pct(float(tiny.sum()), len(ops))
        if per_step < limits.floor or tiny_pct < limits.share_pct or overhead < limits.param("cpu_overhead_pct"):
            continue
        evidence = {
            "ops_per_step": per_step,
            "tiny_op_pct": tiny_pct,
            "op_median_us": numeric.median(self_us),
            "overhead_pct": overhead,
            "step_ms": window.median_step_ms,  # quoted: the median; the shares divide by the mean
        }
        title = (
            f"Framework overhead: {per_step:.0f} host ops/step, {tiny_pct:.0f}% of them under {tiny_us:g} us; "
            f"{overhead:.0f}% of the step is not spent in substantial ops"
        )
        evidence["tiny_ops_by_source_pct"] = {name: share for name, share, _ in sources}
        evidence["collective_ms_per_step"] = comm_ms
        fix, events = source_fix(ctx, sources, CPU_FIX)
        findings.append(rule.finding(evidence, locations=ctx.locations(events), rank=window.rank, title=title, fix=fix))
    return findings


# launch_bound's own fix, without what needs a GPU (CUDA graphs): this trace has no device
CPU_FIX = "fewer, bigger operations: torch.compile (fuses elementwise ops on the CPU too), vectorise Python loops over " \
    "tensors, bigger batches"


def _collective_ms(ctx: Context, window) -> float:
    """Host time inside collectives (gloo, c10d) within the window's steps, overlapping calls counted once."""
    trace = ctx.trace
    calls = events_of(ctx, window, trace.kind == Kind.COMM_OP)
    if len(calls) == 0:
        return 0.0
    starts, ends = intervals.union(trace.ts[calls], trace.end[calls])
    total = 0.0
    for start, end in zip(window.starts.tolist(), window.ends.tolist()):  # clipped to each step
        total += float(np.clip(np.minimum(ends, end) - np.maximum(starts, start), 0.0, None).sum())
    return total / 1000.0


DATA, OPTIMIZER, MODEL = "data loading", "optimizer step", "model and the rest"
_FIXES = {
    DATA: "the loader builds each batch from single samples (Dataset.__getitem__ per sample, then collate): fetch "
    "whole batches (index a TensorDataset with a tensor of indices, or pass a BatchSampler as sampler with "
    "batch_size=None), or keep the data on the device and slice it",
    OPTIMIZER: "the optimizer updates one parameter tensor at a time: torch.optim.Adam(..., foreach=True) or "
    "fused=True (AdamW, SGD likewise)",
}


def tiny_op_sources(ctx: Context, rank: int, ops: np.ndarray) -> list[tuple[str, float, np.ndarray]]:
    """Tiny ops grouped by where they come from: (source, share in %, ops), largest first.

    Data loading: inside a DataLoader ``__next__`` range; optimizer step: inside an
    ``Optimizer.step#...`` range, after the last backward op in it (a closure's forward and backward run
    inside ``step()``: LBFGS, Lightning); the rest is the model and the loop around it.
    """
    trace = ctx.trace
    if len(ops) == 0:
        return []
    annotations = np.flatnonzero((trace.rank == rank) & isin_few(trace.kind, [Kind.USER_ANNOTATION, Kind.CPU_OP]))
    optimizer_names = [i for i in numeric.unique(trace.name[annotations]) if trace.names[i].startswith("Optimizer.step#")]
    optimizer = annotations[numeric.isin(trace.name[annotations], optimizer_names)]
    backward_names = [i for i in numeric.unique(trace.name[annotations])
                      if trace.names[i].startswith("autograd::engine::evaluate_function")]  # fmt: skip
    backward = annotations[numeric.isin(trace.name[annotations], backward_names)]
    loader = np.flatnonzero((trace.kind == Kind.DATALOADER) & (trace.rank == rank))
    in_loader = _inside(trace, ops, loader)
    in_optimizer = _inside_spans(trace, ops, *_after_closures(trace, optimizer, backward)) & ~in_loader
    groups = [(DATA, ops[in_loader]), (OPTIMIZER, ops[in_optimizer]), (MODEL, ops[~in_loader & ~in_optimizer])]
    result = [(name, 100.0 * len(events) / len(ops), events) for name, events in groups if len(events)]
    return sorted(result, key=lambda group: -group[1])


# a source of tiny ops below the largest whose own fix the finding names too: on a CPU loop of 1,732 ops a step
# (model 44%, optimizer 32%, data loading 24%) the optimizer's fused=True saved 16% of the step, whole batches 8%,
# both 23% (8.34 -> 6.42 ms), where the fix named only the model's
ALSO_NAMED_PCT = 20.0


def source_fix(ctx: Context, sources: list[tuple[str, float, np.ndarray]], default: str) -> tuple[str, np.ndarray]:
    """The fix for the largest source of tiny ops (the default for the model), then for each other source with
    ``ALSO_NAMED_PCT`` of them or more; and the largest source's ops."""
    if not sources:
        return default, np.zeros(0, dtype=np.int64)
    named = [sources[0], *[source for source in sources[1:] if source[1] >= ALSO_NAMED_PCT]]
    if len(named) == 1 and named[0][0] not in _FIXES:
        return default, sources[0][2]
    parts = [f"{share:.0f}% of the tiny ops come from the {name}: {_FIXES.get(name, default)}" for name, share, _ in named]
    return "; ".join(parts), sources[0][2]


def _inside(trace, events: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Which events start inside one of the (host) ranges."""
    return _inside_spans(trace, events, trace.ts[ranges], trace.end[ranges])


def _inside_spans(trace, events: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(len(events), dtype=bool)
    starts, ends = intervals.union(starts, ends)
    return intervals.containing(starts, ends, trace.ts[events]) >= 0


def _after_closures(trace, steps: np.ndarray, backward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The optimizer steps' spans, each from the end of the last backward op inside it (its closure's) on."""
    starts, ends = trace.ts[steps].astype(float), trace.end[steps].astype(float)
    if len(backward) == 0 or len(steps) == 0:
        return starts, ends
    order = np.argsort(trace.ts[backward], kind="stable")
    backward_starts, backward_ends = trace.ts[backward][order], trace.end[backward][order]
    first = np.searchsorted(backward_starts, starts, side="left")
    last = np.searchsorted(backward_starts, ends, side="left")
    for row in np.flatnonzero(last > first):  # the steps that ran a closure: few, one per step at most
        starts[row] = max(starts[row], float(backward_ends[first[row]:last[row]].max()))
    return starts, ends


def _substantial(names: np.ndarray, self_us: np.ndarray, tiny_us: float) -> np.ndarray:
    """Calls of ops whose median self time (by name) reaches ``tiny_us``: real work, not dispatch.

    Judged per name, so a tiny op that a busy machine preempted once does not count as work.
    """
    ids, group = np.unique(names, return_inverse=True)
    medians = np.array([numeric.median(self_us[group == g]) for g in range(len(ids))])
    return medians[group] >= tiny_us

