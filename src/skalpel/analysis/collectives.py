"""The collectives of one rank: what ran, when, on how many bytes, in how many ranks.

A collective is timed where it really runs: on GPUs by its NCCL/RCCL kernel
(``ncclDevKernel_AllReduce_Sum_f32_RING_LL``), on CPUs by the backend's own host range
(``gloo:all_reduce`` on gloo's worker thread). Its metadata comes from the kernel's
args (torch >= 2.3 copies ``Collective name``, ``In msg nelems``, ``dtype``, ``Group size``
there) or else from the host ops around the launch (``record_param_comms``,
``nccl:all_reduce`` with ``Input Dims`` and ``Input type``).

Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md): the size S of an all_gather
is its whole output and of a reduce_scatter its whole input; the algorithm bandwidth is
S / time; the bus bandwidth multiplies it by 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and all_to_all, and 1 for broadcast, reduce and send/recv,
so that it can be compared with the hardware's link bandwidth whatever the rank count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.opnames import collective_type  # noqa: F401 (public here: diagnose and tests import it)
from ..trace.model import Trace
from . import numeric

TYPES = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier",
    "send_recv", "reduce", "gather", "scatter", "other",
)
"""Canonical collective types, in report order."""

SYNCHRONISING = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
"""Types that end at (nearly) the same true time on every rank: usable to align clocks."""

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "uint32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "long long": 8, "uint64": 8,
    "half": 2, "float16": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "bf16": 2, "f16": 2,
    "short": 2, "short int": 2, "int16": 2,
    "byte": 1, "char": 1, "bool": 1, "int8": 1, "uint8": 1, "signed char": 1, "unsigned char": 1,
    "int8_t": 1, "uint8_t": 1,
}


@dataclass(frozen=True, slots=True)  # slots: a job's driver holds every rank's collectives (ranks x collectives)
class Collective:
    """One collective call: its type, when it ran, its size and its group."""

    rank: int
    type: str  # one of TYPES
    event: int  # index of the timed event (kernel or host range) in the trace
    start_us: float
    end_us: float
    nbytes: int  # nccl-tests size S; 0 when the trace does not say
    group_size: int
    on_device: bool  # timed by a device kernel (True) or a host range (False)
    tid: int  # stream of the kernel, or host thread of the range

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


def busbw_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor for a collective of ``ranks`` ranks."""
    n = max(ranks, 1)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def dtype_bytes(spelled: object) -> int | None:
    """Bytes per element of a dtype as traces spell it ('Float', 'c10::BFloat16', 'long int')."""
    if not isinstance(spelled, str):
        return None
    lowered = spelled.lower().strip()
    if lowered.startswith("float8") or lowered.startswith("c10::float8"):
        return 1
    return _DTYPE_BYTES.get(lowered) or _DTYPE_BYTES.get(lowered.replace("at::", "").replace("torch.", ""))


def message_bytes(kind: str, args: dict, group_size: int) -> int:
    """nccl-tests size S of one collective from its args; 0 when they do not say."""
    size = dtype_bytes(args.get("dtype"))
    counts = [args.get("In msg nelems"), args.get("Out msg nelems")]
    counts = [count for count in counts if isinstance(count, int) and count > 0]
    if size and counts:
        return max(counts) * size
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list):
        return 0
    total = 0
    for position, shape in enumerate(dims):
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            continue
        element = dtype_bytes(types[position]) if isinstance(types, list) and position < len(types) else None
        total += math.prod(shape) * (element or 0)
    if kind == "all_gather":
        total *= max(group_size, 1)  # the op records its local input; S is the gathered output
    return total


def find_collectives(trace: Trace, rank: int) -> list[Collective]:
    """Every collective of ``rank`` in time order: device kernels if any, else backend host ranges."""
    kernels = np.flatnonzero(trace.mask(Kind.COMM_KERNEL, rank=rank))
    world = _world_size(trace, rank)
    if len(kernels):
        kernels = kernels[np.lexsort((kernels, trace.ts[kernels]))]  # time order, as the result is sorted
        return _from_kernels(trace, kernels, _HostComms(trace, rank), world)
    found = [_from_host(trace, int(e), world) for e in _host_ranges(trace, rank)]
    return sorted(found, key=lambda c: (c.start_us, c.event))


def _world_size(trace: Trace, rank: int) -> int:
    for info in trace.ranks:
        if info.rank == rank and info.world_size:
            return info.world_size
    return max(trace.job_ranks or len(trace.ranks), 1)


def _host_ranges(trace: Trace, rank: int) -> np.ndarray:
    ops = np.flatnonzero(trace.mask(Kind.COMM_OP, rank=rank))
    backend = ops[numeric.isin(trace.name[ops], opnames.names_where(trace, opnames.is_host_backend_collective, ops))]
    if len(backend):
        return backend.astype(np.int64)
    return ops[numeric.isin(trace.name[ops], opnames.names_where(trace, opnames.is_c10d_collective, ops))].astype(np.int64)


def _from_host(trace: Trace, event: int, world: int) -> Collective:
    args = trace.args_of(event)
    kind = collective_type(str(args.get("Collective name") or trace.name_of(event)))
    group = _group_size(args, world)
    start = float(trace.ts[event])
    return Collective(
        rank=int(trace.rank[event]), type=kind, event=event, start_us=start, end_us=start + float(trace.dur[event]),
        nbytes=message_bytes(kind, args, group), group_size=group, on_device=False, tid=int(trace.tid[event]),
    )


