"""Where each rank's device idles: the work that ends its longest gaps (launched late by the host) and its idle
time inside DataLoader ranges (the device waiting for the next batch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.model import Trace
from . import intervals
from .loader_ranges import LoaderRanges
from .timeline import device_busy, device_events

LONGEST_GAPS = 20  # the device events located: their launch sites are where the host was late


@dataclass(frozen=True)
class RankIdleGaps:
    rank: int
    after_longest_gaps: np.ndarray  # the device events that end the longest idle gaps, longest first
    idle_in_loader_us: float  # time inside DataLoader ranges with the device idle (their union less its busy time)


@dataclass(frozen=True)
class IdleGaps:
    ranks: dict[int, RankIdleGaps]

    def for_rank(self, rank: int) -> RankIdleGaps | None:
        return self.ranks.get(rank)


def idle_gaps(trace: Trace, loaders: LoaderRanges) -> IdleGaps | None:
    """None without device activity."""
    if not trace.has_device:
        return None
    return IdleGaps({rank: _rank_gaps(trace, rank, loaders.for_rank(rank).ranges) for rank in trace.rank_ids})


def _rank_gaps(trace: Trace, rank: int, loader: np.ndarray) -> RankIdleGaps:
    return RankIdleGaps(rank, _after_longest_gaps(trace, rank), _idle_inside(trace, rank, loader))


def _idle_inside(trace: Trace, rank: int, ranges: np.ndarray) -> float:
    if len(ranges) == 0:
        return 0.0
    loader = intervals.union(trace.ts[ranges], trace.end[ranges])
    return intervals.length(*loader) - intervals.intersection_length(loader, device_busy(trace, rank))


def _after_longest_gaps(trace: Trace, rank: int) -> np.ndarray:
    events = device_events(trace, rank)  # by start
    if len(events) < 2:
        return events
    ends = np.maximum.accumulate(trace.ts[events] + trace.dur[events])
    gaps = trace.ts[events[1:]] - ends[:-1]
    return events[1:][np.argsort(-gaps)[:LONGEST_GAPS]]
