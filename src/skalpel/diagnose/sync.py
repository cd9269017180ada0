"""Host-device synchronisation: the host stops inside the step and waits for the device.

The host time a sync blocks is not what it costs: while the host waits the device is busy.
The cost is what follows: the queue is empty when the sync returns, so the device idles
until the host has launched new work. The rule measures that idle time after each sync
(up to the end of its step) and judges it against the thresholds; below them a finding is
an info note that still locates every sync.
"""

from __future__ import annotations

import numpy as np

from ..analysis import intervals, numeric
from ..analysis.syncs import SyncOptions, syncs
from ..trace.kinds import DEVICE_KIND_ARRAY
from ..trace.model import isin_few
from . import thresholds
from .common import Window, pct, windows
from .rule import Context, Docs, Outcome, Rule

_CAUSES = {
    "sync_call": "explicit synchronize (torch.cuda.synchronize(), stream/event.synchronize())",
    "item": ".item() / .tolist() / Python control flow on a device tensor",
    "blocking_dtoh": "blocking device-to-host copy (.cpu(), .to('cpu'), .numpy())",
}


def _check_sync(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.result("syncs_all", lambda: syncs(ctx.trace, ctx.steps, options=SyncOptions(worst=1_000_000)))
    limits = rule.thresholds
    findings = []
    for window in windows(ctx):
        rank = result.for_rank(window.rank)
        if rank is None:
            continue
        counts = {name: rank.categories[name].count for name in _CAUSES}
        if sum(counts.values()) == 0:
            continue
        host = _host_events(ctx, rank)
        idle_ms = _idle_after(ctx, window, host) / 1000.0 / window.count
        share = pct(idle_ms, window.mean_step_ms)
        severity = rule.severity_for(share) if share >= limits.share_pct and idle_ms >= limits.floor else "info"
        main = max(counts, key=lambda name: rank.categories[name].total_ms if counts[name] else -1.0)
        longest = host[np.argsort(-ctx.trace.dur[host], kind="stable")[:8]]
        evidence = {
            "share_pct": share,
            "idle_after_ms_per_step": idle_ms,
            "blocked_ms_per_step": rank.blocked_ms_per_step,
            "syncs_per_step": sum(counts.values()) / rank.steps,
            "step_ms": window.mean_step_ms,
            "main_cause": _CAUSES[main],
            **{f"{name}_count": count for name, count in counts.items()},
            "device_sync_events": rank.categories["device_sync"].count,
            "events": sorted(int(index) for index in longest),
        }
        findings.append(rule.finding(evidence, locations=ctx.locations(host), severity=severity, rank=window.rank))
    return findings


def _host_events(ctx: Context, rank) -> np.ndarray:
    """The host side of every sync: sync calls, item ops, and the launch calls of blocking copies."""
    trace = ctx.trace
    copies = np.array(rank.categories["blocking_dtoh"].worst_events, dtype=np.int64)
    parts = [np.array(rank.categories[name].worst_events, dtype=np.int64) for name in ("sync_call", "item")]
    parts.append(trace.launcher[copies] if len(copies) else copies)
    host = numeric.unique(np.concatenate(parts))
    return host[host >= 0]


def _idle_after(ctx: Context, window: Window, host: np.ndarray) -> float:
    """Device idle time (us) that starts when a sync returns, each gap counted once, cut at the step's end."""
    trace = ctx.trace
    device = np.flatnonzero(isin_few(trace.kind, DEVICE_KIND_ARRAY) & (trace.rank == window.rank))
    if len(device) == 0 or len(host) == 0:
        return 0.0
    busy_start, busy_end = intervals.union(trace.ts[device], trace.ts[device] + trace.dur[device])
    returns = trace.ts[host] + trace.dur[host]
    step = window.step_of(returns)
    inside = step >= 0
    returns, step_end = returns[inside], np.sort(window.ends)[step[inside]] if inside.any() else np.zeros(0)
    following = np.searchsorted(busy_start, returns, side="right")  # the first busy interval starting after
    previous = following - 1
    still_busy = (previous >= 0) & (busy_end[np.maximum(previous, 0)] > returns)
    has_next = following < len(busy_start)
    counted = ~still_busy & has_next
    gap_start = returns[counted]  # the device was already idle before; the sync's share starts when it returns
    gap_end = np.minimum(busy_start[following[counted]], step_end[counted])
    gaps = np.clip(gap_end - gap_start, 0.0, None)
    _, first = np.unique(following[counted], return_index=True)  # one gap per idle stretch
    return float(gaps[first].sum())


HOST_DEVICE_SYNC = Rule(
    id="host_device_sync",
    family="sync",
    severity="warning",
    title="{syncs_per_step:.3g} host-device sync(s) per step; the device then idles {idle_after_ms_per_step:.2f} ms/step ({share_pct:.1f}% of the step)",
    thresholds=thresholds.HOST_DEVICE_SYNC,
    check=_check_sync,
    needs_device=True,
    fix="keep values on the device inside the step: drop .item()/.cpu()/print of tensors in the loop, log every N "
    "steps, use non_blocking copies into pinned memory, remove torch.cuda.synchronize() outside timing code",
    docs=Docs(
        what="Points inside a step where the host waits for the device: `cudaDeviceSynchronize` / "
        "`cudaStreamSynchronize` / `cudaEventSynchronize` calls, `.item()` (`aten::_local_scalar_dense`), and "
        "device-to-host copies the host waits for (`.cpu()`, a synchronous `cudaMemcpy`).",
        why="The host normally runs ahead and queues work; a sync drains that queue, so when it returns the device "
        "idles until the host has launched new work, on every step. One `.item()` per step for logging can cost "
        "several percent.",
        evidence="The device idle time that starts when a sync returns (per step, cut at the step's end) and its "
        "share of the step, which the thresholds judge; the host time blocked in syncs; syncs per step by cause; "
        "the cuda_sync events CUPTI recorded; the indices of the longest. Below the thresholds the finding is an "
        "info note, so each sync is still located.",
        fix="Accumulate metrics on the device and read them every N steps; avoid data-dependent Python control "
        "flow on tensors (`if loss > x`, `nonzero`); `copy_(..., non_blocking=True)` into pinned memory; keep "
        "`torch.cuda.synchronize()` only around timing code.",
        false_positives="A sync at the very end of a step costs little when the next step starts with host work "
        "anyway (data loading); syncs for gradient clipping with `inf` checks or loss scaling are often deliberate.",
    ),
)

RULES = (HOST_DEVICE_SYNC,)
