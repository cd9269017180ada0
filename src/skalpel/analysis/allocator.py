"""Device memory allocator calls in steady state: cudaMalloc/cudaFree (hipMalloc/hipFree) per rank.

PyTorch's caching allocator asks the driver for memory only while its pool grows, so in
steady state these calls should not happen at all. Steady state is the marked steps after
the first (all steps when there is one); without markers, the whole window less the first
call of each name (which creates the context or the pool).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from .steps import StepSegmentation

ALLOCATOR_CALLS = frozenset(
    {"cudaMalloc", "cudaFree", "hipMalloc", "hipFree", "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2",
     "hipExtMallocWithFlags", "cudaMallocManaged", "hipMallocManaged"}
)  # fmt: skip


@dataclass(frozen=True)
class RankAllocatorCalls:
    rank: int
    calls: int  # in steady state
    total_ms: float
    window_ms: float  # the steady-state window the calls were counted in
    steady_state: str  # "marked steps after the first", "marked steps", "the whole window ..."
    by_name: dict[str, int]
    events: tuple[int, ...]  # the longest calls, to locate them

    @property
    def share_pct(self) -> float:
        return 100.0 * self.total_ms / self.window_ms if self.window_ms > 0 else 0.0


@dataclass(frozen=True)
class AllocatorResult:
    ranks: dict[int, RankAllocatorCalls]

    def for_rank(self, rank: int) -> RankAllocatorCalls | None:
        return self.ranks.get(rank)


def allocator_calls(trace: Trace, steps: StepSegmentation) -> AllocatorResult:
    ids = [trace.name_id(name) for name in ALLOCATOR_CALLS]
    calls = np.flatnonzero(np.isin(trace.name, [i for i in ids if i >= 0]) & np.isin(trace.kind, [Kind.RUNTIME, Kind.DRIVER]))
    return AllocatorResult({rank: _rank_calls(trace, steps, rank, calls[trace.rank[calls] == rank]) for rank in trace.rank_ids})


def _rank_calls(trace: Trace, steps: StepSegmentation, rank: int, calls: np.ndarray) -> RankAllocatorCalls:
    own = sorted(steps.for_rank(rank), key=lambda step: step.start_us)
    if steps.marked and own:
        window = own[1:] if len(own) > 1 else own
        steady = "marked steps after the first" if len(own) > 1 else "the one marked step"
        starts = np.array([step.start_us for step in window])
        ends = np.array([step.end_us for step in window])
        index = np.searchsorted(starts, trace.ts[calls], side="right") - 1
        inside = (index >= 0) & (trace.ts[calls] < ends[np.maximum(index, 0)])
        calls, window_us = calls[inside], float((ends - starts).sum())
    else:
        calls = calls[np.argsort(trace.ts[calls], kind="stable")]
        _, first = np.unique(trace.name[calls], return_index=True)
        calls = np.delete(calls, first)
        on_rank = (trace.rank == rank) & (trace.kind != Kind.PYTHON)
        window_us = float(trace.end[on_rank].max() - trace.ts[on_rank].min()) if on_rank.any() else 0.0
        steady = "the whole window less the first call of each name (no ProfilerStep markers)"
    longest = calls[np.argsort(-trace.dur[calls], kind="stable")[:20]]
    return RankAllocatorCalls(
        rank=rank,
        calls=len(calls),
        total_ms=float(trace.dur[calls].sum()) / 1000.0,
        window_ms=window_us / 1000.0,
        steady_state=steady,
        by_name=dict(Counter(trace.names[i] for i in trace.name[calls])),
        events=tuple(int(i) for i in longest),
    )
