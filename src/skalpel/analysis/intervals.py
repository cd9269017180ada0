"""Interval arithmetic on numpy arrays: unions, lengths, intersections.

Every function is vectorised (sort + ``np.maximum.accumulate``), so it stays fast on
millions of intervals. Intervals are half-open ``[start, end)``; touching intervals
merge, as in HTA's ``merge_kernel_intervals`` (a new group starts only when
``start > running max(end)``).
"""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted intervals covering the same time as the input."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if len(starts) == 0:
        return starts.copy(), ends.copy()
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    new_group = np.empty(len(starts), dtype=bool)
    new_group[0] = True
    new_group[1:] = starts[1:] > running_end[:-1]
    first = np.flatnonzero(new_group)
    last = np.append(first[1:] - 1, len(starts) - 1)
    return starts[first], running_end[last]


def length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total time covered by the intervals (overlaps counted once)."""
    merged_starts, merged_ends = union(starts, ends)
    return float((merged_ends - merged_starts).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time covered by both interval sets: |A| + |B| - |A or B|."""
    both = (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return length(*a) + length(*b) - length(*both)


def intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted intervals covered by both sets (each merged first; touching ends do not overlap)."""
    a, b = union(*a), union(*b)
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    if len(times) == 0:
        return times.copy(), times.copy()
    rise = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.lexsort((rise, times))  # at one instant the ends come first: [0, 5) and [5, 9) share nothing
    times, depth = times[order], np.cumsum(rise[order])
    inside = np.flatnonzero(depth == 2)  # both sets open here; the depth is back at 0 after the last boundary
    starts, ends = times[inside], times[inside + 1]  # the next boundary closes one of them
    keep = ends > starts
    return starts[keep], ends[keep]


def difference(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sorted, disjoint intervals of ``a`` outside ``b`` (both sorted and disjoint)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    outside = (np.concatenate([[-np.inf], b[1]]), np.concatenate([b[0], [np.inf]]))
    keep = outside[1] > outside[0]
    return intersection(a, (outside[0][keep], outside[1][keep]))


def outermost(starts: np.ndarray, ends: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Mask of the intervals not nested in (or overlapping) an earlier interval of the same group.

    Used for host ranges on one thread, which nest properly: keeps the outer ``aten::item``
    and drops the ``aten::_local_scalar_dense`` inside it.
    """
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    result = np.zeros(len(starts), dtype=bool)
    if len(starts) == 0:
        return result
    order = np.lexsort((starts - ends, starts, groups))  # by group, start, longest first
    sorted_groups = groups[order]
    group_index = np.concatenate([[0], np.cumsum(sorted_groups[1:] != sorted_groups[:-1])])
    offset = group_index * (float(ends.max() - starts.min()) + 1.0)  # keeps groups apart on one time axis
    shifted_starts = starts[order] + offset
    running_end = np.maximum.accumulate(ends[order] + offset)
    outer = np.ones(len(starts), dtype=bool)
    outer[1:] = shifted_starts[1:] >= running_end[:-1]
    result[order] = outer
    return result


def containing(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For each point, the index of the range of sorted, disjoint [start, end) ranges holding it; -1 outside."""
    if len(starts) == 0:
        return np.full(len(points), -1)
    index = np.searchsorted(starts, points, side="right") - 1
    inside = (index >= 0) & (points < ends[np.maximum(index, 0)])
    return np.where(inside, index, -1)


def busy_between(busy: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Device busy time inside each [start, end), from the sorted, disjoint busy intervals."""
    busy_starts, busy_ends = busy
    if len(busy_starts) == 0:
        return np.zeros(len(starts))
    before = np.concatenate([[0.0], np.cumsum(busy_ends - busy_starts)])

    def until(t: np.ndarray) -> np.ndarray:
        index = np.searchsorted(busy_starts, t, side="right") - 1
        inside = np.clip(t - busy_starts[np.maximum(index, 0)], 0.0, (busy_ends - busy_starts)[np.maximum(index, 0)])
        return np.where(index >= 0, before[np.maximum(index, 0)] + inside, 0.0)

    return np.maximum(until(ends) - until(starts), 0.0)
