"""Links between events: device work to the runtime call that launched it, and to its host op.

Both read columns of a ``Trace`` (``Trace.launcher`` and ``Trace.op_of_event`` compute
them once and cache them).
"""

from __future__ import annotations

import numpy as np

from .kinds import HOST_OP_KINDS, LAUNCH_KINDS, LAUNCHED_KINDS, Kind, kind_array
from .nesting import innermost_enclosing

_LAUNCHED = kind_array(LAUNCHED_KINDS)
_LAUNCH = kind_array(LAUNCH_KINDS)
_HOST_OPS = kind_array(HOST_OP_KINDS)
_NESTING = kind_array(HOST_OP_KINDS | {Kind.STEP})  # a ProfilerStep encloses ops but is none
_TOLERANCE_US = 1e-3  # the JSON's precision (1 ns): a call that ends with its op still lies inside it


def launcher_of_events(kind: np.ndarray, rank: np.ndarray, correlation: np.ndarray) -> np.ndarray:
    """For each device event (and sync record), the runtime call with the same (rank, correlation id); -1 otherwise."""
    return _link(kind, rank, correlation, _LAUNCHED, _LAUNCH)


def op_of_events(kind: np.ndarray, rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray,
                 dur: np.ndarray, external_id: np.ndarray, launcher: np.ndarray) -> np.ndarray:  # fmt: skip
    """The host op of each runtime call and of each device event (through its ``launcher``).

    A runtime call carries the External id of the innermost op that issued it, and that op lies
    around the call on its thread. Some traces break the id: HTA's sampled ones drop it, and some
    exporters write the call's correlation id there, which then names an unrelated op. So the
    External id links only where its op encloses the call; every other call gets the innermost
    host op around it on its thread (the op Kineto would have named), or none.
    """
    op = _link(kind, rank, external_id, _LAUNCH, _HOST_OPS)
    calls = np.flatnonzero(np.isin(kind, _LAUNCH))
    linked = op[calls]
    unverified = calls[(linked < 0) | ~_encloses(rank, pid, tid, ts, dur, np.maximum(linked, 0), calls)]
    if len(unverified):
        ranges = np.flatnonzero(np.isin(kind, _NESTING))
        enclosing = innermost_enclosing(rank, pid, tid, ts, dur, ranges, unverified)
        enclosing[(enclosing >= 0) & (kind[np.maximum(enclosing, 0)] == Kind.STEP)] = -1
        op[unverified] = enclosing
    device = np.flatnonzero(launcher >= 0)
    op[device] = op[launcher[device]]
    return op


def _encloses(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, outer: np.ndarray,
              inner: np.ndarray) -> np.ndarray:  # fmt: skip
    """Whether each ``outer`` event lies around its ``inner`` event on the same thread."""
    same_thread = (rank[outer] == rank[inner]) & (pid[outer] == pid[inner]) & (tid[outer] == tid[inner])
    starts_after = ts[inner] >= ts[outer] - _TOLERANCE_US
    ends_before = ts[inner] + dur[inner] <= ts[outer] + dur[outer] + _TOLERANCE_US
    return same_thread & starts_after & ends_before


def _link(kind: np.ndarray, rank: np.ndarray, ids: np.ndarray, source_kinds: np.ndarray,
          target_kinds: np.ndarray) -> np.ndarray:  # fmt: skip
    """For each event of ``source_kinds``, the event of ``target_kinds`` with the same (rank, id); -1 otherwise.

    An id of 0 is no id: such events link to nothing.
    """
    linked = np.full(len(kind), -1, dtype=np.int64)
    has_id = ids != 0
    sources = np.flatnonzero(np.isin(kind, source_kinds) & has_id)
    targets = np.flatnonzero(np.isin(kind, target_kinds) & has_id)
    if len(sources) == 0 or len(targets) == 0:
        return linked
    target_keys = _keys(rank, ids, targets)
    order = np.argsort(target_keys, kind="stable")
    sorted_keys = target_keys[order]
    source_keys = _keys(rank, ids, sources)
    found = np.minimum(np.searchsorted(sorted_keys, source_keys), len(sorted_keys) - 1)
    hit = sorted_keys[found] == source_keys
    linked[sources[hit]] = targets[order[found[hit]]]
    return linked


def _keys(rank: np.ndarray, ids: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Combine rank and an id column into one sortable key."""
    return rank[indices].astype(np.int64) * (1 << 40) + (ids[indices] & ((1 << 40) - 1))
