"""A materialised broadcast: the op that made the largest allocation copied an expanded view.

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

from ..analysis import numeric
from ..trace.kinds import Kind
from .rule import Context

_EXPANDS = ("aten::expand", "aten::expand_as", "aten::broadcast_to")
_LOOK_BACK_US = 1000.0  # the expand is issued just before the copy: the same Python line in practice


@dataclass(frozen=True)
class Broadcast:
    """An expanded tensor materialised by a copy, with the shapes."""

    expand_event: int
    from_dims: list[int]  # the expanded tensor's own shape (size-1 dims broadcast)
    to_dims: list[int]  # the shape materialised
    ratio: float  # elements written / elements of the tensor expanded


def materialised_broadcast(ctx: Context, op_event: int) -> Broadcast | None:
    """The expand whose view ``op_event`` (the outermost op around the largest allocation) materialised."""
    trace = ctx.trace
    to_dims = _first_input_dims(trace, op_event)
    if op_event < 0 or not to_dims:
        return None
    same = (trace.rank == trace.rank[op_event]) & (trace.tid == trace.tid[op_event]) & (trace.kind == Kind.CPU_OP)
    start = float(trace.ts[op_event])
    names = [trace.name_id(name) for name in _EXPANDS]
    candidates = np.flatnonzero(same & numeric.isin(trace.name, names) & (trace.end <= start) & (trace.end >= start - _LOOK_BACK_US))
    for event in candidates[np.argsort(-trace.ts[candidates])]:
        from_dims = _first_input_dims(trace, int(event))
        if len(from_dims) == len(to_dims) and all(a in (1, b) for a, b in zip(from_dims, to_dims)):
            ratio = float(np.prod(to_dims, dtype=np.float64) / max(np.prod(from_dims, dtype=np.float64), 1.0))
            if ratio > 1:
                return Broadcast(int(event), from_dims, to_dims, ratio)
    return None


def _first_input_dims(trace, event: int) -> list[int]:
    if event < 0 or trace.shapes[event] < 0:
        return []
    try:
        dims = json.loads(trace.names[trace.shapes[event]])
    except ValueError:
        return []
    first = dims[0] if dims and isinstance(dims[0], list) else []
    return [int(value) for value in first if isinstance(value, int)]
