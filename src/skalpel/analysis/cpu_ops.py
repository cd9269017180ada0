"""The host ops of a CPU-only run's steps, per rank: their self times, how long ops of their name usually take,
where they come from (``op_sources``), and the time the steps spend blocked in collectives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from . import intervals, numeric
from .loader_ranges import LoaderRanges
from .op_sources import OpSource, by_source, source_labels
from .ops import self_times
from .step_window import Window
from .steps import StepSegmentation


@dataclass(frozen=True)
class RankCpuOps:
    rank: int
    ops: np.ndarray  # the host ops (aten ops and the like) starting inside the steps
    self_us: np.ndarray  # each op's self time
    name_median_us: np.ndarray  # for each op, the median self time of the ops of its name
    labels: np.ndarray  # each op's source (a position in op_sources.SOURCES)
    collective_ms: float  # host time inside collectives (gloo, c10d) within the steps, overlaps once, clipped to each

    def sources(self, selected: np.ndarray) -> tuple[OpSource, ...]:
        """The selected ops (a mask over ``ops``) by source, largest first."""
        return by_source(self.ops[selected], self.labels[selected])


@dataclass(frozen=True)
class CpuOps:
    ranks: dict[int, RankCpuOps]  # ranks with steps, in the trace's rank order

    def for_rank(self, rank: int) -> RankCpuOps | None:
        return self.ranks.get(rank)


def cpu_ops(trace: Trace, steps: StepSegmentation, loaders: LoaderRanges) -> CpuOps:
    ranks = {}
    for rank in trace.rank_ids:
        window = Window(rank, tuple(steps.for_rank(rank)))
        if window.count:
            ops = _inside(trace, window, trace.kind == Kind.CPU_OP)
            self_us = self_times(trace, ops)
            ranks[rank] = RankCpuOps(rank, ops, self_us, _name_medians(trace.name[ops], self_us),
                                     source_labels(trace, rank, ops, loaders.for_rank(rank).ranges),
                                     _collective_ms(trace, window))  # fmt: skip
    return CpuOps(ranks)


def _inside(trace: Trace, window: Window, mask: np.ndarray) -> np.ndarray:
    events = np.flatnonzero(mask & (trace.rank == window.rank))
    return events[window.inside(trace.ts[events])]


def _name_medians(names: np.ndarray, self_us: np.ndarray) -> np.ndarray:
    """For each call, the median self time of its op's calls: judged per name, a tiny op that a busy machine
    preempted once does not count as work."""
    ids, group = np.unique(names, return_inverse=True)
    medians = np.array([numeric.median(self_us[group == g]) for g in range(len(ids))])
    return medians[group]


def _collective_ms(trace: Trace, window: Window) -> float:
    calls = _inside(trace, window, trace.kind == Kind.COMM_OP)
    if len(calls) == 0:
        return 0.0
    starts, ends = intervals.union(trace.ts[calls], trace.end[calls])
    total = 0.0
    for start, end in zip(window.starts.tolist(), window.ends.tolist()):  # clipped to each step
        total += float(np.clip(np.minimum(ends, end) - np.maximum(starts, start), 0.0, None).sum())
    return total / 1000.0
