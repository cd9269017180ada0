"""The op table: per rank and op name, calls, self and total host time, and device time.

Host ops are the operator-level host ranges (aten ops, record_function ranges, the
DataLoader wait, host collectives); ``ProfilerStep#N`` ranges take part in the nesting
but get no row, and Python frames (``with_stack``) are left out of the nesting.

- ``total_ms``: sum of the op's host durations (nested calls of the same name count
  twice, as in ``torch.profiler``'s ``key_averages``);
- ``self_ms``: host duration minus that of its direct child ops on the same thread,
  like ``self_cpu_time_total``;
- ``device_ms``: *self* device time, like ``self_device_time_total``: a runtime call
  carries the External id of the innermost op around it, so each kernel, copy and
  memset counts for the innermost op that launched it, not for its callers;
- ``input_shapes``: the op's most frequent ``Input Dims`` (when recorded), and
  ``shape_variants``, how many different ones the row aggregates.

Rows are sorted by device time when the rank has device activity, else by self host time.
Nesting is found without a Python loop over events (``trace.nesting``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..result.report import OpRow
from ..trace.kinds import HOST_OP_KINDS, Kind, kind_array
from ..trace.model import Trace, isin_few
from ..trace.nesting import parents
from ..trace.roles import Role
from .timeline import device_mask

_ROWS = kind_array(HOST_OP_KINDS)
_NESTING = kind_array(HOST_OP_KINDS | {Kind.STEP})


@dataclass(frozen=True)
class RankOps:
    """The op table of one rank."""

    rank: int
    rows: tuple[OpRow, ...]  # sorted by device_ms when sorted_by == "device_ms", else by self_ms
    sorted_by: str  # "device_ms" | "self_ms"

    def top(self, count: int) -> tuple[OpRow, ...]:
        return self.rows[:count]


@dataclass(frozen=True)
class OpTable:
    """Op tables of every rank."""

    ranks: tuple[RankOps, ...]

    def for_rank(self, rank: int) -> RankOps | None:
        return next((item for item in self.ranks if item.rank == rank), None)


def op_table(trace: Trace) -> OpTable:
    """Aggregate host ops by name, per rank."""
    nesting = np.flatnonzero(isin_few(trace.kind, _NESTING))
    self_us = np.zeros(len(trace))
    self_us[nesting] = self_times(trace, nesting)
    device_us = _device_time_by_op(trace)
    rows = np.flatnonzero(isin_few(trace.kind, _ROWS))
    rows = rows[trace.role[rows] != Role.PROFILER]  # skalpel's closing range, the profiler's own spans: not the user's
    has_device = device_mask(trace)
    ranks = []
    for rank in trace.rank_ids:
        mine = rows[trace.rank[rows] == rank]
        sort_key = "device_ms" if has_device[trace.rank == rank].any() else "self_ms"
        ranks.append(RankOps(rank, _aggregate(trace, mine, self_us[mine], device_us[mine], sort_key), sort_key))
    return OpTable(tuple(ranks))


def self_times(trace: Trace, events: np.ndarray) -> np.ndarray:
    """Host duration minus the durations of direct children on the same thread, for the given events.

    Zero-length events have no self time and take no part in the nesting.
    """
    result = np.zeros(len(events))
    positive = np.flatnonzero(trace.dur[events] > 0)
    nested = events[positive]
    parent = _parents(trace, nested)
    has_parent = parent >= 0
    child_us = np.bincount(parent[has_parent], weights=trace.dur[nested][has_parent], minlength=len(nested))
    result[positive] = np.maximum(trace.dur[nested] - child_us, 0.0)
    return result


def _parents(trace: Trace, events: np.ndarray) -> np.ndarray:
    """For each event, the position (in ``events``) of its innermost enclosing event on its thread, or -1."""
    start = trace.ts[events]
    return parents(trace.rank[events], trace.pid[events], trace.tid[events], start, start + trace.dur[events])


def _device_time_by_op(trace: Trace) -> np.ndarray:
    """Device microseconds credited to each host op (self device time), indexed by event.

    The op is the launch call's (``trace.op_of_event``): the op its External id names where that op
    lies around the call, else the innermost op around it on its thread.
    """
    device = np.flatnonzero(device_mask(trace))
    op = trace.op_of_event[device]
    linked = op >= 0
    return np.bincount(op[linked], weights=trace.dur[device[linked]], minlength=len(trace))


def _aggregate(trace: Trace, ops: np.ndarray, self_us: np.ndarray, device_us: np.ndarray, sort_key: str) -> tuple[OpRow, ...]:
    if len(ops) == 0:
        return ()
    # Group by name id with bincount (no sort): ids are small, dense integers into trace.names.
    per_name = np.bincount(trace.name[ops], minlength=len(trace.names))
    ids = np.flatnonzero(per_name)
    group_of_name = np.zeros(len(trace.names), dtype=np.int64)
    group_of_name[ids] = np.arange(len(ids))
    group = group_of_name[trace.name[ops]]
    calls = np.bincount(group)
    total = np.bincount(group, weights=trace.dur[ops])
    self_sum = np.bincount(group, weights=self_us)
    device_sum = np.bincount(group, weights=device_us)
    primary = device_sum if sort_key == "device_ms" else self_sum
    ranked = np.lexsort((-total, -self_sum, -primary))
    shapes, variants = _common_shapes(trace, ops, group, len(ids))
    return tuple(
        OpRow(
            name=trace.names[int(ids[g])],
            calls=int(calls[g]),
            self_ms=float(self_sum[g]) / 1000.0,
            total_ms=float(total[g]) / 1000.0,
            device_ms=float(device_sum[g]) / 1000.0,
            input_shapes=trace.names[int(shapes[g])] if shapes[g] >= 0 else None,
            shape_variants=int(variants[g]),
        )
        for g in ranked
    )


def _common_shapes(trace: Trace, ops: np.ndarray, group: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The most frequent shapes id of each group (-1 where none was recorded), and its number of distinct shapes."""
    best = np.full(groups, -1, dtype=np.int64)
    with_shapes = trace.shapes[ops] >= 0
    if not with_shapes.any():
        return best, np.zeros(groups, dtype=np.int64)
    shapes = trace.shapes[ops][with_shapes].astype(np.int64)
    span = int(shapes.max()) + 1
    pairs, seen_at, counts = np.unique(group[with_shapes].astype(np.int64) * span + shapes, return_index=True, return_counts=True)
    pair_group, pair_shapes = pairs // span, pairs % span
    # By group, most frequent first; a tie goes to the shapes recorded first (not to the lower
    # interned id, which depends on the other ranks loaded with this one).
    order = np.lexsort((seen_at, -counts, pair_group))
    first = order[np.flatnonzero(np.diff(pair_group[order], prepend=-1) != 0)]
    best[pair_group[first]] = pair_shapes[first]
    return best, np.bincount(pair_group, minlength=groups)
