"""Links between events: device work to the runtime call that launched it, and to its host op."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .kinds import DEVICE_KINDS, HOST_OP_KINDS, LAUNCH_KINDS, Kind

if TYPE_CHECKING:
    from .model import Trace

_DEVICE = np.array(sorted(int(k) for k in DEVICE_KINDS | {Kind.DEVICE_SYNC}), dtype=np.int8)
_LAUNCH = np.array(sorted(int(k) for k in LAUNCH_KINDS), dtype=np.int8)
_HOST_OPS = np.array(sorted(int(k) for k in HOST_OP_KINDS), dtype=np.int8)


def _keys(trace: Trace, indices: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Combine rank and an id column into one sortable key."""
    return trace.rank[indices].astype(np.int64) * (1 << 40) + (column[indices] & ((1 << 40) - 1))


def _match(trace: Trace, sources: np.ndarray, targets: np.ndarray, source_ids: np.ndarray, target_ids: np.ndarray) -> np.ndarray:
    """For each source event, the target event with the same (rank, id); -1 when none."""
    result = np.full(len(sources), -1, dtype=np.int64)
    if len(sources) == 0 or len(targets) == 0:
        return result
    target_keys = _keys(trace, targets, target_ids)
    order = np.argsort(target_keys, kind="stable")
    sorted_keys = target_keys[order]
    source_keys = _keys(trace, sources, source_ids)
    found = np.searchsorted(sorted_keys, source_keys)
    found_clipped = np.minimum(found, len(sorted_keys) - 1)
    hit = sorted_keys[found_clipped] == source_keys
    result[hit] = targets[order[found_clipped[hit]]]
    return result


def launcher_of_events(trace: Trace) -> np.ndarray:
    launcher = np.full(len(trace), -1, dtype=np.int64)
    device = np.flatnonzero(np.isin(trace.kind, _DEVICE) & (trace.correlation != 0))
    launches = np.flatnonzero(np.isin(trace.kind, _LAUNCH) & (trace.correlation != 0))
    launcher[device] = _match(trace, device, launches, trace.correlation, trace.correlation)
    return launcher


def op_of_events(trace: Trace) -> np.ndarray:
    """The host op of each runtime call (by External id) and of each device event (through its launcher)."""
    op = np.full(len(trace), -1, dtype=np.int64)
    launches = np.flatnonzero(np.isin(trace.kind, _LAUNCH) & (trace.external_id != 0))
    ops = np.flatnonzero(np.isin(trace.kind, _HOST_OPS) & (trace.external_id != 0))
    op[launches] = _match(trace, launches, ops, trace.external_id, trace.external_id)
    launcher = trace.launcher
    device = np.flatnonzero(launcher >= 0)
    op[device] = op[launcher[device]]
    return op
