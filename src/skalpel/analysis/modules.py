"""Time, FLOPs and calls by ``nn.Module``: the module tree of each rank over its judged units.

Each event's module is a role of the trace, decided once (``Trace.module``, trace/modules.py): a host
event runs in the innermost ``nn.Module: Name_N`` frame around it, a kernel in its launch call's.
A node of the tree is a module by its path from the outermost module (``TinyTransformer_0 >
Sequential_0 > Block_2``); its figures are per unit (``steps.judged_units``), over the frames that
start inside the units and the module frames around them (an unmarked trace's window opens at its first
op, inside the first forward's outermost frame: without it, that forward's children would stand as roots):

* host: the frames' time (total) and that time less the child modules' frames (self);
* device: kernels, copies and memsets the module's own launch calls queued (self) and its subtree's
  (total), summed by duration (work on two streams at once counts twice, as in the kernel table);
* FLOPs: the counted ops' (``mfu.op_flops``: the trace's own count, else from shapes), by the same
  self / total split.

Backward is charged to the module whose forward made each autograd node (``Trace.backward_module``:
autograd's sequence numbers, which torch.profiler writes on every op): a module's backward share is the
host time of its backward ops, the device work they launched and their FLOPs (self: its own forward
ops' nodes; total: its subtree's). A module's figures cover forward + backward where the trace links
them; a trace without sequence numbers (inference, a torch that does not write them) has no backward share.

What runs outside every module frame and is not a module's backward (the optimizer, data loading, the
loss, the loop's own code) is the unattributed share, shown beside the tree so the modules and it add
up to the unit.

Torch's frames say which instance ran but not its size: under ``skalpel run`` (and ``skalpel.profile()``)
the capture records each module's parameters and forward output bytes into the trace header
(``capture/module_sizes.py``), read here by the instance's name; a stored trace has none ("not recorded").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.modules import module_class, module_name
from ..trace.roles import Role
from ..trace.stacks import format_location, forward_frame, is_user_file, parse_frame
from .mfu import op_flops
from .steps import StepSegmentation, judged_units
from .timeline import device_mask

MAX_NODES = 200  # the tree a report keeps: the heaviest nodes, every one with its ancestors
OP_PLACES = 30  # op names whose module is looked up, by self host time


@dataclass(frozen=True)
class ModuleNode:
    """One module of the tree, by its path; figures per unit."""

    path: tuple[str, ...]  # ("TinyTransformer_0", "Sequential_0", "Block_2")
    calls: float
    host_ms: float
    host_self_ms: float
    device_ms: float
    device_self_ms: float
    flops: float
    flops_self: float
    location: str | None  # the innermost user-code line: its own forward's, else the nearest caller module's
    defined_at: str | None  # its forward's definition, in any file ("torch/nn/modules/linear.py:124 in forward")
    backward_host_ms: float = 0.0  # the subtree's backward ops (autograd nodes its forward made)
    backward_host_self_ms: float = 0.0
    backward_device_ms: float = 0.0  # device work those backward ops launched
    backward_device_self_ms: float = 0.0
    backward_flops: float = 0.0  # the subtree's
    params: int | None = None  # parameters of the module and its children (None: not recorded)
    output_bytes: int | None = None  # bytes of the tensors its forward returned, at its first call
    own_ms_by_unit: tuple[float, ...] = ()  # host self time, forward and backward, in each judged unit (ms)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def depth(self) -> int:
        return len(self.path) - 1

    @property
    def class_path(self) -> str:
        """``"TinyTransformer > Sequential > Block"``: the path by class, as ``OpPlace.module`` names it."""
        return " > ".join(module_class(name) for name in self.path)

    @property
    def user_forward(self) -> bool:
        """Its forward is the user's code (its line is its own forward's definition), not a library's."""
        return self.location is not None and self.location == self.defined_at


@dataclass(frozen=True)
class OpPlace:
    """Where an op name runs among the modules: the class path holding most of its self host time."""

    op: str
    module: str  # "TinyTransformer > Sequential > Block > FeedForward > Linear"
    instances: int  # module instances of that class path the op ran in
    share_pct: float  # of the op's self host time in the units (the rest: backward, other modules, no module)
    location: str | None


