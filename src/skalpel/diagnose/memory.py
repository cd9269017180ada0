"""Memory findings: allocated memory that grows step after step, and one op that allocates much of the peak."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import numeric
from ..analysis.kept_memory import DeviceKept
from ..display import rough_duration
from . import thresholds
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

MIB = 2**20
_NO_MEMORY = "no [memory] events: profile with profile_memory=True (skalpel run records them)"


def _check_growth(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.analyses.memory
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
        if growth < limits.floor * MIB or rising < limits.param("min_rising_pct"):
            continue  # not a rise step after step: a warm-up, a one-time allocation, allocator noise
        share = pct(growth, device.peak_bytes)
        projection = _projection(ctx, device, growth)
        severity = _growth_severity(share, projection, limits)
        if severity is None:
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
            **(projection.evidence(limits) if projection else {}),
        }
        title = rule.title.format(**evidence) + (f"; {projection.text()}" if projection else "")
        kept = ctx.analyses.kept_memory.of(device)
        by_op = _kept_by_op(kept, len(deltas))
        if by_op:
            evidence["kept_by_op"] = by_op
            title += f"; kept blocks allocated in {by_op[0]['op']} ({by_op[0]['mib_per_step']:.1f} MiB/step)"
        history = _lbfgs_history(kept)
        if history is not None:  # bounded, not a leak: said as such, with no leak fix
            evidence["lbfgs_history_bound_mib"] = history / MIB
            title = rule.title.format(**evidence) + _LBFGS_TITLE.format(bound_mib=history / MIB)
            findings.append(rule.finding(evidence, severity="info", title=title, fix=_LBFGS_FIX,
                                         locations=_leak_sites(ctx, device, kept), rank=device.rank))  # fmt: skip
            continue
        buffer_loss = next((item.op for item in kept.by_op if item.keeps_loss_buffer), None)
        fix = _LOSS_KEEPS_BUFFER_FIX.format(op=buffer_loss) if buffer_loss else None
        findings.append(rule.finding(evidence, severity=severity, title=title, fix=fix,
                                     locations=_leak_sites(ctx, device, kept), rank=device.rank))  # fmt: skip
    if not judged:
        return NotJudged(f"fewer than {limits.param('min_steps'):g} marked steps with memory events: cannot judge growth per step")
    return findings


@dataclass(frozen=True)
class _Projection:
    """When a steady growth fills the device: from its free headroom above the peak."""

    growth_bytes: float  # per step
    capacity_bytes: int
    headroom_bytes: int
    step_ms: float  # 0 when unknown

    @property
    def steps_to_full(self) -> float:
        return self.headroom_bytes / self.growth_bytes

    @property
    def seconds_to_full(self) -> float | None:
        return self.steps_to_full * self.step_ms / 1000.0 if self.step_ms > 0 else None

    def text(self) -> str:
        steps = self.steps_to_full
        when = f"~{_two_digits(steps):,.0f} steps" if steps >= 1 else "the next step"
        if self.seconds_to_full is not None and steps >= 1:
            when += f" (~{rough_duration(self.seconds_to_full)} at {self.step_ms:.1f} ms/step)"
        device = f"{self.capacity_bytes / 2**30:.1f} GiB device"
        return f"at {self.growth_bytes / MIB:.1f} MiB/step the {device} is full in {when}"

    def evidence(self, limits) -> dict:
        return {
            "capacity_mib": self.capacity_bytes / MIB,
            "headroom_mib": self.headroom_bytes / MIB,
            "steps_to_full": self.steps_to_full,
            "seconds_to_full": self.seconds_to_full,
            "horizon_steps": limits.param("horizon_steps"),
            "projection": self.text(),
        }


def _projection(ctx: Context, device, growth: float) -> _Projection | None:
    """The projection to the device's capacity; None where it is unknown (the host, no deviceProperties)."""
    capacity = device.capacity_bytes
    if not capacity:
        return None
    step_ms = numeric.median([step.duration_ms for step in ctx.steps.for_rank(device.rank)])
    return _Projection(growth, capacity, max(capacity - device.peak_bytes, 0), step_ms)


def _growth_severity(share: float, projection: _Projection | None, limits) -> str | None:
    """How much a consistent rise matters: by how soon it fills the device, else by its share of the peak.

    A warning where the device is full within ``horizon_steps``. Beyond it, info: a rise in
    nearly every step is a leak whatever its pace, and training runs last 10^5 steps and more, so
    the user should compare the projection with the run's length; but it is not this run's
    bottleneck. Without a capacity (the host) only a large share of the peak gained per step
    says it matters.
    """
    if projection is not None:
        return "warning" if projection.steps_to_full <= limits.param("horizon_steps") else "info"
    return "warning" if share >= limits.share_pct else None


def _two_digits(value: float) -> float:
    """Rounded to two significant digits: a projection is not precise to the step (4,305 -> 4,300)."""
    return float(f"{value:.2g}")


def _main_devices(ctx: Context, result) -> list:
    devices = [result.main_device(rank) for rank in ctx.rank_ids]
    return [device for device in devices if device is not None]


def _leak_sites(ctx: Context, device, kept: DeviceKept) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for tid, times in kept.threads:
        found.update(dict.fromkeys(ctx.locations_at(device.rank, tid, times)))
    return tuple(found)[:3]


def _kept_by_op(kept: DeviceKept, steps: int) -> list[dict]:
    return [{"op": item.op, "mib_per_step": item.nbytes / MIB / max(steps, 1), "blocks": item.blocks} for item in kept.by_op]


