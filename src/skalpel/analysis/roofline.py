"""A roofline per op: arithmetic intensity from shapes and dtypes, achieved FLOP/s and bytes/s against the roofs.

For each heavy op group (an op name, its input shapes and dtype) in the judged units:

* **FLOPs** as MFU counts them (``mfu.op_flops``: 2·M·K·N for matmuls, convolutions from their backward twin's
  output size); one per output element for elementwise ops, five for softmax (max, subtract, exp, sum, divide).
* **bytes** the op must move at least once: its tensor inputs and its output, at the dtype's size (matmuls:
  A, B, bias and C; a convolution: input, weight and output, the output's size from its FLOP count; elementwise:
  the inputs and the broadcast output; softmax: its input read and its output written).
* **time**: on a GPU the device time of the kernels its launch calls queued; on a CPU-only run its host time.
* **roofs**: a GPU's dense datasheet peak for the dtype (``mfu.PEAK_TFLOPS``: a matmul in fp32 on tensor ops
  runs TF32, on the CUDA cores FP32; elementwise ops and softmax the FP32 vector peak) and its memory bandwidth
  (``PEAK_TBPS``); a CPU's from skalpel run's own measurement (capture/precision.py: a matmul's FLOP/s in the
  dtype, a large copy's bytes/s).

The label: where the intensity (FLOPs / bytes) is at or above the ridge (peak FLOP/s / peak bytes/s) the op's roof
is compute, else memory; an op reaching OVERHEAD_BELOW of that roof or more is compute-bound or memory-bound,
one below it is overhead-bound (dispatch, launches, sizes too small to fill the machine). Missing shapes, an
unknown dtype, no FLOP count or a device without peaks: "not judged", with why. No number is made up.

A roofline per module (``module_roofs``) sums the judged op calls' FLOPs, bytes and time by the module they
ran in: the forward's innermost module frame, else the module whose forward made the backward node
(``Trace.backward_module``); a module's figures hold its subtree's. Its ops have roofs of their own (a bf16
matmul's tensor peak, an elementwise op's vector peak), so its roofs are theirs together: the time its ops
would take at their compute roofs (sum of FLOPs / peak) and at their memory roofs (sum of bytes / bandwidth),
which give its effective peak (its FLOPs over the first) and bandwidth (its bytes over the second). The
larger of the two is its roof; ``roof_pct`` its share of the time the ops took (never above 100% where no
op beats its own roof).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.modules import module_name
from ..trace.roles import Role
from .mfu import op_flops, peak_tflops
from .precision import DTYPES
from .steps import StepSegmentation, judged_units
from .timeline import device_mask

OVERHEAD_BELOW = 0.10  # of its roof: an op this far below both roofs is held by something else than the machine
ROWS = 12  # op groups a rank keeps, by time
MIN_SHARE = 0.01  # of the judged ops' time
SIZES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}
SOFTMAX_FLOPS = 5.0  # per element
# Memory bandwidth, TB/s, from the vendors' datasheets; the first pattern matching the device name wins. An A100 is
# only in the table by its memory size (40 GB 1.555, 80 GB SXM 2.039, 80 GB PCIe 1.935): a bare "A100" is not.
PEAK_TBPS: tuple[tuple[str, float], ...] = (
    (r"B200", 8.0),  # NVIDIA B200 (HBM3e)
    (r"H200", 4.8),  # NVIDIA H200 SXM (HBM3e)
    (r"H100.*PCIe", 2.0),  # NVIDIA H100 PCIe
    (r"H100", 3.35),  # NVIDIA H100 SXM ("H100 80GB HBM3")
    (r"A100.*SXM.*80GB", 2.039), (r"A100.*80GB.*PCIe|A100.*PCIE.*80GB", 1.935), (r"A100.*40GB", 1.555),
    (r"MI300X", 5.3),  # AMD Instinct MI300X (HBM3)
)  # fmt: skip


@dataclass(frozen=True)
class RooflineRow:
    """One op group: an op name with one input shape and dtype, per unit, and its place under the roofs."""

    op: str
    shapes: str | None
    dtype: str | None
    calls: float  # per unit
    ms: float  # per unit: device time on device runs, host time on CPU-only runs
    flops: float | None  # per call
    bytes: float | None  # per call
    intensity: float | None  # FLOPs per byte
    achieved_gflops: float | None
    achieved_gbps: float | None
    peak_gflops: float | None
    peak_gbps: float | None
    label: str  # "compute-bound", "memory-bound", "overhead-bound" or "not judged"
    roof_pct: float | None  # achieved against the roof that holds it (compute above the ridge, memory below)
    why: str  # the reasoning, or why it is not judged


@dataclass(frozen=True)
class ModuleRoof:
    """A module's judged ops together under the roofs, per unit (forward and the backward its forward made)."""

    path: tuple[str, ...]
    calls: float  # judged op calls per unit
    ms: float  # their time per unit (device on device runs, else host)
    flops: float  # per unit
    bytes: float  # per unit
    intensity: float
    achieved_gflops: float
    achieved_gbps: float
    peak_gflops: float  # its ops' compute roofs together: its FLOPs / the sum of each op's FLOPs / its peak
    peak_gbps: float  # likewise, its bytes / the sum of each op's bytes / its bandwidth
    label: str  # "compute-bound", "memory-bound" or "overhead-bound"
    roof_pct: float
    why: str


