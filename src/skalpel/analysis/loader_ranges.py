"""The DataLoader ranges of each rank (any ``enumerate(DataLoader)#...`` range) and the iterator types they name."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace
from . import numeric


@dataclass(frozen=True)
class RankLoaderRanges:
    """One rank's DataLoader ranges, in event order, and the iterator types they name (sorted)."""

    rank: int
    ranges: np.ndarray
    iterators: tuple[str, ...]

    @property
    def single_process(self) -> bool:
        """A loader with num_workers=0: every batch is made in the training process."""
        return any(opnames.single_process(name) for name in self.iterators)


@dataclass(frozen=True)
class LoaderRanges:
    ranks: dict[int, RankLoaderRanges]

    def for_rank(self, rank: int) -> RankLoaderRanges:
        found = self.ranks.get(rank)
        return found if found is not None else RankLoaderRanges(rank, np.zeros(0, dtype=np.int64), ())


def loader_ranges(trace: Trace) -> LoaderRanges:
    every = np.flatnonzero(trace.kind == Kind.DATALOADER)
    ranks = {}
    for rank in trace.rank_ids:
        ranges = every[trace.rank[every] == rank]
        names = (trace.names[int(name)] for name in numeric.unique(trace.name[ranges]))
        ranks[rank] = RankLoaderRanges(rank, ranges, tuple(sorted({opnames.loader_iterator(name) for name in names})))
    return LoaderRanges(ranks)
