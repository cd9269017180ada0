"""What a device keeps through the steps, for a memory rise: which blocks, allocated by which ops, on which
threads, and whether an LBFGS history holds them.

The blocks are those of the sizes allocated more often than freed during the steps (allocations and frees
paired by size); where the trace gives each block's address, only the blocks of those sizes still held at the
last step's end: a leak of activations shares its size with the activations, gradients and temporaries that
every step frees again.

A device is looked at on its first read only (``KeptMemory.of``): the pairing walks every allocation of the
steps, and only a device whose memory rises needs it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..trace.model import MemoryEvents, Trace
from ..trace.opnames import keeps_loss_buffer, lbfgs_steps
from .memory import DeviceMemory, allocating_ops
from .steps import StepSegmentation

MIB = 2**20
_SMALLEST = MIB // 16  # kept sizes below this are allocator noise, not what a rise is made of
_OPS_NAMED = 64  # the largest held blocks whose op is looked up
_TOP_OPS = 3


@dataclass(frozen=True)
class KeptOp:
    """An op that allocated some of the largest kept blocks."""

    op: str  # "(no op)" where none was open
    nbytes: int
    blocks: int

    @property
    def keeps_loss_buffer(self) -> bool:
        """A reduced loss whose kept 0-dim result holds its whole elementwise-loss buffer."""
        return keeps_loss_buffer(self.op)


@dataclass(frozen=True)
class DeviceKept:
    """The blocks one device keeps through the steps."""

    allocs: np.ndarray  # rows of ``trace.memory``
    by_op: tuple[KeptOp, ...]  # the ops holding most of the largest kept blocks, most bytes first
    threads: tuple[tuple[int, np.ndarray], ...]  # (tid, times of its kept allocations), most allocations first
    kept_bytes: float
    lbfgs_bytes: float | None  # of which allocated inside an LBFGS step; None: no LBFGS step on the rank
    lbfgs_block_bytes: int  # the commonest size of those (0: none)


class KeptMemory:
    """The kept blocks of each device, found on its first read and kept."""

    def __init__(self, trace: Trace, steps: StepSegmentation) -> None:
        self._trace, self._steps = trace, steps
        self._found: dict[tuple[int, str], DeviceKept] = {}

    def of(self, device: DeviceMemory) -> DeviceKept:
        key = (device.rank, device.device)
        if key not in self._found:
            self._found[key] = _device_kept(self._trace, self._steps, device)
        return self._found[key]


def _device_kept(trace: Trace, steps: StepSegmentation, device: DeviceMemory) -> DeviceKept:
    events = trace.memory
    allocs = _held_allocations(events, steps, device)
    threads = tuple(
        (int(tid), events.ts[allocs[events.tid[allocs] == tid]])
        for tid, _ in Counter(events.tid[allocs].tolist()).most_common()
    )  # per thread, most allocations first: a GPU step's backward allocates on autograd's thread, no user frames
    sizes = events.nbytes[allocs].astype(np.float64)
    lbfgs, block = _inside_lbfgs(trace, device.rank, events, allocs)
    return DeviceKept(allocs, _kept_by_op(trace, device.rank, events, allocs), threads, float(sizes.sum()), lbfgs, block)


def _held_allocations(events: MemoryEvents, steps: StepSegmentation, device: DeviceMemory) -> np.ndarray:
    ordered = sorted(steps.for_rank(device.rank), key=lambda step: step.start_us)
    start, end = ordered[0].host_begin_us, ordered[-1].host_end_us  # allocations happen on the host's timeline
    on_device = events.device_type == 0 if device.device == "cpu" else events.device_type != 0
    rows = np.flatnonzero((events.rank == device.rank) & on_device & (events.ts >= start) & (events.ts < end))
    rows = rows[np.argsort(events.ts[rows], kind="stable")]
    sizes = events.nbytes[rows]
    surplus = Counter(sizes[sizes > 0].tolist())
    surplus.subtract(Counter((-sizes[sizes < 0]).tolist()))
    kept = {size for size, count in surplus.items() if count > 0 and size >= _SMALLEST}
    allocs = rows[np.isin(sizes, list(kept))] if kept else rows[:0]
    held = _held_at_end(events, rows) if len(allocs) else None
    return np.intersect1d(allocs, held) if held is not None else allocs


def _held_at_end(events: MemoryEvents, rows: np.ndarray) -> np.ndarray | None:
    """The allocations among ``rows`` (in time order) whose block is not freed by the end of ``rows``;
    None where the addresses cannot pair them (absent, or a block allocated twice without a free between)."""
    held: dict[int, int] = {}
    for row, addr, size in zip(rows.tolist(), events.addr[rows].tolist(), events.nbytes[rows].tolist()):
        if addr < 0 or (size > 0 and addr in held):
            return None
        if size > 0:
            held[addr] = row
        elif size < 0:
            held.pop(addr, None)
    return np.array(sorted(held.values()), dtype=np.int64)


def _kept_by_op(trace: Trace, rank: int, events: MemoryEvents, allocs: np.ndarray) -> tuple[KeptOp, ...]:
    largest = allocs[np.argsort(-events.nbytes[allocs], kind="stable")[:_OPS_NAMED]]
    kept: Counter[str] = Counter()
    blocks: Counter[str] = Counter()
    ops = allocating_ops(trace, rank, events.tid[largest], events.ts[largest].astype(float))
    for row, op in zip(largest.tolist(), ops):
        kept[op or "(no op)"] += int(events.nbytes[row])
        blocks[op or "(no op)"] += 1
    return tuple(KeptOp(op, size, blocks[op]) for op, size in kept.most_common(_TOP_OPS))


def _inside_lbfgs(trace: Trace, rank: int, events: MemoryEvents, allocs: np.ndarray) -> tuple[float | None, int]:
    """The kept bytes allocated inside the rank's LBFGS steps and their commonest block size."""
    ranges = lbfgs_steps(trace, rank)
    if len(ranges) == 0 or len(allocs) == 0:
        return None, 0
    at = events.ts[allocs].astype(np.float64)
    before = np.searchsorted(trace.ts[ranges], at, side="right") - 1
    inside = (before >= 0) & (at < trace.end[ranges][np.maximum(before, 0)])
    sizes = events.nbytes[allocs].astype(np.float64)
    common = Counter(events.nbytes[allocs[inside]].tolist()).most_common(1)
    return float(sizes[inside].sum()), int(common[0][0]) if common else 0
