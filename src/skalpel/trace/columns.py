"""Turn batches of decoded events into numpy columns, a whole batch at a time.

Each field becomes a column with one list comprehension and one numpy conversion;
per-event Python work is limited to dict look-ups (interned names, a cache of the
kind of each (category, name) pair). Irregular values (string pids, numeric
strings, nulls) take a slower per-value path only in the batches that have them.

Each batch is copied into one array per column that grows in place (``_Column``), so
memory is the final columns plus one batch: never the batches and their join at once.
"""

from __future__ import annotations

import math
import mmap

import numpy as np
import orjson

from .events import EMPTY, MISSING, PHASES, Event, decode_args, decode_memory_args, full_args
from .kinds import DEVICE_KIND_ARRAY, DEVICE_KINDS, Kind, classify, kind_array, legacy_category

_KEPT_ARG_KINDS = np.array([Kind.COMM_OP, Kind.COMM_KERNEL, Kind.DEVICE_SYNC, Kind.MEMCPY], np.int8)
_ON_DEVICE = kind_array(DEVICE_KINDS | {Kind.DEVICE_SYNC, Kind.GPU_ANNOTATION})
# ops whose inputs' dtypes are kept ('Input type'): the matrix multiplies and convolutions, whose precision decides
# their speed (analysis/precision.py), and the elementwise ops and softmax the roofline judges (analysis/roofline.py)
MATMUL_TYPED = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution")
ELEMENTWISE_TYPED = ("aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::relu",
                     "aten::relu_", "aten::gelu", "aten::silu", "aten::sigmoid", "aten::tanh", "aten::exp")  # fmt: skip
SOFTMAX_TYPED = ("aten::_softmax",)
TYPED_OPS = MATMUL_TYPED + ELEMENTWISE_TYPED + SOFTMAX_TYPED
_MOVES_BYTES = np.array([Kind.MEMCPY, Kind.MEMSET], np.int8)
_FLOW_CATEGORIES = ("ac2g", "async")
COLUMNS = ("ts", "dur", "kind", "name", "pid", "tid", "device", "stream", "correlation", "external_id",
           "stack", "shapes", "nbytes", "autograd")  # fmt: skip
MEMORY_COLUMNS = ("ts", "nbytes", "total_allocated", "total_reserved", "device_type", "device_id", "tid", "addr")


