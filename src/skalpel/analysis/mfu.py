"""Model FLOP utilisation: achieved FLOP/s per step against the device's peak.

The achieved FLOP/s are the FLOPs of the profiled steps divided by their time. An op's FLOPs
are the profiler's own count where the trace has one (a ``flops`` argument, ``with_flops=True``
in the torch versions that export it), else counted from its recorded input shapes the way
torch's ``with_flops`` counts them: 2·M·K·N for ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm``
(times the batch), 4·B·H·L·S·D for the forward of ``scaled_dot_product_attention`` kernels,
and convolutions forward and backward (``_convolution_flops``). The note names the ops counted.
Ops Inductor fused into generated kernels are not seen (their matrix multiplies are, as
``aten::mm`` extern calls). The peak is the dense (no sparsity) tensor-core figure of
the device's datasheet for the training dtype; MFU is achieved / peak, as in the PaLM paper
(Chowdhery et al. 2022, appendix B) and nanoGPT's ``estimate_mfu``. CPUs have no entry: their
peak depends on cores, clocks and vector units the trace does not record.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

import numpy as np

from ..trace import opnames
from ..trace.model import Trace
from . import numeric
from .steps import StepSegmentation

DEFAULT_DTYPE = "bf16"  # the training dtype MFU is usually quoted for; fp16 has the same peak on these devices

# Dense peak TFLOP/s per device and dtype, from the vendors' datasheets. The first pattern that
# matches the device name (``deviceProperties[].name``) wins, so the specific forms come first.
PEAK_TFLOPS: tuple[tuple[str, str, dict[str, float]], ...] = (
    # NVIDIA B200 datasheet (DGX B200 / HGX B200, per GPU): FP16/BF16 2.25 PFLOPS, TF32 1.1 PFLOPS dense
    (r"B200", "NVIDIA B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp8": 4500.0}),
    # NVIDIA H200 datasheet (SXM): same compute as the H100 SXM; BF16 989 TFLOPS, TF32 494, FP32 67 dense
    (r"H200", "NVIDIA H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67.0, "fp8": 1978.9}),
    # NVIDIA H100 datasheet: PCIe BF16 756 TFLOPS, TF32 378, FP32 51 dense
    (r"H100.*PCIe", "NVIDIA H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0, "fp8": 1513.0}),
    # NVIDIA H100 datasheet: SXM (and "H100 80GB HBM3") BF16 989 TFLOPS, TF32 494, FP32 67 dense
    (r"H100", "NVIDIA H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67.0, "fp8": 1978.9}),
    # NVIDIA A100 datasheet (SXM and PCIe): BF16/FP16 312 TFLOPS, TF32 156, FP32 19.5 dense
    (r"A100", "NVIDIA A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    # NVIDIA L40S datasheet: BF16 362 TFLOPS, TF32 183, FP32 91.6 dense
    (r"L40S", "NVIDIA L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    # NVIDIA L4 datasheet: BF16 121 TFLOPS, TF32 60, FP32 30.3 dense
    (r"\bL4\b", "NVIDIA L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    # NVIDIA A10 datasheet: BF16 125 TFLOPS, TF32 62.5, FP32 31.2 dense
    (r"\bA10\b", "NVIDIA A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    # NVIDIA V100 datasheet (SXM2): FP16 tensor 125 TFLOPS, FP32 15.7; no BF16
    (r"V100", "NVIDIA V100", {"fp16": 125.0, "fp32": 15.7}),
    # NVIDIA T4 datasheet: FP16 65 TFLOPS, FP32 8.1; no BF16
    (r"\bT4\b", "NVIDIA T4", {"fp16": 65.0, "fp32": 8.1}),
    # AMD Instinct MI355X / MI325X / MI300X datasheets: dense FP16/BF16 2516.6 / 1307.4 / 1307.4 TFLOPS
    (r"MI355X", "AMD Instinct MI355X", {"bf16": 2516.6, "fp16": 2516.6, "fp32": 157.3}),
    (r"MI325X", "AMD Instinct MI325X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    (r"MI300X", "AMD Instinct MI300X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    # AMD Instinct MI250X datasheet: FP16/BF16 383 TFLOPS, FP32 matrix 95.7
    (r"MI250X?", "AMD Instinct MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
)


@dataclass(frozen=True)
class Mfu:
    """Achieved FLOP/s of one rank and its share of the device's peak."""

    rank: int
    device: str | None
    flops_per_step: float  # 0 when the trace has no flop counts
    achieved_tflops: float  # flops per step / median step time
    peak_tflops: float | None  # dense peak of the device for ``dtype``; None for a CPU or a device not in the table
    dtype: str
    mfu_pct: float | None
    note: str | None = None  # why there is no MFU

    def to_dict(self) -> dict:
        return {
            "device": self.device, "flops_per_step": self.flops_per_step,
            "achieved_tflops": round(self.achieved_tflops, 4), "peak_tflops": self.peak_tflops,
            "dtype": self.dtype, "mfu_pct": round(self.mfu_pct, 2) if self.mfu_pct is not None else None,
            "note": self.note,
        }  # fmt: skip


