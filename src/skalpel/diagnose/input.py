"""Input pipeline findings: the step waits for its data, or copies it from pageable memory."""

from __future__ import annotations

import numpy as np

from ..analysis.breakdown import step_breakdown
from ..analysis.syncs import syncs
from ..trace.kinds import Kind
from . import thresholds
from .common import pct, windows
from .cpu import usable_cores
from .rule import Context, Docs, Outcome, Rule


def _breakdown(ctx: Context):
    return ctx.result("breakdown", lambda: step_breakdown(ctx.trace, ctx.steps))


def _check_dataloader(ctx: Context, rule: Rule) -> Outcome:
    breakdown = _breakdown(ctx)
    limits = rule.thresholds
    findings = []
    for rank in breakdown.ranks:
        share, ms = rank.pct.get("dataloader", 0.0), rank.ms_per_step.get("dataloader", 0.0)
        if share < limits.share_pct or ms < limits.floor:
            continue
        waits = np.flatnonzero((ctx.trace.kind == Kind.DATALOADER) & (ctx.trace.rank == rank.rank))
        iterators = sorted({ctx.trace.name_of(index).split("#", 1)[-1].split(".")[0] for index in waits})
        single = any("SingleProcess" in name for name in iterators)
        evidence = {
            "share_pct": share,
            "ms_per_step": ms,
            "step_ms": rank.avg_step_ms,
            "steps": len(rank.step_ms),
            "worst_step_wait_ms": max(rank.per_step_ms.get("dataloader", (0.0,))),
            "iterator": ", ".join(iterators),
            "judged_over": "marked steps" if ctx.steps.marked else "the whole window (no ProfilerStep markers)",
        }
        cpu = ctx.capture.cpu if ctx.capture is not None else None
        fix = worker_advice(cpu, device=ctx.trace.has_device) + "; " + _CHEAP_ITEMS
        if single:
            fix = "num_workers=0 loads every batch in the training process: " + fix
        locations = _unique(ctx.inner_locations(waits) + ctx.locations(waits))
        title = None if ctx.steps.marked else (
            f"Waiting for data takes {share:.0f}% of the whole window ({ms:.1f} ms of {rank.avg_step_ms:.1f} ms; "
            "no ProfilerStep markers)"
        )  # fmt: skip
        findings.append(
            rule.finding(evidence, locations=locations, severity=rule.severity_for(share), fix=fix, rank=rank.rank, title=title)
        )
    return findings


_CHEAP_ITEMS = "make __getitem__ cheap (decode/augment once, cache, or move transforms to the device)"


def worker_advice(cpu: dict | None, *, device: bool = True) -> str:
    """How many DataLoader workers to use: never more than the cores the capture saw (one stays for training).

    ``pin_memory`` only with a device: pinned pages speed host-to-device copies, and a CPU-only run makes none.
    """
    pin = "pin_memory=True, " if device else ""
    cores = usable_cores(cpu) if cpu else None
    if cores is None:
        return f"DataLoader(num_workers=N up to the cores the machine has, {pin}persistent_workers=True)"
    if cores < 2:
        return f"with {cores:g} usable core, worker processes would only compete with training"
    workers = min(4, int(cores) - 1)
    return (f"DataLoader(num_workers={workers}, {pin}persistent_workers=True, prefetch_factor=2) "
            f"({cores:g} usable cores)")  # fmt: skip


def _unique(locations: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(location for location in locations if location))


