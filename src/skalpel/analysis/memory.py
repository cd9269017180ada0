"""The memory curve from ``[memory]`` events: allocated bytes over time, peak, growth per step.

Per (rank, device). Allocated bytes come from the allocator's ``Total Allocated`` counter
when the trace has it (torch >= 1.10 writes it); older traces only have each event's
signed ``Bytes``, so the curve is their running sum, lifted so it never dips below 0
(``absolute`` False: a lower bound, as memory allocated before profiling started is unknown).

*Growth per step* is the median of the per-step changes of allocated memory, measured at
each step's end (and at the first step's start), so one large step does not make a leak.
Those are the ends of the ProfilerStep ranges on the host: the allocator runs when the host
dispatches an op, and a GPU step's end (its device work) falls while the host is already
steps ahead, which would read the same value at every step's end.
The *largest allocation* names the host op enclosing that ``[memory]`` event on the same
thread, with its event index for the Python stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from . import numeric
from .steps import StepSegmentation

_HOST_OPS = np.array([Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.COMM_OP, Kind.DATALOADER], dtype=np.int8)
_DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda"}


@dataclass(frozen=True)
class MemoryOptions:
    """How far the memory curves are decimated."""

    max_points: int = 2000  # downsampled curve length; each point keeps the maximum of its bucket


@dataclass(frozen=True)
class DeviceMemory:
    """The allocated-memory curve of one device of one rank, its peak and growth."""

    rank: int
    device: str  # "cuda:0", "cpu", "device7:0"
    events: int
    absolute: bool  # True: from Total Allocated; False: running sum of Bytes from 0
    peak_bytes: int
    peak_ts_us: float
    start_bytes: int
    end_bytes: int
    growth_bytes_per_step: float | None  # None with fewer than two marked steps
    step_end_bytes: tuple[int, ...]  # allocated at the first step's start, then at each step's end
    largest_alloc_bytes: int
    largest_alloc_op: str | None  # name of the host op enclosing the largest allocation
    largest_alloc_op_event: int  # its event index (-1 when none encloses it)
    curve: tuple[tuple[float, int], ...]  # (us from trace origin, allocated bytes), downsampled
    largest_alloc_at_peak: bool = False  # the largest allocation is still held when the peak is reached (paired by size)
    largest_alloc_freed: bool = False  # and freed again before the trace ends: a temporary, not weights or state
    largest_alloc_in_op: bool = False  # freed before the op around it returned: its workspace, not its output
    steady_bytes: int = 0  # the footprint between steps (median at step boundaries; at the end without steps)
    capacity_bytes: int | None = None  # the device's memory from the trace's deviceProperties; None for the host
    peak_reserved_bytes: int | None = None  # the caching allocator's highest Total Reserved; None where not recorded


@dataclass(frozen=True)
class MemoryResult:
    """Memory curves of every device of every rank."""

    devices: tuple[DeviceMemory, ...]
    options: MemoryOptions

    def for_rank(self, rank: int) -> list[DeviceMemory]:
        return [device for device in self.devices if device.rank == rank]

    def main_device(self, rank: int) -> DeviceMemory | None:
        """The accelerator with the highest peak on this rank, else the host."""
        devices = sorted(self.for_rank(rank), key=lambda d: (d.device != "cpu", d.peak_bytes))
        return devices[-1] if devices else None


def memory(trace: Trace, steps: StepSegmentation, *, options: MemoryOptions = MemoryOptions()) -> MemoryResult | None:
    """Memory curves per (rank, device); None when the trace has no ``[memory]`` events."""
    events = trace.memory
    if len(events) == 0:
        return None
    # one int64 key per (rank, device type, device id); rows sorted by key, then time
    key = events.rank.astype(np.int64) << 32
    key |= (events.device_type.astype(np.int64) & 0xFF) << 16
    key |= events.device_id.astype(np.int64) & 0xFFFF
    order = np.lexsort((events.ts, key))
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    devices = []
    for rows in np.split(order, bounds):
        first = rows[0]
        device_type, device_id = int(events.device_type[first]), int(events.device_id[first])
        devices.append(_device_memory(trace, int(events.rank[first]), device_type, device_id, rows, steps, options))
    return MemoryResult(devices=tuple(devices), options=options)


def _device_memory(
    trace: Trace,
    rank: int,
    device_type: int,
    device_id: int,
    rows: np.ndarray,
    steps: StepSegmentation,
    options: MemoryOptions,
) -> DeviceMemory:
    events = trace.memory
    ts = events.ts[rows]
    totals = events.total_allocated[rows]
    absolute = bool((totals >= 0).all())
    allocated = totals if absolute else _running_sum(events.nbytes[rows])
    peak = int(np.argmax(allocated))
    boundaries = _step_boundaries(steps, rank)
    at_boundaries = _value_at(ts, allocated, boundaries)
    deltas = np.diff(at_boundaries)
    largest_row = int(np.argmax(events.nbytes[rows]))
    largest = rows[largest_row]
    op = _enclosing_op(trace, rank, int(events.tid[largest]), float(events.ts[largest]))
    name = _DEVICE_TYPE_NAMES.get(device_type, f"device{device_type}")
    return DeviceMemory(
        rank=rank,
        device=name if device_type == 0 else f"{name}:{device_id}",
        events=len(rows),
        absolute=absolute,
        peak_bytes=int(allocated[peak]),
        peak_ts_us=float(ts[peak]),
        start_bytes=int(allocated[0]),
        end_bytes=int(allocated[-1]),
        growth_bytes_per_step=numeric.median(deltas) if len(deltas) >= 2 else None,
        step_end_bytes=tuple(int(v) for v in at_boundaries),
        largest_alloc_bytes=int(events.nbytes[largest]),
        largest_alloc_op=trace.name_of(op) if op >= 0 else None,
        largest_alloc_op_event=op,
        curve=_downsample(ts, allocated, options.max_points),
        largest_alloc_at_peak=_held_at(events.nbytes[rows], largest_row, peak),
        largest_alloc_freed=not _held_at(events.nbytes[rows], largest_row, len(rows) - 1),
        largest_alloc_in_op=op >= 0 and _freed_by(events.nbytes[rows], ts, largest_row) <= float(trace.end[op]),
        steady_bytes=int(numeric.median(at_boundaries)) if len(at_boundaries) >= 2 else int(allocated[-1]),
        capacity_bytes=_capacity(trace, rank, device_id) if device_type != 0 else None,
        peak_reserved_bytes=_peak_reserved(events.total_reserved[rows]) if absolute else None,
    )


def _peak_reserved(reserved: np.ndarray) -> int | None:
    """The highest reserved bytes the allocator reported (a device's caching allocator; the host reports none)."""
    known = reserved[reserved > 0]
    return int(known.max()) if len(known) else None


def _held_at(nbytes: np.ndarray, row: int, at: int) -> bool:
    """Whether the allocation at ``row`` is still held at ``at`` (rows in time order).

    ``[memory]`` rows carry no address here, so frees are paired by size: the allocation counts
    as freed when more blocks of its size are freed than allocated between it and ``at``.
    """
    if row > at:
        return False
    size = nbytes[row]
    between = nbytes[row + 1 : at + 1]
    return int((between == -size).sum()) <= int((between == size).sum())


def _freed_by(nbytes: np.ndarray, ts: np.ndarray, row: int) -> float:
    """When the allocation at ``row`` is freed (paired by size, as ``_held_at``); infinity while it is held."""
    size = nbytes[row]
    later = nbytes[row + 1 :]
    balance = np.cumsum((later == -size).astype(np.int64) - (later == size).astype(np.int64))
    freed = np.flatnonzero(balance > 0)
    return float(ts[row + 1 + freed[0]]) if len(freed) else float("inf")


def _capacity(trace: Trace, rank: int, device_id: int) -> int | None:
    """``totalGlobalMem`` of the device with this id in the rank's ``deviceProperties``; None when not given."""
    for info in trace.ranks:
        if info.rank != rank:
            continue
        for device in info.device_properties:
            if device.get("id", 0) == device_id and isinstance(device.get("totalGlobalMem"), (int, float)):
                total = int(device["totalGlobalMem"])
                return total if total > 0 else None
    return None


_LARGEST_EVENT_BYTES = 2**40


def _running_sum(nbytes: np.ndarray) -> np.ndarray:
    """Allocated bytes from signed Bytes alone: a lower bound, lifted so that it never goes below 0.

    A dip below 0 means memory allocated before profiling started was freed; at least that
    much was in use at the start. An event of more than 1 TiB is no real allocation (a damaged field, read as up to
    2**63): it counts as 1 TiB, so that millions of events still sum inside int64 instead of wrapping round.
    """
    total = np.cumsum(np.clip(nbytes, -_LARGEST_EVENT_BYTES, _LARGEST_EVENT_BYTES))
    return total - min(int(total.min()), 0)


def _step_boundaries(steps: StepSegmentation, rank: int) -> np.ndarray:
    if not steps.marked:
        return np.zeros(0)
    rank_steps = sorted(steps.for_rank(rank), key=lambda step: step.start_us)
    if not rank_steps:
        return np.zeros(0)
    return np.array([rank_steps[0].host_begin_us] + [step.host_end_us for step in rank_steps])


def _value_at(ts: np.ndarray, values: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The allocated value in force at each time (the last event at or before it; the first value before any)."""
    position = np.searchsorted(ts, times, side="right") - 1
    return values[np.maximum(position, 0)]


def _enclosing_op(trace: Trace, rank: int, tid: int, at_us: float) -> int:
    """The innermost host op on (rank, tid) running at ``at_us``; -1 when none."""
    candidates = np.flatnonzero((trace.tid == tid) & (trace.rank == rank) & isin_few(trace.kind, _HOST_OPS))
    inside = candidates[(trace.ts[candidates] <= at_us) & (trace.ts[candidates] + trace.dur[candidates] >= at_us)]
    if len(inside) == 0:
        return -1
    return int(inside[np.lexsort((trace.dur[inside], -trace.ts[inside]))[0]])  # latest start, then shortest


def allocating_ops(trace: Trace, rank: int, tids: np.ndarray, times: np.ndarray) -> list[str | None]:
    """The op each allocation (on thread ``tids[i]`` at ``times[i]``, on ``rank``) belongs to, as a user knows it:
    the outermost ``aten::`` op open then (``aten::mse_loss``, not the ``aten::empty`` inside it), else the innermost
    host op; None where no op is open. One scan of the trace for all of them."""
    host = np.flatnonzero((trace.rank == rank) & isin_few(trace.kind, _HOST_OPS))
    host = host[numeric.isin(trace.tid[host], np.unique(tids))] if len(tids) else host[:0]
    starts, ends = trace.ts[host], trace.ts[host] + trace.dur[host]
    found: list[str | None] = []
    for tid, at in zip(tids.tolist(), times.tolist()):
        inside = host[(trace.tid[host] == tid) & (starts <= at) & (ends >= at)]
        if len(inside) == 0:
            found.append(None)
            continue
        order = np.lexsort((-trace.dur[inside], trace.ts[inside]))  # outermost first
        names = [trace.names[int(trace.name[i])] for i in inside[order]]
        found.append(next((name for name in names if opnames.is_aten_op(name)), names[-1]))
    return found


def _downsample(ts: np.ndarray, values: np.ndarray, max_points: int) -> tuple[tuple[float, int], ...]:
    """At most ``max_points`` points; each bucket of consecutive events keeps its maximum, so the peak survives."""
    if len(ts) > max_points:
        starts = np.linspace(0, len(ts), max_points, endpoint=False).astype(np.int64)
        starts = numeric.unique(starts)
        peaks = np.maximum.reduceat(values, starts)
        ts, values = ts[starts], peaks
    return tuple((float(t), int(v)) for t, v in zip(ts, values))  # rounded once, in the report
