"""Blame: every idle millisecond of a step charged to what held the device back.

For each interval of a step in which the device is idle (streams merged, as ``step_device``
measures it), the device work that ends the interval is found, then the runtime call that
launched it (``correlation``) and the host thread that made that call. Then:

* the call started after the device went idle: the host was elsewhere until it launched.
  The host part ``[idle start, launch start)`` is charged to what that thread was doing,
  at the level a user can act on: a DataLoader fetch (``data_loading``), a dynamo/inductor
  compile range (``compile``), one-time work that ``onetime`` finds (``one_time_init``),
  a host collective (``collective_wait``), other launch calls (``launch_overhead``), else
  ``host_compute`` by the innermost ``record_function`` range (the optimizer step is one),
  else by the outermost op, else by the user's innermost Python function running (with Python
  stacks: "augment() in train.py:12"), else "host code between recorded ops";
* a sync on that thread that really waited (it started while device work was still running,
  and the device went idle inside it) takes the host part first, capped at what it drained
  (the device's busy time inside the sync): a sync that returned at once causes nothing.
  A sync inside a fetch, a compile range or one-time work (cuDNN's autotuning syncs) is
  charged to that work, not to ``sync``;
* the rest of the interval: the launch call itself is ``launch_overhead``; the work queued
  when the call returned but started later waited on the device, as below;
* the work was queued before the device went idle: it waited on something on the device.
  A collective kernel waited for its peers (``collective_wait``); a gap shorter than
  ``kernel_wait_us`` is the device's own dispatch (``launch_overhead``); a longer one waited
  on another stream or an event (``other_stream``);
* no later device work (a step's tail, the end of the trace): the host part is the whole
  interval, on the thread that launched the work before it (what the feeding thread did);
* no launch call (no ``correlation``, or one no launch call carries), or work that starts
  before its launch (clock skew): ``unexplained``, with a note.

A launch call that is itself one-time work (a first launch loading its module) is
``one_time_init``, not ``launch_overhead``.

Without step markers the units are the loop's iterations (``steps.inferred_iterations``),
else the whole window; ``RankBlame.unit`` says which. The categories of a step add up to its
idle time exactly.

A CPU-only trace has no device: there the compute the step waits on is the main thread's own
ops (the thread that marks the steps, else the one with the most op time), and its idle time
is the step's time outside them, or inside a DataLoader fetch, a host collective, a compile
range or one-time work, which the same rules charge (``RankBlame.waits_on`` says "main thread").
Python between ops is the host work that kept the ops from running: ``host_compute``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import LAUNCH_KINDS, Kind, kind_array
from ..trace.model import Trace, isin_few
from ..trace.roles import SYNC_ROLES, Role
from ..trace.stacks import is_user_file, parse_frame
from . import intervals, numeric
from .compile import compile_ranges
from .onetime import OneTimeResult
from .options import KERNEL_WAIT_US
from .steps import Step, StepSegmentation, judged_units, main_thread
from .syncs import inside_the_profiler
from .timeline import device_busy, device_events

CATEGORIES = (
    "data_loading", "host_compute", "compile", "sync", "launch_overhead", "collective_wait", "one_time_init",
    "other_stream", "unexplained",
)  # fmt: skip
CATEGORY_WORDS = {
    "data_loading": "waiting for the next batch (DataLoader fetch on the launching thread)",
    "host_compute": "host work on the launching thread (record_function range, op or Python between ops)",
    "compile": "torch.compile compiling (dynamo/inductor ranges)",
    "sync": "after a host-device sync that drained the queue (capped at what it drained)",
    "launch_overhead": "launch calls and the device's dispatch between queued kernels",
    "collective_wait": "a collective waiting for its peers (host collective, or a queued collective kernel)",
    "one_time_init": "one-time work (CUDA context, cuDNN autotuning, lazy loading)",
    "other_stream": "work queued in time that waited on another stream or an event",
    "unexplained": "no link to a cause in the trace (device work with no launch call, clock skew)",
}
PEER_WORDS = (
    "with several ranks compared, a rank's collective_wait is split by the peer that arrived last at each collective "
    "(\"rank N\": the time before it arrived), \"transfer\" (after the last arrival), \"arriving\" (the host side "
    "of a collective this rank itself reached last, before it did; on NCCL the host's wait in the collective's op or "
    "a sync after it counts as the collective's) and \"unmatched\" (in no collective matched across ranks); the "
    "terminal says whom it waited for mostly"
)
UNTRACED = "host code between recorded ops"
UNLINKED = "device work the trace links to no cause"
_LAUNCH = kind_array(LAUNCH_KINDS)
_LAUNCH_ROLES = (Role.LAUNCH, Role.GRAPH_LAUNCH)
_CAT = {name: code for code, name in enumerate(CATEGORIES)}
_WAITED_US = 1.0  # a sync during which the device ran less than this returned at once: it waited for nothing
_SYNC_TOLERANCE_US = 2.0  # the device may report going idle this long after the host's sync returned (clock alignment)
_TOP = 8  # contributors kept per rank


@dataclass(frozen=True)
class BlameOptions:
    kernel_wait_us: float = KERNEL_WAIT_US  # HTA's consecutive_kernel_delay: shorter gaps are the device's dispatch


@dataclass(frozen=True)
class Contributor:
    """One cause, at the level a user can act on, and the events that show it."""

    category: str
    label: str  # the range, op or sync call's name; UNTRACED for host time no op covers
    ms: float  # summed over the steps
    events: tuple[int, ...]  # evidence: the ranges, syncs or launches charged, most time first
    spans: tuple[tuple[float, float], ...] = ()  # where the time lies (kept for the host work after syncs)
    python: bool = False  # Python between ops, named by the user's function running it
    source: str = ""  # what the events are: "op", "range", "python", "allocator", "collective", "sync", "runtime"


@dataclass(frozen=True)
class PeerWait:
    """Collective wait blamed on one peer rank that arrived last at one collective (``peer`` None: the transfer
    after the last arrival, or time in no collective matched across ranks)."""

    peer: int | None
    part: str  # "rank N", "transfer", "arriving" or "unmatched"
    collective: str | None  # the collective's name in the trace; None for unmatched time
    location: str | None  # the user's line of the collective (None without Python stacks)
    ms: float  # summed over the steps


@dataclass(frozen=True)
class PeerSplit:
    """A rank's collective-wait time split by the peer it waited for: ``by_step_ms[i]`` sums to step i's
    collective wait; the part before a collective's last arrival is that rank's, the rest is the transfer."""

    by_step_ms: tuple[dict[str, float], ...]  # per step: "rank N" / "transfer" / "arriving" / "unmatched" -> ms
    total_ms: dict[str, float]
    top: tuple[PeerWait, ...]  # most time first

    @property
    def mostly(self) -> str | None:
        """The part holding most of the collective wait."""
        return max(self.total_ms, key=lambda key: self.total_ms[key]) if self.total_ms else None

    def to_dict(self, numbers: list[int] | tuple[int, ...], *, top: int = 5) -> dict:
        """Plain JSON: per step (``numbers``: the steps' numbers, in order), summed, and the largest parts."""
        count = max(len(numbers), 1)
        return {
            "mostly": self.mostly,
            "ms_per_step": {key: round(value / count, 4) for key, value in self.total_ms.items() if value > 0},
            "steps": [{"number": number, "ms": {key: round(value, 4) for key, value in split.items() if value > 0}}
                      for number, split in zip(numbers, self.by_step_ms)],  # fmt: skip
            "top": [{"waiting_for": item.part, "collective": item.collective, "location": item.location,
                     "ms_per_step": round(item.ms / count, 4)} for item in self.top[:top]],  # fmt: skip
        }


@dataclass(frozen=True)
class StepBlame:
    """One step's idle time by cause."""

    number: int
    start_us: float
    end_us: float
    idle_ms: float
    by_category_ms: dict[str, float]  # sums to idle_ms


@dataclass(frozen=True, eq=False)
class WaitSpans:
    """Pieces of idle time as columns, (step position, start, end) a row: a rank of 1 GB has some 300,000 collective
    waits, and they stay columns from ``blame`` to the worker's hand-off (``job.transfer``); iterating gives rows."""

    steps: np.ndarray  # int64
    starts: np.ndarray  # float64
    ends: np.ndarray  # float64

    @classmethod
    def of(cls, rows) -> WaitSpans:
        """From (step position, start, end) rows."""
        rows = list(rows)
        return cls(np.array([row[0] for row in rows], np.int64), np.array([row[1] for row in rows], np.float64),
                   np.array([row[2] for row in rows], np.float64))  # fmt: skip

    @classmethod
    def empty(cls) -> WaitSpans:
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))

    def middles(self) -> np.ndarray:
        return (self.starts + self.ends) / 2

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self):
        return zip(self.steps.tolist(), self.starts.tolist(), self.ends.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, (WaitSpans, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment] - equal to the tuple of its rows

    def __getstate__(self) -> dict:
        """To another process with the step positions as int32 (300,000 pieces a 1 GB rank: 1.2 MB less each)."""
        return {"steps": self.steps.astype(np.int32), "starts": self.starts, "ends": self.ends}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, steps=state["steps"].astype(np.int64))