@dataclass(frozen=True)
class RankModules:
    """A rank's module tree over its judged units, and what runs outside every module."""

    rank: int
    unit: str  # "step", "iteration" or "window"
    units: int
    unit_ms: float  # the units' mean length
    host_ms: float  # per unit, in the outermost module frames
    device_ms: float  # per unit, all device work that started in the units
    device_in_modules_ms: float  # per unit, the part of it launched inside a module frame
    nodes: tuple[ModuleNode, ...]  # preorder, siblings by time (device on device runs, else host)
    places: dict[str, OpPlace] = field(default_factory=dict)
    has_device: bool = False
    backward_host_ms: float = 0.0  # per unit, the backward ops charged to a module
    backward_device_ms: float = 0.0  # per unit, the device work they launched
    sizes_recorded: bool = False  # the capture wrote each module's parameters and output bytes

    @property
    def host_unattributed_ms(self) -> float:
        return max(self.unit_ms - self.host_ms - self.backward_host_ms, 0.0)

    @property
    def device_unattributed_ms(self) -> float:
        return max(self.device_ms - self.device_in_modules_ms - self.backward_device_ms, 0.0)

    def time_ms(self, node: ModuleNode) -> float:
        """The figure the tree is ranked by, forward + backward: device time on device runs, else host time."""
        return node.device_ms + node.backward_device_ms if self.has_device else node.host_ms + node.backward_host_ms


@dataclass(frozen=True)
class ModuleTree:
    ranks: dict[int, RankModules]

    def for_rank(self, rank: int) -> RankModules | None:
        return self.ranks.get(rank)


def module_tree(trace: Trace, steps: StepSegmentation) -> ModuleTree | None:
    """Each rank's module tree; None when the trace recorded no module frames."""
    frames_all = np.flatnonzero(trace.role == Role.MODULE)
    if len(frames_all) == 0:
        return None
    flop_events, flops = op_flops(trace)
    ranks = {}
    for info in trace.ranks:
        units, unit = judged_units(trace, steps, info.rank)
        if not units:
            continue
        found = _rank_tree(trace, info.rank, units, unit, frames_all, flop_events, flops)
        if found is not None:
            ranks[info.rank] = found
    return ModuleTree(ranks) if ranks else None


def _in_units(times: np.ndarray, units) -> np.ndarray:
    inside = np.zeros(len(times), dtype=bool)
    for step in units:
        inside |= (times >= step.start_us) & (times < step.end_us)
    return inside