@dataclass(frozen=True)
class RankRoofline:
    rank: int
    roofs: str  # where the peaks come from: "datasheet (NVIDIA H100 80GB HBM3)", "measured on this CPU", "none"
    rows: tuple[RooflineRow, ...]
    modules: tuple[ModuleRoof, ...] = ()  # by time, at most MODULE_ROWS
    modules_why: str | None = None  # why there are none
    members: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)  # each row's op calls


@dataclass(frozen=True)
class Roofline:
    ranks: dict[int, RankRoofline]

    def for_rank(self, rank: int) -> RankRoofline | None:
        return self.ranks.get(rank)


def roofline(trace: Trace, steps: StepSegmentation) -> Roofline | None:
    """Each rank's heavy ops under the roofs; None when the trace has none of the judged ops."""
    kinds = opnames.roofline_kinds(trace)
    if not kinds:
        return None
    simt = set(opnames.names_where(trace, opnames.is_fp32_simt_gemm, np.flatnonzero(device_mask(trace))))
    flop_events, flops = op_flops(trace)
    flops_of = dict(zip(flop_events.tolist(), flops.tolist()))
    device_ms = _device_ms_by_op(trace) if trace.has_device else None
    ranks = {}
    for info in trace.ranks:
        units, _ = judged_units(trace, steps, info.rank)
        if not units:
            continue
        on_rank = (trace.rank == info.rank) & (trace.kind == Kind.CPU_OP)
        events = np.flatnonzero(on_rank & np.isin(trace.name, list(kinds)))
        inside = np.zeros(len(events), dtype=bool)
        for step in units:
            inside |= (trace.ts[events] >= step.start_us) & (trace.ts[events] < step.end_us)
        rows, members = _rows(trace, events[inside], len(units), flops_of, device_ms, info, kinds, simt)
        modules = module_roofs(trace, rows, members, device_ms, len(units))
        why = None if modules else _no_module_roofs(trace, rows)
        ranks[info.rank] = RankRoofline(info.rank, _roofs_source(info, device_ms is not None), rows, modules, why,
                                        members)  # fmt: skip
    return Roofline(ranks)


def _roofs_source(info, on_device: bool) -> str:
    if on_device:
        name = info.device_names[0] if info.device_names else "unknown device"
        return f"datasheet peaks ({name})"
    return "measured on this CPU (skalpel run)" if info.precision and info.precision.get("copy_gbps") else "none"


def _device_ms_by_op(trace: Trace) -> np.ndarray:
    """For each host op event, the device ms of the kernels launched inside its span on its thread (its children's
    included: a convolution's cuDNN call). Launch calls map to their kernels through the trace's launch links."""
    result = np.zeros(len(trace))
    device = np.flatnonzero(device_mask(trace) & (trace.launcher >= 0))
    if not len(device):
        return result
    by_launch = defaultdict(float)
    for launch, dur in zip(trace.launcher[device].tolist(), trace.dur[device].tolist()):
        by_launch[launch] += dur / 1000.0
    launches = np.array(sorted(by_launch), dtype=np.int64)
    launch_ms = np.array([by_launch[int(launch)] for launch in launches])
    key = trace.rank.astype(np.int64) * (1 << 40) + trace.tid
    ops = np.flatnonzero(trace.kind == Kind.CPU_OP)
    for thread in set(key[launches].tolist()):
        mine = launches[key[launches] == thread]
        order = np.argsort(trace.ts[mine], kind="stable")
        starts = trace.ts[mine][order]
        cumulative = np.concatenate([[0.0], np.cumsum(launch_ms[key[launches] == thread][order])])
        on_thread = ops[key[ops] == thread]
        first = np.searchsorted(starts, trace.ts[on_thread], side="left")
        last = np.searchsorted(starts, trace.end[on_thread], side="right")
        result[on_thread] = cumulative[last] - cumulative[first]
    return result


