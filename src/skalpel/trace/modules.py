"""Module attribution: the ``nn.Module`` call each event runs in, decided once for the whole trace.

torch.profiler records each module call as an ``nn.Module: Name_N`` Python frame (``with_stack``
or ``with_modules``): ``Name`` the class, ``N`` the instance's number among that class's modules.
The frames of one thread nest as the calls do. Every host event on a thread runs in the innermost
frame around it; a kernel, copy or memset runs in the frame of the launch call that queued it (the
trace's launch links), wherever and whenever it ran on the device. A module frame's own module is
the frame around it: its parent in the module tree. Backward and the optimizer run outside any
frame (autograd does not re-enter the module's call), and so does every event of a trace without
module frames: -1.

Backward is charged apart (``backward_module_of_events``): torch.profiler writes autograd's sequence
number on every op ('Sequence number'; the backward ones also 'Fwd thread id'), the number of the node
a forward op made and of the backward op that runs that node. A backward op takes the module of the
latest forward op with its number (before it, on its rank); what runs inside it (the ops it calls, the
kernels they launch) takes the innermost backward op's module. What runs inside a module frame within
backward (activation checkpointing's recomputed forward) stays that frame's, forward work, and its time
is taken off the backward op's.
"""

from __future__ import annotations

import numpy as np

from .kinds import Kind, kind_array
from .roles import Role

MODULE_PREFIX = "nn.Module: "
_HOST = kind_array({Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.COMM_OP, Kind.RUNTIME, Kind.DRIVER,
                    Kind.PYTHON})  # fmt: skip
_SLACK_US = 1e-3  # a child's end rounded past its parent's in the trace's microseconds


def module_of_events(role: np.ndarray, kind: np.ndarray, rank: np.ndarray, tid: np.ndarray, ts: np.ndarray,
                     end: np.ndarray, launcher: np.ndarray) -> np.ndarray:  # fmt: skip
    """For each event, the index of the innermost module frame it runs in (int64, -1: none)."""
    module = np.full(len(kind), -1, dtype=np.int64)
    frames = np.flatnonzero(role == Role.MODULE)
    if len(frames) == 0:
        return module
    thread = rank.astype(np.int64) * (1 << 40) + tid
    host = np.flatnonzero(np.isin(kind, _HOST))
    parents = {}
    for key in sorted(set(thread[frames].tolist())):  # a few threads run modules
        mine = frames[thread[frames] == key]
        mine = mine[np.lexsort((-end[mine], ts[mine]))]  # by start, the outer of two equal starts first
        depth, parent = _nesting(mine, ts, end)
        parents.update(zip(mine.tolist(), parent.tolist()))
        _innermost(mine, depth, host[thread[host] == key], ts, end, module)
    module[frames] = [parents[int(frame)] for frame in frames.tolist()]  # a frame runs in its parent
    device = np.flatnonzero(launcher >= 0)
    module[device] = module[launcher[device]]
    return module


def _innermost(frames: np.ndarray, depth: np.ndarray, events: np.ndarray, ts: np.ndarray, end: np.ndarray,
               out: np.ndarray) -> None:  # fmt: skip
    """Set ``out[event]`` to the innermost of ``frames`` (one thread's, by start, with their ``depth``) around it."""
    for level in range(int(depth.max()) + 1):  # frames of one depth never overlap: one search each
        at = frames[depth == level]
        position = np.searchsorted(ts[at], ts[events], side="right") - 1
        found = np.maximum(position, 0)
        inside = (position >= 0) & (end[events] <= end[at[found]] + _SLACK_US)
        out[events[inside]] = at[found[inside]]


