"""Attention on each rank: which backend ``scaled_dot_product_attention`` ran and the device time of its slower
paths, or, without SDPA, attention computed eagerly as batched matmuls around a softmax.

``aten::scaled_dot_product_attention`` dispatches to one backend per call, visible as the op inside it:
``_scaled_dot_product_flash_attention`` / ``_cudnn_attention`` (fused, fast), ``_scaled_dot_product_efficient_attention``
(fused, memory-efficient), or ``_scaled_dot_product_attention_math`` (the eager fallback: bmm + softmax + bmm, the
full score matrix in memory). The device time of a call is that of the kernels launched inside it (forward only:
the backward runs as autograd ops). The query's head dim and the mask come from the recorded input shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace
from .kernels import KernelTable
from .ops import OpTable, RankOps
from .timeline import device_events


@dataclass(frozen=True)
class SdpaBackend:
    """The SDPA calls of one rank that ran one backend."""

    backend: str
    calls: tuple[int, ...]  # event indices, in event order
    kernel_ms: float | None  # device time of the kernels launched inside them; None for flash and the like
    head_dim: int  # of the first call's query; 0 unrecorded
    explicit_mask: bool  # the first call was passed an attn_mask

    @property
    def slower_than_flash(self) -> bool:
        return self.backend in opnames.SLOWER_THAN_FLASH


@dataclass(frozen=True)
class EagerAttention:
    """Batched matmuls around a softmax, at least as many matmul calls as softmax calls."""

    matmul_calls: int
    softmax_calls: int  # the most calls of one softmax op (softmax wraps _softmax: counted once)
    matmul_ms: float  # device time
    softmax_ms: float
    fused_seen: bool  # a fused attention op or kernel runs on the rank too
    softmax_events: np.ndarray


@dataclass(frozen=True)
class RankAttention:
    rank: int
    device_ms: float  # the device time of the rank's ops
    sdpa: tuple[SdpaBackend, ...] | None  # by backend, in the order first run; None: no SDPA op on the rank
    eager: EagerAttention | None  # where there is no SDPA op (its math path runs bmm + softmax inside)


@dataclass(frozen=True)
class Attention:
    ranks: tuple[RankAttention, ...]  # in the op table's order


def attention(trace: Trace, ops: OpTable, kernels: KernelTable | None) -> Attention | None:
    """None without device activity."""
    if not trace.has_device:
        return None
    return Attention(tuple(_rank_attention(trace, rank_ops, kernels) for rank_ops in ops.ranks))


def _rank_attention(trace: Trace, rank_ops: RankOps, kernels: KernelTable | None) -> RankAttention:
    rows = {row.name: row for row in rank_ops.rows}
    device_ms = sum(row.device_ms for row in rank_ops.rows)
    if opnames.SDPA in rows:
        return RankAttention(rank_ops.rank, device_ms, _sdpa(trace, rank_ops.rank), None)
    return RankAttention(rank_ops.rank, device_ms, None, _eager(trace, rank_ops.rank, rows, kernels))


def _eager(trace: Trace, rank: int, rows: dict, kernels: KernelTable | None) -> EagerAttention | None:
    softmax = [rows[name] for name in opnames.SOFTMAX if name in rows]
    matmul = [rows[name] for name in opnames.ATTENTION_MATMUL if name in rows]
    softmax_calls = max((row.calls for row in softmax), default=0)
    matmul_calls = sum(row.calls for row in matmul)
    if softmax_calls == 0 or matmul_calls < softmax_calls:
        return None  # no softmax between batched matmuls: not the eager attention pattern
    table = kernels.for_rank(rank) if kernels is not None else None
    fused = any(opnames.fused_attention_op(name) for name in rows) or (
        table is not None and any(opnames.fused_attention_kernel(row.name) for row in table.rows)
    )
    events = np.flatnonzero(opnames.named(trace, opnames.SOFTMAX) & (trace.rank == rank))
    return EagerAttention(matmul_calls, softmax_calls, sum(row.device_ms for row in matmul),
                          sum(row.device_ms for row in softmax), fused, events)  # fmt: skip


def _sdpa(trace: Trace, rank: int) -> tuple[SdpaBackend, ...]:
    calls = np.flatnonzero(opnames.named(trace, (opnames.SDPA,)) & (trace.rank == rank))
    backend_of = _backend_inside(trace, rank)
    by_backend: dict[str, list[int]] = {}
    for call in calls.tolist():
        by_backend.setdefault(backend_of(call), []).append(call)
    kernel_ms = _kernel_ms_inside(trace, rank)
    found = []
    for backend, events in by_backend.items():
        ms = sum(kernel_ms(event) for event in events) if backend in opnames.SLOWER_THAN_FLASH else None
        found.append(SdpaBackend(backend, tuple(events), ms, *_inputs(trace, events[0])))
    return tuple(found)


def _backend_inside(trace: Trace, rank: int):
    """The backend an SDPA call ran: the one the host ops inside the call, on its thread, name."""
    ops = np.flatnonzero((trace.kind == Kind.CPU_OP) & (trace.rank == rank))
    tid, ts, end = trace.tid[ops], trace.ts[ops], trace.end[ops]

    def backend(call: int) -> str:
        inside = ops[(tid == trace.tid[call]) & (ts >= trace.ts[call]) & (end <= trace.ts[call] + trace.dur[call])]
        return opnames.sdpa_backend(trace.name_of(index) for index in inside)

    return backend


def _kernel_ms_inside(trace: Trace, rank: int):
    """ms of the device work launched by ops inside a host call (on its thread, within its time range)."""
    device = device_events(trace, rank)
    launcher = trace.launcher[device]
    device, launcher = device[launcher >= 0], launcher[launcher >= 0]
    tid, ts, end, dur = trace.tid[launcher], trace.ts[launcher], trace.end[launcher], trace.dur[device]

    def kernel_ms(call: int) -> float:
        inside = (tid == trace.tid[call]) & (ts >= trace.ts[call]) & (end <= trace.ts[call] + trace.dur[call])
        return float(dur[inside].sum()) / 1000.0

    return kernel_ms


def _inputs(trace: Trace, call: int) -> tuple[int, bool]:
    """(head dim of the query, whether an attn_mask was passed) from the recorded input shapes."""
    if trace.shapes[call] < 0:
        return 0, False
    try:
        dims = json.loads(trace.names[trace.shapes[call]])
    except ValueError:
        return 0, False
    query = dims[0] if dims and isinstance(dims[0], list) else []
    mask = len(dims) > 3 and isinstance(dims[3], list) and len(dims[3]) > 0
    return (int(query[-1]) if query else 0), mask