@dataclass(frozen=True)
class RankBlame:
    """One rank's idle time by cause, per step and summed."""

    rank: int
    steps: tuple[StepBlame, ...]
    idle_ms: float  # over all steps
    by_category_ms: dict[str, float]  # sums to idle_ms
    contributors: tuple[Contributor, ...]  # the largest, across categories
    notes: tuple[str, ...]  # why some time is unexplained
    syncs_waited: tuple[int, ...] = ()  # sync calls that blocked while device work ran, outside fetches, compile and one-time work
    syncs_charged: tuple[int, ...] = ()  # of those, the ones charged with idle time after them, most time first
    after_syncs: tuple[Contributor, ...] = ()  # what the host ran while the idle time charged to syncs went by
    unit: str = "step"  # what ``steps`` are: marked steps, iterations inferred from the loop, or the whole window
    waits_on: str = "device"  # what was idle: the device, or (CPU-only) the main thread's compute
    collective_spans: WaitSpans = dataclasses.field(default_factory=WaitSpans.empty)  # where the collective waits lie
    peers: PeerSplit | None = None  # collective wait by the late peer rank (several ranks compared; see blame_peers)

    @property
    def share_pct(self) -> dict[str, float]:
        return {key: (100.0 * value / self.idle_ms if self.idle_ms > 0 else 0.0) for key, value in self.by_category_ms.items()}

    @property
    def ms_per_step(self) -> dict[str, float]:
        count = max(len(self.steps), 1)
        return {key: value / count for key, value in self.by_category_ms.items()}

    def top(self, category: str | None = None) -> list[Contributor]:
        return [item for item in self.contributors if category is None or item.category == category]

    def to_dict(self, *, top: int = 5) -> dict:
        """A plain summary for the report: ms per step and share by cause, each step's split, the top causes."""
        count = max(len(self.steps), 1)
        where = {} if self.waits_on == "device" else {"waits_on": self.waits_on}
        return {
            **where,
            "unit": self.unit,
            "idle_ms_per_step": round(self.idle_ms / count, 4),
            "ms_per_step": {key: round(value, 4) for key, value in self.ms_per_step.items() if value > 0},
            "share_pct": {key: round(value, 2) for key, value in self.share_pct.items() if value > 0},
            "steps": [{"number": step.number, "idle_ms": round(step.idle_ms, 4),
                       "ms": {key: round(value, 4) for key, value in step.by_category_ms.items() if value > 0}}
                      for step in self.steps],  # fmt: skip
            "top": [{"category": item.category, "label": item.label, "ms_per_step": round(item.ms / count, 4)}
                    for item in self.contributors[:top]],  # fmt: skip
            "notes": list(self.notes),
            **({"collective_wait_by_peer": self.peers.to_dict([step.number for step in self.steps], top=top)} if self.peers is not None else {}),
        }

    @property
    def dominant(self) -> str | None:
        """The category with the most idle time, when any."""
        if self.idle_ms <= 0:
            return None
        return max(self.by_category_ms, key=lambda key: self.by_category_ms[key])