_LOSS_KEEPS_BUFFER_FIX = (
    "a kept {op} result holds its whole elementwise-loss buffer, not 4 bytes (its storage is the buffer: "
    "pytorch/pytorch#185647), even after .detach(): keep loss.detach().clone() or a running sum "
    "(total += loss.detach()), or read loss.item() every N steps"
)


# LBFGS's curvature history (thresholds.LBFGS_HISTORY, LBFGS_SHARE): memory that grows inside its step stops once
# the history is full
_LBFGS_TITLE = (
    ", allocated inside LBFGS's step: its curvature history, history_size pairs of parameter-sized vectors, which "
    "stops growing once full (~{bound_mib:.0f} MiB with the default history_size=100), not a leak"
)
_LBFGS_FIX = (
    "nothing to fix if it fits: LBFGS's history holds at most history_size pairs of flattened-parameter vectors "
    "(2 x history_size x the parameters' bytes) and then stops growing; a smaller history "
    "(torch.optim.LBFGS(params, history_size=10)) caps it lower"
)


def _lbfgs_history(kept: DeviceKept) -> float | None:
    """The bound of LBFGS's history where the kept blocks were allocated inside its steps (2 x history_size
    blocks of the common kept size a pair), else None."""
    if kept.lbfgs_bytes is None or kept.lbfgs_bytes < thresholds.LBFGS_SHARE * kept.kept_bytes:
        return None
    return 2.0 * thresholds.LBFGS_HISTORY * kept.lbfgs_block_bytes


MEMORY_GROWTH = Rule(
    id="memory_growth",
    family="memory",
    severity="warning",
    title="Allocated memory grows {growth_mib_per_step:.1f} MiB every step on {device} ({start_mib:.0f} -> {end_mib:.0f} MiB over {steps} steps)",
    thresholds=thresholds.MEMORY_GROWTH,
    check=_check_growth,
    needs_steps=True,
    fix="stop keeping tensors alive across steps: keep a running sum (total += loss.detach()) or loss.item() every N "
    "steps, not a list of losses (a loss keeps its graph; a detached mse_loss its elementwise buffer), clear "
    "lists/caches of outputs, avoid retain_graph=True",
    docs=Docs(
        what="Allocated memory (the allocator's Total Allocated, or the running sum of allocations) measured at "
        "each step's end on the host rises step after step: the median per-step change reaches the floor (MiB/step) and "
        "`min_rising_pct` of the steps (at least `min_steps`) rise. How much it matters is judged by how soon it "
        "fills the device: where the trace gives the device's memory (`deviceProperties`), the headroom above the "
        "peak divided by the growth per step is the steps left; a warning when that is within `horizon_steps`, "
        "info beyond it (a long run can still reach it). Where the memory is unknown (the host) it needs "
        "the threshold's share of the peak gained per step.",
        why="A leak ends in an out-of-memory error after enough steps, and before that it fragments the caching "
        "allocator and slows every step. The usual cause is a Python reference that keeps tensors (and the "
        "autograd graph behind them) alive.",
        evidence="Median growth per step in MiB and as a share of the peak, how many steps rose, allocated memory "
        "at the first step's start and the last step's end, the peak and the device; with a known capacity, the "
        "projection: the device's memory, the headroom, the steps (and at the median step time, the seconds) "
        "until it is full, and the horizon. Locations: user code allocating the sizes that are allocated more "
        "often than freed; where the trace gives the blocks' addresses, only the blocks of those sizes still held "
        "at the last step's end; `kept_by_op`: the ops those blocks were allocated in (the outermost `aten::` op "
        "open at the allocation), with the MiB they keep a step.",
        fix="Keep a running sum on the device (`total += loss.detach()`) or `loss.item()` every N steps instead of a "
        "list of `loss` (which keeps its autograd graph); `del` or clear lists of outputs; do not use "
        "`retain_graph=True` without need; wrap evaluation in `torch.no_grad()`. A 0-dim result of `F.mse_loss` "
        "or `F.smooth_l1_loss` has the whole elementwise-loss buffer as its storage (pytorch/pytorch#185647): "
        "even a list of their `.detach()` keeps it; the finding then says so, from the op that allocated the "
        "kept blocks.",
        false_positives="LBFGS's curvature history grows inside its step until it holds history_size pairs (100 "
        "by default, 2 x history_size x the parameters' bytes): where the kept blocks were allocated inside "
        "`Optimizer.step#LBFGS.step`, the finding is an info note saying so, with that bound and no leak fix. "
        "Caches that fill once (cudnn workspaces, the optimizer's state on its first step, a "
        "growing KV cache in generation) grow during the first steps and then level off: a capture of those "
        "steps alone looks like a leak; profile after warm-up. One large allocation or allocator noise does not "
        "rise in most steps and is not reported.",
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
    result = ctx.analyses.memory
    if result is None:
        return NotJudged(_NO_MEMORY)
    limits = rule.thresholds
    findings = []
    for device in _main_devices(ctx, result):
        size, peak = device.largest_alloc_bytes, device.peak_bytes
        share = pct(size, peak)
        op_event = device.largest_alloc_op_event
        largest = ctx.analyses.largest_allocs[(device.rank, device.device)]
        broadcast = largest.broadcast if share >= limits.share_pct else None
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
            "op": largest.op if largest.op_event >= 0 else device.largest_alloc_op or "unknown",
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
