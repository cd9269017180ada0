"""Which op names hold a rank's steps, for hot_op: computed once here, so that the rule reads no events.

CPU-only runs (from ``cpu_ops``): each op name's self time in the steps outside one-time work (a slow first call
and the ops inside it on its thread: hot_op's share is of the step less one-time work, so is the op's time),
heaviest first, and whether it is torch's reference kernel or a library compute kernel (``trace/opnames``). For
the heaviest name, and for the reference kernels together: their calls counted outermost (``aten::sort`` runs
inside ``aten::sort``, its overload), their heavier calls (where the time is, to locate), their source, and their
self time in each unit of the ledger's host lane (an op that holds the step holds most units, not one call that the
scheduler stalled: a 3 us AccumulateGrad preempted for 16 ms made 53% of a 4-step window).

Device runs (from the op table): the reference kernels that launched device work, that device time, their calls
and the calls counted outermost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.model import Trace
from . import intervals
from .cpu_ops import CpuOps, RankCpuOps
from .ledger import Lane, Ledger
from .onetime import OneTimeResult, RankOneTime
from .ops import OpTable, RankOps


@dataclass(frozen=True)
class HeldOp:
    """One op name's self time in a CPU-only run's steps, one-time work left out."""

    name: str
    self_ms: float
    reference: bool  # torch's reference (fallback) kernel, run where no library kernel takes the op
    library_compute: bool  # a matrix multiply or convolution on its library kernel


@dataclass(frozen=True)
class HeldCalls:
    """The calls of one op name, or of several together (the reference kernels)."""

    ops: tuple[str, ...]  # their names: CPU-only heaviest first; device runs in the op table's order
    ms: float  # CPU-only: their self host time outside one-time work; device runs: the device time they launched
    calls: int  # counted outermost: a call inside another of these on its thread is not one more
    located: np.ndarray  # the events to locate: CPU-only, the heavier calls (self time at least the median); all
    source: str | None  # where most of the calls come from (model, optimizer step, data loading); CPU-only
    unit_ms: tuple[float, ...] = ()  # CPU-only: their self time in each unit of the ledger's host lane, in its order


@dataclass(frozen=True)
class RankHeldOps:
    rank: int
    ops: tuple[HeldOp, ...] = ()  # CPU-only: each op name with self time in the steps, heaviest first
    top: HeldCalls | None = None  # CPU-only: the calls of ops[0]
    reference: HeldCalls | None = None  # the reference kernels with time (CPU-only: self time; device: device time)


@dataclass(frozen=True)
class HeldOps:
    ranks: dict[int, RankHeldOps]

    def for_rank(self, rank: int) -> RankHeldOps | None:
        return self.ranks.get(rank)


def held_ops(trace: Trace, cpu: CpuOps | None, one_time: OneTimeResult | None, table: OpTable | None,
             ledger: Ledger | None = None) -> HeldOps:  # fmt: skip
    """CPU-only runs from ``cpu`` (the ops in the steps, by the units of ``ledger``'s host lane); runs with a device
    from the op table."""
    if trace.has_device:
        ranks = table.ranks if table is not None else ()
        return HeldOps({rank_ops.rank: _device_rank(trace, rank_ops) for rank_ops in ranks})
    if cpu is None:
        return HeldOps({})
    return HeldOps({rank: _cpu_rank(trace, ops, one_time.for_rank(rank) if one_time is not None else None,
                                    _host_lane(ledger, rank))
                    for rank, ops in cpu.ranks.items()})  # fmt: skip


def _host_lane(ledger: Ledger | None, rank: int) -> Lane | None:
    found = ledger.for_rank(rank) if ledger is not None else None
    return found.lane("host") if found is not None else None


def _cpu_rank(trace: Trace, ops: RankCpuOps, one_time: RankOneTime | None, host: Lane | None) -> RankHeldOps:
    if len(ops.ops) == 0:
        return RankHeldOps(ops.rank)
    names = trace.name[ops.ops]
    steady = _outside_one_time(trace, ops, one_time)
    self_ms = np.bincount(names, weights=np.where(steady, ops.self_us, 0.0)) / 1000.0
    order = [int(i) for i in np.argsort(-self_ms) if self_ms[i] > 0]
    if not order:
        return RankHeldOps(ops.rank)
    reference = set(opnames.names_where(trace, opnames.is_reference_kernel, ops.ops))
    compute = set(opnames.names_where(trace, opnames.is_library_compute, ops.ops))
    held = tuple(HeldOp(trace.names[i], float(self_ms[i]), i in reference, i in compute) for i in order)
    fallback = [i for i in order if i in reference]
    return RankHeldOps(ops.rank, held, _cpu_calls(trace, ops, steady, self_ms, order[:1], host),
                       _cpu_calls(trace, ops, steady, self_ms, fallback, host) if fallback else None)  # fmt: skip


def _cpu_calls(trace: Trace, ops: RankCpuOps, steady: np.ndarray, self_ms: np.ndarray, ids: list[int],
               host: Lane | None) -> HeldCalls:  # fmt: skip
    picked = np.isin(trace.name[ops.ops], ids) & steady
    events = ops.ops[picked]
    heavy = picked & (ops.self_us >= np.median(ops.self_us[picked]))  # where the time is, not every tiny call
    sources = ops.sources(picked)
    return HeldCalls(tuple(trace.names[i] for i in ids), float(sum(self_ms[i] for i in ids)), _outermost(trace, events),
                     ops.ops[heavy], sources[0].name if sources else None,
                     _per_unit_ms(trace.ts[events], ops.self_us[picked], host))  # fmt: skip


def _per_unit_ms(starts_us: np.ndarray, self_us: np.ndarray, host: Lane | None) -> tuple[float, ...]:
    """The calls' self time (ms) in each unit of the host lane, a call counted in the unit it starts in."""
    if host is None or not host.units:
        return ()
    begins = np.array([unit.start_us for unit in host.units])
    ends = np.array([unit.end_us for unit in host.units])
    unit = np.searchsorted(begins, starts_us, side="right") - 1
    inside = (unit >= 0) & (starts_us < ends[np.clip(unit, 0, None)])
    return tuple(float(ms) for ms in np.bincount(unit[inside], weights=self_us[inside], minlength=len(begins)) / 1000.0)


def _outside_one_time(trace: Trace, ops: RankCpuOps, work: RankOneTime | None) -> np.ndarray:
    """Mask of the ops that are not one-time work (a first call, and the ops inside it on its thread)."""
    return np.ones(len(ops.ops), dtype=bool) if work is None else ~work.holds(trace, ops.ops)


def _device_rank(trace: Trace, rank_ops: RankOps) -> RankHeldOps:
    """The reference kernels by the device time they launched themselves: a dominant GEMM is healthy there."""
    slow = [row for row in rank_ops.rows if opnames.is_reference_kernel(row.name) and row.device_ms > 0]
    if not slow:
        return RankHeldOps(rank_ops.rank)
    held = tuple(row.name for row in slow)
    events = np.flatnonzero((trace.rank == rank_ops.rank) & opnames.named(trace, held))
    calls = HeldCalls(held, sum(row.device_ms for row in slow), _outermost(trace, events), events, None)
    return RankHeldOps(rank_ops.rank, reference=calls)


def _outermost(trace: Trace, events: np.ndarray) -> int:
    return int(intervals.outermost(trace.ts[events], trace.end[events], trace.tid[events].astype(np.int64)).sum())
