"""The columnar trace model: one table of events for every rank, names interned once.

Every analysis reads this; nothing reparses JSON. Columns are numpy arrays of equal
length, indexed by event. Times are microseconds relative to ``Trace.origin_us``
(the earliest timestamp of any loaded file), so that differences keep their precision.

Memory events (``[memory]`` instants) live in their own small table because they
carry allocator counters instead of a duration. Arguments that only a few events
need (collective metadata, sync kinds, copy kinds) stay as dicts in ``Trace.extra``,
keyed by event index, so the hot columns stay compact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .kinds import DEVICE_KIND_ARRAY, Kind
from .links import launcher_of_events, op_of_events
from .modules import backward_module_of_events, module_of_events
from .roles import event_phases, event_roles

NO_ID = -1


@dataclass(frozen=True)
class RankInfo:
    """What one trace file says about the process that wrote it."""

    rank: int
    path: str
    world_size: int | None = None
    backend: str | None = None
    device_names: tuple[str, ...] = ()
    device_properties: tuple[dict, ...] = ()
    versions: dict[str, Any] = field(default_factory=dict)  # torch, cuda runtime/driver, cupti, hip
    job: str | None = None  # a job or trace id, to tell rank files of different runs apart
    host: str | None = None  # host_name from the header: ranks on one host share one clock
    truncated: bool = False
    event_count: int = 0
    compile_log: dict | None = None  # torch.compile events skalpel's capture wrote into the header (skalpel_compile)
    line_samples: Any = None  # line_samples.LineSamples from a skalpel capture's header, else None
    precision: dict | None = None  # this CPU's bf16 and fp32 matmul speeds from a skalpel capture's header
    module_sizes: dict | None = None  # "Linear_0" -> (parameters, forward output bytes) from a skalpel capture's header
    run_queue: dict | None = None  # the main thread's wait for a core over the window (run_queue_header), if recorded


CUT_FILE = "the file is cut off"  # what the loader's note on a cut file says after its name: reports show it first


@dataclass
class MemoryEvents:
    """``[memory]`` instants: one row per allocation (bytes > 0) or free (bytes < 0)."""

    ts: np.ndarray  # float64 us, relative to Trace.origin_us
    nbytes: np.ndarray  # int64, signed
    total_allocated: np.ndarray  # int64, -1 where the trace predates the counter
    total_reserved: np.ndarray  # int64, -1 where absent
    device_type: np.ndarray  # int8: 0 CPU, 1 CUDA, other values as the allocator reports
    device_id: np.ndarray  # int16
    rank: np.ndarray  # int32
    tid: np.ndarray  # int64, the host thread that allocated
    addr: np.ndarray  # int64, the block's address (pairs a free with its allocation); -1 where absent

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class Trace:
    """All events of all loaded ranks, as columns."""

    names: list[str]  # interned strings; name, stack and shapes columns index into it
    ts: np.ndarray  # float64 us from origin_us
    dur: np.ndarray  # float64 us
    kind: np.ndarray  # int8, a Kind
    name: np.ndarray  # int32 index into names
    rank: np.ndarray  # int32
    pid: np.ndarray  # int64 (string pids are interned and negated)
    tid: np.ndarray  # int64 host thread, or the stream for device events
    device: np.ndarray  # int32, -1 for host events
    stream: np.ndarray  # int64, -1 for host events
    correlation: np.ndarray  # int64, 0 when absent: links a runtime call to its device work
    external_id: np.ndarray  # int64, 0 when absent: links an op to its runtime calls
    stack: np.ndarray  # int32 index into names of the 'Call stack' argument, -1 when absent
    shapes: np.ndarray  # int32 index into names of the 'Input Dims' argument (as JSON), -1 when absent
    nbytes: np.ndarray  # int64 bytes moved (memcpy, memset) or 0
    autograd: np.ndarray  # int64, cpu ops: 2n on a forward op of autograd sequence number n, 2n+1 on a backward one
    memory: MemoryEvents
    ranks: tuple[RankInfo, ...]
    origin_us: float = 0.0  # absolute timestamp of ts == 0
    extra: dict[int, dict] = field(default_factory=dict)  # selected args of rare events, by event index
    warnings: list[str] = field(default_factory=list)
    job_ranks: int | None = None  # rank files of the whole job, when this trace holds one rank of it
    _name_ids: dict[str, int] | None = field(default=None, repr=False)
    _derived: dict[str, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @property
    def rank_ids(self) -> list[int]:
        return [info.rank for info in self.ranks]

    @property
    def has_device(self) -> bool:
        """True when the trace recorded any device activity (kernels, copies, memsets)."""
        return bool(isin_few(self.kind, DEVICE_KIND_ARRAY).any())

    @property
    def has_stacks(self) -> bool:
        return bool((self.kind == Kind.PYTHON).any() or (self.stack >= 0).any())

    def name_id(self, name: str) -> int:
        """The interned id of ``name``, or -1 when no event has it."""
        if self._name_ids is None:
            self._name_ids = {text: index for index, text in enumerate(self.names)}
        return self._name_ids.get(name, NO_ID)

    def name_of(self, index: int) -> str:
        return self.names[int(self.name[index])]

    def mask(self, *kinds: Kind, rank: int | None = None) -> np.ndarray:
        """Boolean mask of events of the given kinds (all kinds when none), optionally on one rank."""
        selected = isin_few(self.kind, [int(k) for k in kinds]) if kinds else np.ones(len(self), bool)
        if rank is not None:
            selected &= self.rank == rank
        return selected

    def args_of(self, index: int) -> dict:
        return self.extra.get(int(index), {})

    @property
    def launcher(self) -> np.ndarray:
        """For each device event, the index of the runtime call that launched it (-1 otherwise).

        Matched on (rank, correlation id); computed once and cached.
        """
        if "launcher" not in self._derived:
            self._derived["launcher"] = launcher_of_events(self.kind, self.rank, self.correlation)
        return self._derived["launcher"]

    @property
    def op_of_event(self) -> np.ndarray:
        """For each runtime call and device event, the index of the host op it belongs to (-1 otherwise).

        A runtime call belongs to the op its External id names where that op lies around it on its
        thread, else to the innermost host op around it (``links.op_of_events``); a device event
        inherits the op of its launcher. Computed once and cached.
        """
        if "op_of_event" not in self._derived:
            self._derived["op_of_event"] = op_of_events(self.kind, self.rank, self.pid, self.tid, self.ts, self.dur,
                                                          self.external_id, self.launcher)
        return self._derived["op_of_event"]


    @property
    def role(self) -> np.ndarray:
        """The ``roles.Role`` of every event (int8): what it is for. Computed once and cached."""
        if "role" not in self._derived:
            self._derived["role"] = event_roles(self.names, self.kind, self.name, self.rank, self.tid, self.ts, self.end)
        return self._derived["role"]

    @property
    def phase(self) -> np.ndarray:
        """The ``roles.Phase`` of every host event (int8): backward, optimizer step or DataLoader fetch around it."""
        if "phase" not in self._derived:
            self._derived["phase"] = event_phases(self.role, self.kind, self.rank, self.tid, self.ts, self.end)
        return self._derived["phase"]

    @property
    def module(self) -> np.ndarray:
        """For each event, the ``nn.Module: Name_N`` frame it runs in (-1: none); a module frame's is its parent's.

        Host events by the frames around them on their thread, device events by their launch call
        (``trace/modules.py``). Computed once and cached."""
        if "module" not in self._derived:
            self._derived["module"] = module_of_events(self.role, self.kind, self.rank, self.tid, self.ts, self.end,
                                                       self.launcher)  # fmt: skip
        return self._derived["module"]

    @property
    def backward_module(self) -> np.ndarray:
        """For each event, the module frame whose forward made the backward node it runs in (-1: none): autograd's
        sequence numbers link a backward op to its forward op (``trace/modules.py``). Computed once and cached."""
        return self._backward()[0]

    @property
    def backward_roots(self) -> tuple[np.ndarray, np.ndarray]:
        """The outermost backward ops charged to a module (indices, by position) and their host time (us) less the
        module frames inside them (a recomputed forward, counted as forward): their time counted once."""
        return self._backward()[1], self._backward()[2]

    def _backward(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if "backward_module" not in self._derived:
            self._derived["backward_module"] = backward_module_of_events(
                self.autograd, self.module, self.role, self.kind, self.rank, self.tid, self.ts, self.end,
                self.launcher)  # fmt: skip
        return self._derived["backward_module"]

    def cached(self, key: str, compute):
        """A value derived from this trace, computed by ``compute()`` the first time ``key`` is asked for."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]


def isin_few(values: np.ndarray, members) -> np.ndarray:
    """``np.isin(values, members)`` for a handful of members (event kinds): one comparison each, about
    ten times cheaper on a column of int8 kinds than np.isin's lookup table, which widens to intp."""
    result = np.zeros(np.shape(values), dtype=bool)
    for member in np.asarray(members).ravel().tolist():
        result |= values == member
    return result