def _rank_tree(trace: Trace, rank: int, units, unit: str, frames_all, flop_events, flops) -> RankModules | None:
    frames = frames_all[(trace.rank[frames_all] == rank) & _in_units(trace.ts[frames_all], units)]
    if len(frames) == 0:
        return None
    frames = _with_enclosing(trace.module, frames)
    count = len(units)
    module = trace.module
    position = {int(frame): i for i, frame in enumerate(frames.tolist())}  # frame -> its row
    paths = _paths(trace, frames, position)
    parent_row = np.array([position.get(int(module[frame]), -1) for frame in frames.tolist()], dtype=np.int64)
    dur = trace.dur[frames]
    child_time = np.bincount(parent_row[parent_row >= 0], weights=dur[parent_row >= 0], minlength=len(frames))
    rows_of = np.full(len(trace), -1, dtype=np.int64)  # event -> the row of its module frame (-1: none of these)
    rows_of[frames] = np.arange(len(frames))

    def self_sum(events: np.ndarray, values: np.ndarray, owners: np.ndarray = module) -> np.ndarray:
        owner = owners[events]
        rows = np.where(owner >= 0, rows_of[np.maximum(owner, 0)], -1)
        keep = rows >= 0
        return np.bincount(rows[keep], weights=values[keep], minlength=len(frames))

    device = np.flatnonzero(device_mask(trace) & (trace.rank == rank))
    device = device[_in_units(trace.ts[device], units)]
    device_self = self_sum(device, trace.dur[device])
    on_rank = trace.rank[flop_events] == rank if len(flop_events) else np.zeros(0, bool)
    flops_self = self_sum(flop_events[on_rank], flops[on_rank]) if len(flop_events) else np.zeros(len(frames))
    location, defined = _forward_lines(trace, frames, rows_of)
    backward = trace.backward_module
    roots, own_us = trace.backward_roots
    mine = (trace.rank[roots] == rank) & _in_units(trace.ts[roots], units)
    backward_host = self_sum(roots[mine], own_us[mine], backward)  # less the recomputed forward's frames in them
    backward_device = self_sum(device, trace.dur[device], backward)
    backward_flops = (self_sum(flop_events[on_rank], flops[on_rank], backward) if len(flop_events)
                      else np.zeros(len(frames)))  # fmt: skip
    # each path's own host time (forward self and the backward charged to it) by unit: a module that holds the
    # step holds most units, not one call the scheduler stalled (paths x units, not frames x units: a large trace
    # has a million frames)
    path_ids = {path: i for i, path in enumerate(dict.fromkeys(paths))}
    path_of_row = np.array([path_ids[path] for path in paths], dtype=np.int64)
    starts = np.array([step.start_us for step in units])
    own_by_unit = _by_unit(path_of_row, dur - child_time, _unit_of(trace.ts[frames], starts), len(path_ids), count)
    owner = backward[roots[mine]]
    rows = np.where(owner >= 0, rows_of[np.maximum(owner, 0)], -1)
    kept = rows >= 0
    own_by_unit += _by_unit(path_of_row[rows[kept]], own_us[mine][kept], _unit_of(trace.ts[roots[mine]][kept], starts),
                            len(path_ids), count)  # fmt: skip

    # calls, host, host self, device self, flops self, backward host, backward device, backward flops (all self)
    sums: dict[tuple[str, ...], np.ndarray] = defaultdict(lambda: np.zeros(8))
    by_unit = {path: own_by_unit[i] for path, i in path_ids.items()}
    where: dict[tuple[str, ...], tuple[str | None, str | None]] = {}
    for row, path in enumerate(paths):
        sums[path] += (1.0, dur[row], dur[row] - child_time[row], device_self[row], flops_self[row],
                       backward_host[row], backward_device[row], backward_flops[row])  # fmt: skip
        if path not in where or (where[path][0] is None and location[row] is not None):
            where[path] = (location[row], defined[row])
    sizes = next((info.module_sizes for info in trace.ranks if info.rank == rank), None)
    nodes = _nodes(sums, where, count, has_device=bool(len(device)), sizes=sizes or {}, by_unit=by_unit)
    roots = parent_row < 0
    device_ms = float(trace.dur[device].sum()) / 1000.0 / count
    return RankModules(
        rank=rank, unit=unit, units=count, unit_ms=sum(step.duration_us for step in units) / 1000.0 / count,
        host_ms=float(dur[roots].sum()) / 1000.0 / count, device_ms=device_ms,
        device_in_modules_ms=float(device_self.sum()) / 1000.0 / count, nodes=nodes,
        places=_op_places(trace, rank, units, rows_of, paths, location, count), has_device=bool(len(device)),
        backward_host_ms=float(backward_host.sum()) / 1000.0 / count,
        backward_device_ms=float(backward_device.sum()) / 1000.0 / count, sizes_recorded=sizes is not None,
    )  # fmt: skip


