"""Distributed findings: the step is communication-bound, communication is not hidden, one rank straggles.

All three read ``analysis/comm.py`` (collectives per rank) and ``analysis/ranks.py``
(aligned clocks, waits, the straggler). Time a rank spends *waiting* for a later rank
inside a collective is the straggler's doing, not the network's: communication_bound and
low_comm_overlap count only the rest (transfer time), so a planted straggler does not
also read as a slow network.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..analysis import numeric
from ..analysis.collectives import SYNCHRONISING
from ..analysis.comm import CommAnalysis, RankComm
from ..analysis.rankprofile import RankLocations
from ..analysis.ranks import OUTSIDE_OPS, RankComparison
from ..analysis.rankwork import ExtraWork
from ..result.report import AcrossRanks, Finding
from ..trace import run_queue_header
from . import thresholds
from .rule import Context, Docs, NotJudged, Outcome, Rule


def _comm(ctx: Context) -> CommAnalysis:
    return ctx.analyses.comm


def _ranks(ctx: Context) -> RankComparison:
    return ctx.analyses.rank_comparison  # set wherever several ranks are loaded, the only case asking for it


def _waits(ctx: Context) -> dict[int, float]:
    """Each rank's wait for a consistent straggler, to leave out of its communication time.

    When one rank arrives last consistently the wait is that rank's fault and straggler_rank
    reports it; when the ranks do identical work on one loaded machine (``_machine_load``) the
    wait is the load's, and straggler_rank's info note keeps it (with the collectives' share,
    waits included). Waits that move from rank to rank otherwise (jitter) stay in the
    communication time, so a job losing most of its step in collectives never reads as
    "no bottleneck".
    """
    if len(ctx.ranks) < 2:
        return {}
    if not _consistent_straggler(ctx) and not _machine_load(ctx):
        return {}
    return {timing.rank: timing.wait_ms_per_step for timing in _ranks(ctx).ranks}


def _consistent_straggler(ctx: Context) -> bool:
    """One rank arrives last at most collectives, or at half of them when it does more work than the others."""
    straggler = _ranks(ctx).straggler
    if straggler is None:
        return False
    least = "min_last_arrival_pct" if _extra_work(ctx) is None else "min_last_arrival_pct_extra_work"
    return straggler.last_arrival_pct >= thresholds.STRAGGLER_RANK.param(least)


def _machine_load(ctx: Context) -> bool:
    """The waits between ranks come from the shared machine's load, not from one rank's extra work.

    All ranks on one host (one clock), identical work (every op called equally often a step on
    every rank, on the same inputs), and the slowest rank's extra time, if it has one, in host ops
    that every rank runs, not in Python outside ops (extra work: a sleep, I/O, logging; unless the rank's script
    thread waited that much longer for a core, ``_waited_for_a_core``) and not in kernels (a slow device is a real
    straggler): the same work ran slower where the CPU load happened to fall,
    and which rank that is moves from run to run. The waits are then neither a straggler's
    nor the network's; straggler_rank says so in an info note that keeps the numbers.
    """
    if len(ctx.ranks) < 2:
        return False
    comparison = _ranks(ctx)
    if len(comparison.ranks) < 2 or any(timing.clock not in ("reference", "same host") for timing in comparison.ranks):
        return False
    work = ctx.analyses.rank_work
    if work is None or not work.matched:
        return False
    straggler = comparison.straggler
    top = straggler.excess[0] if straggler is not None and straggler.excess else None
    if top is not None and top.category == OUTSIDE_OPS:
        return _waited_for_a_core(ctx, straggler.rank, straggler.step_ms, top.extra_ms_per_step)
    return top is None or not top.category.startswith("kernel: ")


PREEMPTED_SHARE = 0.5  # of the straggler's extra time outside ops that its longer wait for a core must explain


def _waited_for_a_core(ctx: Context, rank: int, step_ms: float, extra_ms: float) -> bool:
    """Whether the straggler's extra host time outside any op is its script thread waiting for a core: it waited
    longer than the others (``run_queue_header``, skalpel's capture) by at least ``PREEMPTED_SHARE`` of that time.

    A rank of identical work that the scheduler kept off the cores arrives last with its extra time outside ops,
    as a rank that sleeps or reads files does: beside busy loops on 2 cores one such rank read as a critical
    straggler (others waiting 48.9 ms/step for it, 95% of the step). A sleep is no wait for a core: that rank stays
    the straggler. Without the capture's figures (a trace from elsewhere) the extra time is the rank's.
    """
    shares = {info.rank: run_queue_header.wait_share(info.run_queue) for info in ctx.ranks}
    mine = shares.get(rank)
    others = [share for other, share in shares.items() if other != rank and share is not None]
    if mine is None or not others or extra_ms <= 0:
        return False
    return (mine - min(others)) * step_ms >= PREEMPTED_SHARE * extra_ms


def _extra_work(ctx: Context) -> ExtraWork | None:
    """What the straggler runs more of than the others, when it costs a material part of the wait it imposes."""
    straggler = _ranks(ctx).straggler
    work = ctx.analyses.rank_work
    if straggler is None or work is None or not work.extra:
        return None
    top = work.extra[0]
    least = thresholds.STRAGGLER_RANK.param("min_extra_work_pct") / 100.0 * straggler.imposed_wait_ms_per_step
    return top if top.extra_ms_per_step > 0 and top.extra_ms_per_step >= least else None


def _count(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _extra_work_words(rank: int, extra: ExtraWork) -> str:
    """'rank 1 runs 3.0x the aten::mm calls a step: 96 vs 32' (or the others' inputs, or calls only it makes)."""
    if extra.input_shapes is not None:
        return (f"rank {rank} runs {extra.op} on inputs {extra.input_shapes}, the other ranks on {extra.others_input_shapes} "
                f"({_count(extra.calls_per_step)} vs {_count(extra.others_calls_per_step)} calls a step)")  # fmt: skip
    if extra.others_calls_per_step <= 0:
        return f"rank {rank} runs {extra.op} {_count(extra.calls_per_step)} times a step, the other ranks never"
    return (f"rank {rank} runs {extra.call_ratio:.1f}x the {extra.op} calls a step: {_count(extra.calls_per_step)} vs "
            f"{_count(extra.others_calls_per_step)}")  # fmt: skip


def _is_distributed_job(ctx: Context) -> bool:
    """Several ranks loaded, or a rank file that says it belongs to a job of several ranks."""
    return len(ctx.ranks) > 1 or any((info.world_size or 1) > 1 for info in ctx.ranks)


NEVER_COMMUNICATE = "no collective on any rank: the ranks never communicate"
NOT_RECOGNISED = "no collective recognised on any rank (kernels on a side stream run beside compute)"


def _never_communicate(ctx: Context) -> bool:
    """A job of several ranks none of which issues a collective in its profiled steps (a model not wrapped in DDP)."""
    comm = _comm(ctx)
    stepped = [rank for rank in comm.ranks if rank.steps > 0]
    return _is_distributed_job(ctx) and bool(stepped) and not any(rank.collectives for rank in comm.ranks)


def _side_kernels(ctx: Context, limit: int = 3) -> list[str]:
    """Unrecognised kernels that run on a side stream beside compute, over the ranks: maybe their communication."""
    names: list[str] = []
    for rank in _comm(ctx).ranks:
        names += [name for name in rank.side_kernels if name not in names]
    return names[:limit]


def _no_collective(ctx: Context) -> NotJudged:
    """Why the communication rules are not judged when no rank issues a recognised collective."""
    return NotJudged(NOT_RECOGNISED if _side_kernels(ctx) else NEVER_COMMUNICATE)


def _with_comm(ctx: Context) -> list[RankComm] | NotJudged:
    comm = _comm(ctx)
    ranks = [rank for rank in comm.ranks if rank.collectives and rank.step_ms > 0]
    if not ranks and _never_communicate(ctx):
        return _no_collective(ctx)
    # A single-process job has no collectives to judge: no note, the question does not arise.
    return ranks or NotJudged("no collectives in the profiled steps", applies=_is_distributed_job(ctx))


def _no_communication_note(ctx: Context, rule: Rule) -> Finding:
    """The ranks of a distributed job exchange nothing: each trains (or runs) its own copy of the model.

    Unless kernels skalpel does not know run on a side stream beside compute, as communication kernels do (an
    in-house all-to-all, a library not yet recognised): then it says only that no collective was recognised."""
    ranks = [info.rank for info in ctx.ranks]
    world = max((info.world_size or 1 for info in ctx.ranks), default=1)
    steps = sum(rank.steps for rank in _comm(ctx).ranks)
    side = _side_kernels(ctx)
    if side:
        return _unrecognised_note(rule, ranks, world, steps, side)
    who = f"The {len(ranks)} ranks never communicate" if len(ranks) > 1 else f"Rank {ranks[0]} of {world} never communicates"
    title = (f"{who}: no collective (all_reduce, broadcast, barrier, ...) in {steps} profiled steps, so every rank "
             "trains its own copy of the model; a model meant to be trained together must be wrapped in "
             "DistributedDataParallel (or FSDP)")  # fmt: skip
    evidence = {"ranks": len(ranks), "world_size": max(world, len(ranks)), "profiled_steps": steps, "collectives": 0}
    fix = ("wrap the model once the process group is up: model = DistributedDataParallel(model) (device_ids=[local_rank] "
           "on GPUs), and give each rank its shard of the data (DistributedSampler); nothing to do if the ranks are "
           "independent runs by design (a sweep, sharded inference)")  # fmt: skip
    return rule.finding(evidence, severity="info", title=title, fix=fix)


def _unrecognised_note(rule: Rule, ranks: list[int], world: int, steps: int, side: list[str]) -> Finding:
    who = f"the {len(ranks)} ranks" if len(ranks) > 1 else f"rank {ranks[0]} of {world}"
    title = (f"No collective recognised on {who} in {steps} profiled steps; kernels on a side stream run beside "
             f"compute and may be its communication: {', '.join(side)}")  # fmt: skip
    evidence = {"ranks": len(ranks), "world_size": max(world, len(ranks)), "profiled_steps": steps, "collectives": 0,
                "side_stream_kernels": ", ".join(side)}  # fmt: skip
    fix = ("nothing to change if these kernels exchange data between ranks: skalpel does not know their names, so it "
           "neither times them as communication nor judges communication_bound or low_comm_overlap")  # fmt: skip
    return rule.finding(evidence, severity="info", title=title, fix=fix)


def _types(rank: RankComm, limit: int = 3) -> str:
    rows = [
        f"{row.type} {row.ms_per_step:.1f} ms/step" + (f" at {row.busbw_gbps:.2f} GB/s busbw" if row.busbw_gbps else "")
        for row in rank.by_type[:limit]
    ]
    return ", ".join(rows)


def _median_rank(ranks: list[RankComm], key) -> RankComm:
    """The rank at the median of ``key`` (the job's typical rank; the only one for one rank)."""
    ordered = sorted(ranks, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _check_communication_bound(ctx: Context, rule: Rule) -> Outcome:
    ranks = _with_comm(ctx)
    if isinstance(ranks, NotJudged):
        return [_no_communication_note(ctx, rule)] if ranks.reason in (NEVER_COMMUNICATE, NOT_RECOGNISED) else ranks
    waits = _waits(ctx)
    transfer = {r.rank: max(r.comm_ms_per_step - waits.get(r.rank, 0.0), 0.0) for r in ranks}
    typical = _median_rank(ranks, lambda r: transfer[r.rank] / r.step_ms)
    ms = transfer[typical.rank]
    share = 100.0 * ms / typical.step_ms
    if share < rule.thresholds.share_pct or ms < rule.thresholds.floor:
        return []
    evidence = {
        "share_pct": share,
        "comm_ms_per_step": ms,
        "step_ms": typical.step_ms,  # the mean step, the share's own denominator: per-step means never exceed it
        "wait_ms_per_step": waits.get(typical.rank, 0.0),
        "exposed_ms_per_step": typical.exposed_ms_per_step,
        "overlap_pct": typical.overlap_pct,
        "collectives": _types(typical),
        "rank": typical.rank,
        "share_pct_by_rank": {r.rank: 100.0 * transfer[r.rank] / r.step_ms for r in ranks},  # every rank's
    }
    shares = {r.rank: 100.0 * transfer[r.rank] / r.step_ms for r in ranks}
    holds = [r.rank for r in ranks if shares[r.rank] >= rule.thresholds.share_pct and transfer[r.rank] >= rule.thresholds.floor]
    exposed = max(typical.exposed_ms_per_step - waits.get(typical.rank, 0.0), 0.0)
    hidden = 100.0 * exposed / typical.step_ms < rule.thresholds.share_pct  # the step pays less than a bound's share
    words = _hidden_words(evidence, exposed) if hidden else {"severity": rule.severity_for(share)}
    finding = rule.finding(evidence, locations=_issued_at(ctx, typical), rank=typical.rank if len(ranks) == 1 else None,
                           **words)  # fmt: skip
    return [_with_spread(ctx, finding, "share_pct", shares, holds, typical.rank)]


def _hidden_words(evidence: dict, exposed_ms: float) -> dict:
    """An info note for collectives that run much of the step but hidden behind compute (expert parallelism's
    all-to-all overlapped by design, DDP's all_reduce under backward): the step pays only the exposed part, below
    a bound's share, so "communicate less" is not the fix."""
    step = evidence["step_ms"]
    hidden_pct = 100.0 * (1.0 - exposed_ms / evidence["comm_ms_per_step"])
    title = (f"Collectives run {evidence['share_pct']:.0f}% of the step ({evidence['comm_ms_per_step']:.1f} ms of the "
             f"{step:.1f} ms mean step: {evidence['collectives']}), {hidden_pct:.0f}% of it hidden behind compute: "
             f"the step waits for {exposed_ms:.1f} ms ({100.0 * exposed_ms / step:.0f}%)")  # fmt: skip
    fix = ("nothing to change for the exchange's own sake: it overlaps compute; to gain, shorten the exposed "
           f"{exposed_ms:.1f} ms or the compute that hides it")  # fmt: skip
    return {"severity": "info", "title": title, "fix": fix}


def _check_low_overlap(ctx: Context, rule: Rule) -> Outcome:
    ranks = _with_comm(ctx)
    if isinstance(ranks, NotJudged):
        return ranks
    waits = _waits(ctx)
    exposed = {r.rank: max(r.exposed_ms_per_step - waits.get(r.rank, 0.0), 0.0) for r in ranks}
    transfer = {r.rank: max(r.comm_ms_per_step - waits.get(r.rank, 0.0), 0.0) for r in ranks}
    typical = _median_rank(ranks, lambda r: exposed[r.rank])
    comm_ms = transfer[typical.rank]
    if comm_ms <= 0 or _one_small_bucket(typical, rule):
        return []
    exposed_pct = min(100.0 * exposed[typical.rank] / comm_ms, 100.0)
    comm_share = 100.0 * comm_ms / typical.step_ms
    limits = rule.thresholds
    if exposed_pct < limits.share_pct or exposed[typical.rank] < limits.floor or comm_share < limits.param("min_comm_share_pct"):
        return []
    evidence = {
        "exposed_pct": exposed_pct,
        "exposed_ms_per_step": exposed[typical.rank],
        "comm_ms_per_step": comm_ms,
        "comm_share_pct": comm_share,
        "step_ms": typical.step_ms,  # the mean step, the share's own denominator: per-step means never exceed it
        "timed_on": typical.timed_on,
        "collectives": _types(typical),
        "rank": typical.rank,
    }
    finding = rule.finding(evidence, locations=_issued_at(ctx, typical), rank=typical.rank if len(ranks) == 1 else None)
    shares = {r.rank: min(100.0 * exposed[r.rank] / transfer[r.rank], 100.0) for r in ranks if transfer[r.rank] > 0}
    holds = [r.rank for r in ranks if r.rank in shares and shares[r.rank] >= limits.share_pct
             and exposed[r.rank] >= limits.floor and not _one_small_bucket(r, rule)
             and 100.0 * transfer[r.rank] / r.step_ms >= limits.param("min_comm_share_pct")]  # fmt: skip
    return [_with_spread(ctx, finding, "exposed_pct", shares, holds, typical.rank)]


def _with_spread(ctx: Context, finding: Finding, key: str, values: dict[int, float], holds: list[int],
                 typical: int) -> Finding:  # fmt: skip
    """A job-wide finding (judged at the job's median rank) with the ranks it holds on by the same thresholds, the
    spread of ``key`` over them and the worst, as a finding merged across ranks says (``job/across.py``)."""
    if len(values) < 2 or not holds:
        return finding
    across = AcrossRanks.spread_of(values, ranks=holds, of=max(len(ctx.rank_ids), len(values)), key=key,
                                   worst=thresholds.WORST_RANKS, title_rank=typical)  # fmt: skip
    return dataclasses.replace(finding, across=across)


def _one_small_bucket(rank: RankComm, rule: Rule) -> bool:
    """One all_reduce per step, smaller than DDP's default bucket: it can only start once backward is over,
    so there is no compute left to hide it behind (a small model; a smaller bucket_cap_mb would gain little)."""
    synchronising = [row for row in rank.by_type if row.type in SYNCHRONISING]
    if len(synchronising) != 1 or synchronising[0].type != "all_reduce":
        return False
    row = synchronising[0]
    return row.calls_per_step <= 1.0 and row.bytes_per_step / 2**20 < rule.thresholds.param("single_bucket_mib")


def _issued_at(ctx: Context, rank: RankComm) -> tuple[str, ...]:
    """Where the user's code issues the costliest type of collective: located where the rank's trace was reduced."""
    known = ctx.analyses.rank_locations or {}
    return known[rank.rank].issued_at if rank.rank in known else ()


def _issued_in_trace(ctx: Context, rank: RankComm) -> tuple[str, ...]:
    """Where the user's code issues the costliest type of collective (backward for DDP's all_reduce), in the rank's
    trace that ``ctx`` holds."""
    if not rank.by_type:
        return ()
    kind = rank.by_type[0].type
    events = [c.event for c in rank.collectives if c.type == kind]
    if rank.timed_on == "host":  # gloo runs them on its own thread: locate the c10d op that issued them
        events = list(ctx.analyses.c10d_issuers.get(rank.rank, {}).get(kind, ())) or events
    return ctx.locations(np.array(events[:200]))


def _check_straggler(ctx: Context, rule: Rule) -> Outcome:
    if len(ctx.ranks) < 2:
        return NotJudged(
            "one rank in the trace: load every rank's file to compare them", applies=_is_distributed_job(ctx)
        )
    if _never_communicate(ctx):
        return _no_collective(ctx)
    comparison = _ranks(ctx)
    straggler = comparison.straggler
    if straggler is None:
        return NotJudged("no collective matches across the ranks")
    limits = rule.thresholds
    extra = _extra_work(ctx)  # more work than the others is the straggler's whatever the load
    if extra is None and _machine_load(ctx):
        note = _load_note(ctx, rule, comparison)
        waited = note.evidence["wait_share_pct"] >= limits.share_pct and note.evidence["wait_ms_per_step"] >= limits.floor
        return [note] if waited else []
    share = 100.0 * straggler.imposed_wait_ms_per_step / straggler.step_ms if straggler.step_ms > 0 else 0.0
    if share < limits.share_pct or straggler.imposed_wait_ms_per_step < limits.floor or not _consistent_straggler(ctx):
        return []
    top = straggler.excess[0] if straggler.excess else None
    evidence = {
        "rank": straggler.rank,
        "share_pct": share,
        "others_wait_ms_per_step": straggler.others_wait_ms_per_step,
        "own_wait_ms_per_step": straggler.own_wait_ms_per_step,
        "imposed_wait_ms_per_step": straggler.imposed_wait_ms_per_step,
        "last_arrival_pct": straggler.last_arrival_pct,
        "step_ms": straggler.step_ms,
        "extra_time_in": top.category if top else "unknown",
        "extra_ms_per_step": top.extra_ms_per_step if top else 0.0,
        "wait_ms_per_step_by_rank": {t.rank: t.wait_ms_per_step for t in comparison.ranks},
        "comm_share_with_waits_pct_by_rank": {r.rank: r.share_pct for r in _comm(ctx).ranks},  # never hidden
        "comm_share_max_pct": max((r.share_pct for r in _comm(ctx).ranks), default=0.0),
    }
    locations = _straggler_locations(ctx, straggler.rank, top) if top else ()
    fix = rule.fix
    if top is not None:
        fix = f"rank {straggler.rank} spends {top.extra_ms_per_step:.1f} ms/step more in {top.category}: " + fix
    title = None
    if extra is not None:
        evidence.update(_extra_work_evidence(extra))
        words = _extra_work_words(straggler.rank, extra)
        title = (f"Rank {straggler.rank} is the straggler, from extra work: {words}; the other ranks wait "
                 f"{straggler.others_wait_ms_per_step:.1f} ms/step for it in collectives ({share:.0f}% of the step); "
                 f"collectives with the waits take up to {evidence['comm_share_max_pct']:.0f}% of the step")  # fmt: skip
        fix = f"balance the work: {words}; " + fix
    finding = rule.finding(evidence, locations=locations, severity=rule.severity_for(share), fix=fix, title=title,
                           rank=straggler.rank)  # fmt: skip
    return [finding]


def _extra_work_evidence(extra: ExtraWork) -> dict:
    evidence = {
        "extra_work_op": extra.op,
        "calls_per_step": extra.calls_per_step,
        "others_calls_per_step": extra.others_calls_per_step,
        "call_ratio": extra.call_ratio if extra.others_calls_per_step > 0 else None,
        "extra_work_ms_per_step": extra.extra_ms_per_step,
    }
    if extra.input_shapes is not None:
        evidence.update(input_shapes=extra.input_shapes, others_input_shapes=extra.others_input_shapes)
    return evidence


def _load_note(ctx: Context, rule: Rule, comparison: RankComparison) -> Finding:
    """Identical work on one machine: who arrives last follows the machine's load, so no rank is blamed."""
    timings = comparison.ranks
    step_ms = numeric.median([t.step_ms for t in timings])
    wait_ms = max(t.wait_ms_per_step for t in timings)  # the rank that waits most
    comm_share = {r.rank: r.share_pct for r in _comm(ctx).ranks}
    slowest = comparison.straggler
    evidence = {
        "wait_share_pct": 100.0 * wait_ms / step_ms if step_ms > 0 else 0.0,
        "wait_ms_per_step": wait_ms,
        "step_ms": step_ms,
        "last_arrivals_by_rank": {t.rank: t.last_arrivals for t in timings},
        "matched_collectives": max(t.matched_collectives for t in timings),
        "wait_ms_per_step_by_rank": {t.rank: t.wait_ms_per_step for t in timings},
        "comm_share_with_waits_pct_by_rank": comm_share,  # never hidden: the collectives' whole share
        "slowest_rank": slowest.rank if slowest is not None else -1,
        "slower_in": slowest.excess[0].category if slowest is not None and slowest.excess else "nothing",
    }
    title = (
        f"No straggler: the ranks do identical work on one machine and wait up to {wait_ms:.1f} ms/step for each other "
        f"({evidence['wait_share_pct']:.0f}% of the step; collectives with the waits take up to "
        f"{max(comm_share.values(), default=0.0):.0f}% of the step); the slower rank runs the same ops slower, so who arrives "
        f"last follows the machine's load (last arrivals: {', '.join(f'rank {t.rank} {t.last_arrivals}' for t in timings)})"
    )
    fix = ("nothing in the code: give each rank its own cores (ranks x OMP_NUM_THREADS <= cores), stop other load "
           "on the machine, and measure again")  # fmt: skip
    return rule.finding(evidence, severity="info", title=title, fix=fix)


def _straggler_locations(ctx: Context, rank: int, top) -> tuple[str, ...]:
    known = ctx.analyses.rank_locations or {}
    return known[rank].by_category.get(top.category, ()) if rank in known else ()


def _located(ctx: Context, rank: int, events: tuple[int, ...], instants_us: tuple[float, ...], tid: int | None) -> tuple[str, ...]:
    if events:
        return ctx.locations(np.array(events))
    if instants_us:
        return ctx.locations_at(rank, tid, instants_us)
    return ()


def rank_locations(ctx: Context, rank: int, profile) -> RankLocations:
    """``ctx`` holds this one rank's trace; ``profile`` is its ``analysis.rankprofile.Profile`` (None: one-rank job)."""
    rank_comm = _comm(ctx).for_rank(rank)
    issued = _issued_in_trace(ctx, rank_comm) if rank_comm is not None and rank_comm.collectives else ()
    where = profile.where if profile is not None else {}
    by_category = {category: _located(ctx, rank, events, instants, profile.tid) for category, (events, instants) in where.items()}
    return RankLocations(issued, {category: found for category, found in by_category.items() if found})


COMMUNICATION_BOUND = Rule(
    id="communication_bound",
    family="distributed",
    severity="warning",
    title="Collectives take {share_pct:.0f}% of the step ({comm_ms_per_step:.1f} ms of the {step_ms:.1f} ms mean step): {collectives}",
    thresholds=thresholds.COMMUNICATION_BOUND,
    check=_check_communication_bound,
    scope="job",
    fix="communicate less per sample: gradient accumulation (DDP no_sync() on all but the last micro-step), "
    "a larger per-GPU batch, FSDP or a sharded optimizer (ZeroRedundancyOptimizer) for large models, "
    "bf16/fp16 gradient compression (DDP comm hooks)",
    docs=Docs(
        what="The time some collective runs (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, "
        "barrier, send/recv), as a share of the step, on the typical (median) rank. Collectives are timed by their "
        "NCCL/RCCL kernels on GPUs and by the backend's host ranges (gloo:all_reduce) on CPUs. Time a rank only "
        "waits inside a collective for a consistent straggler (one rank arriving last at most collectives) is left "
        "out: that is straggler_rank's. Waits that move from rank to rank (jitter, contention) are counted.",
        why="Data-parallel training scales only while the gradient exchange is small next to the compute. At 30% of "
        "the step the exchange, not the model, sets the speed, and adding ranks makes it worse.",
        evidence="`share_pct` and `comm_ms_per_step` (without waits), `step_ms` (the median step), the wait, the part not hidden "
        "behind compute, and per collective type its time per step and achieved bus bandwidth (nccl-tests "
        "definition; compare with `skalpel commbench`).",
        fix="Exchange gradients less often or on more samples: gradient accumulation with `no_sync()`, a larger "
        "per-GPU batch; shard instead of replicate (FSDP, ZeroRedundancyOptimizer); compress gradients with a DDP "
        "comm hook; if achieved bus bandwidth is far below `skalpel commbench`, fix the transport first "
        "(NCCL_SOCKET_IFNAME, InfiniBand, NVLink topology).",
        false_positives="A one-rank trace cannot tell waiting from transferring, so a straggler elsewhere inflates "
        "it; the first steps after start-up include one-off broadcasts. A job of several ranks with no collective at "
        "all in its profiled steps gets an info note under this id instead: the ranks never communicate, so each "
        "trains its own copy of the model (no DistributedDataParallel), which is right only for independent runs; "
        "when kernels skalpel does not know run on a side stream beside compute, the note says only that no collective "
        "was recognised and names them (an in-house or unknown communication library). Collectives hidden behind "
        "compute (expert parallelism's all-to-all overlapped by design) so that the step waits for less than the "
        "share are an info note, not a bound.",
    ),
)

LOW_COMM_OVERLAP = Rule(
    id="low_comm_overlap",
    family="distributed",
    severity="warning",
    title="{exposed_pct:.0f}% of communication is not hidden behind compute ({exposed_ms_per_step:.1f} ms/step exposed, mean step {step_ms:.1f} ms)",
    thresholds=thresholds.LOW_COMM_OVERLAP,
    check=_check_low_overlap,
    scope="job",
    fix="let collectives run during backward: DDP overlaps its bucketed all_reduce with backward (a smaller "
    "bucket_cap_mb starts it earlier; avoid find_unused_parameters=True), issue your own collectives with "
    "async_op=True and wait() later, FSDP backward_prefetch / forward_prefetch",
    docs=Docs(
        what="The share of collective time during which the rank computes nothing: no compute kernel on the device "
        "(GPUs), no host op on the training threads (CPUs, where gloo runs collectives on its own thread). Waits for "
        "later ranks are left out.",
        why="Communication that overlaps compute is free; exposed communication adds straight to the step time.",
        evidence="`exposed_pct` of the communication time, `exposed_ms_per_step`, the communication time and share "
        "of the step, `step_ms` (the median step), and the collectives by type.",
        fix="Start collectives early and wait late: DDP's buckets (`bucket_cap_mb`, `gradient_as_bucket_view=True`, "
        "`static_graph=True`), `async_op=True` collectives, FSDP prefetching; take synchronous collectives "
        "(`.item()` of a reduced loss, a barrier) out of the step.",
        false_positives="Small models: the last bucket's all_reduce always runs after backward, and on a tiny step "
        "that is most of it; a single all_reduce per step smaller than `single_bucket_mib` (one DDP bucket) is "
        "therefore not judged. On CPUs, the training thread blocked inside an op counts as computing.",
    ),
)

STRAGGLER_RANK = Rule(
    id="straggler_rank",
    family="distributed",
    severity="warning",
    title="Rank {rank} is the straggler: the other ranks wait {others_wait_ms_per_step:.1f} ms/step for it in collectives "
    "({share_pct:.0f}% of the step; extra time in {extra_time_in}); collectives with the waits take up to "
    "{comm_share_max_pct:.0f}% of the step",
    thresholds=thresholds.STRAGGLER_RANK,
    check=_check_straggler,
    scope="job",
    fix="give every rank the same work: shard data evenly (same batch size and sequence lengths), keep logging, "
    "evaluation and checkpointing off the step or spread them, and check the slow rank's host and device "
    "(other processes, thermal throttling, a slower link)",
    docs=Docs(
        what="Ranks on one host share its clock; other hosts' clocks are aligned on the ends of matching collectives "
        "(never trusted raw). Then, collective by collective, each rank's wait is the time from its start to the "
        "last rank's start. The straggler is the rank the others wait for: the least wait of its own, and the last "
        "to arrive at most collectives (`min_last_arrival_pct`). Then the ranks' work is compared, op by op from the op "
        "tables: calls a step and most frequent input shapes. A straggler that calls some op `min_call_ratio` times as "
        "often as the median of the others (or on other inputs), where those calls cost `min_extra_work_pct` of the "
        "wait it imposes or more, is a straggler from extra work whatever the machine's load: it need only arrive "
        "last at `min_last_arrival_pct_extra_work` of the collectives.",
        why="A synchronous job runs at the speed of its slowest rank: every other rank idles for the difference, "
        "every step.",
        evidence="The straggler's `rank`, the other ranks' median wait per step and its own, the share of the step, "
        "how often it arrived last, every rank's wait, every rank's collective share with the waits (never hidden "
        "behind the verdict), and where its extra time goes (`extra_time_in`: a top-level "
        f"op, a kernel, or {OUTSIDE_OPS}) against the median of the others. A straggler from extra work also has "
        "`extra_work_op`, its `calls_per_step` against `others_calls_per_step`, the `call_ratio`, what the extra calls "
        "cost (`extra_work_ms_per_step`) and, when the calls match but the inputs do not, both `input_shapes`.",
        fix="Remove the extra work the straggler does (see `extra_time_in` and the location), balance the data, "
        "or replace the slow node.",
        false_positives="Ranks on one machine that do identical work (every op called equally often a step, on the same "
        "inputs) and differ only "
        "in how fast the same host ops ran are not blamed: who arrives last then follows the machine's CPU load and "
        "moves from run to run, so the rule writes an info note with the waits and the collectives' full share "
        "instead; so is a rank whose extra time is host time outside any op while its script thread waited that "
        "much longer for a core than the others (skalpel's capture records each rank's wait, `skalpel_run_queue`). "
        "Ranks that do different work by design (pipeline stages, a parameter server); traces "
        "sampled so sparsely that few collectives match; ranks sharing too few CPU cores, where the rank that falls "
        "behind is slowed further by its peers' collective threads.",
    ),
)

RULES: tuple[Rule, ...] = (COMMUNICATION_BOUND, LOW_COMM_OVERLAP, STRAGGLER_RANK)
