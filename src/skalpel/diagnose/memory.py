"""Memory findings: allocated memory that grows step after step, and one op that allocates much of the peak."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..analysis import numeric
from ..analysis.memory import allocating_ops, memory
from ..display import rough_duration
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
        allocs = _held_allocations(ctx, device)
        by_op = _kept_by_op(ctx, device, allocs, len(deltas))
        if by_op:
            evidence["kept_by_op"] = by_op
            title += f"; kept blocks allocated in {by_op[0]['op']} ({by_op[0]['mib_per_step']:.1f} MiB/step)"
        history = _lbfgs_history(ctx, device, allocs)
        if history is not None:  # bounded, not a leak: said as such, with no leak fix
            evidence["lbfgs_history_bound_mib"] = history / MIB
            title = rule.title.format(**evidence) + _LBFGS_TITLE.format(bound_mib=history / MIB)
            findings.append(rule.finding(evidence, severity="info", title=title, fix=_LBFGS_FIX,
                                         locations=_leak_sites(ctx, device, allocs), rank=device.rank))  # fmt: skip
            continue
        buffer_loss = next((entry["op"] for entry in by_op if entry["op"] in _LOSS_KEEPS_BUFFER), None)
        fix = _LOSS_KEEPS_BUFFER_FIX.format(op=buffer_loss) if buffer_loss else None
        findings.append(rule.finding(evidence, severity=severity, title=title, fix=fix,
                                     locations=_leak_sites(ctx, device, allocs), rank=device.rank))  # fmt: skip
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
    """Per rank, the accelerator with the highest peak, else the host: host memory of a GPU job is not judged."""
    devices = [result.main_device(rank) for rank in ctx.trace.rank_ids]
    return [device for device in devices if device is not None]


def _held_allocations(ctx: Context, device) -> np.ndarray:
    """The allocations that are never freed during the steps: rows of ``ctx.trace.memory``.

    Those are the sizes allocated more often than freed during the steps (allocations and frees
    paired by size); where the trace gives each block's address, only the blocks of those sizes
    still held at the last step's end: a leak of activations shares its size with the
    activations, gradients and temporaries that every step frees again.
    """
    events = ctx.trace.memory
    steps = sorted(ctx.steps.for_rank(device.rank), key=lambda step: step.start_us)
    start, end = steps[0].host_begin_us, steps[-1].host_end_us  # allocations happen on the host's timeline
    on_device = events.device_type == 0 if device.device == "cpu" else events.device_type != 0
    rows = np.flatnonzero((events.rank == device.rank) & on_device & (events.ts >= start) & (events.ts < end))
    rows = rows[np.argsort(events.ts[rows], kind="stable")]
    sizes = events.nbytes[rows]
    surplus = Counter(sizes[sizes > 0].tolist())
    surplus.subtract(Counter((-sizes[sizes < 0]).tolist()))
    kept = {size for size, count in surplus.items() if count > 0 and size >= MIB // 16}
    allocs = rows[np.isin(sizes, list(kept))] if kept else rows[:0]
    held = _held_at_end(events, rows) if len(allocs) else None
    return np.intersect1d(allocs, held) if held is not None else allocs


def _leak_sites(ctx: Context, device, allocs: np.ndarray) -> tuple[str, ...]:
    """Where the allocations that are never freed happen: the user frames open at them."""
    events = ctx.trace.memory
    # per thread, most allocations first: a GPU step's backward allocates on autograd's thread, which has no user frames
    threads = Counter(events.tid[allocs].tolist())
    found: dict[str, None] = {}
    for tid, _ in threads.most_common():
        on_thread = allocs[events.tid[allocs] == tid]
        found.update(dict.fromkeys(ctx.locations_at(device.rank, int(tid), events.ts[on_thread])))
    return tuple(found)[:3]


_OPS_NAMED = 64  # the largest held blocks whose op is looked up


def _kept_by_op(ctx: Context, device, allocs: np.ndarray, steps: int) -> list[dict]:
    """The ops that allocated the blocks never freed, most memory first: the op, MiB kept a step, blocks."""
    events = ctx.trace.memory
    largest = allocs[np.argsort(-events.nbytes[allocs], kind="stable")[:_OPS_NAMED]]
    kept: Counter[str] = Counter()
    blocks: Counter[str] = Counter()
    ops = allocating_ops(ctx.trace, device.rank, events.tid[largest], events.ts[largest].astype(float))
    for row, op in zip(largest.tolist(), ops):
        kept[op or "(no op)"] += int(events.nbytes[row])
        blocks[op or "(no op)"] += 1
    return [{"op": op, "mib_per_step": size / MIB / max(steps, 1), "blocks": blocks[op]}
            for op, size in kept.most_common(3)]


# reduced losses whose 0-dim result keeps the whole elementwise-loss buffer as its storage (pytorch/pytorch#185647)
_LOSS_KEEPS_BUFFER = frozenset({"aten::mse_loss", "aten::smooth_l1_loss"})
_LOSS_KEEPS_BUFFER_FIX = (
    "a kept {op} result holds its whole elementwise-loss buffer, not 4 bytes (its storage is the buffer: "
    "pytorch/pytorch#185647), even after .detach(): keep loss.detach().clone() or a running sum "
    "(total += loss.detach()), or read loss.item() every N steps"
)


# LBFGS keeps history_size (100 by default) pairs of flat parameter-sized vectors (a step and a gradient change),
# made inside its step: memory that grows there stops once the history is full
_LBFGS_STEP = "Optimizer.step#LBFGS.step"
_LBFGS_HISTORY = 100  # torch.optim.LBFGS's default history_size
_LBFGS_SHARE = 0.8  # of the kept bytes allocated inside its steps
_LBFGS_TITLE = (
    ", allocated inside LBFGS's step: its curvature history, history_size pairs of parameter-sized vectors, which "
    "stops growing once full (~{bound_mib:.0f} MiB with the default history_size=100), not a leak"
)
_LBFGS_FIX = (
    "nothing to fix if it fits: LBFGS's history holds at most history_size pairs of flattened-parameter vectors "
    "(2 x history_size x the parameters' bytes) and then stops growing; a smaller history "
    "(torch.optim.LBFGS(params, history_size=10)) caps it lower"
)


def _lbfgs_history(ctx: Context, device, allocs: np.ndarray) -> float | None:
    """Where the kept blocks were allocated inside LBFGS's steps: the bytes its full history would hold (two
    blocks of the common kept size a pair), else None."""
    trace, events = ctx.trace, ctx.trace.memory
    name = trace.name_id(_LBFGS_STEP)
    if name < 0 or len(allocs) == 0:
        return None
    ranges = np.flatnonzero((trace.name == name) & (trace.rank == device.rank))
    ranges = ranges[np.argsort(trace.ts[ranges], kind="stable")]
    at = events.ts[allocs].astype(np.float64)
    before = np.searchsorted(trace.ts[ranges], at, side="right") - 1
    inside = (before >= 0) & (at < trace.end[ranges][np.maximum(before, 0)])
    sizes = events.nbytes[allocs].astype(np.float64)
    if sizes[inside].sum() < _LBFGS_SHARE * sizes.sum():
        return None
    block = Counter(events.nbytes[allocs[inside]].tolist()).most_common(1)[0][0]
    return 2.0 * _LBFGS_HISTORY * block


def _held_at_end(events, rows: np.ndarray) -> np.ndarray | None:
    """The allocations among ``rows`` (in time order) whose block is not freed again before the last row;
    None where the addresses cannot pair them (absent, or a block allocated twice without a free between)."""
    held: dict[int, int] = {}
    for row, addr, size in zip(rows.tolist(), events.addr[rows].tolist(), events.nbytes[rows].tolist()):
        if addr < 0 or (size > 0 and addr in held):
            return None
        if size > 0:
            held[addr] = row
        elif size < 0:
            held.pop(addr, None)
    return np.array(sorted(held.values()), dtype=np.int64)


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