def backward_module_of_events(autograd: np.ndarray, module: np.ndarray, role: np.ndarray, kind: np.ndarray,
                              rank: np.ndarray, tid: np.ndarray, ts: np.ndarray, end: np.ndarray,
                              launcher: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """For each event, the module frame whose forward made the backward node it runs in (int64, -1: none); the
    outermost backward ops charged to a module; and their host time (us) less the module frames inside them
    (a recomputed forward): the module's backward host time, counted once.

    ``autograd``: the trace's column (2n forward, 2n+1 backward, -1 none); ``module``: ``module_of_events``.
    """
    charged = np.full(len(kind), -1, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    backward = np.flatnonzero((autograd >= 0) & (autograd & 1 == 1) & (module < 0))
    forward = np.flatnonzero((autograd >= 0) & (autograd & 1 == 0) & (module >= 0))
    if len(backward) == 0 or len(forward) == 0:
        return charged, none, np.zeros(0)
    key = rank.astype(np.int64) * (1 << 44) + (autograd >> 1)  # a rank's sequence numbers
    forward = forward[np.lexsort((ts[forward], key[forward]))]  # by number, then start
    forward_keys = key[forward]
    last = np.searchsorted(forward_keys, key[backward], side="right") - 1
    hit = (last >= 0) & (forward_keys[np.maximum(last, 0)] == key[backward])
    made_by = np.full(len(backward), -1, dtype=np.int64)
    made_by[hit] = forward[last[hit]]
    for row in np.flatnonzero(hit & (ts[np.maximum(made_by, 0)] >= ts[backward])).tolist():
        made_by[row] = _made_before(forward, forward_keys, last[row], ts, int(backward[row]))  # two forward threads
    owner = np.where(made_by >= 0, module[np.maximum(made_by, 0)], -1)
    backward, owner = backward[owner >= 0], owner[owner >= 0]
    if len(backward) == 0:
        return charged, none, np.zeros(0)
    node_module = np.full(len(kind), -1, dtype=np.int64)
    node_module[backward] = owner
    thread = rank.astype(np.int64) * (1 << 40) + tid
    host = np.flatnonzero(np.isin(kind, _HOST))
    outermost, own_us = [], []
    recomputed = np.flatnonzero((role == Role.MODULE) & (module < 0))  # outermost module frames (some in backward)
    for key_thread in sorted(set(thread[backward].tolist())):  # the threads autograd ran on: one or a few
        mine = backward[thread[backward] == key_thread]
        mine = mine[np.lexsort((-end[mine], ts[mine]))]
        depth, _ = _nesting(mine, ts, end)
        roots = mine[depth == 0]
        outermost.append(roots)
        frames = recomputed[thread[recomputed] == key_thread]
        position = np.searchsorted(ts[roots], ts[frames], side="right") - 1
        inside = (position >= 0) & (end[frames] <= end[roots[np.maximum(position, 0)]] + _SLACK_US)
        nested = np.bincount(position[inside], weights=end[frames[inside]] - ts[frames[inside]], minlength=len(roots))
        own_us.append(np.maximum(end[roots] - ts[roots] - nested, 0.0))
        inner = np.full(len(kind), -1, dtype=np.int64)
        _innermost(mine, depth, host[thread[host] == key_thread], ts, end, inner)
        inside = np.flatnonzero(inner >= 0)
        charged[inside] = node_module[inner[inside]]
    charged[module >= 0] = -1  # in a module frame within backward: that frame's forward work
    device = np.flatnonzero(launcher >= 0)
    charged[device] = charged[launcher[device]]
    roots, own = np.concatenate(outermost), np.concatenate(own_us)
    order = np.argsort(roots, kind="stable")
    return charged, roots[order], own[order]


def _made_before(forward: np.ndarray, keys: np.ndarray, last: int, ts: np.ndarray, backward: int) -> int:
    """The latest forward op with the backward op's number that started before it (-1: none)."""
    position = last
    while position >= 0 and keys[position] == keys[last]:
        if ts[forward[position]] < ts[backward]:
            return int(forward[position])
        position -= 1
    return -1


def _nesting(frames: np.ndarray, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The depth of each frame (sorted by start) among the frames of its thread, and its parent frame (-1: a root)."""
    depth = np.zeros(len(frames), dtype=np.int64)
    parent = np.full(len(frames), -1, dtype=np.int64)
    open_frames: list[int] = []  # positions in ``frames`` of the frames around the current one
    starts, ends = ts[frames].tolist(), end[frames].tolist()
    for position, (start, stop) in enumerate(zip(starts, ends)):
        while open_frames and ends[open_frames[-1]] + _SLACK_US < stop:
            open_frames.pop()
        if open_frames and start < ends[open_frames[-1]]:
            depth[position] = len(open_frames)
            parent[position] = frames[open_frames[-1]]
        else:
            open_frames.clear()
        open_frames.append(position)
    return depth, parent


def module_name(frame_name: str) -> str:
    """``"nn.Module: Block_3"`` -> ``"Block_3"``."""
    return frame_name[len(MODULE_PREFIX):] if frame_name.startswith(MODULE_PREFIX) else frame_name


def module_class(name: str) -> str:
    """``"Block_3"`` -> ``"Block"``: the class, without the instance's number."""
    head, _, number = name.rpartition("_")
    return head if head and number.isdigit() else name

