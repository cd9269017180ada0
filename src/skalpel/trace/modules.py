"""Module attribution: the ``nn.Module`` call each event runs in, decided once for the whole trace.

torch.profiler records each module call as an ``nn.Module: Name_N`` Python frame (``with_stack``
or ``with_modules``): ``Name`` the class, ``N`` the instance's number among that class's modules.
The frames of one thread nest as the calls do. Every host event on a thread runs in the innermost
frame around it; a kernel, copy or memset runs in the frame of the launch call that queued it (the
trace's launch links), wherever and whenever it ran on the device. A module frame's own module is
the frame around it: its parent in the module tree. Backward and the optimizer run outside any
frame (autograd does not re-enter the module's call), and so does every event of a trace without
module frames: -1.
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
        events = host[thread[host] == key]
        for level in range(int(depth.max()) + 1):  # frames of one depth never overlap: one search each
            at = mine[depth == level]
            position = np.searchsorted(ts[at], ts[events], side="right") - 1
            found = np.maximum(position, 0)
            inside = (position >= 0) & (end[events] <= end[at[found]] + _SLACK_US)
            module[events[inside]] = at[found[inside]]
    module[frames] = [parents[int(frame)] for frame in frames.tolist()]  # a frame runs in its parent
    device = np.flatnonzero(launcher >= 0)
    module[device] = module[launcher[device]]
    return module


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