@dataclass(frozen=True)
class BlameResult:
    """Idle time by cause for every rank; ``applies`` is False (with the reason) on a trace without device work."""

    ranks: dict[int, RankBlame]
    applies: bool = True
    reason: str | None = None

    def for_rank(self, rank: int) -> RankBlame | None:
        return self.ranks.get(rank)


def blame(
    trace: Trace, steps: StepSegmentation, *, one_time: OneTimeResult, options: BlameOptions = BlameOptions()
) -> BlameResult:
    """Idle time of every step charged to its causes, per rank (per inferred iteration without step markers).

    On a CPU-only trace the idle time is the main thread's, outside its compute (see the module's docstring).
    """
    labels = _Labels(trace, one_time)
    ranks = {}
    for rank in trace.rank_ids:
        rank_steps, unit = judged_units(trace, steps, rank)
        if not rank_steps:
            continue
        if trace.has_device:
            ranks[rank] = dataclasses.replace(_rank_blame(trace, rank, rank_steps, labels, options), unit=unit)
        else:
            found = _cpu_rank_blame(trace, rank, rank_steps, labels)
            if found is not None:
                ranks[rank] = dataclasses.replace(found, unit=unit, waits_on="main thread")
    return BlameResult(ranks)


# -- the idle intervals and the work that ends each ------------------------------------------------


@dataclass
class _Pieces:
    """Charged pieces of idle time: category, the event that shows it, its label (name id, -1 untraced), step."""

    category: list[np.ndarray]
    event: list[np.ndarray]
    label: list[np.ndarray]
    step: list[np.ndarray]
    length: list[np.ndarray]
    start: list[np.ndarray] = dataclasses.field(default_factory=list)  # where the piece begins; NaN when not kept

    def add(self, category, event, label, step, length, start=np.nan) -> None:
        size = len(length)
        self.start.append(np.broadcast_to(np.asarray(start, dtype=np.float64), size))
        self.category.append(np.broadcast_to(np.asarray(category, dtype=np.int64), size))
        self.event.append(np.broadcast_to(np.asarray(event, dtype=np.int64), size))
        self.label.append(np.broadcast_to(np.asarray(label, dtype=np.int64), size))
        self.step.append(np.broadcast_to(np.asarray(step, dtype=np.int64), size))
        self.length.append(np.asarray(length, dtype=np.float64))

    def arrays(self):
        if not self.length:
            empty_int = np.zeros(0, dtype=np.int64)
            return empty_int, empty_int, empty_int, empty_int, np.zeros(0)
        return tuple(np.concatenate(part) for part in (self.category, self.event, self.label, self.step, self.length))

    def collective_spans(self) -> WaitSpans:
        """(step position, start, end) of the collective-wait pieces whose place in time is known."""
        if not self.length:
            return WaitSpans.empty()
        category, step, length, start = (np.concatenate(part) for part in (self.category, self.step, self.length, self.start))
        keep = (category == _CAT["collective_wait"]) & np.isfinite(start) & (length > 0)
        return WaitSpans(step[keep], start[keep], (start + length)[keep])


def _rank_blame(trace: Trace, rank: int, rank_steps: list[Step], labels: "_Labels", options: BlameOptions) -> RankBlame:
    device = device_events(trace, rank)  # by start
    end = labels.end
    busy = device_busy(trace, rank)
    step_starts = np.array([step.start_us for step in rank_steps])
    step_ends = np.array([step.end_us for step in rank_steps])
    g0, g1, step_of = _idle_in_steps(busy, step_starts, step_ends)
    pieces = _Pieces([], [], [], [], [])
    notes: list[str] = []

    nxt, launcher, launched = _next_work(trace, device, g1)
    has_next = nxt >= 0
    launch_ts = np.where(launched, trace.ts[np.maximum(launcher, 0)], np.nan)
    launch_end = np.where(launched, end[np.maximum(launcher, 0)], np.nan)
    with np.errstate(invalid="ignore"):
        skewed = launched & (launch_ts > trace.ts[np.maximum(nxt, 0)])
    length = g1 - g0

    # no later device work (the step's tail, the trace's end): what the thread that fed the device did meanwhile
    tail = ~has_next
    feeder = _previous_launch(trace, device, end, g0[tail])
    fed = np.zeros(len(g0), dtype=bool)
    fed[np.flatnonzero(tail)[feeder >= 0]] = True
    _unexplained(pieces, notes, tail & ~fed, nxt, step_of, length,
                 "no later device work, and the work before it has no launch call")  # fmt: skip
    _unexplained(pieces, notes, has_next & ~launched, nxt, step_of, length,
                 "device work with no launch call linked to it (missing or unmatched correlation)")  # fmt: skip
    _unexplained(pieces, notes, skewed, nxt, step_of, length, "device work that starts before its launch call (clock skew)")
    ok = launched & ~skewed

    with np.errstate(invalid="ignore"):
        queued = ok & (launch_end <= g0)
        in_launch = ok & (launch_ts <= g0) & (launch_end > g0)
        host_late = ok & (launch_ts > g0)
    # queued in time: the device waited on something of its own
    is_comm = trace.kind[np.maximum(nxt, 0)] == Kind.COMM_KERNEL
    for mask, category in (
        (queued & is_comm, "collective_wait"),
        (queued & ~is_comm & (length < options.kernel_wait_us), "launch_overhead"),
        (queued & ~is_comm & (length >= options.kernel_wait_us), "other_stream"),
    ):
        pieces.add(_CAT[category], nxt[mask], trace.name[nxt[mask]], step_of[mask], length[mask], g0[mask])
    labels.charge_call(pieces, launcher[in_launch], step_of[in_launch], length[in_launch])

    # the host launched late: the host part on the launching thread, then the launch call and the work's wait
    host_end = np.minimum(launch_ts[host_late], g1[host_late])
    call_end = np.minimum(launch_end[host_late], g1[host_late])
    calls, late_next, late_step = launcher[host_late], nxt[host_late], step_of[host_late]
    part = call_end > host_end
    labels.charge_call(pieces, calls[part], late_step[part], (call_end - host_end)[part])
    waited = g1[host_late] - call_end  # queued when the call returned, started this much later
    dispatch = (waited > 0) & (waited < options.kernel_wait_us)
    pieces.add(_CAT["launch_overhead"], calls[dispatch], trace.name[calls[dispatch]], late_step[dispatch], waited[dispatch])
    for mask, category in ((is_comm[host_late], "collective_wait"), (~is_comm[host_late], "other_stream")):
        mask = mask & (waited >= options.kernel_wait_us)
        pieces.add(_CAT[category], late_next[mask], trace.name[late_next[mask]], late_step[mask], waited[mask], call_end[mask])
    labels.charge_host(pieces, rank, trace.tid[calls], g0[host_late], host_end, step_of[host_late], calls, busy)
    feeders = feeder[feeder >= 0]
    labels.charge_host(pieces, rank, trace.tid[feeders], g0[fed], g1[fed], step_of[fed], feeders, busy)

    return _summed(trace, rank, rank_steps, pieces, notes, length, step_of, labels, busy)


