"""Who launches each rank's kernels: a graph launch (kernels replayed from a CUDA graph pay no launch each), or which
host ops, grouped by where they come from (``op_sources``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.roles import Role
from . import numeric
from .loader_ranges import LoaderRanges
from .op_sources import OpSource, by_source, source_labels


@dataclass(frozen=True)
class RankKernelLaunchers:
    rank: int
    kernels: np.ndarray  # the rank's kernels, in event order
    graph_launched_pct: float  # share of them launched by a graph launch (cudaGraphLaunch, hipGraphLaunch)
    sources: tuple[OpSource, ...]  # the host ops that launched them, by source, largest first


@dataclass(frozen=True)
class KernelLaunchers:
    ranks: dict[int, RankKernelLaunchers]

    def for_rank(self, rank: int) -> RankKernelLaunchers | None:
        return self.ranks.get(rank)


def kernel_launchers(trace: Trace, loaders: LoaderRanges) -> KernelLaunchers | None:
    """None without device activity."""
    if not trace.has_device:
        return None
    every = np.flatnonzero(trace.kind == Kind.KERNEL)
    ranks = {}
    for rank in trace.rank_ids:
        kernels = every[trace.rank[every] == rank]
        launching = trace.op_of_event[kernels]
        ops = numeric.unique(launching[launching >= 0])
        labels = source_labels(trace, rank, ops, loaders.for_rank(rank).ranges)
        ranks[rank] = RankKernelLaunchers(rank, kernels, _graph_launched_pct(trace, kernels), by_source(ops, labels))
    return KernelLaunchers(ranks)


def _graph_launched_pct(trace: Trace, kernels: np.ndarray) -> float:
    launcher = trace.launcher[kernels]
    launched = launcher[launcher >= 0]
    if len(launched) == 0:
        return 0.0
    return 100.0 * float((trace.role[launched] == Role.GRAPH_LAUNCH).sum()) / len(launched)
