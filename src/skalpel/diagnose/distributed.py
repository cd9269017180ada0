"""Distributed findings: the step is communication-bound, communication is not hidden, one rank straggles.

All three read ``analysis/comm.py`` (collectives per rank) and ``analysis/ranks.py``
(aligned clocks, waits, the straggler). Time a rank spends *waiting* for a later rank
inside a collective is the straggler's doing, not the network's: communication_bound and
low_comm_overlap count only the rest (transfer time), so a planted straggler does not
also read as a slow network.
"""

from __future__ import annotations

import numpy as np

from ..analysis.collectives import collective_type
from ..analysis.comm import CommAnalysis, RankComm, analyze_comm
from ..analysis.ranks import OUTSIDE_OPS, RankComparison, compare_ranks
from ..trace.kinds import Kind
from . import thresholds
from .rule import Context, Docs, NotJudged, Outcome, Rule


def _comm(ctx: Context) -> CommAnalysis:
    return ctx.result("comm", lambda: analyze_comm(ctx.trace, ctx.steps))


def _ranks(ctx: Context) -> RankComparison:
    return ctx.result("rank_comparison", lambda: compare_ranks(ctx.trace, ctx.steps, _comm(ctx)))


def _waits(ctx: Context) -> dict[int, float]:
    """Each rank's wait for a consistent straggler, to leave out of its communication time.

    Only when one rank arrives last consistently: then the wait is that rank's fault and
    straggler_rank reports it. Waits that move from rank to rank (jitter, contention) stay
    in the communication time, so a job losing most of its step in collectives never reads
    as "no bottleneck".
    """
    if len(ctx.trace.ranks) < 2:
        return {}
    comparison = _ranks(ctx)
    straggler = comparison.straggler
    min_last = thresholds.STRAGGLER_RANK.param("min_last_arrival_pct")
    if straggler is None or straggler.last_arrival_pct < min_last:
        return {}
    return {timing.rank: timing.wait_ms_per_step for timing in comparison.ranks}


def _is_distributed_job(ctx: Context) -> bool:
    """Several ranks loaded, or a rank file that says it belongs to a job of several ranks."""
    return len(ctx.trace.ranks) > 1 or any((info.world_size or 1) > 1 for info in ctx.trace.ranks)


def _with_comm(ctx: Context) -> list[RankComm] | NotJudged:
    comm = _comm(ctx)
    ranks = [rank for rank in comm.ranks if rank.collectives and rank.step_ms > 0]
    # A single-process job has no collectives to judge: no note, the question does not arise.
    return ranks or NotJudged("no collectives in the profiled steps", applies=_is_distributed_job(ctx))


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
        return ranks
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
        "step_ms": typical.step_ms,
        "wait_ms_per_step": waits.get(typical.rank, 0.0),
        "exposed_ms_per_step": typical.exposed_ms_per_step,
        "overlap_pct": typical.overlap_pct,
        "collectives": _types(typical),
        "rank": typical.rank,
        "share_pct_by_rank": {r.rank: 100.0 * transfer[r.rank] / r.step_ms for r in ranks},
    }
    return [
        rule.finding(
            evidence,
            locations=_issued_at(ctx, typical),
            severity=rule.severity_for(share),
            rank=typical.rank if len(ranks) == 1 else None,
        )
    ]


def _check_low_overlap(ctx: Context, rule: Rule) -> Outcome:
    ranks = _with_comm(ctx)
    if isinstance(ranks, NotJudged):
        return ranks
    waits = _waits(ctx)
    exposed = {r.rank: max(r.exposed_ms_per_step - waits.get(r.rank, 0.0), 0.0) for r in ranks}
    transfer = {r.rank: max(r.comm_ms_per_step - waits.get(r.rank, 0.0), 0.0) for r in ranks}
    typical = _median_rank(ranks, lambda r: exposed[r.rank])
    comm_ms = transfer[typical.rank]
    if comm_ms <= 0:
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
        "step_ms": typical.step_ms,
        "timed_on": typical.timed_on,
        "collectives": _types(typical),
        "rank": typical.rank,
    }
    return [rule.finding(evidence, locations=_issued_at(ctx, typical), rank=typical.rank if len(ranks) == 1 else None)]


def _issued_at(ctx: Context, rank: RankComm) -> tuple[str, ...]:
    """Where the user's code issues the costliest type of collective (backward for DDP's all_reduce)."""
    if not rank.by_type:
        return ()
    kind = rank.by_type[0].type
    events = [c.event for c in rank.collectives if c.type == kind]
    if rank.timed_on == "host":  # gloo runs them on its own thread: locate the c10d op that issued them
        trace = ctx.trace
        issued = np.flatnonzero((trace.kind == Kind.COMM_OP) & (trace.rank == rank.rank))
        events = [int(i) for i in issued if trace.name_of(i).startswith("c10d::") and collective_type(trace.name_of(i)) == kind] or events
    return ctx.locations(np.array(events[:200]))


def _check_straggler(ctx: Context, rule: Rule) -> Outcome:
    if len(ctx.trace.ranks) < 2:
        return NotJudged(
            "one rank in the trace: load every rank's file to compare them", applies=_is_distributed_job(ctx)
        )
    comparison = _ranks(ctx)
    straggler = comparison.straggler
    if straggler is None:
        return NotJudged("no collective matches across the ranks")
    limits = rule.thresholds
    share = 100.0 * straggler.imposed_wait_ms_per_step / straggler.step_ms if straggler.step_ms > 0 else 0.0
    if (
        share < limits.share_pct
        or straggler.imposed_wait_ms_per_step < limits.floor
        or straggler.last_arrival_pct < limits.param("min_last_arrival_pct")
    ):
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
    }
    locations = _straggler_locations(ctx, straggler.rank, top) if top else ()
    fix = rule.fix
    if top is not None:
        fix = f"rank {straggler.rank} spends {top.extra_ms_per_step:.1f} ms/step more in {top.category}: " + fix
    return [rule.finding(evidence, locations=locations, severity=rule.severity_for(share), fix=fix, rank=straggler.rank)]