def _rows(trace: Trace, events: np.ndarray, units: int, flops_of: dict, device_ms, info, kinds: dict[int, str],
          simt: set[int]) -> tuple[tuple[RooflineRow, ...], tuple[np.ndarray, ...]]:  # fmt: skip
    groups: dict[tuple[int, int, str | None], list[int]] = defaultdict(list)
    for event in events.tolist():
        dtype = _dtype(trace.args_of(event).get("types"))
        groups[(int(trace.name[event]), int(trace.shapes[event]), dtype)].append(event)
    times = {key: (float(device_ms[members].sum()) if device_ms is not None else float(trace.dur[members].sum()) / 1e3)
             for key, members in ((key, np.array(found)) for key, found in groups.items())}  # fmt: skip
    total = sum(times.values())
    if total <= 0:
        return (), ()
    kept = [key for key in sorted(times, key=times.get, reverse=True) if times[key] >= MIN_SHARE * total][:ROWS]
    context = (units, flops_of, device_ms is not None, info, kinds, simt)
    rows = tuple(_judge(trace, key, groups[key], times[key], *context) for key in kept)
    return rows, tuple(np.array(groups[key], dtype=np.int64) for key in kept)


MODULE_ROWS = 20


def _no_module_roofs(trace: Trace, rows) -> str:
    if not (trace.role == Role.MODULE).any():
        return "not judged: the trace recorded no module frames (torch.profiler's with_stack or with_modules)"
    if all(row.label == "not judged" for row in rows):
        return "not judged: none of the heavy op groups is judged (see each op's why)"
    return "not judged: no judged op ran inside a module or in a module's backward"


def module_roofs(trace: Trace, rows, members, device_ms, units: int) -> tuple[ModuleRoof, ...]:
    """The judged rows' calls summed by module path (self, then rolled up to every ancestor), judged against the
    roof of the op groups holding most of each module's time; the heaviest MODULE_ROWS by time."""
    if not rows or units <= 0:
        return ()
    module, backward = trace.module, trace.backward_module
    # frame -> calls, ms, FLOPs, bytes, seconds at the compute roofs, seconds at the memory roofs
    sums: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(6))
    for row, events in zip(rows, members):
        if row.label == "not judged" or row.flops is None or row.bytes is None:
            continue
        frames = np.where(module[events] >= 0, module[events], backward[events])
        times = device_ms[events] if device_ms is not None else trace.dur[events] / 1e3
        at_roofs = (row.flops / (row.peak_gflops * 1e9), row.bytes / (row.peak_gbps * 1e9))
        for frame, ms in zip(frames.tolist(), times.tolist()):
            if frame >= 0:
                sums[frame] += (1.0, ms, row.flops, row.bytes, *at_roofs)
    by_path: dict[tuple[str, ...], np.ndarray] = defaultdict(lambda: np.zeros(6))
    paths: dict[int, tuple[str, ...]] = {}
    for frame, figures in sums.items():
        path = _frame_path(trace, frame, paths)
        for depth in range(1, len(path) + 1):  # the module and every ancestor hold these calls
            by_path[path[:depth]] += figures
    found = []
    for path, (calls, ms, flops, moved, compute_s, memory_s) in by_path.items():
        if ms <= 0 or moved <= 0 or compute_s <= 0 or memory_s <= 0:
            continue
        peak_gflops, peak_gbps = flops / compute_s / 1e9, moved / memory_s / 1e9
        seconds = ms / 1e3
        achieved_gflops, achieved_gbps = flops / seconds / 1e9, moved / seconds / 1e9
        intensity, ridge = flops / moved, peak_gflops / peak_gbps
        compute_roof = compute_s >= memory_s  # the same as intensity >= ridge
        roof_pct = 100.0 * max(compute_s, memory_s) / seconds
        bound = "compute" if compute_roof else "memory"
        label = f"{bound}-bound" if roof_pct >= 100.0 * OVERHEAD_BELOW else "overhead-bound"
        why = (f"{calls / units:g} judged op calls: intensity {intensity:.3g} FLOP/B "
               f"{'>=' if compute_roof else '<'} ridge {ridge:.3g}; {roof_pct:.0f}% of the {bound} roof")
        found.append(ModuleRoof(path, calls / units, ms / units, flops / units, moved / units, intensity,
                                achieved_gflops, achieved_gbps, peak_gflops, peak_gbps, label, roof_pct, why))
    found.sort(key=lambda roof: (-roof.ms, roof.path))
    return tuple(found[:MODULE_ROWS])


