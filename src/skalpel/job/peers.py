"""The join's one per-rank task: a rank's collective wait split by the peer that arrived last.

The split needs the whole job's arrivals (``RankComparison.arrivals``), so it runs after the driver
compared the ranks; it then needs only its own rank's waits and arrivals. A 1 GB rank has some
300,000 wait pieces (0.2 s of a core to split), so a job of 1,000 ranks splits them in the workers
(``pool.split_all``, ``pool.split_on_ray``), not one rank after another in the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..analysis.blame import PeerSplit
from ..analysis.blame_peers import CollectiveWaits, split_waits
from ..analysis.ranks import Arrivals


@dataclass(frozen=True)
class SplitRequest:
    """One rank's waits, its matched collectives' arrivals on the job's clock, and where its times move."""

    rank: int
    waits: CollectiveWaits
    arrivals: Arrivals
    shift_us: float  # onto the job's clock
    event_offset: int  # into the job's event numbering


def split_one(request: SplitRequest) -> PeerSplit:
    return split_waits(request.waits, request.arrivals, shift_us=request.shift_us, event_offset=request.event_offset)


def split_here(requests: list[SplitRequest]) -> list[PeerSplit]:
    """Every rank's split in this process, one after another."""
    return [split_one(request) for request in requests]


Splitter = Callable[[list[SplitRequest]], list[PeerSplit]]
"""Splits every request, results in their order: ``split_here``, or the pool's parallel ones."""