def _straggler_locations(ctx: Context, rank: int, top) -> tuple[str, ...]:
    if top.events:
        return ctx.locations(np.array(top.events))
    if top.instants_us:
        return ctx.locations_at(rank, top.tid, top.instants_us)
    return ()


COMMUNICATION_BOUND = Rule(
    id="communication_bound",
    family="distributed",
    severity="warning",
    title="Collectives take {share_pct:.0f}% of the step ({comm_ms_per_step:.1f} ms of {step_ms:.1f} ms): {collectives}",
    thresholds=thresholds.COMMUNICATION_BOUND,
    check=_check_communication_bound,
    needs_steps=True,
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
        evidence="`share_pct` and `comm_ms_per_step` (without waits), the step time, the wait, the part not hidden "
        "behind compute, and per collective type its time per step and achieved bus bandwidth (nccl-tests "
        "definition; compare with `skalpel commbench`).",
        fix="Exchange gradients less often or on more samples: gradient accumulation with `no_sync()`, a larger "
        "per-GPU batch; shard instead of replicate (FSDP, ZeroRedundancyOptimizer); compress gradients with a DDP "
        "comm hook; if achieved bus bandwidth is far below `skalpel commbench`, fix the transport first "
        "(NCCL_SOCKET_IFNAME, InfiniBand, NVLink topology).",
        false_positives="A one-rank trace cannot tell waiting from transferring, so a straggler elsewhere inflates "
        "it; the first steps after start-up include one-off broadcasts.",
    ),
)

LOW_COMM_OVERLAP = Rule(
    id="low_comm_overlap",
    family="distributed",
    severity="warning",
    title="{exposed_pct:.0f}% of communication is not hidden behind compute ({exposed_ms_per_step:.1f} ms/step exposed)",
    thresholds=thresholds.LOW_COMM_OVERLAP,
    check=_check_low_overlap,
    needs_steps=True,
    fix="let collectives run during backward: DDP overlaps its bucketed all_reduce with backward (a smaller "
    "bucket_cap_mb starts it earlier; avoid find_unused_parameters=True), issue your own collectives with "
    "async_op=True and wait() later, FSDP backward_prefetch / forward_prefetch",
    docs=Docs(
        what="The share of collective time during which the rank computes nothing: no compute kernel on the device "
        "(GPUs), no host op on the training threads (CPUs, where gloo runs collectives on its own thread). Waits for "
        "later ranks are left out.",
        why="Communication that overlaps compute is free; exposed communication adds straight to the step time.",
        evidence="`exposed_pct` of the communication time, `exposed_ms_per_step`, the communication time and share "
        "of the step, and the collectives by type.",
        fix="Start collectives early and wait late: DDP's buckets (`bucket_cap_mb`, `gradient_as_bucket_view=True`, "
        "`static_graph=True`), `async_op=True` collectives, FSDP prefetching; take synchronous collectives "
        "(`.item()` of a reduced loss, a barrier) out of the step.",
        false_positives="Small models: the last bucket's all_reduce always runs after backward, and on a tiny step "
        "that is most of it. On CPUs, the training thread blocked inside an op counts as computing.",
    ),
)

STRAGGLER_RANK = Rule(
    id="straggler_rank",
    family="distributed",
    severity="warning",
    title="Rank {rank} is the straggler: the other ranks wait {others_wait_ms_per_step:.1f} ms/step for it in collectives "
    "({share_pct:.0f}% of the step; extra time in {extra_time_in})",
    thresholds=thresholds.STRAGGLER_RANK,
    check=_check_straggler,
    needs_steps=True,
    fix="give every rank the same work: shard data evenly (same batch size and sequence lengths), keep logging, "
    "evaluation and checkpointing off the step or spread them, and check the slow rank's host and device "
    "(other processes, thermal throttling, a slower link)",
    docs=Docs(
        what="Ranks on one host share its clock; other hosts' clocks are aligned on the ends of matching collectives "
        "(never trusted raw). Then, collective by collective, each rank's wait is the time from its start to the "
        "last rank's start. The straggler is the rank the others wait for: the least wait of its own, and the last "
        "to arrive at most collectives (`min_last_arrival_pct`).",
        why="A synchronous job runs at the speed of its slowest rank: every other rank idles for the difference, "
        "every step.",
        evidence="The straggler's `rank`, the other ranks' median wait per step and its own, the share of the step, "
        "how often it arrived last, every rank's wait, and where its extra time goes (`extra_time_in`: a top-level "
        f"op, a kernel, or {OUTSIDE_OPS}) against the median of the others.",
        fix="Remove the extra work the straggler does (see `extra_time_in` and the location), balance the data, "
        "or replace the slow node.",
        false_positives="Ranks that do different work by design (pipeline stages, a parameter server); traces "
        "sampled so sparsely that few collectives match; ranks sharing too few CPU cores, where the rank that falls "
        "behind is slowed further by its peers' collective threads.",
    ),
)

RULES: tuple[Rule, ...] = (COMMUNICATION_BOUND, LOW_COMM_OVERLAP, STRAGGLER_RANK)
