"""Kernels that run on a side stream beside compute: a hint of communication no collective name matched.

A rank of a distributed job with no recognised collective may still communicate: an in-house all-to-all or a
library whose kernels skalpel does not know runs on a stream of its own, overlapping the compute on the main
stream, as NCCL's and DeepEP's kernels do. The main stream is the one with the most kernel time; a kernel on any
other stream that overlaps kernels on another stream is a side kernel. The names, by the time they overlap compute,
are what the note about a job that seems not to communicate quotes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.opnames import kernel_stem
from . import intervals, numeric


def side_kernels(trace: Trace, rank: int, spans: tuple[np.ndarray, np.ndarray], *,
                 limit: int = 3) -> tuple[str, ...]:  # fmt: skip
    """The stems of the kernels (``acme::moe::dispatch`` of ``void acme::moe::dispatch<8>(...)``) on a side stream
    of ``rank`` that overlap kernels on other streams inside ``spans`` (the steps), the longest overlap first."""
    kernels = np.flatnonzero(trace.mask(Kind.KERNEL, rank=rank))
    if len(kernels) == 0:
        return ()
    streams = trace.stream[kernels]
    ids = numeric.unique(streams)
    if len(ids) < 2:
        return ()
    starts, ends = trace.ts[kernels], trace.ts[kernels] + trace.dur[kernels]
    busy = {int(s): float(trace.dur[kernels[streams == s]].sum()) for s in ids}
    main = max(busy, key=lambda s: (busy[s], -s))
    overlap: dict[str, float] = defaultdict(float)
    for stream in ids.tolist():
        if stream == main:
            continue
        mine = streams == stream
        others = intervals.intersection(intervals.union(starts[~mine], ends[~mine]), spans)
        shared = intervals.busy_between(others, starts[mine], ends[mine])
        by_name = np.bincount(trace.name[kernels[mine]], weights=shared)  # one pass, not one mask a name
        for name_id in np.flatnonzero(by_name > 0).tolist():
            overlap[kernel_stem(trace.names[name_id])] += float(by_name[name_id])
    return tuple(sorted(overlap, key=lambda name: (-overlap[name], name))[:limit])
