"""Events picked by name for the few facts no role covers: an LBFGS step, a broadcast view, a c10d op.

Roles (``roles.py``) say what an event is for; these are narrower questions a single analysis asks, kept here so
that analyses and rules never test an event's name themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .kinds import Kind
from .roles import OPTIMIZER_PREFIX

if TYPE_CHECKING:
    from .model import Trace

LBFGS_STEP = OPTIMIZER_PREFIX + "LBFGS.step"  # torch.optim.LBFGS's step: it makes its curvature history inside
EXPAND_OPS = ("aten::expand", "aten::expand_as", "aten::broadcast_to")  # a broadcast view, free until materialised
C10D_PREFIX = "c10d::"  # the dispatcher's collective ops (c10d::allreduce_), issued by the user's code
# reduced losses whose 0-dim result keeps the whole elementwise-loss buffer as its storage (pytorch/pytorch#185647)
LOSS_KEEPS_BUFFER = frozenset({"aten::mse_loss", "aten::smooth_l1_loss"})


def lbfgs_steps(trace: Trace, rank: int) -> np.ndarray:
    """The LBFGS optimizer steps of a rank, by start (empty without one)."""
    name = trace.name_id(LBFGS_STEP)
    if name < 0:
        return np.zeros(0, dtype=np.int64)
    ranges = np.flatnonzero((trace.name == name) & (trace.rank == rank))
    return ranges[np.argsort(trace.ts[ranges], kind="stable")]


def expand_ops(trace: Trace) -> np.ndarray:
    """A mask of the events that are broadcast views (aten::expand, expand_as, broadcast_to)."""
    return np.isin(trace.name, np.array([trace.name_id(name) for name in EXPAND_OPS], dtype=np.int64))


def keeps_loss_buffer(op: str) -> bool:
    return op in LOSS_KEEPS_BUFFER


def is_c10d_op(name: str) -> bool:
    return name.startswith(C10D_PREFIX)


def c10d_ops(trace: Trace, rank: int) -> np.ndarray:
    """A rank's c10d collective ops (host side), in event order."""
    issued = np.flatnonzero((trace.kind == Kind.COMM_OP) & (trace.rank == rank))
    return np.array([int(i) for i in issued if is_c10d_op(trace.name_of(i))], dtype=np.int64)
