"""Communication per rank: collectives by type, their share of the step, bandwidth and overlap.

For each rank: the collectives that start inside its steps (see ``collectives.py`` for
how they are found and sized), per type the calls, time, bytes and achieved algorithm
and bus bandwidth (nccl-tests definitions), the time any collective is running (their
union, within the steps: calls on several threads at once count once) as a share of the step,
and how much of that time is hidden behind compute.

Compute is what the rank does meanwhile: device compute kernels when collectives are
timed on the device (as HTA's comm/comp overlap), host ops on the other threads when
they are timed on the host (gloo runs collectives on its own thread while the training
thread computes). Collective time not covered by compute is *exposed*: the step waits
for it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from . import intervals, numeric
from ..trace.opnames import c10d_ops
from .collectives import TYPES, Collective, busbw_factor, collective_type, find_collectives
from .side_kernels import side_kernels
from .steps import Step, StepSegmentation


@dataclass(frozen=True)
class CollectiveStats:
    """The collectives of one type on one rank: calls, time, bytes and bandwidth."""

    type: str
    calls: int
    calls_per_step: float
    total_ms: float
    ms_per_step: float
    share_pct: float  # of the rank's step time (time any call of the type runs, so types may overlap each other)
    bytes_per_step: float
    median_bytes: int
    group_size: int
    algbw_gbps: float | None  # GB/s (1e9), bytes / time over the calls of known size
    busbw_gbps: float | None  # algbw times the nccl-tests factor for the group size


@dataclass(frozen=True)
class RankComm:
    """Communication of one rank over its steps: share of the step, overlap, by type."""

    rank: int
    timed_on: str  # "device" (collective kernels), "host" (backend host ranges) or "none"
    steps: int
    step_ms: float  # mean step time of the rank
    comm_ms_per_step: float  # time any collective runs (union), per step
    share_pct: float  # comm_ms_per_step of step_ms
    overlapped_ms_per_step: float  # comm time covered by compute
    exposed_ms_per_step: float  # comm time not covered by compute
    overlap_pct: float | None  # overlapped of comm time; None without comm
    by_type: tuple[CollectiveStats, ...]
    collectives: tuple[Collective, ...]  # the collectives inside the steps, in time order
    side_kernels: tuple[str, ...] = ()  # without collectives: unrecognised kernels beside compute (side_kernels.py)

    def to_summary(self) -> dict:
        """The plain-JSON summary that RankReport.comm is read from (result/sections.py CommSummary)."""
        return {
            "timed_on": self.timed_on,
            "comm_ms_per_step": round(self.comm_ms_per_step, 4),
            "share_pct": round(self.share_pct, 2),
            "exposed_ms_per_step": round(self.exposed_ms_per_step, 4),
            "overlap_pct": None if self.overlap_pct is None else round(self.overlap_pct, 2),
            "by_type": [
                {key: (round(value, 4) if isinstance(value, float) else value) for key, value in vars(row).items()}
                for row in self.by_type
            ],
        }


@dataclass(frozen=True)
class CommAnalysis:
    """Communication of every rank."""

    ranks: tuple[RankComm, ...]

    @property
    def has_comm(self) -> bool:
        return any(rank.collectives for rank in self.ranks)

    def for_rank(self, rank: int) -> RankComm | None:
        return self._by_rank.get(rank)

    @cached_property
    def _by_rank(self) -> dict[int, RankComm]:  # a job's ranks each look up their own: not a scan per rank
        return {item.rank: item for item in reversed(self.ranks)}  # reversed: the first of a repeated rank wins


def analyze_comm(trace: Trace, steps: StepSegmentation) -> CommAnalysis:
    """Communication of every rank, over its steps."""
    return CommAnalysis(tuple(_rank_comm(trace, rank, steps.for_rank(rank)) for rank in trace.rank_ids))


def c10d_issuers(trace: Trace, comm: CommAnalysis) -> dict[int, dict[str, tuple[int, ...]]]:
    """The c10d ops of each rank whose collectives are timed on the host, by collective type: gloo runs them on its
    own thread, so the user's code that issued them is the c10d op's."""
    found: dict[int, dict[str, tuple[int, ...]]] = {}
    for rank in comm.ranks:
        if rank.timed_on != "host":
            continue
        by_type: dict[str, list[int]] = defaultdict(list)
        for event in c10d_ops(trace, rank.rank).tolist():
            by_type[collective_type(trace.name_of(event))].append(event)
        found[rank.rank] = {kind: tuple(events) for kind, events in by_type.items()}
    return found


def _rank_comm(trace: Trace, rank: int, steps: list[Step]) -> RankComm:
    found = _in_steps(find_collectives(trace, rank), steps)
    count = max(len(steps), 1)
    step_us = float(sum(step.duration_us for step in steps))
    starts = np.array([c.start_us for c in found], dtype=np.float64)
    ends = np.array([c.end_us for c in found], dtype=np.float64)
    spans = _spans(steps)
    comm = intervals.intersection((starts, ends), spans)  # calls on several threads at once count once
    comm_us = float((comm[1] - comm[0]).sum())
    overlapped_us = intervals.intersection_length(comm, _compute(trace, rank, found)) if found else 0.0
    overlapped_us = max(overlapped_us, 0.0)  # float sums of disjoint pieces can come out at -1e-12, printed as -0.0
    return RankComm(
        rank=rank,
        timed_on=("device" if found[0].on_device else "host") if found else "none",
        steps=len(steps),
        step_ms=step_us / count / 1000.0,
        comm_ms_per_step=comm_us / count / 1000.0,
        share_pct=100.0 * comm_us / step_us if step_us > 0 else 0.0,
        overlapped_ms_per_step=overlapped_us / count / 1000.0,
        exposed_ms_per_step=(comm_us - overlapped_us) / count / 1000.0,
        overlap_pct=100.0 * overlapped_us / comm_us if comm_us > 0 else None,
        by_type=_by_type(found, count, step_us, spans),
        collectives=tuple(found),
        side_kernels=() if found else side_kernels(trace, rank, spans),
    )


def _spans(steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
    """The time the steps cover: collective time is counted inside it, so it is never more than the step."""
    return (np.array([step.start_us for step in steps], dtype=np.float64),
            np.array([step.end_us for step in steps], dtype=np.float64))  # fmt: skip


def _in_steps(found: list[Collective], steps: list[Step]) -> list[Collective]:
    """The collectives that start inside one of the steps."""
    if not steps:
        return []
    bounds = sorted((step.start_us, step.end_us) for step in steps)
    starts = np.array([start for start, _ in bounds])
    ends = np.array([end for _, end in bounds])
    collective_starts = np.array([collective.start_us for collective in found], dtype=np.float64)
    position = np.searchsorted(starts, collective_starts, side="right") - 1  # the last step to start by it
    inside = (position >= 0) & (collective_starts <= ends[np.maximum(position, 0)])
    return [collective for collective, keep in zip(found, inside.tolist()) if keep]


def _compute(trace: Trace, rank: int, found: list[Collective]) -> tuple[np.ndarray, np.ndarray]:
    """The intervals in which the rank computes while its collectives run."""
    if found[0].on_device:
        selected = trace.mask(Kind.KERNEL, rank=rank)
    else:
        comm_threads = np.array(sorted({c.tid for c in found}), dtype=np.int64)
        selected = trace.mask(Kind.CPU_OP, rank=rank) & ~np.isin(trace.tid, comm_threads)
    index = np.flatnonzero(selected)
    return intervals.union(trace.ts[index], trace.ts[index] + trace.dur[index])


def _by_type(found: list[Collective], steps: int, step_us: float, spans) -> tuple[CollectiveStats, ...]:
    groups: dict[str, list[Collective]] = defaultdict(list)
    for collective in found:
        groups[collective.type].append(collective)
    rows = [_stats(kind, groups[kind], steps, step_us, spans) for kind in TYPES if kind in groups]
    return tuple(sorted(rows, key=lambda row: -row.total_ms))


def _stats(kind: str, calls: list[Collective], steps: int, step_us: float, spans) -> CollectiveStats:
    """One type's calls; its time is the union of the calls inside the steps (gloo runs one call per thread at once)."""
    running = intervals.intersection((np.array([c.start_us for c in calls]), np.array([c.end_us for c in calls])), spans)
    total_us = float((running[1] - running[0]).sum())
    sized = [c for c in calls if c.nbytes > 0 and c.dur_us > 0]
    group = int(numeric.median([c.group_size for c in calls]))
    algbw = sum(c.nbytes for c in sized) / sum(c.dur_us for c in sized) / 1e3 if sized else None
    return CollectiveStats(
        type=kind,
        calls=len(calls),
        calls_per_step=len(calls) / steps,
        total_ms=total_us / 1000.0,
        ms_per_step=total_us / steps / 1000.0,
        share_pct=100.0 * total_us / step_us if step_us > 0 else 0.0,
        bytes_per_step=float(sum(c.nbytes for c in calls)) / steps,
        median_bytes=int(numeric.median([c.nbytes for c in calls])),
        group_size=group,
        algbw_gbps=algbw,
        busbw_gbps=algbw * busbw_factor(kind, group) if algbw is not None else None,
    )
