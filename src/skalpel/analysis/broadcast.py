"""The op behind each device's largest allocation, as the user wrote it, and the broadcast it materialised.

``x.expand(n, n, d).contiguous()`` (or ``.clone()``, ``.reshape()`` of a non-viewable shape,
``.repeat()``) writes out what ``expand`` only pretended to have: the output is as many times
larger than the expanded tensor's storage as the broadcast dims are long, and it grows with
their product (n² for a pairwise layer). With recorded shapes the pattern shows whatever the
absolute size: an ``aten::expand`` (``expand_as``, ``broadcast_to``) on the same thread shortly
before the allocating op, whose input has size-1 dims where the allocating op's input is long.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.opnames import expand_ops
from .memory import MemoryResult
from .options import BROADCAST_LOOK_BACK_US


@dataclass(frozen=True)
class Broadcast:
    """An expanded tensor materialised by a copy, with the shapes."""

    expand_event: int
    from_dims: list[int]  # the expanded tensor's own shape (size-1 dims broadcast)
    to_dims: list[int]  # the shape materialised
    ratio: float  # elements written / elements of the tensor expanded


@dataclass(frozen=True)
class LargestAlloc:
    """The outermost host op around a device's largest allocation, and the broadcast that op materialised."""

    op_event: int  # -1: no op encloses the allocation
    op: str | None  # its name
    broadcast: Broadcast | None


def largest_allocs(trace: Trace, memory: MemoryResult | None) -> dict[tuple[int, str], LargestAlloc]:
    """Each rank's main device's largest allocation, by (rank, device)."""
    if memory is None:
        return {}
    found = {}
    for rank in trace.rank_ids:
        device = memory.main_device(rank)
        if device is None:
            continue
        outer = _outer_event(trace, device.largest_alloc_op_event)
        op = trace.name_of(outer) if outer >= 0 else None
        # a block freed before its op returned is the op's workspace (cuBLAS's, an algorithm's): nothing materialised
        broadcast = None if device.largest_alloc_in_op else materialised_broadcast(trace, outer)
        found[(rank, device.device)] = LargestAlloc(outer, op, broadcast)
    return found


def _outer_event(trace: Trace, event: int) -> int:
    if event < 0:
        return -1
    same = (trace.rank == trace.rank[event]) & (trace.pid == trace.pid[event]) & (trace.tid == trace.tid[event])
    around = np.flatnonzero(
        same & (trace.kind == Kind.CPU_OP) & (trace.ts <= trace.ts[event]) & (trace.ts + trace.dur >= trace.ts[event] + trace.dur[event])
    )
    return int(around[np.argmin(trace.ts[around])]) if len(around) else event


def materialised_broadcast(trace: Trace, op_event: int) -> Broadcast | None:
    """The expand whose view ``op_event`` (the outermost op around the largest allocation) materialised."""
    to_dims = _first_input_dims(trace, op_event)
    if op_event < 0 or not to_dims:
        return None
    same = (trace.rank == trace.rank[op_event]) & (trace.tid == trace.tid[op_event]) & (trace.kind == Kind.CPU_OP)
    start = float(trace.ts[op_event])
    candidates = np.flatnonzero(
        same & expand_ops(trace) & (trace.end <= start) & (trace.end >= start - BROADCAST_LOOK_BACK_US)
    )
    for event in candidates[np.argsort(-trace.ts[candidates])]:
        from_dims = _first_input_dims(trace, int(event))
        if len(from_dims) == len(to_dims) and all(a in (1, b) for a, b in zip(from_dims, to_dims)):
            ratio = float(np.prod(to_dims, dtype=np.float64) / max(np.prod(from_dims, dtype=np.float64), 1.0))
            if ratio > 1:
                return Broadcast(int(event), from_dims, to_dims, ratio)
    return None


def _first_input_dims(trace: Trace, event: int) -> list[int]:
    if event < 0 or trace.shapes[event] < 0:
        return []
    try:
        dims = json.loads(trace.names[trace.shapes[event]])
    except ValueError:
        return []
    first = dims[0] if dims and isinstance(dims[0], list) else []
    return [int(value) for value in first if isinstance(value, int)]