def _from_kernels(trace: Trace, kernels: np.ndarray, host: _HostComms, world: int) -> list[Collective]:
    """The collectives the kernels time, each described by its args over those of the host ops around its launch."""
    starts = trace.ts[kernels]
    columns = zip(
        kernels.tolist(), host.around(kernels), trace.name[kernels].tolist(), trace.rank[kernels].tolist(),
        starts.tolist(), (starts + trace.dur[kernels]).tolist(), trace.stream[kernels].tolist(),
    )
    plain: dict[tuple[int, str | None], tuple[str, int, int]] = {}  # descriptions from names alone, by names
    found = []
    for kernel, around, name, rank, start, end, stream in columns:
        op_name = host.op_name(around)
        if _has_metadata(trace, kernel) or not host.described.isdisjoint(around):
            args = host.merged_args(around)
            args.update({key: value for key, value in _metadata(trace, kernel).items() if value not in (None, "", "[]")})
            kind, nbytes, group = _describe(args, op_name, trace.names[name], world)
        else:  # no args to read (most kernels of an older trace): the same few names, described once
            key = (name, op_name)
            if key not in plain:
                plain[key] = _describe({}, op_name, trace.names[name], world)
            kind, nbytes, group = plain[key]
        found.append(Collective(
            rank=rank, type=kind, event=kernel, start_us=start, end_us=end, nbytes=nbytes, group_size=group,
            on_device=True, tid=stream,
        ))  # fmt: skip
    return found


def _describe(args: dict, op_name: str | None, kernel_name: str, world: int) -> tuple[str, int, int]:
    """(type, nccl-tests size, group size) of a collective kernel from its merged args and names."""
    kind = collective_type(str(args.get("Collective name") or op_name or kernel_name))
    if kind == "other":
        kind = collective_type(kernel_name)
    group = _group_size(args, world)
    return kind, message_bytes(kind, args, group), group


def _group_size(args: dict, world: int) -> int:
    size = args.get("Group size")
    return size if isinstance(size, int) and size > 0 else world


_METADATA = frozenset({"Collective name", "Group size", "dtype", "In msg nelems", "Out msg nelems", "Input Dims", "Input type"})
"""The args a collective's type, group and size are read from; an event's other args are never read here."""


def _has_metadata(trace: Trace, event: int) -> bool:
    return not _METADATA.isdisjoint(trace.extra.get(event, ()))  # most events carry none (only External id...)


def _metadata(trace: Trace, event: int) -> dict:
    return {key: value for key, value in trace.args_of(event).items() if key in _METADATA}


class _HostComms:
    """The host collective ops of one rank, to find those open when a kernel was launched."""

    def __init__(self, trace: Trace, rank: int) -> None:
        self.trace = trace
        self.record_param_comms = opnames.id_of(trace, opnames.RECORD_PARAM_COMMS)
        ops = np.flatnonzero(trace.mask(Kind.COMM_OP, rank=rank))
        ops = ops[np.argsort(trace.ts[ops], kind="stable")]
        # ops with args to merge: looked up among the few events that carry args at all, not op by op
        self.described = {op for op in trace.extra.keys() & set(ops.tolist()) if _has_metadata(trace, op)}
        self.name_of_op = dict(zip(ops.tolist(), trace.name[ops].tolist()))
        # reach[i]: the latest end among ops 0..i, so that the scan back stops where nothing can still be open.
        self.by_thread = {}
        for tid in numeric.unique(trace.tid[ops]):
            mine = ops[trace.tid[ops] == tid]
            ends = trace.ts[mine] + trace.dur[mine]
            self.by_thread[int(tid)] = (mine, trace.ts[mine], ends, np.maximum.accumulate(ends))

    def around(self, kernels: np.ndarray) -> list[list[int]]:
        """For each kernel, the comm ops open at its launch on the launching thread, innermost first."""
        trace = self.trace
        found: list[list[int]] = [[] for _ in range(len(kernels))]
        launcher = trace.launcher[kernels]
        for position in np.flatnonzero(launcher < 0):  # no launch call: the op the kernel is linked to, if a comm op
            op = int(trace.op_of_event[kernels[position]])
            if op >= 0 and trace.kind[op] == Kind.COMM_OP:
                found[position].append(op)
        launched = np.flatnonzero(launcher >= 0)
        threads = trace.tid[launcher[launched]]
        for tid in numeric.unique(threads):
            if int(tid) not in self.by_thread:
                continue
            ops, starts, ends, reach = self.by_thread[int(tid)]
            positions = launched[threads == tid]
            instant = trace.ts[launcher[positions]]
            last = np.searchsorted(starts, instant, side="right")
            # Scan back from the latest op to start, one op per round for all kernels at once: an op is open
            # when it ends at or after the launch; the scan stops where no earlier op reaches the launch,
            # after the 64 latest to start at most.
            scanning = np.ones(len(positions), dtype=bool)
            for back in range(1, 65):
                index = last - back
                scanning &= index >= 0
                scanning[scanning] = reach[index[scanning]] >= instant[scanning]
                if not scanning.any():
                    break
                open_now = np.flatnonzero(scanning)
                open_now = open_now[ends[index[open_now]] >= instant[open_now]]
                for position, op in zip(positions[open_now].tolist(), ops[index[open_now]].tolist()):
                    found[position].append(op)
        return found

    def merged_args(self, ops: list[int]) -> dict:
        merged: dict = {}
        for op in ops:  # innermost first: the innermost op's args win
            for key, value in _metadata(self.trace, op).items():
                if key not in merged and value not in (None, "", "[]", [], [[]]):
                    merged[key] = value
        return merged

    def op_name(self, ops: list[int]) -> str | None:
        """The name of the innermost backend op (nccl:all_to_all) among ``ops``."""
        for op in ops:
            name = self.name_of_op[op]
            if name != self.record_param_comms:
                return self.trace.names[name]
        return None
