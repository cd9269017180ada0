"""Host-device synchronisation: the host stops inside the step and waits for the device.

The host time a sync blocks is not what it costs: while the host waits the device is busy.
The cost is what follows: the queue is empty when the sync returns, so the device idles
until the host has launched new work. The rule reads that cost from the blame analysis
(``analysis/blame.py``): only sync calls that blocked while device work ran count (a
``.item()`` on a CPU tensor makes no sync call; a sync that returned at once waited for
nothing), syncs inside a DataLoader fetch, a compile range or one-time work (cuDNN's
autotuning) belong to that work, and the idle charged to a sync is capped at what it
drained. Below the thresholds a finding is an info note that still locates the syncs.
"""

from __future__ import annotations

from ..analysis.sync_causes import BLOCKING_DTOH, ITEM, SYNC_CALL
from . import thresholds
from .common import named_at, pct, window_of
from .rule import Context, Docs, NotJudged, Outcome, Rule

_CAUSES = {
    SYNC_CALL: "explicit synchronize (torch.cuda.synchronize(), stream/event.synchronize())",
    ITEM: ".item() / .tolist() / Python control flow on a device tensor",
    BLOCKING_DTOH: "blocking device-to-host copy (.cpu(), .to('cpu'), .numpy())",
}


def _check_sync(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.analyses.blame
    if result is None or not result.applies:
        return NotJudged(result.reason if result is not None else "no device activity")
    limits = rule.thresholds
    findings = []
    for rank, syncs in ctx.analyses.sync_causes.ranks.items():  # the ranks whose syncs blocked on device work
        window, blamed = window_of(ctx, rank), result.for_rank(rank)
        idle_ms = blamed.by_category_ms["sync"] / window.count
        share = pct(idle_ms, window.mean_step_ms)
        severity = rule.severity_for(share) if share >= limits.share_pct and idle_ms >= limits.floor else "info"
        evidence = {
            "share_pct": share,
            "idle_after_ms_per_step": idle_ms,
            "blocked_ms_per_step": syncs.blocked_us / 1000.0 / window.count,
            "syncs_per_step": syncs.points_total / window.count,
            "step_ms": window.median_step_ms,
            "main_cause": _CAUSES[syncs.main_cause],
            **{f"{name}_count": syncs.points[name] for name in _CAUSES},
            "device_sync_events": syncs.device_sync_events,
            "events": sorted(int(index) for index in syncs.shown),  # the sync calls themselves
            "sync_calls": list(syncs.shown_names),
        }
        title = None
        after = _host_work_after(ctx, blamed, window.count, limits.floor, limits.param("host_work_after_pct"))
        if after:
            evidence["host_work_after"] = after
            lead = after[0]
            title = rule.title.format(**evidence) + (
                f" while the host runs {named_at(lead['label'], lead['location'])} ({lead['ms_per_step']:.2f} ms/step), "
                "which the sync keeps from overlapping the device's work")  # fmt: skip
        findings.append(rule.finding(evidence, locations=ctx.locations(syncs.shown), severity=severity, rank=rank,
                                     title=title))  # fmt: skip
    return findings


def _host_work_after(ctx: Context, blamed, steps: int, floor_ms: float, share_pct: float, count: int = 3) -> list[dict]:
    """What the host ran while the device idled after the syncs (the time charged to them): the work the sync
    exposes, named apart from the sync, each with its time per step (the rule's floor or more, ``share_pct`` of
    that idle time or more) and the statement sampled while it ran."""
    total = blamed.by_category_ms["sync"]
    found = []
    for item in blamed.after_syncs[:count]:
        if total <= 0 or item.ms < share_pct / 100.0 * total or item.ms / steps < floor_ms or item.category != "host_compute":
            continue
        where = ctx.location_in(item.events[0], item.spans) if item.events else None
        found.append({"label": item.label, "ms_per_step": item.ms / steps, "location": where})
    return found


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
        "`cudaStreamSynchronize` / `cudaEventSynchronize` calls (also the ones `.item()` and `.cpu()` make), and "
        "synchronous device-to-host copies (`cudaMemcpy`, copies into pageable memory). Only calls during which "
        "device work ran count: `.item()` on a CPU tensor (Adam's step counter) makes no such call, a sync that "
        "returns at once waited for nothing, and syncs inside a DataLoader fetch, a compile range or one-time work "
        "(cuDNN's autotuning) belong to that work.",
        why="The host normally runs ahead and queues work; a sync drains that queue, so when it returns the device "
        "idles until the host has launched new work, on every step. One `.item()` per step for logging can cost "
        "several percent.",
        evidence="The device idle time the blame analysis charges to syncs (from the idle start to the next launch, "
        "capped at what the sync drained) per step and its share of the step, which the thresholds judge; the host "
        "time blocked in them; syncs per step by cause; the cuda_sync events CUPTI recorded; the sync calls "
        "themselves (`events`, `sync_calls`): those after which the device idled, else the longest; "
        "`host_work_after`: what the host ran while the device idled after them (the user's function, the "
        "statement sampled there, ms per step), the work the sync keeps from overlapping the device's, named "
        "apart from the sync and in the title. Below the thresholds the finding is an info note, so each sync is "
        "still located.",
        fix="Accumulate metrics on the device and read them every N steps; avoid data-dependent Python control "
        "flow on tensors (`if loss > x`, `nonzero`); `copy_(..., non_blocking=True)` into pinned memory; keep "
        "`torch.cuda.synchronize()` only around timing code.",
        false_positives="A sync at the very end of a step costs little when the next step starts with host work "
        "anyway (data loading); syncs for gradient clipping with `inf` checks or loss scaling are often deliberate.",
    ),
)

RULES = (HOST_DEVICE_SYNC,)