class Interner(dict):
    """str -> id, adding unseen strings to ``names`` (looked up at C speed, filled on a miss)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __missing__(self, text: str) -> int:
        index = self[text] = len(self.names)
        self.names.append(text)
        return index


class _KindCache(dict):
    """(category id << 32 | name id) -> Kind value, classifying each pair once.

    Most names come with one category throughout a trace, so each name id also notes the
    first category it came with and that pair's kind: a batch's kinds are then two array
    look-ups, and only a name seen in another category goes through the dict.
    """

    def __init__(self, names: list[str], categories: list) -> None:
        super().__init__()
        self.names, self.categories = names, categories
        self.category_of_name = np.zeros(0, np.int64)  # -1: not seen yet
        self.kind_of_name = np.zeros(0, np.int8)

    def __missing__(self, key: int) -> int:
        kind = self[key] = int(classify(self.categories[key >> 32], self.names[key & 0xFFFFFFFF], "X"))
        return kind

    def of(self, categories: np.ndarray, name_ids: np.ndarray) -> np.ndarray:
        if len(name_ids) and int(name_ids.max()) >= len(self.kind_of_name):
            grown = max(2 * len(self.kind_of_name), int(name_ids.max()) + 1, 1024)
            self.category_of_name = np.concatenate([self.category_of_name, np.full(grown - len(self.category_of_name), -1)])
            self.kind_of_name = np.concatenate([self.kind_of_name, np.zeros(grown - len(self.kind_of_name), np.int8)])
        kinds = self.kind_of_name[name_ids]
        others = np.flatnonzero(self.category_of_name[name_ids] != categories)
        if len(others):
            keys = (categories[others] << 32) | name_ids[others]
            unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            found = np.array([self[key] for key in unique.tolist()], np.int8)
            kinds[others] = found[inverse]
            new = self.category_of_name[name_ids[others][first]] < 0  # names met for the first time: note them
            self.category_of_name[name_ids[others][first][new]] = categories[others][first][new]
            self.kind_of_name[name_ids[others][first][new]] = found[new]
        return kinds


class _ShapeIds(dict):
    """Raw 'Input Dims' JSON bytes -> id of its compact JSON text in the interner (-1 when empty)."""

    def __init__(self, interner: Interner) -> None:
        super().__init__()
        self.interner = interner

    def __missing__(self, raw: bytes) -> int:
        try:
            value = orjson.loads(raw)
            text = orjson.dumps(value).decode() if value else ""
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # not JSON, or nested hundreds deep
            text = ""
        index = self[raw] = self.interner[text] if text else -1
        return index


class ColumnBuilder:
    """Accumulates one file's events into numpy columns, interning names as it goes."""

    def __init__(self) -> None:
        self.interner = Interner()
        self._categories = Interner()
        self._kinds = _KindCache(self.interner.names, self._categories.names)
        self._shapes = _ShapeIds(self.interner)
        self._columns = {key: _Column(_DTYPES.get(key, np.int64)) for key in COLUMNS}
        self._memory_columns = {key: _Column(_MEMORY_DTYPES.get(key, np.int64)) for key in MEMORY_COLUMNS}
        self.extra: dict[int, dict] = {}
        self.count = 0
        self.skipped = 0
        self.seen = 0  # objects decoded from the events array
        self.phased = False  # whether any of them had a 'ph' (phase), as every trace event does
        self.unphased = 0  # objects without a 'ph' (or with one that is not a string): ignored
        self.unknown_phases: dict[str, int] = {}  # phases the Trace Event Format does not define: ignored
        self._flow_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._uncorrelated: list[np.ndarray] = []

    @property
    def names(self) -> list[str]:
        return self.interner.names

    def nbytes(self) -> int:
        """Memory taken by the columns built so far (the arrays, not the names or the kept args)."""
        return sum(column.nbytes for column in [*self._columns.values(), *self._memory_columns.values()])

    def add(self, events: list[Event]) -> None:
        self.seen += len(events)
        phases = [e.ph for e in events]  # a comprehension reads a struct's field faster than map(attrgetter)
        present = set(phases)  # tiny: the filters below run only for the phases a batch has
        unphased = phases.count(None) if None in present else 0
        self.unphased += unphased
        self.phased = self.phased or unphased < len(events)
        for phase in present - PHASES:  # counted at C speed
            if phase is not None:
                self.unknown_phases[phase] = self.unknown_phases.get(phase, 0) + phases.count(phase)
        codes = _phase_codes(phases) if present <= PHASES else None
        if "X" in present:
            self._add_ranges(_of_phases(events, phases, codes, "X"))
        if "i" in present or "I" in present:
            memory = [e for e in _of_phases(events, phases, codes, "i", "I") if e.name == "[memory]"]
            if memory:
                self._add_memory(memory)
        if "f" in present:
            flows = [e for e in _of_phases(events, phases, codes, "f") if e.cat in _FLOW_CATEGORIES]
            if flows:
                self._add_flow_ends(flows)

    def _add_ranges(self, events: list[Event]) -> None:
        cats = [e.cat for e in events]
        if "Trace" in cats:  # the profiler's own spans
            events = [e for e in events if e.cat != "Trace"]
            cats = [e.cat for e in events]
        ts = _floats([e.ts for e in events])
        dur = _floats([e.dur for e in events])
        names = [e.name for e in events]
        valid = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
        if not valid.all() or None in names:
            valid &= np.array([name is not None for name in names], bool)
            self.skipped += len(events) - int(valid.sum())
            events = [e for e, ok in zip(events, valid.tolist()) if ok]
            ts, dur, names, cats = ts[valid], dur[valid], [e.name for e in events], [e.cat for e in events]
        if not events:
            return
        interner, categories = self.interner, self._categories
        # map over the interner's own look-up: no Python frame per event (a name not seen yet goes to __missing__)
        name = np.fromiter(map(interner.__getitem__, names), np.int32, len(names))
        if None in cats:  # no category: maybe the pre-Kineto exporter's, which put it in the pid
            cats = [legacy_category(e.cat, e.pid) for e in events]
        kind = self._kinds.of(np.fromiter(map(categories.__getitem__, cats), np.int64, len(cats)), name)
        pid = self._ids([e.pid for e in events])
        tid = self._ids([e.tid for e in events])
        no_args = kind == Kind.PYTHON  # python_function args (Python ids) hold nothing skalpel reads
        if no_args.any():
            args = decode_args([EMPTY if skip else e.args for e, skip in zip(events, no_args.tolist())])
        else:
            args = decode_args([e.args for e in events])
        correlation = _ints([a.correlation for a in args], 0)
        external = _ints([a.external for a in args], 0)
        if not external.all():
            external = np.where(external != 0, external, _ints([a.external_lower for a in args], 0))
        # device, stream and bytes are read only where they mean something: on the device rows, the copy rows
        on_device = np.flatnonzero(np.isin(kind, _ON_DEVICE))
        device, stream = np.full(len(events), -1, np.int64), np.full(len(events), -1, np.int64)
        if len(on_device):
            device_args = [args[index] for index in on_device.tolist()]
            given = _ints([a.device for a in device_args], MISSING)
            device[on_device] = np.where(given == MISSING, pid[on_device], given)
            given = _ints([a.stream for a in device_args], MISSING)
            stream[on_device] = np.where(given == MISSING, tid[on_device], given)
        nbytes = np.zeros(len(events), np.int64)
        moves = np.flatnonzero(np.isin(kind, _MOVES_BYTES))
        if len(moves):
            nbytes[moves] = _ints([args[index].nbytes for index in moves.tolist()], 0)
        autograd = _autograd_ids(kind, args)
        columns = {
            "ts": ts, "dur": dur, "kind": kind, "name": name, "pid": pid, "tid": tid, "device": device, "stream": stream,
            "correlation": correlation, "external_id": external,
            "stack": self._stack_ids([a.stack for a in args]),
            "shapes": self._shape_ids([a.dims for a in args]),
            "nbytes": nbytes,
            "autograd": autograd,
        }  # fmt: skip
        for key, values in columns.items():
            self._columns[key].append(values)
        kept = np.flatnonzero(np.isin(kind, _KEPT_ARG_KINDS)).tolist()
        if kept:
            whole = full_args([events[index].args for index in kept])
            self.extra.update(zip([self.count + index for index in kept], whole))
        flops = [a.flops for a in args]  # with_flops: few ops carry a count, kept beside their other args
        if flops.count(0) < len(flops):
            counts = _ints(flops, 0)
            for index in np.flatnonzero(counts > 0).tolist():
                self.extra.setdefault(self.count + index, {})["flops"] = float(counts[index])
        self._keep_types(name, args)
        uncorrelated = np.flatnonzero(np.isin(kind, DEVICE_KIND_ARRAY) & (correlation == 0))
        if len(uncorrelated):
            self._uncorrelated.append(uncorrelated + self.count)
        self.count += len(events)

    def _keep_types(self, name: np.ndarray, args: list) -> None:
        """The inputs' dtypes ('Input type', record_shapes) of the matmul and convolution ops, beside their other
        args: the precision they ran in. Other ops' types are not kept (most events have them)."""
        ids = [found for op in TYPED_OPS if (found := self.interner.get(op)) is not None]
        if not ids:
            return
        for index in np.flatnonzero(np.isin(name, ids)).tolist():
            raw = args[index].types
            if raw:
                try:
                    types = orjson.loads(bytes(raw))
                except orjson.JSONDecodeError:
                    continue
                if isinstance(types, list):
                    self.extra.setdefault(self.count + index, {})["types"] = types

    def _add_memory(self, events: list[Event]) -> None:
        usable = [e for e in events if e.args and e.ts is not None and math.isfinite(e.ts)]
        self.skipped += len(events) - len(usable)
        events = usable
        if not events:
            return
        args = decode_memory_args([e.args for e in events])
        parts = self._memory_columns
        parts["ts"].append(_floats([e.ts for e in events]))
        parts["nbytes"].append(_ints([a.nbytes for a in args], 0))
        parts["total_allocated"].append(_ints([a.total_allocated for a in args], -1))
        parts["total_reserved"].append(_ints([a.total_reserved for a in args], -1))
        parts["device_type"].append(np.clip(_ints([a.device_type for a in args], 0), -128, 127).astype(np.int8))
        parts["device_id"].append(np.clip(_ints([a.device_id for a in args], -1), -32768, 32767).astype(np.int16))
        parts["tid"].append(self._ids([e.tid for e in events]))
        parts["addr"].append(_ints([a.addr for a in args], -1))

    def _add_flow_ends(self, events: list[Event]) -> None:
        ts = _floats([e.ts for e in events])
        ids = _ints([e.id for e in events], 0)
        keep = np.isfinite(ts) & (ids != 0)
        pid, tid = self._ids([e.pid for e in events]), self._ids([e.tid for e in events])
        self._flow_parts.append((pid[keep], tid[keep], ts[keep], ids[keep]))

    def _stack_ids(self, stacks: list) -> np.ndarray:
        """Call stacks as name ids, -1 where none (most traces have none at all)."""
        if stacks.count(None) == len(stacks):
            return np.full(len(stacks), -1, np.int32)
        return np.fromiter([self.interner[text] if text else -1 for text in stacks], np.int32, len(stacks))

    def _shape_ids(self, dims: list) -> np.ndarray:
        """'Input Dims' as name ids of their JSON, -1 where none (traces recorded without shapes have none at all)."""
        if dims.count(EMPTY) == len(dims):
            return np.full(len(dims), -1, np.int32)
        shapes = self._shapes
        return np.fromiter([shapes[bytes(raw)] if raw else -1 for raw in dims], np.int32, len(dims))

    def _ids(self, values: list) -> np.ndarray:
        """Pids and tids: integers, numeric strings, or labels such as 'stream 7' or 'Spans'."""
        try:
            return np.fromiter(values, np.int64, len(values))
        except (TypeError, ValueError, OverflowError):
            return np.array([self._id(value) for value in values], np.int64)

    def _id(self, value: object) -> int:
        if isinstance(value, int) and -(2**63) <= value < 2**63:
            return value
        if isinstance(value, str):
            if value.isdigit():
                return _clamp(int(value))
            tail = value.rsplit(" ", 1)[-1]
            if tail.isdigit():
                return _clamp(int(tail))
            return -1 - self.interner[value]
        return 0

    def finish(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The columns, with device events that lack a 'correlation' arg linked through their flow."""
        columns = {key: column.finish() for key, column in self._columns.items()}
        memory = {key: column.finish() for key, column in self._memory_columns.items()}
        if self._uncorrelated and self._flow_parts:
            pid, tid, ts, ids = (np.concatenate(part).tolist() for part in zip(*self._flow_parts))
            flow_ends = dict(zip(zip(pid, tid, ts), ids))
            indices = np.concatenate(self._uncorrelated)
            keys = zip(columns["pid"][indices].tolist(), columns["tid"][indices].tolist(), columns["ts"][indices].tolist())
            columns["correlation"][indices] = np.array([flow_ends.get(key, 0) for key in keys], np.int64)
        return columns, memory


def _autograd_ids(kind: np.ndarray, args: list) -> np.ndarray:
    """The 'Sequence number' of each cpu op as ``2 * n`` on a forward op and ``2 * n + 1`` on a backward one
    (its 'Fwd thread id' set), -1 elsewhere: a backward op and the forward op that made its node share ``n``."""
    autograd = np.full(len(kind), -1, np.int64)
    sequence = [a.sequence for a in args]  # one pass over all: cheaper than picking the cpu ops first
    if sequence.count(-1) == len(sequence):  # a trace without autograd's numbers (inference, old torch)
        return autograd
    numbers = _ints(sequence, -1)
    numbered = np.flatnonzero((numbers >= 0) & (kind == Kind.CPU_OP))
    backward = _ints([args[index].fwd_thread for index in numbered.tolist()], 0) != 0
    autograd[numbered] = 2 * numbers[numbered] + backward
    return autograd


def _phase_codes(phases: list[str]) -> np.ndarray:
    """The phases (one ASCII letter each: ``PHASES``) as bytes, to pick a batch's events of a phase with one
    comparison instead of reading every event's phase again."""
    return np.frombuffer("".join(phases).encode("ascii"), np.uint8)


def _of_phases(events: list[Event], phases: list, codes: np.ndarray | None, *wanted: str) -> list[Event]:
    """The events of the ``wanted`` phases, in order; ``codes`` from ``_phase_codes``, None where a phase is not
    one of the format's."""
    if codes is None:
        return [e for e, phase in zip(events, phases) if phase in wanted]
    picked = codes == ord(wanted[0])
    for phase in wanted[1:]:
        picked |= codes == ord(phase)
    return events if picked.all() else [events[index] for index in np.flatnonzero(picked).tolist()]


_DTYPES = {"ts": np.float64, "dur": np.float64, "kind": np.int8, "name": np.int32, "stack": np.int32,
           "shapes": np.int32, "device": np.int32}  # fmt: skip
_MEMORY_DTYPES = {"ts": np.float64, "device_type": np.int8, "device_id": np.int16}


class _Column:
    """One column, filled batch by batch into an anonymous memory map that grows in place.

    Growing remaps the pages (``mremap``): no copy, no second array, and room not yet
    written is address space, not memory. A map is outside the C heap, so it leaves no
    freed holes there (per-batch arrays joined at the end left some 100 MB of them on a
    311 MB trace, beside the joined columns). ``finish`` trims the map to the rows and
    hands it out as the column.
    """

    __slots__ = ("dtype", "map", "size")

    def __init__(self, dtype: type) -> None:
        self.dtype = np.dtype(dtype)
        self.map: mmap.mmap | None = None
        self.size = 0

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def append(self, values: np.ndarray) -> None:
        if not len(values):
            return
        needed = (self.size + len(values)) * self.dtype.itemsize
        try:
            if self.map is None:
                self.map = mmap.mmap(-1, max(needed, _FIRST_BYTES), flags=mmap.MAP_PRIVATE)  # private: mremap grows it
            elif needed > len(self.map):
                self.map.resize(max(needed, 2 * len(self.map)))  # only while no array views it
                if len(self.map) >= _HUGE_PAGE_BYTES and _HUGE_PAGES is not None:
                    # Filled page by page, a column of 100s of MB costs a page fault each 4 KiB (a third of the
                    # copy's time); a kernel that offers huge pages on request (THP "madvise") faults each 2 MiB.
                    self.map.madvise(_HUGE_PAGES)
        except OSError as error:  # ENOMEM from mmap or mremap: out of memory like any allocation
            raise MemoryError(f"cannot map {needed:,} bytes for a column") from error
        rows = np.frombuffer(self.map, self.dtype, len(values), self.nbytes)
        rows[:] = values  # cast to the column's type
        del rows
        self.size += len(values)

    def finish(self) -> np.ndarray:
        if self.map is None:
            return np.zeros(0, self.dtype)
        self.map.resize(self.nbytes)
        return np.frombuffer(self.map, self.dtype)


_FIRST_BYTES = 1 << 16
_HUGE_PAGE_BYTES = 4 << 20
_HUGE_PAGES = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only


def _floats(values: list) -> np.ndarray:
    """Floats at C speed; nulls become NaN."""
    try:
        return np.fromiter(values, np.float64, len(values))
    except (TypeError, ValueError):
        return np.array(values, np.float64)


def _ints(values: list, default: int) -> np.ndarray:
    """Integer args: ints at C speed; floats, numeric strings and nulls one by one."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        return np.array([_int_value(value, default) for value in values], np.int64)


def _int_value(value: object, default: int) -> int:
    if isinstance(value, int):
        return _clamp(value)
    if isinstance(value, float) and value == value and abs(value) < 9e18:
        return int(value)
    if isinstance(value, str):
        try:
            return _clamp(int(value, 0))
        except ValueError:
            return default
    return default


def _clamp(value: int) -> int:
    return max(-(2**63), min(2**63 - 1, value))