def _with_enclosing(module: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """``frames`` and every module frame around one of them, in trace order."""
    kept = set(frames.tolist())
    todo = [int(module[frame]) for frame in frames.tolist()]
    while todo:
        frame = todo.pop()
        if frame >= 0 and frame not in kept:
            kept.add(frame)
            todo.append(int(module[frame]))
    return np.array(sorted(kept), dtype=frames.dtype)


def _paths(trace: Trace, frames: np.ndarray, position: dict[int, int]) -> list[tuple[str, ...]]:
    """Each frame's path of module names from its outermost module frame (among ``frames``)."""
    module = trace.module
    paths: list[tuple[str, ...] | None] = [None] * len(frames)
    for row, frame in enumerate(frames.tolist()):  # frames start before their children: parents come first
        parent = position.get(int(module[frame]), -1)
        head = paths[parent] if parent >= 0 and paths[parent] is not None else ()
        paths[row] = (*head, module_name(trace.name_of(frame)))
    return paths  # type: ignore[return-value]


def _forward_lines(trace: Trace, frames: np.ndarray, rows_of: np.ndarray) -> tuple[list, list]:
    """Per frame: the user-code line of its module (its own forward if the user's, else its nearest ancestor's),
    and its forward's definition in any file. None where the trace has no forward frame under it."""
    python = np.flatnonzero((trace.kind == Kind.PYTHON) & (trace.role != Role.MODULE) & (trace.module >= 0))
    python = python[rows_of[trace.module[python]] >= 0]
    parsed = {}
    for name_id in set(trace.name[python].tolist()):
        frame = forward_frame(trace.names[name_id])
        if frame is not None:
            parsed[name_id] = frame
    python = python[[int(name_id) in parsed for name_id in trace.name[python].tolist()]] if len(python) else python
    python = python[np.argsort(trace.ts[python], kind="stable")]
    defined: list[str | None] = [None] * len(frames)
    own: list[str | None] = [None] * len(frames)
    for event in python.tolist():
        row = int(rows_of[trace.module[event]])
        if defined[row] is None:
            path, line, func = parsed[int(trace.name[event])]
            defined[row] = format_location(path, line, func)
            own[row] = defined[row] if is_user_file(path) else None
    location: list[str | None] = list(own)
    module = trace.module
    callers: dict[int, str | None] = {}
    for row, frame in enumerate(frames.tolist()):  # parents first: a library module takes its caller's line
        if location[row] is None:
            parent = module[frame]
            parent_row = int(rows_of[parent]) if parent >= 0 else -1
            location[row] = location[parent_row] if parent_row >= 0 else _caller(trace, frame, callers)
    return location, defined


def _caller(trace: Trace, frame: int, seen: dict[int, str | None]) -> str | None:
    """An outermost module's line when its forward is a library's (an ``nn.Sequential`` model): the innermost
    user-code Python frame around it on its thread, the function that called the model."""
    key = int(trace.name[frame])  # the module, by its frame's name id
    if key in seen:  # the same module each step: called from the same place
        return seen[key]
    thread = (trace.tid == trace.tid[frame]) & (trace.rank == trace.rank[frame])
    around = np.flatnonzero(thread & (trace.kind == Kind.PYTHON) & (trace.ts <= trace.ts[frame])
                            & (trace.end >= trace.end[frame]))  # fmt: skip
    found = None
    for event in around[np.argsort(trace.ts[around], kind="stable")][::-1].tolist():
        parsed = parse_frame(trace.name_of(event))
        if parsed is not None and is_user_file(parsed[0]):
            found = format_location(*parsed)
            break
    seen[key] = found
    return found


def _unit_of(times: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each instant's unit (its position in ``starts``, the units' starts in order); the units tile the window."""
    return np.clip(np.searchsorted(starts, times, side="right") - 1, 0, max(len(starts) - 1, 0))


def _by_unit(rows: np.ndarray, values: np.ndarray, unit: np.ndarray, count_rows: int, count_units: int) -> np.ndarray:
    """``values`` summed by (row, unit): a rows x units array (microseconds)."""
    flat = np.bincount(rows * count_units + unit, weights=values, minlength=count_rows * count_units)
    return flat.reshape(count_rows, count_units)


def _nodes(sums, where, count: int, *, has_device: bool, sizes: dict, by_unit: dict) -> tuple[ModuleNode, ...]:
    """The tree in preorder, siblings by time, totals rolled up; at most MAX_NODES, the heaviest kept."""
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
    for path in sums:
        children[path[:-1]].append(path)
    totals: dict[tuple[str, ...], np.ndarray] = {}

    def roll(path):  # the subtree's device, FLOPs, backward host, backward device and backward FLOPs
        total = sums[path][3:].copy()
        for child in children.get(path, ()):
            total += roll(child)
        totals[path] = total
        return total

    roots = [path for path in sums if path[:-1] not in sums]
    for root in roots:
        roll(root)
    # forward + backward: device on device runs, else host
    rank_key = ((lambda path: totals[path][0] + totals[path][3]) if has_device
                else (lambda path: sums[path][1] + totals[path][2]))  # fmt: skip
    kept = set(sorted(sums, key=rank_key, reverse=True)[:MAX_NODES])
    kept |= {path[:i] for path in kept for i in range(1, len(path))}
    ordered: list[ModuleNode] = []

    def visit(path):
        if path not in kept:
            return
        calls, host, host_self, device_self, flops_self, back_host_self, back_device_self, _ = sums[path]
        device, flop, back_host, back_device, back_flops = totals[path]
        location, defined = where[path]
        ms = 1000.0 * count
        ordered.append(ModuleNode(path, calls / count, host / ms, host_self / ms, device / ms, device_self / ms,
                                  flop / count, flops_self / count, location, defined, back_host / ms,
                                  back_host_self / ms, back_device / ms, back_device_self / ms,
                                  back_flops / count, *sizes.get(path[-1], (None, None)),
                                  tuple(float(us) / 1000.0 for us in by_unit[path])))  # fmt: skip
        for child in sorted(children.get(path, ()), key=rank_key, reverse=True):
            visit(child)

    for root in sorted(roots, key=rank_key, reverse=True):
        visit(root)
    return tuple(ordered)


def _op_places(trace: Trace, rank: int, units, rows_of, paths, location, count: int) -> dict[str, OpPlace]:
    """For the op names with the most self host time in the units, the module class path holding most of it."""
    ops = np.flatnonzero((trace.kind == Kind.CPU_OP) & (trace.rank == rank))
    ops = ops[_in_units(trace.ts[ops], units)]
    if not len(ops):
        return {}
    self_us = _self_times(trace, ops)
    by_name: dict[int, float] = defaultdict(float)
    for name_id, value in zip(trace.name[ops].tolist(), self_us.tolist()):
        by_name[name_id] += value
    top = sorted(by_name, key=by_name.get, reverse=True)[:OP_PLACES]
    places = {}
    module = trace.module
    class_paths: dict[int, tuple[str, ...]] = {}
    for name_id in top:
        mine = ops[trace.name[ops] == name_id]
        times = self_us[trace.name[ops] == name_id]
        owners = module[mine]
        rows = np.where(owners >= 0, rows_of[np.maximum(owners, 0)], -1)
        held: dict[tuple[str, ...], float] = defaultdict(float)
        instances: dict[tuple[str, ...], set] = defaultdict(set)
        first_row: dict[tuple[str, ...], int] = {}
        for row, value in zip(rows.tolist(), times.tolist()):
            if row < 0:
                continue
            classes = class_paths[row] if row in class_paths else class_paths.setdefault(
                row, tuple(module_class(name) for name in paths[row]))  # fmt: skip
            held[classes] += value
            instances[classes].add(paths[row])
            first_row.setdefault(classes, row)
        if not held:
            continue
        best = max(held, key=held.get)
        share = 100.0 * held[best] / by_name[name_id] if by_name[name_id] > 0 else 0.0
        name = trace.names[name_id]
        places[name] = OpPlace(name, " > ".join(best), len(instances[best]), share, location[first_row[best]])
    return places


def _self_times(trace: Trace, ops: np.ndarray) -> np.ndarray:
    """Each op's time less its direct child ops' on its thread (ops nest as calls do)."""
    end = trace.end[ops]
    order = np.lexsort((-end, trace.ts[ops], trace.tid[ops]))
    tids, starts, ends, durs = (trace.tid[ops][order].tolist(), trace.ts[ops][order].tolist(), end[order].tolist(),
                                trace.dur[ops][order].tolist())  # fmt: skip
    own = list(durs)
    stack: list[int] = []  # positions in ``order`` of the ops open around the current one
    for position in range(len(order)):
        while stack and (tids[stack[-1]] != tids[position] or ends[stack[-1]] <= starts[position]):
            stack.pop()
        if stack:
            own[stack[-1]] -= durs[position]
        stack.append(position)
    result = np.empty(len(ops))
    result[order] = np.maximum(own, 0.0)
    return result
