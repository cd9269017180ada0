"""Where host ops come from: the data loading, the optimizer step, or the model and the loop around it.

Data loading: inside a DataLoader range; optimizer step: inside an ``Optimizer.step#...`` range, after the last
backward node in it (a closure's forward and backward run inside ``step()``: LBFGS, Lightning); the rest is the
model and the loop around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from ..trace.roles import Role
from . import intervals

DATA, OPTIMIZER, MODEL = "data loading", "optimizer step", "model and the rest"
SOURCES = (DATA, OPTIMIZER, MODEL)  # a label is the position here


@dataclass(frozen=True)
class OpSource:
    """Ops of one source: its name, its share of the ops grouped (%), and the ops."""

    name: str
    share_pct: float
    ops: np.ndarray


def source_labels(trace: Trace, rank: int, ops: np.ndarray, loader: np.ndarray) -> np.ndarray:
    """The source of each op (its position in ``SOURCES``); ``loader``: the rank's DataLoader ranges."""
    labels = np.full(len(ops), SOURCES.index(MODEL), dtype=np.int8)
    if len(ops) == 0:
        return labels
    ranges = np.flatnonzero((trace.rank == rank) & isin_few(trace.kind, [Kind.USER_ANNOTATION, Kind.CPU_OP]))
    optimizer = ranges[trace.role[ranges] == Role.OPTIMIZER_STEP]
    backward = ranges[trace.role[ranges] == Role.BACKWARD_NODE]
    in_loader = _inside_spans(trace, ops, trace.ts[loader], trace.end[loader])
    in_optimizer = _inside_spans(trace, ops, *_after_closures(trace, optimizer, backward)) & ~in_loader
    labels[in_optimizer] = SOURCES.index(OPTIMIZER)
    labels[in_loader] = SOURCES.index(DATA)
    return labels


def by_source(ops: np.ndarray, labels: np.ndarray) -> tuple[OpSource, ...]:
    """The ops grouped by source, largest first."""
    if len(ops) == 0:
        return ()
    groups = [(name, ops[labels == label]) for label, name in enumerate(SOURCES)]
    found = [OpSource(name, 100.0 * len(events) / len(ops), events) for name, events in groups if len(events)]
    return tuple(sorted(found, key=lambda group: -group.share_pct))


def _inside_spans(trace: Trace, events: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(len(events), dtype=bool)
    starts, ends = intervals.union(starts, ends)
    return intervals.containing(starts, ends, trace.ts[events]) >= 0


def _after_closures(trace: Trace, steps: np.ndarray, backward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The optimizer steps' spans, each from the end of the last backward op inside it (its closure's) on."""
    starts, ends = trace.ts[steps].astype(float), trace.end[steps].astype(float)
    if len(backward) == 0 or len(steps) == 0:
        return starts, ends
    order = np.argsort(trace.ts[backward], kind="stable")
    backward_starts, backward_ends = trace.ts[backward][order], trace.end[backward][order]
    first = np.searchsorted(backward_starts, starts, side="left")
    last = np.searchsorted(backward_starts, ends, side="left")
    for row in np.flatnonzero(last > first):  # the steps that ran a closure: few, one per step at most
        starts[row] = max(starts[row], float(backward_ends[first[row]:last[row]].max()))
    return starts, ends
