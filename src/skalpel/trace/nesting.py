"""Nesting of host ranges on their threads: each range's innermost enclosing range, without a Python loop.

Sorted by (thread, start, longer first), a range's depth is the number of ranges of its thread
started before it minus those ended by its start, and its parent is the nearest earlier range
one level up. The op table's self times and the op of a runtime call both read it.
"""

from __future__ import annotations

import numpy as np


def parents(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each range (of positive length), the position of its innermost enclosing range on its thread, or -1."""
    count = len(start)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    order = _thread_order(rank, pid, tid, start, end)
    start, end = start[order], end[order]
    thread, first_of_thread = _thread_runs(rank[order], pid[order], tid[order])
    started_before = np.arange(count) - first_of_thread
    # Ranges of the same thread that ended by this one's start (lengths are > 0, so all started earlier).
    depth = started_before - _ended_before(start, end, first_of_thread)
    # Parent: nearest earlier range of the same thread one level up (preorder of a properly nested forest).
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


def innermost_enclosing(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray,
                        containers: np.ndarray, events: np.ndarray) -> np.ndarray:  # fmt: skip
    """For each of ``events`` (indices), the innermost of ``containers`` (indices) around it on its thread, or -1.

    Containers of zero length enclose nothing; an event of zero length counts as one of the
    shortest positive length, so that an instant call still finds the range it lies in.
    """
    if len(events) == 0:
        return np.empty(0, dtype=np.int64)
    containers = containers[dur[containers] > 0]
    every = np.concatenate([containers, events])
    start = ts[every]
    end = np.maximum(start + dur[every], np.nextafter(start, np.inf))
    parent = parents(rank[every], pid[every], tid[every], start, end)
    found = parent[len(containers) :]
    inside_event = found >= len(containers)
    while inside_event.any():  # an event inside another (a driver call in its runtime call): go up to a container
        found[inside_event] = parent[found[inside_event]]
        inside_event = found >= len(containers)
    return np.where(found >= 0, every[np.maximum(found, 0)], -1)


def _thread_order(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((-end, start, tid, pid, rank))``, cheaper on ranges that come nearly in time order.

    A stable sort by start finds the runs already in order; only ranges with equal starts need the
    longer-first tie-break; a last stable sort by thread keeps that order within each thread.
    """
    order = np.argsort(start, kind="stable")
    ordered = start[order]
    tie = ordered[1:] == ordered[:-1]
    if tie.any():
        tied = np.flatnonzero(np.concatenate([tie, [False]]) | np.concatenate([[False], tie]))
        ranges = order[tied]
        order[tied] = ranges[np.lexsort((-end[ranges], start[ranges]))]
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
    """For each range (sorted by thread, then start), how many ranges of its thread end by its start."""
    result = np.empty(len(start), dtype=np.int64)
    bounds = np.append(np.flatnonzero(np.diff(first_of_thread, prepend=-1)), len(start))  # where each thread starts
    for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # one search per thread, not per range
        ends = np.sort(end[first:last], kind="stable")  # nearly in order already: the stable sort finds the runs
        result[first:last] = np.searchsorted(ends, start[first:last], side="right")
    return result
