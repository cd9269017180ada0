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
Nesting is found without a Python loop over events: sorted by (thread, start, longer
first), an op's depth is the number of ops started before it minus those ended by its
start, and its parent is the nearest earlier op one level up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..result.report import OpRow
from ..trace.kinds import HOST_OP_KINDS, Kind, kind_array
from ..trace.model import Trace, isin_few
from ..trace.roles import Role
from . import numeric
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
    device_us = _device_time_by_op(trace, nesting)
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
    count = len(events)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    start = trace.ts[events]
    end = start + trace.dur[events]
    rank, pid, tid = trace.rank[events], trace.pid[events], trace.tid[events]
    order = _thread_order(rank, pid, tid, start, end)
    start, end = start[order], end[order]
    thread, first_of_thread = _thread_runs(rank[order], pid[order], tid[order])
    started_before = np.arange(count) - first_of_thread
    # Ops of the same thread that ended by this op's start (durations are > 0, so all started earlier).
    depth = started_before - _ended_before(start, end, first_of_thread)
    # Parent: nearest earlier op of the same thread one level up (preorder of a properly nested forest).
    # Sorted by (thread, depth, position), the parent candidate is the last element before (thread, depth - 1,
    # own position); those keys are the sorted ones less ``count``, so the search runs over sorted needles.
    level_key = (thread * (int(depth.max()) + 2) + depth) * count + np.arange(count)
    level_order = np.argsort(level_key, kind="stable")
    sorted_keys = level_key[level_order]
    found = np.empty(count, dtype=np.int64)
    found[level_order] = np.searchsorted(sorted_keys, sorted_keys - count, side="left") - 1
    candidate = level_order[np.maximum(found, 0)]
    ok = (depth > 0) & (found >= 0)
    ok &= (thread[candidate] == thread) & (depth[candidate] == depth - 1) & (end[candidate] > start)
    parent_sorted = np.where(ok, candidate, -1)
    parent = np.full(count, -1, dtype=np.int64)
    parent[order] = np.where(parent_sorted >= 0, order[np.maximum(parent_sorted, 0)], -1)
    return parent


def _thread_order(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((-end, start, tid, pid, rank))``, cheaper on events that come nearly in time order.

    A stable sort by start finds the runs already in order; only events with equal starts need the
    longer-first tie-break; a last stable sort by thread keeps that order within each thread.
    """
    order = np.argsort(start, kind="stable")
    ordered = start[order]
    tie = ordered[1:] == ordered[:-1]
    if tie.any():
        tied = np.flatnonzero(np.concatenate([tie, [False]]) | np.concatenate([[False], tie]))
        events = order[tied]
        order[tied] = events[np.lexsort((-end[events], start[events]))]
    return order[np.lexsort((tid[order], pid[order], rank[order]))]


def _thread_runs(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Number the runs of equal (rank, pid, tid) in arrays sorted by them (0, 0, 1, 1, 1, 2...),
    and give each element the position where its run starts."""
    change = np.zeros(len(rank), dtype=bool)
    change[1:] = (rank[1:] != rank[:-1]) | (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    thread = np.cumsum(change)
    run_start = np.flatnonzero(np.concatenate([[True], change[1:]]))
    return thread, run_start[thread]


def _ended_before(start: np.ndarray, end: np.ndarray, first_of_thread: np.ndarray) -> np.ndarray:
    """For each event (sorted by thread, then start), how many events of its thread end by its start."""
    result = np.empty(len(start), dtype=np.int64)
    bounds = np.append(np.flatnonzero(np.diff(first_of_thread, prepend=-1)), len(start))  # where each thread starts
    for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # one search per thread, not per event
        ends = np.sort(end[first:last], kind="stable")  # nearly in order already: the stable sort finds the runs
        result[first:last] = np.searchsorted(ends, start[first:last], side="right")
    return result


def _device_time_by_op(trace: Trace, nesting: np.ndarray) -> np.ndarray:
    """Device microseconds credited to each host op (self device time), indexed by event.

    The op comes from the launch call's External id (``trace.op_of_event``). Some traces
    break that link (HTA's sampled traces rewrite the runtime's External id to its
    correlation id); there the launch call's innermost enclosing host op on its thread
    stands in, which is the op Kineto would have named.
    """
    device = np.flatnonzero(device_mask(trace))
    op = trace.op_of_event[device]
    launcher = trace.launcher[device]
    missing = (op < 0) & (launcher >= 0)
    if missing.any():
        calls = numeric.unique(launcher[missing])
        enclosing = _enclosing_ops(trace, nesting, calls)
        op[missing] = enclosing[np.searchsorted(calls, launcher[missing])]
    linked = op >= 0
    return np.bincount(op[linked], weights=trace.dur[device[linked]], minlength=len(trace))


def _enclosing_ops(trace: Trace, nesting: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """For each launch call (of positive length), the innermost host op around it on its thread, or -1."""
    positive = calls[trace.dur[calls] > 0]
    events = np.concatenate([nesting[trace.dur[nesting] > 0], positive])
    parent = _parents(trace, events)[len(events) - len(positive) :]
    found = np.where(parent >= 0, events[np.maximum(parent, 0)], -1)
    found[(found >= 0) & ~isin_few(trace.kind[np.maximum(found, 0)], _ROWS)] = -1  # a ProfilerStep is no op
    result = np.full(len(calls), -1, dtype=np.int64)
    result[trace.dur[calls] > 0] = found
    return result


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