DATALOADER_BOUND = Rule(
    id="dataloader_bound",
    family="input",
    severity="warning",
    title="The step waits for data {share_pct:.0f}% of the time ({ms_per_step:.1f} ms of a {step_ms:.1f} ms step)",
    thresholds=thresholds.DATALOADER_BOUND,
    check=_check_dataloader,
    fix="DataLoader(num_workers=N up to the cores available, one kept for training; pin_memory=True, "
    "persistent_workers=True, prefetch_factor=2); make __getitem__ cheap (decode/augment once, cache, or move "
    "transforms to the device)",
    docs=Docs(
        what="The training loop waits for the next batch: the time inside `enumerate(DataLoader)#...__next__` "
        "that no device work hides, as the PyTorch Profiler TensorBoard plugin's DataLoader category counts it.",
        why="While the loop waits for data the device and the host compute nothing. That time is pure loss, "
        "and it grows with a faster model or device.",
        evidence="`share_pct` of the mean step and `ms_per_step` (both from the step-time breakdown), the step time, "
        "what it was judged over (`judged_over`: the marked steps, or the whole window from the first to the last "
        "host op when the trace has no ProfilerStep markers), "
        "the worst step's wait, and the DataLoader iterator type (`_SingleProcessDataLoaderIter` means num_workers=0). "
        "The locations are the user code the wait is busy with (a Dataset's `__getitem__`), then the user "
        "function that iterates the loader.",
        fix="Load batches in worker processes (`num_workers` > 0, `persistent_workers=True`, `prefetch_factor`), "
        "pin host memory (`pin_memory=True`) and copy with `non_blocking=True`; make `__getitem__` cheap "
        "(pre-decode, cache, vectorise transforms or run them on the device).",
        false_positives="The first steps after a DataLoader is created (workers starting up) wait longer; profile "
        "after warm-up. An iterable that is not a DataLoader is not seen at all (its time shows as CPU Exec).",
    ),
)


def _check_pageable(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.result("syncs", lambda: syncs(ctx.trace, ctx.steps))
    limits = rule.thresholds
    findings = []
    for window in windows(ctx):
        rank = result.for_rank(window.rank)
        copies = rank.pageable_htod if rank is not None else None
        if copies is None or copies.count == 0:
            continue
        ms = copies.device_ms / rank.steps
        bytes_per_step = copies.total_bytes / rank.steps
        share = pct(ms, window.mean_step_ms)
        if share < limits.share_pct or ms < limits.floor or bytes_per_step < limits.param("min_bytes_per_step"):
            continue
        evidence = {
            "share_pct": share,
            "ms_per_step": ms,
            "copies_per_step": copies.count / rank.steps,
            "mib_per_step": bytes_per_step / 2**20,
            "gb_per_s": copies.total_bytes / 1e9 / (copies.device_ms / 1000.0) if copies.device_ms > 0 else 0.0,
            "events": list(copies.worst_events),
        }
        severity = "warning" if share >= limits.param("warning_pct") else "info"
        locations = ctx.locations(list(copies.worst_events))
        findings.append(rule.finding(evidence, locations=locations, severity=severity, rank=window.rank))
    return findings


PAGEABLE_MEMCPY = Rule(
    id="pageable_memcpy",
    family="input",
    severity="warning",
    title="{mib_per_step:.1f} MiB/step copied to the device from pageable memory ({ms_per_step:.2f} ms/step, {share_pct:.1f}% of the step)",
    thresholds=thresholds.PAGEABLE_MEMCPY,
    check=_check_pageable,
    needs_device=True,
    fix="pin host memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True)",
    docs=Docs(
        what="Host-to-device copies whose source is pageable (not pinned) host memory: copies named "
        "`Memcpy HtoD (Pageable -> Device)`.",
        why="A pageable copy is staged through a driver buffer at lower bandwidth, and the host thread blocks "
        "until it is done, so it can neither overlap with compute nor let the host run ahead.",
        evidence="Pageable copy time per step and its share of the step, copies and MiB per step, the achieved "
        "bandwidth, and the longest copy events' indices; an info note below `warning_pct` of the step. The location is the user code that issued the copy.",
        fix="Pin the source: `DataLoader(pin_memory=True)` or `tensor.pin_memory()`; then copy with "
        "`.to(device, non_blocking=True)` so the copy overlaps with compute.",
        false_positives="One-off copies of a few bytes (a scalar, a shape) are pageable by nature and harmless; "
        "the floors (MiB and ms per step) leave them out.",
    ),
)

RULES = (DATALOADER_BOUND, PAGEABLE_MEMCPY)
