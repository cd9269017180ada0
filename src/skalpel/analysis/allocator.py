"""Device memory allocator calls in steady state: cudaMalloc/cudaFree (hipMalloc/hipFree) per rank.

PyTorch's caching allocator asks the driver for memory only while its pool grows, so in
steady state these calls should not happen at all. Steady state is the marked steps after
the first (all steps when there is one); without markers, the loop iterations after the
first, inferred from DataLoader fetches or optimizer steps, or else the whole window cut
into equal slices. ``spread_pct`` says in how many of the steps (iterations, slices) the
calls recur: a pool that grows during the first iterations fills one or two, churn fills
most. Calls inside one-time work (the first cuBLAS or cuDNN call) are not counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.roles import Role
from . import intervals, numeric
from .onetime import OneTimeResult
from .steps import StepSegmentation, inferred_iterations

@dataclass(frozen=True)
class RankAllocatorCalls:
    """Allocator calls (cudaMalloc, cudaFree...) of one rank in steady state."""

    rank: int
    calls: int  # in steady state
    total_ms: float
    window_ms: float  # the steady-state window the calls were counted in
    steady_state: str  # "marked steps after the first", "the one marked step", "the whole window ..."
    spread_pct: float  # share of the steps (or slices of the window) with at least one call
    by_name: dict[str, int]
    events: tuple[int, ...]  # the longest calls, to locate them

    @property
    def share_pct(self) -> float:
        return 100.0 * self.total_ms / self.window_ms if self.window_ms > 0 else 0.0


@dataclass(frozen=True)
class AllocatorResult:
    """Allocator calls per rank."""

    ranks: dict[int, RankAllocatorCalls]

    def for_rank(self, rank: int) -> RankAllocatorCalls | None:
        return self.ranks.get(rank)


def allocator_calls(trace: Trace, steps: StepSegmentation, *, one_time: OneTimeResult | None = None) -> AllocatorResult:
    """Steady-state allocator calls per rank; calls inside ``one_time`` work (a first cuBLAS call) are left out."""
    calls = np.flatnonzero(trace.role == Role.ALLOCATOR)  # runtime and driver calls only
    if one_time is not None:
        calls = calls[~_inside_one_time(trace, calls, one_time)]
    return AllocatorResult({rank: _rank_calls(trace, steps, rank, calls[trace.rank[calls] == rank]) for rank in trace.rank_ids})


def _inside_one_time(trace: Trace, calls: np.ndarray, one_time: OneTimeResult) -> np.ndarray:
    inside = np.zeros(len(calls), dtype=bool)
    for rank, work in one_time.ranks.items():
        inside |= (trace.rank[calls] == rank) & work.holds(trace, calls, same_thread=False)
    return inside


_SLICES = 8


def _in_ranges(trace: Trace, calls: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(the calls inside the sorted, disjoint ranges, their total length in us, share of ranges holding a call)."""
    where = intervals.containing(starts, ends, trace.ts[calls])
    spread = 100.0 * len(numeric.unique(where[where >= 0])) / len(starts) if len(starts) else 0.0
    return calls[where >= 0], float((ends - starts).sum()), spread


def _rank_calls(trace: Trace, steps: StepSegmentation, rank: int, calls: np.ndarray) -> RankAllocatorCalls:
    own = sorted(steps.for_rank(rank), key=lambda step: step.start_us)
    if steps.marked and own:
        window = own[1:] if len(own) > 1 else own
        steady = "marked steps after the first" if len(own) > 1 else "the one marked step"
        starts = np.array([step.start_us for step in window])
        ends = np.array([step.end_us for step in window])
        calls, window_us, spread = _in_ranges(trace, calls, starts, ends)
    elif (loop := inferred_iterations(trace, rank)) is not None:
        starts, ends, source = loop
        calls, window_us, spread = _in_ranges(trace, calls, starts[1:], ends[1:])  # the first iteration grows the pool
        steady = f"iterations after the first, inferred from {source} (no ProfilerStep markers)"
    else:  # the whole window cut in equal slices: churn recurs in most of them, a pool growing once does not
        on_rank = (trace.rank == rank) & (trace.kind != Kind.PYTHON)
        first, last = (float(trace.ts[on_rank].min()), float(trace.end[on_rank].max())) if on_rank.any() else (0.0, 0.0)
        edges = np.linspace(first, last, _SLICES + 1)
        calls, window_us, spread = _in_ranges(trace, calls, edges[:-1], edges[1:])
        steady = f"the whole window in {_SLICES} slices (no ProfilerStep markers)"
    longest = calls[np.argsort(-trace.dur[calls], kind="stable")[:20]]
    return RankAllocatorCalls(
        rank=rank,
        calls=len(calls),
        total_ms=float(trace.dur[calls].sum()) / 1000.0,
        window_ms=window_us / 1000.0,
        steady_state=steady,
        spread_pct=spread,
        by_name=dict(Counter(trace.names[i] for i in trace.name[calls])),
        events=tuple(int(i) for i in longest),
    )