def _frame_path(trace: Trace, frame: int, seen: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
    """A module frame's path of module names from its outermost frame (a frame's module is its parent)."""
    if frame in seen:
        return seen[frame]
    parent = int(trace.module[frame])
    path = (*(_frame_path(trace, parent, seen) if parent >= 0 else ()), module_name(trace.name_of(frame)))
    seen[frame] = path
    return path


def _dtype(types: object) -> str | None:
    if not isinstance(types, list):
        return None
    first = next((value for value in types if isinstance(value, str) and value), None)
    return DTYPES.get(first) if first else None


def _judge(trace: Trace, key, members: list[int], ms: float, units: int, flops_of: dict, on_device: bool, info,
           kinds: dict[int, str], simt: set[int]) -> RooflineRow:  # fmt: skip
    name_id, shape_id, dtype = key
    op = trace.names[name_id]  # shown, never tested: the kind says what the op is
    kind = kinds[name_id]
    shapes = trace.names[shape_id] if shape_id >= 0 else None
    calls = len(members)

    def not_judged(why: str, flops=None, moved=None) -> RooflineRow:
        return RooflineRow(op, shapes, dtype, calls / units, ms / units, flops, moved, None, None, None, None, None,
                           "not judged", None, why)  # fmt: skip

    if shapes is None:
        return not_judged("no input shapes recorded (record_shapes)")
    if dtype is None or dtype not in SIZES:
        return not_judged("its dtype was not recorded or is not one of fp32, bf16, fp16, fp64")
    try:
        dims = json.loads(shapes)
    except ValueError:
        return not_judged("its input shapes are unreadable")
    flops, moved = _work(kind, dims, SIZES[dtype], [flops_of.get(event) for event in members])
    if flops is None or moved is None or moved <= 0:
        why = ("no FLOP count for these shapes (a convolution without its backward, whose output size the forward's "
               "shapes lack)") if kind == "convolution" else "its shapes do not fit the op's formula"  # fmt: skip
        return not_judged(why, flops, moved)
    peaks = _peaks(trace, kind, dtype, members, on_device, info, simt)
    if isinstance(peaks, str):
        return not_judged(peaks, flops, moved)
    peak_gflops, peak_gbps = peaks
    seconds = ms / 1e3 / calls
    if seconds <= 0:
        return not_judged("no time recorded for it", flops, moved)
    achieved_gflops, achieved_gbps = flops / seconds / 1e9, moved / seconds / 1e9
    intensity, ridge = flops / moved, peak_gflops / peak_gbps
    compute_roof = intensity >= ridge
    roof_pct = 100.0 * (achieved_gflops / peak_gflops if compute_roof else achieved_gbps / peak_gbps)
    bound = "compute" if compute_roof else "memory"
    label = f"{bound}-bound" if roof_pct >= 100.0 * OVERHEAD_BELOW else "overhead-bound"
    why = (f"intensity {intensity:.3g} FLOP/B {'>=' if compute_roof else '<'} ridge {ridge:.3g}: its roof is "
           f"{bound} ({peak_gflops:.4g} GFLOP/s, {peak_gbps:.4g} GB/s); it reaches {roof_pct:.0f}% of it")  # fmt: skip
    if label == "overhead-bound":
        why += f", under {100 * OVERHEAD_BELOW:.0f}%: dispatch or launches, not the machine, hold it"
    return RooflineRow(op, shapes, dtype, calls / units, ms / units, flops, moved, intensity, achieved_gflops,
                       achieved_gbps, peak_gflops, peak_gbps, label, roof_pct, why)  # fmt: skip


def _numel(shape) -> int:
    return int(np.prod(shape)) if shape else 1


def _work(kind: str, dims: list, size: int, counted: list) -> tuple[float | None, float | None]:
    """(FLOPs, bytes) of one call of an op of this kind (``opnames.roofline_kinds``); None where its shapes do not
    give them. A matmul's dims are (a, b) or, with a bias (addmm, baddbmm: three tensors first), (bias, a, b)."""
    tensors = [shape for shape in dims if isinstance(shape, list)]
    if not all(isinstance(size_, int) and not isinstance(size_, bool) for shape in tensors for size_ in shape):
        return None, None
    known = [value for value in counted if value is not None]
    try:
        if kind == "matmul":
            with_bias = len(tensors) >= 3  # (bias, a, b, beta, alpha); mm and bmm: (a, b)
            a, b = (dims[1], dims[2]) if with_bias else (dims[0], dims[1])
            if not (isinstance(a, list) and isinstance(b, list) and len(a) >= 2 and len(b) >= 2):
                return None, None
            out = [*a[:-1], b[-1]]
            bias = _numel(dims[0]) if with_bias and isinstance(dims[0], list) else 0
            flops = known[0] if known else None
            return flops, float(size * (_numel(a) + _numel(b) + _numel(out) + bias))
        if kind == "convolution":
            inputs, weight = tensors[0], tensors[1]
            if not known:
                return None, None
            output = known[0] / (2.0 * _numel(weight[1:]))  # N·O·pixels, from 2·N·O·pixels·(C/g)·kernel
            return known[0], float(size * (_numel(inputs) + _numel(weight) + output))
        if kind == "softmax":
            elements = _numel(tensors[0])
            return SOFTMAX_FLOPS * elements, float(size * 2 * elements)
        if kind == "elementwise":
            if not tensors:
                return None, None
            out = max(_numel(shape) for shape in tensors)  # the broadcast output
            return float(out), float(size * (sum(_numel(shape) for shape in tensors) + out))
    except (IndexError, ValueError):
        return None, None
    return None, None


def _peaks(trace: Trace, kind: str, dtype: str, members: list[int], on_device: bool, info,
           simt: set[int]) -> tuple[float, float] | str:  # fmt: skip
    """(GFLOP/s, GB/s) roofs for this op, or why there are none."""
    if not on_device:
        measured = info.precision or {}
        ms, copy = measured.get("ms") or {}, measured.get("copy_gbps")
        shape = measured.get("shape")
        if not copy or not shape or dtype not in ms:
            return (f"no measured {dtype} roof for this CPU (skalpel run measures fp32 and bf16 matmuls and a copy; "
                    "a stored trace has none)")  # fmt: skip
        flops = 2.0 * float(np.prod(shape))
        return flops / (ms[dtype] / 1e3) / 1e9, float(copy)
    device = info.device_names[0] if info.device_names else None
    bandwidth = next((tbps for pattern, tbps in PEAK_TBPS if device and re.search(pattern, device)), None)
    if bandwidth is None:
        return f"no memory bandwidth for {device or 'an unnamed device'} in the peak table"
    peak_dtype = dtype
    if kind in ("elementwise", "softmax"):
        peak_dtype = "fp32"  # vector work: the FP32 (non-tensor) peak
    elif dtype == "fp32":
        peak_dtype = "fp32" if _on_cuda_cores(trace, members, simt) else "tf32"
    found = peak_tflops(device, peak_dtype)
    if found is None:
        return f"no {peak_dtype} peak for {device} in the peak table"
    return found[1] * 1e3, bandwidth * 1e3


def _on_cuda_cores(trace: Trace, members: list[int], simt: set[int]) -> bool:
    """An fp32 matmul whose kernels are SIMT GEMMs (no TF32); checked on the group's first calls' kernels."""
    launched = np.flatnonzero(np.isin(trace.op_of_event, members[:8]) & device_mask(trace))
    return any(int(name_id) in simt for name_id in trace.name[launched[:8]].tolist())
