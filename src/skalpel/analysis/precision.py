"""The precision the matrix multiplies ran in, and what the hardware offers instead, per rank over its units.

Two questions, each from what the trace itself shows:

* **CPU-only runs**: the dtype of each matmul op (``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` /
  ``convolution``) from its recorded input types ('Input type', ``record_shapes``), and their host time
  per unit by dtype; beside it the machine's own bf16 and fp32 matmul speeds that ``skalpel run``
  measured (``RankInfo.precision``, capture/precision.py). A stored trace without that measurement
  can say the dtype, not what it costs.
* **GPU runs**: the device time of fp32 GEMM kernels that run on the CUDA cores (``ampere_sgemm_*``,
  ``volta_sgemm_*``, ``sm90_xmma_gemm_f32f32_f32f32_*``: no TF32, no tensor cores) against the device's
  compute capability and its datasheet peaks (``mfu.PEAK_TFLOPS``). Tensor-op GEMMs in fp32 (cuBLAS's
  ``tensorop_s1688`` and ``tf32`` kernels) already use TF32; AMD's kernels do not say, and are not judged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..trace import opnames
from ..trace.columns import MATMUL_TYPED
from ..trace.kinds import Kind
from ..trace.model import Trace
from .mfu import peak_tflops
from .steps import StepSegmentation, judged_units

DTYPES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}
LOCATED = 32  # matmul events a rule may name lines from, the longest first


@dataclass(frozen=True)
class RankPrecision:
    """One rank's matmuls by precision, per unit, and what the hardware is known to do."""

    rank: int
    units: int
    matmul_ms: dict[str, float]  # CPU-only: host ms per unit of the matmul ops, by dtype ("fp32", "bf16", ...)
    matmul_calls: dict[str, float]
    untyped_ms: float  # matmul ops without recorded input types (a trace without record_shapes)
    measured: dict | None  # this CPU's bf16 and fp32 matmul times (capture/precision.py); None: not measured
    located: dict[str, tuple[int, ...]] = field(default_factory=dict)  # dtype -> its longest matmul events
    device: str | None = None
    compute_major: int | None = None
    fp32_simt_ms: float = 0.0  # device ms per unit in fp32 GEMM kernels on the CUDA cores
    fp32_simt_kernels: tuple[str, ...] = ()  # the largest of them, by time
    kernel_ms: float = 0.0  # device ms per unit in all kernels

    @property
    def bf16_over_fp32(self) -> float | None:
        """The measured time of a bf16 matmul over an fp32 one on this machine (>1: bf16 is slower); None unmeasured."""
        if not self.measured:
            return None
        return self.measured["ms"]["bf16"] / self.measured["ms"]["fp32"]

    def peaks(self) -> tuple[float, float] | None:
        """The device's dense (fp32, tf32) datasheet peaks in TFLOP/s, where the table has both."""
        fp32, tf32 = peak_tflops(self.device, "fp32"), peak_tflops(self.device, "tf32")
        return (fp32[1], tf32[1]) if fp32 and tf32 else None


@dataclass(frozen=True)
class Precision:
    ranks: dict[int, RankPrecision]

    def for_rank(self, rank: int) -> RankPrecision | None:
        return self.ranks.get(rank)


def precision(trace: Trace, steps: StepSegmentation) -> Precision:
    ranks = {}
    for info in trace.ranks:
        units, _ = judged_units(trace, steps, info.rank)
        if not units:
            continue
        inside = _inside(trace, info.rank, units)
        figures = _device_figures(trace, inside, len(units), info) if trace.has_device else {}
        ranks[info.rank] = RankPrecision(rank=info.rank, units=len(units), measured=info.precision,
                                         **_host_matmuls(trace, inside, len(units)), **figures)  # fmt: skip
    return Precision(ranks)


def _inside(trace: Trace, rank: int, units) -> np.ndarray:
    mask = trace.rank == rank
    within = np.zeros(len(trace), dtype=bool)
    for step in units:
        within |= (trace.ts >= step.start_us) & (trace.ts < step.end_us)
    return mask & within


def _host_matmuls(trace: Trace, inside: np.ndarray, units: int) -> dict:
    ids = opnames.ids_of(trace, MATMUL_TYPED)
    matmuls = np.isin(trace.name, ids) if ids else np.zeros(len(trace), dtype=bool)
    events = np.flatnonzero(inside & matmuls & (trace.kind == Kind.CPU_OP))
    ms: dict[str, float] = defaultdict(float)
    calls: dict[str, float] = defaultdict(float)
    by_dtype: dict[str, list[int]] = defaultdict(list)
    untyped = 0.0
    for event in events.tolist():
        types = trace.args_of(event).get("types")
        dtype = _dtype(types)
        if dtype is None:
            untyped += float(trace.dur[event])
            continue
        ms[dtype] += float(trace.dur[event]) / 1000.0 / units
        calls[dtype] += 1.0 / units
        by_dtype[dtype].append(event)
    located = {dtype: tuple(sorted(found, key=lambda event: -trace.dur[event])[:LOCATED])
               for dtype, found in by_dtype.items()}  # fmt: skip
    return {"matmul_ms": dict(ms), "matmul_calls": dict(calls), "untyped_ms": untyped / 1000.0 / units,
            "located": located}  # fmt: skip


def _dtype(types: object) -> str | None:
    """The dtype of an op's first tensor input ('Input type' lists "" for non-tensors), in short form."""
    if not isinstance(types, list):
        return None
    first = next((value for value in types if isinstance(value, str) and value), None)
    return DTYPES.get(first, first) if first else None


def _device_figures(trace: Trace, inside: np.ndarray, units: int, info) -> dict:
    kernels = np.flatnonzero(inside & (trace.kind == Kind.KERNEL))
    simt = opnames.names_where(trace, opnames.is_fp32_simt_gemm, kernels)
    mine = kernels[np.isin(trace.name[kernels], simt)] if simt else kernels[:0]
    by_name: dict[int, float] = defaultdict(float)
    for name_id, dur in zip(trace.name[mine].tolist(), trace.dur[mine].tolist()):
        by_name[name_id] += dur
    major = next((props.get("computeMajor") for props in info.device_properties if isinstance(props, dict)), None)
    largest = sorted(by_name, key=by_name.get, reverse=True)[:3]
    return {
        "device": info.device_names[0] if info.device_names else None,
        "compute_major": major if isinstance(major, int) and not isinstance(major, bool) else None,
        "fp32_simt_ms": float(trace.dur[mine].sum()) / 1000.0 / units,
        "fp32_simt_kernels": tuple(trace.names[name_id] for name_id in largest),
        "kernel_ms": float(trace.dur[kernels].sum()) / 1000.0 / units,
    }  # fmt: skip
