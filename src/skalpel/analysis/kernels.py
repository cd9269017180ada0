"""The kernel table: device work per rank, grouped by name.

Every kernel, copy and memset has a type: MEMORY for memcpy and memset, COMM for
collective kernels (``Kind.COMM_KERNEL``: NCCL, RCCL and the like), COMP for every
other kernel. ``share_pct`` is the row's share of all device time on the rank (the
sum of device event durations, streams and devices together, overlap counted twice).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..result.report import KernelRow
from ..trace.kinds import Kind
from ..trace.model import Trace
from .timeline import device_mask

_TYPES = {Kind.KERNEL: "COMP", Kind.COMM_KERNEL: "COMM", Kind.MEMCPY: "MEMORY", Kind.MEMSET: "MEMORY"}


@dataclass(frozen=True)
class RankKernels:
    """The kernel table of one rank."""

    rank: int
    rows: tuple[KernelRow, ...]  # by total time, longest first
    device_ms: float  # all device time on this rank
    ms_by_type: dict[str, float]  # COMP / COMM / MEMORY -> ms

    def top(self, count: int) -> tuple[KernelRow, ...]:
        return self.rows[:count]


@dataclass(frozen=True)
class KernelTable:
    """Kernel tables of the ranks with device activity."""

    ranks: tuple[RankKernels, ...]  # only ranks with device activity

    def for_rank(self, rank: int) -> RankKernels | None:
        return next((item for item in self.ranks if item.rank == rank), None)


def kernel_table(trace: Trace) -> KernelTable:
    """Group each rank's device events by name."""
    device = np.flatnonzero(device_mask(trace))
    ranks = []
    for rank in trace.rank_ids:
        mine = device[trace.rank[device] == rank]
        if len(mine):
            ranks.append(_rank_kernels(trace, rank, mine))
    return KernelTable(tuple(ranks))


def _rank_kernels(trace: Trace, rank: int, events: np.ndarray) -> RankKernels:
    # A name keeps one type; (kind, name) keys keep a memcpy and a kernel of the same name apart.
    keys = trace.kind[events].astype(np.int64) << 32 | trace.name[events].astype(np.int64)
    unique_keys, group = np.unique(keys, return_inverse=True)
    durations = trace.dur[events]
    calls = np.bincount(group)
    total = np.bincount(group, weights=durations)
    all_us = float(durations.sum())
    rows = []
    for g in np.argsort(-total, kind="stable"):
        kind = Kind(int(unique_keys[g] >> 32))
        rows.append(
            KernelRow(
                name=trace.names[int(unique_keys[g] & 0xFFFFFFFF)],
                type=_TYPES[kind],
                calls=int(calls[g]),
                total_ms=float(total[g]) / 1000.0,
                mean_us=float(total[g]) / int(calls[g]),
                share_pct=100.0 * float(total[g]) / all_us if all_us > 0 else 0.0,
            )
        )
    by_type = {kind: 0.0 for kind in ("COMP", "COMM", "MEMORY")}
    for row in rows:
        by_type[row.type] += row.total_ms
    return RankKernels(rank, tuple(rows), all_us / 1000.0, by_type)
