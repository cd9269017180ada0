"""Host call stacks of one rank: Python frames with the ops they call, nested by time.

With ``with_stack`` the profiler records every Python call as a ``python_function``
event; ops (``aten::*``), ``record_function`` ranges, DataLoader waits and runtime
calls are ranges on the same thread. Nesting them by time gives the call tree that
the flame graph draws. Only the recorded steps count (the span of the
``ProfilerStep#N`` ranges; the whole trace when unmarked), so the Python frames that
enclose the whole loop are cut to that span. A child that outlasts its parent (clock
rounding, an op left open when recording stopped) is cut to its parent.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace

MIN_FLAME_FRACTION = 0.0005  # a frame under this share of the total is left out of the flame graph
_RANGES = np.array([int(Kind.USER_ANNOTATION), int(Kind.DATALOADER)], dtype=np.int8)
FRAME_KINDS = (Kind.PYTHON, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.COMM_OP, Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER)
# At equal start and length the Python frame encloses the op it calls, the op its runtime calls.
_PRIORITY = np.zeros(max(int(k) for k in Kind) + 1, dtype=np.int8)
for _order, _kind in enumerate(FRAME_KINDS):
    _PRIORITY[int(_kind)] = _order


@dataclass
class ThreadStacks:
    """The nested events of one host thread, in start order, with their clipped times."""

    tid: int
    events: np.ndarray  # trace event indices
    start: np.ndarray  # us, clipped to the window and to the parent
    end: np.ndarray
    parent: np.ndarray  # position (into events) of the enclosing event, -1 at the top


@dataclass
class Node:
    """A frame of the merged call tree: every path of identical names adds up."""

    name: str  # the event name, object addresses removed so that one method is one frame
    kind: int  # a Kind, -1 for the root and thread frames
    total_us: float = 0.0
    children: dict[str, Node] = field(default_factory=dict)

    def child(self, name: str, kind: int) -> Node:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = Node(name, kind)
        return node

    @property
    def self_us(self) -> float:
        return max(self.total_us - sum(child.total_us for child in self.children.values()), 0.0)


def window(trace: Trace, rank: int) -> tuple[float, float]:
    """The span of the recorded steps of ``rank`` (the rank's whole trace when it has no markers)."""
    on_rank = trace.rank == rank
    steps = on_rank & (trace.kind == Kind.STEP)
    chosen = steps if steps.any() else on_rank
    if not chosen.any():
        return 0.0, 0.0
    return float(trace.ts[chosen].min()), float((trace.ts[chosen] + trace.dur[chosen]).max())


def thread_stacks(trace: Trace, rank: int) -> list[ThreadStacks]:
    """The nested host events of each thread of ``rank`` inside the recorded steps."""
    low, high = window(trace, rank)
    ends = trace.ts + trace.dur
    selected = np.flatnonzero(
        (trace.rank == rank) & np.isin(trace.kind, [int(k) for k in FRAME_KINDS]) & (ends > low) & (trace.ts < high)
    )
    # A thread with Python frames only (a monitor, a logger waiting on a lock) ran no torch work:
    # its waiting would fill half the graph, so it is left out when another thread has ops.
    working = np.unique(trace.tid[selected[trace.kind[selected] != Kind.PYTHON]])
    if len(working):
        selected = selected[np.isin(trace.tid[selected], working)]
    result = []
    for tid in np.unique(trace.tid[selected]):
        events = selected[trace.tid[selected] == tid]
        start = np.maximum(trace.ts[events], low)
        end = np.minimum(ends[events], high)
        keep = end > start
        events, start, end = events[keep], start[keep], end[keep]
        if len(events):
            result.append(_thread(trace, int(tid), events, start, end))
    return sorted(result, key=lambda stacks: -float((stacks.end - stacks.start)[stacks.parent < 0].sum()))


def _thread(trace: Trace, tid: int, events: np.ndarray, start: np.ndarray, end: np.ndarray) -> ThreadStacks:
    kinds = trace.kind[events]
    order = np.lexsort((_PRIORITY[kinds], start - end, start))
    events, start, end, kinds = events[order], start[order], end[order], kinds[order]
    is_range = np.isin(kinds, _RANGES)
    calls = np.flatnonzero(~is_range)
    spans = _Spans(start.tolist(), end.tolist())
    roots = spans.nest(calls.tolist())
    for index in np.flatnonzero(is_range).tolist():
        spans.insert(index, roots)
    positions, parents = spans.preorder(roots)
    events = events[positions]
    start, end = np.array(spans.start)[positions], np.array(spans.end)[positions]
    own = _own_frames(trace, events)
    if own.any():
        return _without(tid, events, start, end, parents, own)
    return ThreadStacks(tid, events, start, end, parents)


def _own_frames(trace: Trace, events: np.ndarray) -> np.ndarray:
    python = trace.kind[events] == Kind.PYTHON
    own = opnames.names_where(trace, opnames.is_skalpel_frame, events[python])
    return python & np.isin(trace.name[events], own)


def _without(tid: int, events: np.ndarray, start: np.ndarray, end: np.ndarray, parents: np.ndarray,
             drop: np.ndarray) -> ThreadStacks:  # fmt: skip
    """Remove the ``drop`` events (in preorder); their callees move up to the nearest kept caller."""
    parent = parents.tolist()
    dropped = drop.tolist()
    for i, above in enumerate(parent):
        while above >= 0 and dropped[above]:
            above = parent[above]
        parent[i] = above  # preorder: the callers were already rewritten
    position = np.cumsum(~drop) - 1
    kept_parent = np.array(parent, dtype=np.int64)
    new_parent = np.where(kept_parent >= 0, position[np.maximum(kept_parent, 0)], -1)
    keep = ~drop
    return ThreadStacks(tid, events[keep], start[keep], end[keep], new_parent[keep])


class _Spans:
    """Spans of one thread as parallel lists, with a child list per span."""

    def __init__(self, start: list[float], end: list[float]) -> None:
        self.start, self.end = start, end
        self.children: list[list[int]] = [[] for _ in start]

    def nest(self, calls: list[int]) -> list[int]:
        """Nest calls (in start order, longest first) by time; a call that outlasts its caller is cut."""
        roots: list[int] = []
        stack: list[int] = []
        start, end = self.start, self.end
        for i in calls:
            while stack and end[stack[-1]] <= start[i]:
                stack.pop()
            if stack:
                end[i] = min(end[i], end[stack[-1]])
                self.children[stack[-1]].append(i)
            else:
                roots.append(i)
            stack.append(i)
        return roots

    def insert(self, index: int, roots: list[int]) -> None:
        """Put a range under the deepest span that holds it, above the spans it holds.

        A record_function range (a DataLoader wait, Optimizer.step, a user's annotation) is
        opened by one short Python call (``__enter__``) and closed by another, so it cannot
        nest by time like a call; it belongs to the frame around both.
        """
        start, end, children = self.start, self.end, self.children
        level = roots
        while True:
            at = bisect.bisect_right(level, start[index], key=lambda i: start[i]) - 1
            if at >= 0 and end[level[at]] >= end[index]:
                level = children[level[at]]
                continue
            break
        low = bisect.bisect_left(level, start[index], key=lambda i: start[i])
        high = low
        while high < len(level) and end[level[high]] <= end[index]:
            high += 1
        # The range begins inside __enter__ and ends inside __exit__: cut it to the gap between them,
        # so that siblings never overlap and a frame's callees never add up to more than the frame.
        if low > 0:
            start[index] = max(start[index], end[level[low - 1]])
        if high < len(level):
            end[index] = min(end[index], start[level[high]])
        if end[index] <= start[index]:
            return
        children[index] = level[low:high]
        level[low:high] = [index]

    def preorder(self, roots: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Span indices in depth-first order (callers before callees) and each one's parent position."""
        order: list[int] = []
        parents: list[int] = []
        pending = [(root, -1) for root in reversed(roots)]
        while pending:
            index, parent = pending.pop()
            position = len(order)
            order.append(index)
            parents.append(parent)
            pending.extend((child, position) for child in reversed(self.children[index]))
        return np.array(order, dtype=np.int64), np.array(parents, dtype=np.int64)


MAX_DEPTH = 96
"""Frames below this depth are folded into one frame: every renderer walks the tree by recursion
(and the HTML page's JSON nests two levels per frame, where orjson stops at 254)."""
FOLDED = "[deeper frames folded]"


def merged_tree(trace: Trace, threads: list[ThreadStacks]) -> Node:
    """Merge the threads' call trees by name path; one frame per thread when there are several.

    Events deeper than ``MAX_DEPTH`` give their time to one ``FOLDED`` frame under their
    ancestor at that depth.
    """
    root = Node("all", -1)
    canonical = opnames.without_addresses(trace.names)
    for stacks in threads:
        top = root if len(threads) == 1 else root.child(f"thread {stacks.tid}", -1)
        nodes: list[Node] = []
        depths: list[int] = []
        names = [canonical[name] for name in trace.name[stacks.events].tolist()]
        kinds = trace.kind[stacks.events].tolist()
        durations = (stacks.end - stacks.start).tolist()
        for i, parent in enumerate(stacks.parent.tolist()):
            above = nodes[parent] if parent >= 0 else top
            depth = depths[parent] + 1 if parent >= 0 else 1
            if depth > MAX_DEPTH + 1:  # inside a folded frame: its time is already counted there
                nodes.append(above)
                depths.append(depth)
                continue
            node = above.child(FOLDED, -1) if depth > MAX_DEPTH else above.child(names[i], kinds[i])
            node.total_us += durations[i]
            nodes.append(node)
            depths.append(depth)
            if parent < 0:
                top.total_us += durations[i]
        if top is not root:
            root.total_us += float((stacks.end - stacks.start)[stacks.parent < 0].sum())
    return root


def flame_tree(trace: Trace, *, rank: int = 0, threads: list | None = None) -> dict[str, Any] | None:
    """The merged call tree of ``rank``'s recorded steps as {name, value ms, children}: the flame graph's data."""
    root = merged_tree(trace, thread_stacks(trace, rank) if threads is None else threads)
    if root.total_us <= 0:
        return None
    floor = root.total_us * MIN_FLAME_FRACTION

    def convert(node: Node) -> dict[str, Any]:
        kids = [convert(child) for child in node.children.values() if child.total_us >= floor]
        return {"name": node.name, "value": node.total_us / 1000.0, "children": kids}

    tree = convert(root)
    # Fold the chain of frames that enclose everything (runpy, the CLI, the script's main):
    # they would take a row each and say nothing; the innermost of them stays.
    node, folded = tree, 0
    while len(node["children"]) == 1 and node["children"][0]["value"] >= 0.99 * node["value"]:
        node, folded = node["children"][0], folded + 1
    if folded > 1:
        tree["children"] = [node]
    name = f"all (rank {rank}, recorded steps)"
    tree["name"] = name + (f"; {folded - 1} enclosing frames folded" if folded > 1 else "")
    tree["unit"] = "ms"
    return tree
