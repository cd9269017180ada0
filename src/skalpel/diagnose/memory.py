"""Memory findings: allocated memory that grows step after step, and one op that allocates much of the peak."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..analysis.memory import memory
from ..trace.kinds import Kind
from . import thresholds
from .broadcast import materialised_broadcast
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

MIB = 2**20
_NO_MEMORY = "no [memory] events: profile with profile_memory=True (skalpel run records them)"


def _memory(ctx: Context):
    return ctx.result("memory", lambda: memory(ctx.trace, ctx.steps))


def _check_growth(ctx: Context, rule: Rule) -> Outcome:
    result = _memory(ctx)
    if result is None:
        return NotJudged(_NO_MEMORY)
    limits = rule.thresholds
    findings = []
    judged = False
    for device in _main_devices(ctx, result):
        deltas = np.diff(np.array(device.step_end_bytes, dtype=np.float64))
        if len(deltas) < limits.param("min_steps") or device.growth_bytes_per_step is None:
            continue
        judged = True
        growth = float(device.growth_bytes_per_step)
        rising = pct(float((deltas > 0).sum()), len(deltas))
        share = pct(growth, device.peak_bytes)
        if growth < limits.floor * MIB or share < limits.share_pct or rising < limits.param("min_rising_pct"):
            continue
        evidence = {
            "growth_mib_per_step": growth / MIB,
            "growth_pct_of_peak": share,
            "steps": len(deltas),
            "rising_steps_pct": rising,
            "start_mib": device.step_end_bytes[0] / MIB,
            "end_mib": device.step_end_bytes[-1] / MIB,
            "peak_mib": device.peak_bytes / MIB,
            "device": device.device,
        }
        findings.append(rule.finding(evidence, locations=_leak_sites(ctx, device), rank=device.rank))
    if not judged:
        return NotJudged(f"fewer than {limits.param('min_steps'):g} marked steps with memory events: cannot judge growth per step")
    return findings


def _main_devices(ctx: Context, result) -> list:
    """Per rank, the accelerator with the highest peak, else the host: host memory of a GPU job is not judged."""
    devices = [result.main_device(rank) for rank in ctx.trace.rank_ids]
    return [device for device in devices if device is not None]


def _leak_sites(ctx: Context, device) -> tuple[str, ...]:
    """Where the allocations that are never freed happen.

    ``[memory]`` events carry no address in our model, so allocations and frees are paired by
    size: sizes allocated more often than freed during the steps are the ones that stay, and
    the user frames open at those allocations are the sites.
    """
    events = ctx.trace.memory
    steps = sorted(ctx.steps.for_rank(device.rank), key=lambda step: step.start_us)
    start, end = steps[0].start_us, steps[-1].end_us
    device_type = 0 if device.device == "cpu" else None
    rows = np.flatnonzero((events.rank == device.rank) & (events.ts >= start) & (events.ts < end))
    if device_type is not None:
        rows = rows[events.device_type[rows] == device_type]
    else:
        rows = rows[events.device_type[rows] != 0]
    sizes = events.nbytes[rows]
    surplus = Counter(sizes[sizes > 0].tolist())
    surplus.subtract(Counter((-sizes[sizes < 0]).tolist()))
    kept = {size for size, count in surplus.items() if count > 0 and size >= MIB // 16}
    allocs = rows[np.isin(sizes, list(kept))] if kept else rows[:0]
    if len(allocs) == 0:
        return ()
    tid = int(events.tid[allocs[0]])
    return ctx.locations_at(device.rank, tid, events.ts[allocs])


MEMORY_GROWTH = Rule(
    id="memory_growth",
    family="memory",
    severity="warning",
    title="Allocated memory grows {growth_mib_per_step:.1f} MiB every step on {device} ({start_mib:.0f} -> {end_mib:.0f} MiB over {steps} steps)",
    thresholds=thresholds.MEMORY_GROWTH,
    check=_check_growth,
    needs_steps=True,
    fix="stop keeping tensors alive across steps: store loss.item() or loss.detach() (not the loss with its graph), "
    "clear lists/caches of outputs, avoid retain_graph=True",
    docs=Docs(
        what="Allocated memory (the allocator's Total Allocated, or the running sum of allocations) measured at "
        "each step's end rises step after step: the median per-step change is positive and most steps rise.",
        why="A leak ends in an out-of-memory error after enough steps, and before that it fragments the caching "
        "allocator and slows every step. The usual cause is a Python reference that keeps tensors (and the "
        "autograd graph behind them) alive.",
        evidence="Median growth per step in MiB and as a share of the peak, how many steps rose, allocated memory "
        "at the first step's start and the last step's end, the peak and the device. Locations: user code "
        "allocating the sizes that are allocated more often than freed.",
        fix="Append `loss.item()` or `loss.detach()` instead of `loss`; `del` or clear lists of outputs; do not use "
        "`retain_graph=True` without need; wrap evaluation in `torch.no_grad()`.",
        false_positives="Caches that fill once (cudnn workspaces, the optimizer's state on its first step, a "
        "growing KV cache in generation) grow during the first steps and then level off; profile after warm-up.",
    ),
)


_BROADCAST_FIX = (
    "avoid materialising broadcast views: keep expand() results as views (let broadcasting do the work), "
    "compute in chunks, or use in-place / fused ops"
)
_TRANSIENT_FIX = (
    "shrink the temporary that sets the peak: compute it in chunks (or a fused kernel that never writes it out, "
    "e.g. SDPA instead of a materialised attention matrix), use in-place ops, and drop references to what is "
    "no longer needed before it is made"
)


def _check_spike(ctx: Context, rule: Rule) -> Outcome:
    result = _memory(ctx)
    if result is None:
        return NotJudged(_NO_MEMORY)
    limits = rule.thresholds
    findings = []
    for device in _main_devices(ctx, result):
        size, peak = device.largest_alloc_bytes, device.peak_bytes
        share = pct(size, peak)
        op_event = device.largest_alloc_op_event
        outer = _outer_event(ctx, op_event)
        broadcast = materialised_broadcast(ctx, outer) if share >= limits.share_pct else None
        if broadcast is not None and broadcast.ratio < limits.param("min_broadcast_ratio"):
            broadcast = None
        floor = limits.param("broadcast_floor_mib") if broadcast is not None else limits.floor
        if size < floor * MIB or share < limits.share_pct:
            continue
        capacity = device.capacity_bytes
        evidence = {
            "alloc_mib": size / MIB,
            "share_pct": share,
            "peak_mib": peak / MIB,
            "steady_mib": device.steady_bytes / MIB,
            "capacity_mib": capacity / MIB if capacity else None,
            "peak_of_capacity_pct": pct(peak, capacity) if capacity else None,
            "op": ctx.trace.name_of(outer) if outer >= 0 else device.largest_alloc_op or "unknown",
            "inner_op": device.largest_alloc_op or "unknown",
            "device": device.device,
            "op_event": device.largest_alloc_op_event,
        }
        locations = ctx.locations([op_event]) if op_event >= 0 else ()
        if broadcast is not None:
            evidence.update(broadcast_from=broadcast.from_dims, broadcast_to=broadcast.to_dims, broadcast_ratio=broadcast.ratio)
            title = (
                f"{evidence['op']} materialises a broadcast: {broadcast.from_dims} expanded to {broadcast.to_dims} "
                f"({broadcast.ratio:.0f}x the elements) allocates {size / MIB:.1f} MiB, {share:.0f}% of the "
                f"{peak / MIB:.0f} MiB peak on {device.device}"
            )
            findings.append(rule.finding(evidence, locations=locations, rank=device.rank, title=title, fix=_BROADCAST_FIX))
            continue
        severity = _transient_severity(device, limits)
        if severity is None:
            continue
        room = (
            f"; the peak is {evidence['peak_of_capacity_pct']:.0f}% of the device's {capacity / 2**30:.0f} GiB"
            if capacity else ""
        )
        title = (
            f"One temporary of {size / MIB:.0f} MiB by {evidence['op']} is {share:.0f}% of the {peak / MIB:.0f} MiB peak "
            f"on {device.device} ({device.steady_bytes / MIB:.0f} MiB between steps){room}"
        )
        findings.append(rule.finding(evidence, severity=severity, locations=locations, rank=device.rank, title=title,
                                     fix=_TRANSIENT_FIX))  # fmt: skip
    return findings


def _transient_severity(device, limits) -> str | None:
    """Whether a large allocation without a broadcast is a real transient worth a finding, and how serious.

    It must be part of the peak (still held when the peak is reached) and be freed again (weights loaded
    once are not a spike);
    then it matters by the device's capacity: a warning where the peak fills much of it, info where it is
    large in itself but the device has room (or the capacity is unknown: the host), nothing otherwise:
    an im2col buffer or a cuBLAS workspace of tens of MiB is ordinary.
    """
    size, peak = device.largest_alloc_bytes, device.peak_bytes
    if not device.largest_alloc_at_peak:
        return None
    if not device.largest_alloc_freed:
        return None
    capacity = device.capacity_bytes
    if capacity and peak >= capacity * limits.param("tight_capacity_pct") / 100.0:
        return "warning"
    if size >= limits.param("large_mib") * MIB:
        return "info"
    return None


def _outer_event(ctx: Context, event: int) -> int:
    """The outermost host op around an op on its thread: what the user called (aten::contiguous, not aten::empty)."""
    if event < 0:
        return -1
    trace = ctx.trace
    same = (trace.rank == trace.rank[event]) & (trace.pid == trace.pid[event]) & (trace.tid == trace.tid[event])
    around = np.flatnonzero(
        same & (trace.kind == Kind.CPU_OP) & (trace.ts <= trace.ts[event]) & (trace.ts + trace.dur >= trace.ts[event] + trace.dur[event])
    )
    return int(around[np.argmin(trace.ts[around])]) if len(around) else event


MEMORY_SPIKE = Rule(
    id="memory_spike",
    family="memory",
    severity="warning",
    title="One allocation of {alloc_mib:.0f} MiB by {op} is {share_pct:.0f}% of the {peak_mib:.0f} MiB peak on {device}",
    thresholds=thresholds.MEMORY_SPIKE,
    check=_check_spike,
    fix=_TRANSIENT_FIX,
    docs=Docs(
        what="The largest single allocation in the trace is a large share of the peak allocated memory: one op "
        "sets the memory high-water mark. Without a broadcast it must be a real transient: held at the peak "
        "and freed again (allocations and frees paired by size), and either the peak fills "
        "`tight_capacity_pct` of the device's memory (`deviceProperties`; a warning) or it is `large_mib` or more "
        "(info). When the recorded shapes show that the op "
        "materialised a broadcast (an `aten::expand` just before it, whose input has size-1 dims where the op's "
        "input is `min_broadcast_ratio` or more times larger), the pattern is named whatever the absolute size, "
        "down to `broadcast_floor_mib`: it grows with the product of the broadcast dims.",
        why="The peak decides the batch size that fits and whether the job fits at all. A single oversized "
        "temporary, typically `expand()` followed by `.contiguous()`, `.clone()`, `reshape()` or an op that "
        "materialises the broadcast, can often be avoided entirely.",
        evidence="Size of the allocation in MiB and its share of the peak, the peak, the outermost op the user "
        "called around the allocation (`op`) and the innermost one that allocated (`inner_op`), the device, and the "
        "op's event index; for a broadcast, the expanded shape, the shape written and the ratio of their elements. "
        "The location is the user code calling that op.",
        fix="Keep broadcasts as views (`expand` costs nothing until materialised) and let broadcasting ops consume "
        "them; process in chunks; use in-place ops or fused kernels (SDPA instead of materialised attention "
        "masks).",
        false_positives="Ordinary temporaries (an im2col buffer, a cuBLAS workspace) on a device with room to spare "
        "are not reported; weights or optimizer state allocated once stay allocated and are not transients. A "
        "large input batch made inside the step is a real transient but may be wanted.",
    ),
)

RULES = (MEMORY_GROWTH, MEMORY_SPIKE)