def _cpu_rank_blame(trace: Trace, rank: int, rank_steps: list[Step], labels: "_Labels") -> RankBlame | None:
    """A CPU-only rank: the main thread's ops are the compute; the step's time outside them is charged to what
    that thread was doing (a fetch, a collective, compiling, one-time work, a range, Python between ops)."""
    tid = main_thread(trace, rank)
    if tid is None:
        return None
    end = labels.end
    on_thread = (trace.rank == rank) & (trace.tid == tid)
    ops = np.flatnonzero(on_thread & (trace.kind == Kind.CPU_OP))
    waiting = on_thread & (isin_few(trace.kind, [Kind.DATALOADER, Kind.COMM_OP]) | labels.compile | labels.one_time)
    waits = np.flatnonzero(waiting)
    busy = intervals.difference(intervals.union(trace.ts[ops], end[ops]), intervals.union(trace.ts[waits], end[waits]))
    step_starts = np.array([step.start_us for step in rank_steps])
    step_ends = np.array([step.end_us for step in rank_steps])
    g0, g1, step_of = _idle_in_steps(busy, step_starts, step_ends)
    pieces = _Pieces([], [], [], [], [])
    h0, h1, host_step = _collective_elsewhere(trace, rank, tid, g0, g1, step_of, labels, pieces)
    no_call = np.full(len(h0), -1, dtype=np.int64)
    labels.charge_host(pieces, rank, np.full(len(h0), tid, dtype=np.int64), h0, h1, host_step, no_call, busy)
    return _summed(trace, rank, rank_steps, pieces, [], g1 - g0, step_of, labels, busy)


def _collective_elsewhere(trace: Trace, rank: int, tid: int, g0, g1, step_of, labels: "_Labels", pieces: _Pieces):
    """Idle time of the main thread that nothing recorded on it covers, while a collective runs on another of the
    rank's threads (gloo's, DDP's reducer): the thread waits for that collective. Charged as ``collective_wait``;
    the rest of the idle intervals is returned, for what the main thread was doing."""
    end = labels.end
    others = np.flatnonzero((trace.rank == rank) & (trace.tid != tid) & (trace.kind == Kind.COMM_OP))
    if len(others) == 0 or len(g0) == 0:
        return g0, g1, step_of
    comm = intervals.union(trace.ts[others], end[others])
    cuts = numeric.unique(np.concatenate([g0, g1, comm[0], comm[1]]))
    lows, highs = cuts[:-1], cuts[1:]
    middle = (lows + highs) / 2
    part = intervals.containing(g0, g1, middle)
    lows, highs, middle, part = lows[part >= 0], highs[part >= 0], middle[part >= 0], part[part >= 0]
    mine = np.flatnonzero((trace.rank == rank) & (trace.tid == tid) & isin_few(
        trace.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.COMM_OP]))  # fmt: skip
    recorded = intervals.union(trace.ts[mine], end[mine])
    waiting = (intervals.containing(*comm, middle) >= 0) & (intervals.containing(*recorded, middle) < 0)
    outer = _outermost_sorted(trace, end, others)
    owner = _lookup(trace, end, outer, middle[waiting])
    owner = np.where(owner >= 0, owner, others[0])
    pieces.add(_CAT["collective_wait"], owner, trace.name[owner], step_of[part[waiting]], (highs - lows)[waiting], lows[waiting])
    return lows[~waiting], highs[~waiting], step_of[part[~waiting]]


def _summed(trace: Trace, rank: int, rank_steps: list[Step], pieces: _Pieces, notes: list[str], length, step_of,
            labels: "_Labels", busy) -> RankBlame:  # fmt: skip
    """The charged pieces summed per step and category, with the largest contributors."""
    category, event, label, step, piece_length = pieces.arrays()
    by_step = np.bincount(step * len(CATEGORIES) + category, weights=piece_length,
                          minlength=len(rank_steps) * len(CATEGORIES)).reshape(len(rank_steps), len(CATEGORIES))  # fmt: skip
    step_idle = np.bincount(step_of, weights=length, minlength=len(rank_steps))
    step_blames = tuple(
        StepBlame(step.number, step.start_us, step.end_us, float(step_idle[i]) / 1000.0,
                  {name: float(by_step[i, code]) / 1000.0 for name, code in _CAT.items()})  # fmt: skip
        for i, step in enumerate(rank_steps)
    )
    total = by_step.sum(axis=0)
    charged = labels.take_charged()
    return RankBlame(
        rank=rank,
        steps=step_blames,
        idle_ms=float(length.sum()) / 1000.0,
        by_category_ms={name: float(total[code]) / 1000.0 for name, code in _CAT.items()},
        contributors=_contributors(trace, category, event, label, piece_length),
        notes=tuple(notes),
        syncs_waited=labels.waited_syncs(rank, busy),
        syncs_charged=charged,
        after_syncs=labels.take_after_syncs(),
        collective_spans=pieces.collective_spans(),
    )


