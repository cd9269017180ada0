"""Host-device synchronisations: where the host stops and waits for the device, per rank.

Categories (each with count, host time blocked, and the indices of the longest events so a
rule can look up their Python stack through the trace):

* ``device_sync``: ``cuda_sync`` events (Stream Sync, Context Sync, Event Sync, Stream Wait
  Event), the device-side record CUPTI keeps of a synchronisation (torch >= 2.1);
* ``sync_call``: runtime calls cudaDeviceSynchronize / cudaStreamSynchronize /
  cudaEventSynchronize and their HIP and driver-API twins;
* ``item``: host ops ``aten::item`` and ``aten::_local_scalar_dense`` (``.item()``, ``.tolist()``,
  Python control flow on a tensor), outermost only (an ``aten::item`` counts once, not again
  for the ``_local_scalar_dense`` inside it);
* ``blocking_dtoh``: device-to-host copies the host waits for: launched by a synchronous
  ``cudaMemcpy``/``hipMemcpy``, copied into pageable memory (``Device -> Pageable``: such a copy
  returns only when done, even through ``cudaMemcpyAsync``), or launched by an async copy whose
  next runtime calls on the same thread include a synchronisation (``.cpu()``, ``.to("cpu")``).

``blocked_ms_per_step`` is the union of the host intervals of ``sync_call``, ``item`` and
``blocking_dtoh`` (nested ones counted once), per step. Pageable host-to-device copies
(``Memcpy HtoD (Pageable -> Device)``: pin_memory off) are reported beside, with bytes and time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import LAUNCH_KINDS, Kind, kind_array
from ..trace.model import Trace, isin_few
from ..trace.roles import ITEM_OPS, SYNC_COPY_CALLS, Role  # noqa: F401 (the names: diagnose/sync.py reads them here)
from . import intervals, numeric
from .steps import StepSegmentation

CATEGORIES = ("device_sync", "sync_call", "item", "blocking_dtoh")
_LAUNCH = kind_array(LAUNCH_KINDS)


@dataclass(frozen=True)
class SyncOptions:
    """How many events to keep, and how far to look for a blocking copy."""

    worst: int = 5  # event indices kept per category
    sync_lookahead_calls: int = 2  # an async DtoH copy is blocking when a sync call is among the next N calls


@dataclass(frozen=True)
class SyncCategory:
    """One kind of host-device synchronisation on one rank."""

    count: int
    total_ms: float
    ms_per_step: float
    worst_events: tuple[int, ...]  # event indices, longest first


@dataclass(frozen=True)
class PageableCopies:
    """Host-to-device copies from pageable memory on one rank."""

    count: int
    total_bytes: int
    device_ms: float
    worst_events: tuple[int, ...]  # the copies (device events), longest first


@dataclass(frozen=True)
class RankSyncs:
    """Host-device synchronisations and pageable copies of one rank."""

    rank: int
    steps: int
    categories: dict[str, SyncCategory]  # keys: CATEGORIES
    blocked_ms_per_step: float
    pageable_htod: PageableCopies

    def to_dict(self) -> dict[str, float]:
        values: dict[str, float] = {"blocked_ms_per_step": self.blocked_ms_per_step}
        for name, category in self.categories.items():
            values[f"{name}_count"] = category.count
            values[f"{name}_ms_per_step"] = category.ms_per_step
        values["pageable_htod_count"] = self.pageable_htod.count
        values["pageable_htod_bytes"] = self.pageable_htod.total_bytes
        values["pageable_htod_ms"] = self.pageable_htod.device_ms
        return values


@dataclass(frozen=True)
class SyncResult:
    """Synchronisations and pageable copies per rank."""

    ranks: dict[int, RankSyncs]
    options: SyncOptions

    def for_rank(self, rank: int) -> RankSyncs | None:
        return self.ranks.get(rank)


def syncs(trace: Trace, steps: StepSegmentation, *, options: SyncOptions = SyncOptions()) -> SyncResult:
    """Synchronisations per rank. CPU-only traces give empty categories (item ops may still appear)."""
    sync_call = trace.role == Role.USER_SYNC  # the profiler's own (INTERNAL_SYNC) left out
    item = np.flatnonzero((trace.role == Role.ITEM) & (trace.kind == Kind.CPU_OP))
    thread = trace.rank[item].astype(np.int64) * (1 << 40) + trace.tid[item]
    # outermost only: not again for the _local_scalar_dense inside an aten::item
    item = item[intervals.outermost(trace.ts[item], trace.ts[item] + trace.dur[item], thread)]
    copies, copy_blocking = _blocking_dtoh(trace, sync_call, options.sync_lookahead_calls)
    groups = {
        "device_sync": np.flatnonzero(trace.kind == Kind.DEVICE_SYNC),
        "sync_call": np.flatnonzero(sync_call),
        "item": item,
        "blocking_dtoh": copies,
    }
    ranks = {}
    for rank in trace.rank_ids:
        step_count = max(len(steps.for_rank(rank)), 1)
        cats = {}
        for name, events in groups.items():
            on_rank = trace.rank[events] == rank
            blocked = copy_blocking[on_rank] if name == "blocking_dtoh" else trace.dur[events[on_rank]]
            cats[name] = _category(events[on_rank], blocked, step_count, options.worst)
        ranks[rank] = RankSyncs(
            rank=rank,
            steps=step_count,
            categories=cats,
            blocked_ms_per_step=_blocked_union_ms(trace, rank, groups, copies) / step_count,
            pageable_htod=_pageable(trace, rank, options.worst),
        )
    return SyncResult(ranks=ranks, options=options)


def inside_the_profiler(trace: Trace, events: np.ndarray) -> np.ndarray:
    """Those of ``events`` the profiler made itself: its stop synchronises the device
    (``torch/autograd/profiler.py`` ``__exit__``), inside the Python frames of ``torch/profiler/`` where the trace
    has them. They are the measurement's, not the user's code (a capture that stops mid-run shows one)."""
    if len(events) == 0:
        return events
    frames = np.flatnonzero((trace.role == Role.PROFILER) & (trace.kind == Kind.PYTHON))
    inside = np.zeros(len(events), dtype=bool)
    for frame in frames:  # a capture has one or two such frames: its start and its stop
        inside |= ((trace.rank[events] == trace.rank[frame]) & (trace.tid[events] == trace.tid[frame])
                   & (trace.ts[events] >= trace.ts[frame])
                   & (trace.ts[events] + trace.dur[events] <= trace.ts[frame] + trace.dur[frame]))  # fmt: skip
    return events[inside]


def _category(events: np.ndarray, blocked_us: np.ndarray, step_count: int, worst: int) -> SyncCategory:
    order = np.argsort(-blocked_us, kind="stable")[:worst]
    total_ms = float(blocked_us.sum()) / 1000.0
    return SyncCategory(
        count=len(events),
        total_ms=total_ms,
        ms_per_step=total_ms / step_count,
        worst_events=tuple(int(i) for i in events[order]),
    )


def _blocking_dtoh(trace: Trace, sync_call: np.ndarray, lookahead: int) -> tuple[np.ndarray, np.ndarray]:
    """DtoH copies the host waited for, and the host time blocked on each (copy call + following sync)."""
    copies = np.flatnonzero(trace.kind == Kind.MEMCPY)
    copies = copies[numeric.isin(trace.name[copies], opnames.names_where(trace, opnames.is_dtoh_copy, copies))]
    copies = copies[trace.launcher[copies] >= 0]
    if len(copies) == 0:
        return copies, np.zeros(0)
    calls = np.flatnonzero(isin_few(trace.kind, _LAUNCH))
    # Runtime calls ordered by (rank, thread, start): the next calls on the same thread follow directly.
    calls = calls[np.lexsort((trace.ts[calls], trace.tid[calls], trace.rank[calls]))]
    position = np.full(len(trace), -1, dtype=np.int64)
    position[calls] = np.arange(len(calls))
    launch = trace.launcher[copies]
    # A copy to pageable host memory returns only when done, whatever the API (CUDA runtime docs, "API sync behavior").
    to_pageable = trace.role[copies] == Role.PAGEABLE_DTOH
    synchronous = (trace.role[launch] == Role.SYNC_COPY) | to_pageable
    blocked = np.where(synchronous, trace.dur[launch], 0.0)
    followed = np.zeros(len(copies), dtype=bool)
    for step in range(1, lookahead + 1):
        nxt = position[launch] + step
        valid = (nxt < len(calls)) & ~followed & ~synchronous
        candidate = calls[np.minimum(nxt, len(calls) - 1)]
        same_thread = (trace.tid[candidate] == trace.tid[launch]) & (trace.rank[candidate] == trace.rank[launch])
        hit = valid & same_thread & sync_call[candidate]
        blocked[hit] = trace.dur[launch[hit]] + trace.dur[candidate[hit]]
        followed |= hit
    keep = synchronous | followed
    return copies[keep], blocked[keep]


def _blocked_union_ms(trace: Trace, rank: int, groups: dict[str, np.ndarray], copies: np.ndarray) -> float:
    host = np.concatenate([groups["sync_call"], groups["item"], trace.launcher[copies]])
    host = host[trace.rank[host] == rank]
    return intervals.length(trace.ts[host], trace.ts[host] + trace.dur[host]) / 1000.0


def _pageable(trace: Trace, rank: int, worst: int) -> PageableCopies:
    copies = np.flatnonzero(trace.role == Role.PAGEABLE_HTOD)
    copies = copies[trace.rank[copies] == rank]
    order = np.argsort(-trace.dur[copies], kind="stable")[:worst]
    return PageableCopies(
        count=len(copies),
        total_bytes=int(trace.nbytes[copies].sum()),
        device_ms=float(trace.dur[copies].sum()) / 1000.0,
        worst_events=tuple(int(i) for i in copies[order]),
    )