def peak_tflops(device: str | None, dtype: str = DEFAULT_DTYPE) -> tuple[str, float] | None:
    """(table label, dense peak TFLOP/s) of a device for a dtype, None when it is not in the table."""
    if not device:
        return None
    for pattern, label, peaks in PEAK_TFLOPS:
        if re.search(pattern, device, re.IGNORECASE) and dtype in peaks:
            return label, peaks[dtype]
    return None


def mfu(trace: Trace, steps: StepSegmentation, *, dtype: str = DEFAULT_DTYPE) -> tuple[Mfu, ...]:
    """MFU per rank; empty when no op of the trace has a flop count or the shapes to count them."""
    events, flops, unreadable = _counted(trace)
    if not len(events) or not steps.marked:
        return ()
    results = []
    for info in trace.ranks:
        rank_steps = steps.for_rank(info.rank)
        if not rank_steps:
            continue
        mine = trace.rank[events] == info.rank
        inside = np.zeros(len(events), dtype=bool)
        for step in rank_steps:
            inside |= mine & (trace.ts[events] >= step.start_us) & (trace.ts[events] < step.end_us)
        per_step = float(flops[inside].sum()) / len(rank_steps)
        step_s = numeric.median([step.duration_us for step in rank_steps]) / 1e6
        device = info.device_names[0] if info.device_names else None
        found = utilisation(info.rank, device, per_step, step_s, dtype, has_device=trace.has_device)
        counted = counted_ops(trace, events[inside])
        found = replace(found, note=f"{found.note}; {counted}" if found.note else counted)
        if unreadable:  # a bad field costs that op's FLOPs, not the report
            left_out = f"{unreadable} op(s) with an unreadable 'Input Dims' or 'flops' field left out of the FLOP count"
            found = replace(found, note=f"{found.note}; {left_out}")
        results.append(found)
    return tuple(results)