def _idle_in_steps(busy, step_starts, step_ends) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, step position) of every idle interval inside the steps (steps are disjoint and sorted)."""
    gap_starts = np.concatenate([[-np.inf], busy[1]])
    gap_ends = np.concatenate([busy[0], [np.inf]])
    keep = gap_ends > gap_starts
    gap_starts, gap_ends = gap_starts[keep], gap_ends[keep]
    bounds = numeric.unique(np.concatenate([gap_starts, gap_ends, step_starts, step_ends]))
    bounds = bounds[np.isfinite(bounds)]
    lows, highs = bounds[:-1], bounds[1:]
    middle = (lows + highs) / 2
    in_gap = intervals.containing(gap_starts, gap_ends, middle) >= 0
    step = intervals.containing(step_starts, step_ends, middle)
    inside = in_gap & (step >= 0)
    lows, highs, step = lows[inside], highs[inside], step[inside]
    if len(lows) == 0:  # steps of no length (a one-event trace)
        return lows, highs, step
    # adjacent pieces of one gap in one step are one idle interval
    joined = np.ones(len(lows), dtype=bool)
    joined[1:] = (lows[1:] != highs[:-1]) | (step[1:] != step[:-1])
    first = np.flatnonzero(joined)
    last = np.append(first[1:] - 1, len(lows) - 1)
    return lows[first], highs[last], step[first]


def _next_work(trace: Trace, device: np.ndarray, instants: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The device work that ends each idle interval (the first to start at or after its end; -1: none), the
    runtime call that launched it (-1: none), and whether that call is a launch call."""
    position = np.searchsorted(trace.ts[device], instants, side="left")  # device is sorted by start
    has_next = position < len(device)
    nxt = np.where(has_next, device[np.minimum(position, len(device) - 1)], -1) if len(device) else np.full(len(instants), -1)
    launcher = np.where(has_next, trace.launcher[np.maximum(nxt, 0)], -1)
    launched = launcher >= 0
    launched[launched] = isin_few(trace.kind[launcher[launched]], _LAUNCH)
    return nxt, launcher, launched


def _previous_launch(trace: Trace, device: np.ndarray, end: np.ndarray, instants: np.ndarray) -> np.ndarray:
    """The launch call of the device work that ended last at or before each instant; -1 where unknown."""
    if len(device) == 0 or len(instants) == 0:
        return np.full(len(instants), -1, dtype=np.int64)
    by_end = device[np.argsort(end[device], kind="stable")]
    position = np.searchsorted(end[by_end], instants, side="right") - 1
    launcher = np.where(position >= 0, trace.launcher[by_end[np.maximum(position, 0)]], -1)
    known = launcher >= 0
    known[known] = isin_few(trace.kind[launcher[known]], _LAUNCH)
    return np.where(known, launcher, -1)


def _unexplained(pieces: _Pieces, notes: list[str], mask, nxt, step_of, length, why: str) -> None:
    if not mask.any():
        return
    pieces.add(_CAT["unexplained"], nxt[mask], -1, step_of[mask], length[mask])
    notes.append(f"{float(length[mask].sum()) / 1000.0:.3f} ms in {int(mask.sum())} idle interval(s): {why}")


# -- what the launching thread was doing -----------------------------------------------------------


