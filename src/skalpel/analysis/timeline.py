"""The device's timeline of each rank, derived once and cached on the trace: its work, sorted by start, and the
time it is busy (every stream merged, overlaps counted once). Every analysis that asks "was the device busy
then?" reads these, so busy time has one definition (HTA's: touching intervals merge)."""

from __future__ import annotations

import numpy as np

from ..trace.kinds import DEVICE_KIND_ARRAY
from ..trace.model import Trace, isin_few
from . import intervals


def device_mask(trace: Trace) -> np.ndarray:
    """Which events are device work (kernels, collectives, copies, memsets), every rank. Read-only."""

    def compute() -> np.ndarray:
        return _frozen(isin_few(trace.kind, DEVICE_KIND_ARRAY))

    return trace.cached("device_mask", compute)


def device_events(trace: Trace, rank: int | None = None) -> np.ndarray:
    """Indices of the device work (kernels, collectives, copies, memsets) of one rank, or of every rank, by start."""

    def compute() -> np.ndarray:
        every = np.flatnonzero(device_mask(trace))
        every = every[np.argsort(trace.ts[every], kind="stable")]
        return _frozen(every if rank is None else every[trace.rank[every] == rank])

    return trace.cached(f"device_events:{rank}", compute)


def device_busy(trace: Trace, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted, disjoint intervals in which the rank's device runs any work."""

    def compute() -> tuple[np.ndarray, np.ndarray]:
        events = device_events(trace, rank)
        starts, ends = intervals.union(trace.ts[events], trace.ts[events] + trace.dur[events])
        return _frozen(starts), _frozen(ends)

    return trace.cached(f"device_busy:{rank}", compute)


def _frozen(values: np.ndarray) -> np.ndarray:
    """Cached and shared: read-only, so that no reader changes another's."""
    values.flags.writeable = False
    return values