def op_flops(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(event indices, FLOPs) of the ops with a count: the trace's own, else from their input shapes."""
    events, flops, _ = _counted(trace)
    return events, flops


def _counted(trace: Trace) -> tuple[np.ndarray, np.ndarray, int]:
    """``op_flops``, and how many ops had a count field of the wrong type (a 'flops' that is not a number, an
    'Input Dims' that is not a list of shapes): those are left out."""
    counted: dict[int, float] = {}
    unreadable: set[int] = set()
    for index, args in trace.extra.items():
        if "flops" in args:
            value = _number(args["flops"])
            if value is None:
                unreadable.add(index)  # counted from its shapes below, if it has them
            else:
                counted[index] = value
    names = opnames.flop_formula_ops(trace)
    candidates = np.flatnonzero(numeric.isin(trace.name, list(names)) & (trace.shapes >= 0))
    by_shapes: dict[tuple[int, int], float | None] = {}
    for index in candidates.tolist():
        if index in counted:
            continue
        key = (int(trace.name[index]), int(trace.shapes[index]))
        if key not in by_shapes:
            by_shapes[key] = opnames.flops_from_shapes(names[key[0]], trace.names[key[1]])
        flops = by_shapes[key]
        if flops is None:
            unreadable.add(index)
        elif flops > 0:
            counted[index] = flops
            unreadable.discard(index)
    counted.update(_convolution_flops(trace, counted))
    events = np.array(sorted(counted), dtype=np.int64)
    return events, np.array([counted[int(index)] for index in events], dtype=np.float64), len(unreadable)


def _convolution_flops(trace: Trace, counted: dict[int, float]) -> dict[int, float]:
    """FLOPs of convolutions from their 'Input Dims': 2·N·O·(output pixels)·(C/groups)·(kernel) forward, twice that
    backward (the input's and the weight's gradients).

    ``convolution_backward``'s dims (grad_output, input, weight) hold the output size; a forward
    ``convolution`` (input, weight) does not (stride and padding are not in the dims), so it is counted
    from the backward of the same input and weight shapes, and left out where none ran (inference).
    The first layer's input gradient, which autograd skips, is counted too: an over-count of at most
    one forward of that layer per step.
    A trace whose profiler counted its convolutions itself (``with_flops``) is not counted again.
    """
    if opnames.names_where(trace, opnames.is_convolution_like, np.fromiter(counted, dtype=np.int64, count=len(counted))):
        return {}
    forward_id, backward_id = opnames.id_of(trace, opnames.CONVOLUTION), opnames.id_of(trace, opnames.CONVOLUTION_BACKWARD)
    calls = np.flatnonzero(numeric.isin(trace.name, [i for i in (forward_id, backward_id) if i >= 0]) & (trace.shapes >= 0)).tolist()
    dims_of: dict[int, list] = {}
    for shape_id in {int(trace.shapes[index]) for index in calls}:
        try:
            dims = json.loads(trace.names[shape_id])
        except ValueError:
            continue
        if isinstance(dims, list) and len(dims) >= 3 and all(isinstance(dims[i], list) for i in range(3)):
            dims_of[shape_id] = dims
    output_of: dict[str, list] = {}  # (input, weight) shapes -> output pixels, from the backward calls
    flops: dict[int, float] = {}
    for index in calls:
        dims = dims_of.get(int(trace.shapes[index]))
        if int(trace.name[index]) != backward_id or dims is None:
            continue
        grad_output, inputs, weight = dims[0], dims[1], dims[2]
        forward = _conv_forward(inputs, weight, grad_output[2:])
        if forward > 0:
            output_of[json.dumps([inputs, weight])] = grad_output[2:]
            flops[index] = 2.0 * forward
    for index in calls:
        dims = dims_of.get(int(trace.shapes[index]))
        if int(trace.name[index]) != forward_id or dims is None:
            continue
        pixels = output_of.get(json.dumps([dims[0], dims[1]]))
        forward = _conv_forward(dims[0], dims[1], pixels) if pixels is not None else 0.0
        if forward > 0:
            flops[index] = forward
    return flops


def _conv_forward(inputs: list, weight: list, output_pixels: list) -> float:
    """2·N·O·prod(output spatial)·prod(weight[1:]) (weight[1] is C/groups); 0 when the shapes do not fit."""
    try:
        values = [inputs[0], weight[0], *output_pixels, *weight[1:]]
        if len(inputs) < 3 or len(weight) != len(inputs) or len(output_pixels) != len(inputs) - 2:
            return 0.0
        if not all(isinstance(value, int) and value >= 0 for value in values):
            return 0.0
        return 2.0 * float(np.prod(np.array(values, dtype=np.float64)))
    except (IndexError, TypeError):
        return 0.0


def counted_ops(trace: Trace, events: np.ndarray) -> str:
    """The ops whose FLOPs the achieved rate counts, as a note: 'FLOPs of aten::addmm, aten::mm'."""
    names = sorted({trace.name_of(int(index)) for index in events})
    return "FLOPs counted for " + (", ".join(names) if names else "no op")


def _number(value: object) -> float | None:
    """A count field as a finite, non-negative float; None when it is anything else (a string, a list, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def utilisation(rank: int, device: str | None, flops_per_step: float, step_s: float, dtype: str, *,
                has_device: bool = True) -> Mfu:  # fmt: skip
    """Achieved TFLOP/s and MFU of one rank from its flops per step and step time."""
    achieved = flops_per_step / step_s / 1e12 if step_s > 0 else 0.0
    if not has_device:
        return Mfu(rank, "cpu", flops_per_step, achieved, None, dtype, None, "no peak FLOP/s for CPUs: MFU is for accelerators")
    peak = peak_tflops(device, dtype)
    if peak is None:
        note = f"{device or 'the device'} has no {dtype} peak in skalpel's table (analysis/mfu.py)"
        return Mfu(rank, device, flops_per_step, achieved, None, dtype, None, note)
    return Mfu(rank, device, flops_per_step, achieved, peak[1], dtype, 100.0 * achieved / peak[1])