class _Labels:
    """The host ranges of each thread by cause, looked up at any instant; the syncs that may have waited."""

    def __init__(self, trace: Trace, one_time: OneTimeResult) -> None:
        self.trace = trace
        self.end = trace.end  # computed once: each trace.end is a new array
        self.user_frame, self.frame_name = _user_frames(trace)
        host = np.flatnonzero(isin_few(trace.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER,
                                                             Kind.COMM_OP, Kind.RUNTIME, Kind.DRIVER]) | self.user_frame)  # fmt: skip
        keys = _thread_key(trace, host)
        order = np.argsort(keys, kind="stable")  # grouped by thread: each thread's events are one slice
        self.host, self.thread_key = host[order], keys[order]
        self.compile = np.zeros(len(trace), dtype=bool)
        self.compile[compile_ranges(trace)] = True
        self.one_time = np.zeros(len(trace), dtype=bool)
        costs = np.array([cost.event for work in one_time.ranks.values() for cost in work.costs], dtype=np.int64)
        self.one_time[costs] = True
        # launch calls made inside one-time work (the first aten::add's first cudaLaunchKernel loads its module)
        self.one_time_owner = np.full(len(trace), -1, dtype=np.int64)  # for each launch call, the one-time work holding it
        self.one_time_owner[costs] = costs
        calls = np.flatnonzero(isin_few(trace.kind, _LAUNCH))
        for cost in costs.tolist():  # a few slow first calls
            inside = (trace.ts[calls] >= trace.ts[cost]) & (self.end[calls] <= self.end[cost])
            inside &= (trace.tid[calls] == trace.tid[cost]) & (trace.rank[calls] == trace.rank[cost])
            self.one_time_owner[calls[inside]] = cost
        self.launches = np.zeros(len(trace), dtype=bool)
        launchers = trace.launcher[trace.launcher >= 0]
        self.launches[launchers] = True
        self.launch_named = isin_few(trace.role, _LAUNCH_ROLES)  # launches too, with or without work
        self.sync = isin_few(trace.role, SYNC_ROLES)  # INTERNAL_SYNC, the profiler's own, left out
        self.sync[inside_the_profiler(trace, np.flatnonzero(self.sync))] = False  # and its synchronous copies
        self.sync |= _pageable_dtoh_launches(trace)
        self.sync_events = np.flatnonzero(self.sync)
        # the work a sync inside belongs to: fetches, compile ranges, one-time work
        self.work = np.concatenate([np.flatnonzero(trace.kind == Kind.DATALOADER), np.flatnonzero(self.compile), costs])
        self._waited: dict[int, float] = {}
        self._after_sync = _Pieces([], [], [], [], [])  # the host work during the idle charged to syncs, by its cause

    def charge_call(self, pieces: _Pieces, calls, step_of, length) -> None:
        """Time in the launch calls themselves: launch overhead, or the one-time work that holds the call."""
        owner = self.one_time_owner[calls]
        first = owner >= 0  # a first launch loading its module, inside the op's one-time work
        event = np.where(first, owner, calls)
        category = np.where(first, _CAT["one_time_init"], _CAT["launch_overhead"])
        pieces.add(category, event, self.trace.name[event], step_of, length)

    def charge_host(self, pieces: _Pieces, rank: int, tids, starts, ends, step_of, calls, busy) -> None:
        """Charge the host parts ``[starts, ends)`` to what their launching threads were doing."""
        if len(starts) == 0:
            return
        keys = rank * (1 << 40) + tids.astype(np.int64)
        for key in numeric.unique(keys):
            mine = keys == key
            self._charge_thread(pieces, key, starts[mine], ends[mine], step_of[mine], calls[mine], busy)

    def _charge_thread(self, pieces: _Pieces, key, starts, ends, step_of, calls, busy) -> None:
        trace = self.trace
        on_thread = self.host[np.searchsorted(self.thread_key, key, "left"):np.searchsorted(self.thread_key, key, "right")]
        # a sync in progress when the device went idle, that drained work queued before it, takes its share first
        syncs = on_thread[self.sync[on_thread]]
        syncs = syncs[np.argsort(trace.ts[syncs], kind="stable")]
        end = self.end
        syncs = syncs[intervals.outermost(trace.ts[syncs], end[syncs], np.zeros(len(syncs), dtype=np.int64))]
        which = intervals.containing(trace.ts[syncs], end[syncs] + _SYNC_TOLERANCE_US, starts)
        which[which >= 0] = np.where(trace.ts[syncs[which[which >= 0]]] < starts[which >= 0], which[which >= 0], -1)
        found = which >= 0
        drained = np.zeros(len(starts))
        if found.any():
            sync_events = syncs[which[found]]
            drained[found] = intervals.busy_between(busy, trace.ts[sync_events], starts[found])
        charged = np.minimum(drained, ends - starts)
        waited = charged > 0
        sync_event = np.where(waited, syncs[np.maximum(which, 0)] if len(syncs) else -1, -1)
        rest_starts = starts + charged

        # only the ranges that overlap what is charged matter (and those holding the syncs' starts)
        probes = trace.ts[sync_event[waited]]
        probe_starts, probe_ends = intervals.union(np.concatenate([starts, probes]), np.concatenate([ends, probes + 1e-3]))
        on_thread = on_thread[_overlapping(trace.ts[on_thread], end[on_thread], probe_starts, probe_ends)]
        ranges = _ThreadRanges(trace, on_thread, self)
        # the sync's share goes to the work around it when it sits inside a fetch, a compile or one-time work
        if waited.any():
            events = sync_event[waited]
            category, owner = ranges.at(trace.ts[events])
            inside_work = isin_few(category, [_CAT["data_loading"], _CAT["compile"], _CAT["one_time_init"]])
            category = np.where(inside_work, category, _CAT["sync"])
            owner = np.where(inside_work, owner, events)
            label = np.where(inside_work, trace.name[np.maximum(owner, 0)], trace.name[events])
            pieces.add(category, owner, label, step_of[waited], charged[waited])
            for event, amount in zip(events[~inside_work].tolist(), charged[waited][~inside_work].tolist()):
                self._waited[event] = self._waited.get(event, 0.0) + amount
            synced = np.flatnonzero(waited)[~inside_work]  # the sync is the cause; the host work it exposed is named
            ranges.charge(self._after_sync, starts[synced], rest_starts[synced], step_of[synced], calls[synced])
        ranges.charge(pieces, rest_starts, ends, step_of, calls)

    def waited_syncs(self, rank: int, busy) -> tuple[int, ...]:
        """The rank's sync calls that blocked while device work ran (1 us or more of it), in time order; those
        inside a fetch, a compile range or one-time work (cuDNN's autotuning syncs) belong to that work."""
        trace = self.trace
        syncs = self.sync_events[trace.rank[self.sync_events] == rank]
        drained = intervals.busy_between(busy, trace.ts[syncs], self.end[syncs])
        syncs = syncs[drained >= _WAITED_US]
        syncs = syncs[~covered(trace, self.end, self.work, syncs)]
        return tuple(int(event) for event in syncs[np.argsort(trace.ts[syncs], kind="stable")])

    def take_charged(self) -> tuple[int, ...]:
        """The syncs charged since the last call (one rank's), most time first."""
        chosen = self._waited
        self._waited = {}
        return tuple(event for event, _ in sorted(chosen.items(), key=lambda item: -item[1]))

    def take_after_syncs(self) -> tuple[Contributor, ...]:
        """What the host ran during the idle time charged to syncs since the last call (one rank's), most first,
        each with the spans it ran in (where to look for its statement)."""
        pieces, self._after_sync = self._after_sync, _Pieces([], [], [], [], [])
        category, event, label, _, length = pieces.arrays()
        start = np.concatenate(pieces.start) if pieces.start else np.zeros(0)
        found = []
        for item in _contributors(self.trace, category, event, label, length):
            mine = (category == _CAT[item.category]) & np.isin(event, item.events)  # the spans of its top events
            spans = tuple(zip(start[mine].tolist(), (start + length)[mine].tolist()))
            found.append(dataclasses.replace(item, spans=spans))
        return tuple(found)


class _ThreadRanges:
    """One thread's host ranges as a timeline of causes: which cause and which range at any instant."""

    # priority: the first class that covers an instant takes it
    _CLASSES = ("data_loading", "compile", "one_time_init", "collective_wait", "launch_overhead", "runtime", "annotation",
                "op")  # fmt: skip

    def __init__(self, trace: Trace, events: np.ndarray, labels: _Labels) -> None:
        self.trace = trace
        self.end = labels.end
        kind = trace.kind[events]
        annotation = (kind == Kind.USER_ANNOTATION) & ~labels.compile[events]
        masks = {
            "data_loading": kind == Kind.DATALOADER,
            "compile": labels.compile[events],
            "one_time_init": labels.one_time[events],
            "collective_wait": kind == Kind.COMM_OP,
            "launch_overhead": labels.launches[events] & isin_few(kind, _LAUNCH),
            # other runtime calls (cudaMalloc growing the caching allocator, cudaHostAlloc, cudaEventQuery): named
            # themselves, as HTA's critical path names them, not by the range around them; syncs are judged above
            "runtime": isin_few(kind, _LAUNCH) & ~labels.launch_named[events] & ~labels.launches[events] & ~labels.sync[events],
            "annotation": annotation,
            "op": kind == Kind.CPU_OP,
        }
        self.classes = {name: events[mask] for name, mask in masks.items()}
        self.frames = events[labels.user_frame[events]]  # the user's Python functions: what runs between ops
        self.frame_name = labels.frame_name
        self._frames = _Innermost(trace, self.end, self.frames)
        self._outer = {name: _outermost_sorted(trace, self.end, found) for name, found in self.classes.items()
                       if name != "annotation"}  # fmt: skip
        self._inner = _Innermost(trace, self.end, self.classes["annotation"])

    def at(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(category code, range) at each instant; host_compute and -1 where nothing is recorded."""
        category = np.full(len(points), _CAT["host_compute"], dtype=np.int64)
        owner = np.full(len(points), -1, dtype=np.int64)
        open_ = np.ones(len(points), dtype=bool)
        for name in self._CLASSES:
            found = self._inner.at(points) if name == "annotation" else _lookup(self.trace, self.end, self._outer[name], points)
            hit = open_ & (found >= 0)
            category[hit] = _CAT["host_compute"] if name in ("runtime", "annotation", "op") else _CAT[name]
            owner[hit] = found[hit]
            open_ &= ~hit
        return category, owner

    def charge(self, pieces: _Pieces, starts, ends, step_of, calls) -> None:
        """Charge each [start, end) to the causes that cover it, piece by piece."""
        keep = ends > starts
        starts, ends, step_of, calls = starts[keep], ends[keep], step_of[keep], calls[keep]
        if len(starts) == 0:
            return
        order = np.argsort(starts, kind="stable")
        starts, ends, step_of, calls = starts[order], ends[order], step_of[order], calls[order]
        bounds = [starts, ends]
        for events in (*self.classes.values(), self.frames):
            inside = events[(self.end[events] > starts[0]) & (self.trace.ts[events] < ends[-1])]
            bounds += [self.trace.ts[inside], self.end[inside]]
        cuts = numeric.unique(np.concatenate(bounds))
        lows, highs = cuts[:-1], cuts[1:]
        middle = (lows + highs) / 2
        part = intervals.containing(starts, ends, middle)
        inside = part >= 0
        lows, highs, middle, part = lows[inside], highs[inside], middle[inside], part[inside]
        category, owner = self.at(middle)
        # host time no op covers: the Python between ops, named by the user's innermost function running it (with
        # Python stacks); without one, the launch that ended it shows where
        between = (owner < 0) & (category == _CAT["host_compute"])
        owner[between] = self._frames.at(middle[between])
        untraced = owner < 0
        evidence = np.where(untraced, calls[part], owner)
        label = np.where(untraced, -1, self.frame_name[self.trace.name[np.maximum(owner, 0)]])
        pieces.add(category, evidence, label, step_of[part], highs - lows, lows)


def _user_frames(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Which events are Python frames of the user's own code (``python_function`` events of ``with_stack``), and
    each name id's label: one name for a function the tracer names at several lines (a frame open when recording
    began is named at its current line: "train.py(18): step" and "train.py(19): step"), the first; others as is."""
    mask = np.zeros(len(trace), dtype=bool)
    label = np.arange(len(trace.names), dtype=np.int64)
    python = np.flatnonzero(trace.kind == Kind.PYTHON)
    if len(python) == 0:
        return mask, label
    mine: dict[int, tuple[str, str]] = {}  # name id -> (file, function)
    first: dict[tuple[str, str], tuple[int, int]] = {}  # (file, function) -> (lowest line, its name id)
    for name in numeric.unique(trace.name[python]).tolist():
        parsed = parse_frame(trace.names[name])
        if parsed is not None and is_user_file(parsed[0]):
            key = mine[name] = (parsed[0], parsed[2])
            first[key] = min(first.get(key, (parsed[1], name)), (parsed[1], name))
    for name, key in mine.items():
        label[name] = first[key][1]
    mask[python[numeric.isin(trace.name[python], list(mine))]] = True
    return mask, label


def frame_label(text: str) -> str:
    """A Python frame as the trace names it ("train.py(12): augment") as a cause: "augment() in train.py:12"; a
    comprehension: "<listcomp> in train.py:30"; the module's own code: "module level of train.py"."""
    parsed = parse_frame(text)
    if parsed is None:
        return text
    path, line, function = parsed
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    if function == "<module>":
        return f"module level of {name}"
    return f"{function} in {name}:{line}" if function.startswith("<") else f"{function}() in {name}:{line}"


def _outermost_sorted(trace: Trace, end: np.ndarray, events: np.ndarray) -> np.ndarray:
    events = events[np.argsort(trace.ts[events], kind="stable")]
    return events[intervals.outermost(trace.ts[events], end[events], np.zeros(len(events), dtype=np.int64))]


def _lookup(trace: Trace, end: np.ndarray, events: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The event of sorted, disjoint ``events`` holding each instant; -1 outside."""
    found = intervals.containing(trace.ts[events], end[events], points)
    return np.where(found >= 0, events[np.maximum(found, 0)] if len(events) else -1, -1)


class _Innermost:
    """The innermost of properly nested ranges (record_function ranges on one thread) at any instant.

    Ranges sorted by start (longest first) have a depth (how many ranges hold their start); at an
    instant held by D ranges, the innermost is the last range started before it at depth D - 1.
    """

    def __init__(self, trace: Trace, end: np.ndarray, events: np.ndarray) -> None:
        self.events = events[np.lexsort((-trace.dur[events], trace.ts[events]))]
        self.starts = trace.ts[self.events]
        self.ends = end[self.events]
        count = len(self.events)
        self.sorted_ends = np.sort(self.ends)
        depth = np.arange(count) - np.searchsorted(self.sorted_ends, self.starts, side="right")
        self.keys = np.sort(depth * (count + 1) + np.arange(count))

    def at(self, points: np.ndarray) -> np.ndarray:
        count = len(self.events)
        if count == 0:
            return np.full(len(points), -1, dtype=np.int64)
        last = np.searchsorted(self.starts, points, side="right") - 1
        holding = (last + 1) - np.searchsorted(self.sorted_ends, points, side="right")
        level = holding - 1
        position = np.searchsorted(self.keys, level * (count + 1) + last, side="right") - 1
        valid = (holding > 0) & (position >= 0)
        key = self.keys[np.maximum(position, 0)]
        valid &= key // (count + 1) == level
        index = key % (count + 1)
        valid &= (self.starts[np.minimum(index, count - 1)] <= points) & (self.ends[np.minimum(index, count - 1)] > points)
        return np.where(valid, self.events[np.minimum(index, count - 1)], -1)


def covered(trace: Trace, end: np.ndarray, ranges: np.ndarray, events: np.ndarray) -> np.ndarray:
    """Which events start inside one of ``ranges`` on their own host thread."""
    return holding_range(trace, end, ranges, events) >= 0


def holding_range(trace: Trace, end: np.ndarray, ranges: np.ndarray, events: np.ndarray) -> np.ndarray:
    """For each event, a number for the (merged, outermost) range holding its start on its thread; -1 outside.

    Events with the same number are inside the same range: one ``.item()`` that made two sync calls.
    """
    if len(ranges) == 0 or len(events) == 0:
        return np.full(len(events), -1, dtype=np.int64)
    keys = numeric.unique(np.concatenate([_thread_key(trace, ranges), _thread_key(trace, events)]))
    origin = float(min(trace.ts[ranges].min(), trace.ts[events].min()))
    span = float(max(end[ranges].max(), trace.ts[events].max())) - origin + 1.0

    def on_one_axis(found: np.ndarray, times: np.ndarray) -> np.ndarray:  # threads side by side on one time axis
        return (times - origin) + np.searchsorted(keys, _thread_key(trace, found)) * span

    union = intervals.union(on_one_axis(ranges, trace.ts[ranges]), on_one_axis(ranges, end[ranges]))
    return intervals.containing(*union, on_one_axis(events, trace.ts[events]))


def _overlapping(starts: np.ndarray, ends: np.ndarray, union_starts: np.ndarray, union_ends: np.ndarray) -> np.ndarray:
    """Which [start, end) ranges overlap one of the sorted, disjoint union intervals."""
    index = np.searchsorted(union_starts, ends, side="left") - 1
    return (index >= 0) & (union_ends[np.maximum(index, 0)] > starts)


def _thread_key(trace: Trace, events: np.ndarray) -> np.ndarray:
    return trace.rank[events].astype(np.int64) * (1 << 40) + trace.tid[events].astype(np.int64)


def _pageable_dtoh_launches(trace: Trace) -> np.ndarray:
    """Launch calls of copies into pageable host memory: such a copy returns only when done, as a sync does."""
    mask = np.zeros(len(trace), dtype=bool)
    copies = np.flatnonzero(trace.role == Role.PAGEABLE_DTOH)
    launcher = trace.launcher[copies]
    mask[launcher[launcher >= 0]] = True
    return mask


def _contributors(trace: Trace, category, event, label, length) -> tuple[Contributor, ...]:
    """The largest causes: time by (category, label), with the events that took most of it."""
    if len(length) == 0:
        return ()
    group = category * (len(trace.names) + 1) + (label + 1)
    keys = numeric.unique(group)
    inverse = np.searchsorted(keys, group)
    totals = np.bincount(inverse, weights=length)
    result = []
    for position in np.argsort(-totals, kind="stable")[:_TOP]:
        if totals[position] <= 0:
            break
        mine = inverse == position
        events, per_event = _sum_by(event[mine], length[mine])
        events = events[np.argsort(-per_event, kind="stable")][:5]
        code, name = divmod(int(keys[position]), len(trace.names) + 1)
        text = trace.names[name - 1] if name > 0 else (UNLINKED if CATEGORIES[code] == "unexplained" else UNTRACED)
        python = bool(len(events)) and trace.kind[events[0]] == Kind.PYTHON
        source = _source(trace, int(events[0])) if len(events) and events[0] >= 0 else ""
        result.append(Contributor(CATEGORIES[code], frame_label(text) if python else text, float(totals[position]) / 1000.0,
                                  tuple(int(e) for e in events if e >= 0), python=python, source=source))  # fmt: skip
    return tuple(result)


_SOURCES = {Role.ALLOCATOR: "allocator", Role.COLLECTIVE: "collective", Role.USER_SYNC: "sync",
            Role.SYNC_COPY: "sync", Role.ITEM: "sync"}  # fmt: skip
_KIND_SOURCES = {Kind.PYTHON: "python", Kind.CPU_OP: "op", Kind.USER_ANNOTATION: "range", Kind.RUNTIME: "runtime",
                 Kind.DRIVER: "runtime", Kind.DATALOADER: "range", Kind.COMM_OP: "collective"}  # fmt: skip


def _source(trace: Trace, event: int) -> str:
    """What a contributor's event is, for the fix its cause calls for (a cudaFree is not Python to move)."""
    return _SOURCES.get(Role(int(trace.role[event])), _KIND_SOURCES.get(Kind(int(trace.kind[event])), ""))


def _sum_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    distinct = numeric.unique(keys)
    inverse = np.searchsorted(distinct, keys)
    return distinct, np.bincount(inverse, weights=values)
