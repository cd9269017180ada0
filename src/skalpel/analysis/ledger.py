"""The ledger: every millisecond of every unit, on the host's main thread and on the device, charged to one cause.

A unit is what a rank is judged over (``steps.judged_units``): a marked step; without markers an
iteration inferred from the loop; else the whole window. For each unit there are two lanes:

* **device** (every stream of the rank merged, where the trace recorded device work): the time it
  is busy, by what runs (``compute``, ``backward``, ``optimizer`` by the op that launched the
  kernel, ``collective``, ``transfer``, ``one_time`` for work launched inside one-time work), and
  the time it is idle, by what held it back, as ``blame`` charges it (``data_wait``, ``host_work``,
  ``compile``, ``sync_wait``, ``launch_overhead``, ``collective_wait``, ``one_time``,
  ``other_stream``, ``unrecorded``). Overlapping work counts once, for the first cause in
  ``DEVICE_CAUSES`` order: compute hides the collective and the copy beside it.
* **host** (the rank's main thread: the one that marks steps, else the one with the most op time):
  at each instant the first cause in ``HOST_CAUSES`` order among the events open on that thread:
  one-time work, the profiler's own work, compiling, waiting for a batch, a collective (its own, or
  one running on another of the rank's threads while the main thread runs no op: gloo's and DDP's
  reducer), a sync, the allocator, launch calls, the optimizer step, backward, other ops
  (``compute``), the user's Python between ops, else ``unrecorded`` (nothing recorded on the thread).

Each lane's causes add up to the unit's length exactly: the ledger is the one account every rule
reads (what share of a step waits for data, how much is collective) so that a fact has one
definition. One-time work is its own cause, so the steady state is the unit less it
(``RankLedger.steady_ms``); a window that is nearly all one-time work says so (``all_one_time``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from ..trace.roles import SYNC_ROLES, Phase, Role
from . import intervals, numeric
from .blame import BlameResult
from .onetime import OneTimeResult
from .options import ALL_ONE_TIME_PCT, BETWEEN_OPS_US
from .steps import Step, StepSegmentation, judged_units, main_thread
from .timeline import device_events

DEVICE_BUSY = ("one_time", "backward", "optimizer", "compute", "collective", "transfer")
DEVICE_IDLE = ("data_wait", "host_work", "compile", "sync_wait", "launch_overhead", "collective_wait", "other_stream",
               "unrecorded")  # fmt: skip
DEVICE_CAUSES = DEVICE_BUSY + DEVICE_IDLE
HOST_CAUSES = (
    "one_time", "profiler", "compile", "data_wait", "collective_wait", "sync_wait", "allocator", "launch", "optimizer",
    "backward", "compute", "between_ops", "python", "other_thread", "unrecorded",
)  # fmt: skip
CAUSE_WORDS = {
    "one_time": "one-time work (CUDA context, first calls, autotuning, lazy loading), taken out of the steady state",
    "profiler": "the profiler's own work (its Python frames, overhead spans, skalpel's closing range, its syncs)",
    "compile": "torch.compile compiling (dynamo / inductor)",
    "data_wait": "waiting for the next batch (DataLoader fetch); on the device: idle while the host fetched",
    "collective_wait": "in a collective, or waiting for one (another thread's, or a peer's)",
    "sync_wait": "a host-device synchronisation (sync calls, blocking copies, .item()); on the device: idle after one",
    "allocator": "cudaMalloc / cudaFree: the caching allocator's misses",
    "launch": "launch calls (cudaLaunchKernel and the like)",
    "launch_overhead": "idle between launches: the launch calls and the device's dispatch",
    "optimizer": "the optimizer's step (Optimizer.step, zero_grad), less a closure's forward and backward (LBFGS)",
    "backward": "backward (autograd nodes)",
    "compute": "other ops: the forward pass and the model's other work",
    "collective": "collective kernels no compute overlaps",
    "transfer": "copies and memsets no compute overlaps",
    "host_work": "idle while the host ran other work (ops, Python) before its next launch",
    "other_stream": "work queued in time that waited on another stream or an event",
    "between_ops": f"gaps under {BETWEEN_OPS_US:g} us between back-to-back ops with no Python call in them: dispatch "
    "and the profiler's own per-op bookkeeping (record_shapes, with_stack), not code of the user's to move",
    "python": "the user's Python between ops (a Python frame or record_function range, no op)",
    "other_thread": "nothing recorded on the main thread while another of the rank's threads ran ops (autograd's)",
    "unrecorded": "nothing recorded that explains it (no event on the thread; on the device: no link to a cause)",
}
_BLAME_CAUSE = {
    "data_loading": "data_wait", "host_compute": "host_work", "compile": "compile", "sync": "sync_wait",
    "launch_overhead": "launch_overhead", "collective_wait": "collective_wait", "one_time_init": "one_time",
    "other_stream": "other_stream", "unexplained": "unrecorded",
}  # fmt: skip
_HOST_KINDS = [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.COMM_OP, Kind.RUNTIME, Kind.DRIVER, Kind.PYTHON,
               Kind.OVERHEAD]  # fmt: skip
_THREAD_BITS = 1 << 40


@dataclass(frozen=True)
class LedgerUnit:
    """One unit of one lane: its time by cause (ms), adding up to its length."""

    number: int
    start_us: float
    end_us: float
    ms: dict[str, float]

    @property
    def length_ms(self) -> float:
        return (self.end_us - self.start_us) / 1000.0


@dataclass(frozen=True)
class Lane:
    """One lane of a rank (the device, or the host's main thread): every unit's time by cause."""

    name: str  # "device" or "host"
    what: str  # "device (all streams)", "main thread 4512"
    units: tuple[LedgerUnit, ...]

    @cached_property
    def total_ms(self) -> dict[str, float]:
        causes = DEVICE_CAUSES if self.name == "device" else HOST_CAUSES
        return {cause: sum(unit.ms.get(cause, 0.0) for unit in self.units) for cause in causes}

    @cached_property
    def length_ms(self) -> float:
        return sum(unit.length_ms for unit in self.units)

    def share_pct(self, *causes: str, steady: bool = False) -> float:
        """The share of the lane's time held by these causes; ``steady``: of the time that is not one-time work."""
        total = self.total_ms
        whole = self.length_ms - (total.get("one_time", 0.0) if steady else 0.0)
        return 100.0 * sum(total.get(cause, 0.0) for cause in causes) / whole if whole > 0 else 0.0

    def ms_per_unit(self, *causes: str) -> float:
        total = self.total_ms
        return sum(total.get(cause, 0.0) for cause in causes) / max(len(self.units), 1)

    @property
    def steady_ms(self) -> float:
        """The lane's time less its one-time work: what every share of the steady state divides by."""
        return max(self.length_ms - self.total_ms.get("one_time", 0.0), 0.0)

    @property
    def steady_ms_per_unit(self) -> float:
        return self.steady_ms / max(len(self.units), 1)

    def typical_share_pct(self, unit_ms) -> float | None:
        """The share of the typical unit some work holds (``unit_ms``: its time in each unit, in the lane's order):
        the median over the units of it against the unit's time less its one-time work. One call the scheduler
        stalled inflates the mean share from one unit; the median holds. None where no unit has steady time."""
        shares = [100.0 * ms / steady for ms, unit in zip(unit_ms, self.units)
                  if (steady := unit.length_ms - unit.ms.get("one_time", 0.0)) > 0]  # fmt: skip
        return numeric.median(shares) if shares else None


@dataclass(frozen=True)
class RankLedger:
    """One rank's ledger: the units it is judged over and, for each lane, every millisecond by cause."""

    rank: int
    unit: str  # "step", "iteration" or "window"
    lanes: tuple[Lane, ...]  # the device first where there is one, then the host's main thread
    notes: tuple[str, ...] = ()

    def lane(self, name: str) -> Lane | None:
        return next((lane for lane in self.lanes if lane.name == name), None)

    def steady_lane(self, name: str) -> Lane | None:
        """The lane over its steady units, where one-time work was found: the units that hold none on any lane
        (the first iteration that created the CUDA context and searched cuDNN's algorithms runs cold after its
        one-time work, too) and, without markers, not the set-up before the first iteration. None where there is
        no one-time work (every unit is steady) or no unit is left (nothing steady to judge)."""
        lane = self.lane(name)
        if lane is None or self.one_time_ms <= 0:
            return None
        cold = {unit.number for each in self.lanes for unit in each.units if unit.ms.get("one_time", 0.0) > 0}
        kept = tuple(unit for unit in lane.units
                     if unit.number not in cold and not (self.unit == "iteration" and unit.number == 0))  # fmt: skip
        return Lane(lane.name, lane.what, kept) if kept else None

    def data_wait_ms_per_unit(self, lane: str = "host") -> float:
        """The one account of waiting for data: the main thread inside a DataLoader fetch (``host``), or the part
        of that wait the device idled (``device``); 0 where the rank has no such lane."""
        found = self.lane(lane)
        return found.ms_per_unit("data_wait") if found is not None else 0.0

    @property
    def units(self) -> int:
        return len(self.lanes[0].units) if self.lanes else 0

    @property
    def length_ms(self) -> float:
        return self.lanes[0].length_ms if self.lanes else 0.0

    @property
    def one_time_ms(self) -> float:
        """One-time work: the most any lane holds (the host ran it, or the device waited on it)."""
        return max((lane.total_ms.get("one_time", 0.0) for lane in self.lanes), default=0.0)

    @property
    def steady_ms(self) -> float:
        return max(self.length_ms - self.one_time_ms, 0.0)

    @property
    def all_one_time(self) -> bool:
        """The window is (nearly) all one-time work: there is no steady state to judge."""
        return self.length_ms > 0 and 100.0 * self.one_time_ms / self.length_ms >= ALL_ONE_TIME_PCT

    def describe(self) -> str:
        """What the rank was judged over, in words: "6 steps", "one 850.0 ms window, no steps marked"."""
        if self.unit == "window":
            said = f"one {_duration(self.length_ms)} window, no steps marked"
        else:
            word = "step" if self.unit == "step" else "iteration"
            said = f"{self.units} {word}{'s' if self.units != 1 else ''}"
            said += "" if self.unit == "step" else " found from the loop, no steps marked"
        return said + ("; one-time work taken out first" if self.one_time_ms > 0 else "")


def _duration(ms: float) -> str:
    return f"{ms:,.1f} ms" if ms >= 1.0 else f"{ms * 1000.0:,.0f} us"


@dataclass(frozen=True)
class Ledger:
    """Every rank's ledger; a rank with no unit (no host op) has none."""

    ranks: dict[int, RankLedger]

    def for_rank(self, rank: int) -> RankLedger | None:
        return self.ranks.get(rank)


def ledger(trace: Trace, steps: StepSegmentation, blame: BlameResult | None, one_time: OneTimeResult) -> Ledger:
    """The ledger of every rank: its units' time by cause on the device and on the main thread."""
    ranks = {}
    for rank in trace.rank_ids:
        units, unit = judged_units(trace, steps, rank)
        if not units:
            continue
        starts = np.array([step.start_us for step in units])
        ends = np.array([step.end_us for step in units])
        costs = _one_time_events(one_time, rank)
        lanes, notes = [], []
        if len(device_events(trace, rank)):
            blamed = blame.for_rank(rank) if blame is not None else None
            lane, note = _device_lane(trace, rank, units, starts, ends, costs, blamed)
            lanes.append(lane)
            notes += note
        tid = main_thread(trace, rank)
        if tid is not None:
            lanes.append(_host_lane(trace, rank, tid, units, starts, ends, costs))
        if lanes:
            ranks[rank] = RankLedger(rank, unit, tuple(lanes), tuple(notes))
    return Ledger(ranks)


def _one_time_events(one_time: OneTimeResult, rank: int) -> np.ndarray:
    work = one_time.for_rank(rank)
    return np.array([cost.event for cost in work.costs], dtype=np.int64) if work is not None else np.zeros(0, np.int64)


# -- the device ------------------------------------------------------------------------------------


def _device_lane(trace: Trace, rank: int, units: list[Step], starts, ends, costs, blamed) -> tuple[Lane, list[str]]:
    events = device_events(trace, rank)
    cause = np.full(len(events), DEVICE_BUSY.index("compute"), dtype=np.int64)
    cause[trace.kind[events] == Kind.COMM_KERNEL] = DEVICE_BUSY.index("collective")
    cause[isin_few(trace.kind[events], [Kind.MEMCPY, Kind.MEMSET])] = DEVICE_BUSY.index("transfer")
    kernels = trace.kind[events] == Kind.KERNEL
    op = trace.op_of_event[events]
    phase = np.where(op >= 0, trace.phase[np.maximum(op, 0)], Phase.NONE)
    cause[kernels & (phase == Phase.BACKWARD)] = DEVICE_BUSY.index("backward")
    cause[kernels & (phase == Phase.OPTIMIZER)] = DEVICE_BUSY.index("optimizer")
    cause[_launched_inside(trace, events, costs)] = DEVICE_BUSY.index("one_time")
    busy_ms = _charged(trace.ts[events], trace.ts[events] + trace.dur[events], cause, len(DEVICE_BUSY), starts, ends,
                       None)  # fmt: skip
    idle = _blamed_idle(units, blamed)
    notes = []
    rows = []
    for i, step in enumerate(units):
        ms = {name: float(busy_ms[i, code]) for code, name in enumerate(DEVICE_BUSY)}
        idle_ms = step.duration_ms - sum(ms.values())
        charged = idle[i] if idle is not None else {}
        for name, value in charged.items():
            ms[name] = ms.get(name, 0.0) + value
        rest = idle_ms - sum(charged.values())  # no blame for this unit: the idle time is unrecorded
        if rest > 1e-6 * max(step.duration_ms, 1.0):
            ms["unrecorded"] = ms.get("unrecorded", 0.0) + rest
        rows.append(LedgerUnit(step.number, step.start_us, step.end_us, ms))
    if idle is None and any(unit.ms.get("unrecorded", 0.0) > 0 for unit in rows):
        notes.append("the device's idle time is not charged to causes on this rank (no blame): it is unrecorded")
    if blamed is not None:
        notes += [f"device unrecorded: {note}" for note in blamed.notes]  # broken links, clock skew
    return Lane("device", "device (all streams)", tuple(rows)), notes


def _blamed_idle(units: list[Step], blamed) -> list[dict[str, float]] | None:
    """Blame's idle time of each unit, in the ledger's causes (blame judges the same units)."""
    if blamed is None or len(blamed.steps) != len(units):
        return None
    result = []
    for step in blamed.steps:
        ms: dict[str, float] = {}
        for category, value in step.by_category_ms.items():
            if value > 0:
                cause = _BLAME_CAUSE[category]
                ms[cause] = ms.get(cause, 0.0) + value
        result.append(ms)
    return result


def _launched_inside(trace: Trace, events: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """Mask of ``events`` (device work) launched by a call made inside one-time work (cuDNN's autotuning runs)."""
    inside = np.zeros(len(events), dtype=bool)
    if len(costs) == 0:
        return inside
    launcher = trace.launcher[events]
    known = launcher >= 0
    call = np.maximum(launcher, 0)
    starts, ends, threads = trace.ts[call], trace.ts[call] + trace.dur[call], trace.tid[call]
    for cost in costs.tolist():  # a few slow first calls
        end = trace.ts[cost] + trace.dur[cost]
        inside |= known & (starts >= trace.ts[cost]) & (ends <= end) & (threads == trace.tid[cost])
        inside[launcher == cost] = True  # the one-time work is the launch call itself (a module's first load)
    return inside


# -- the host's main thread ------------------------------------------------------------------------


def _host_lane(trace: Trace, rank: int, tid: int, units: list[Step], starts, ends, costs) -> Lane:
    on_rank = np.flatnonzero((trace.rank == rank) & isin_few(trace.kind, _HOST_KINDS))
    mine = on_rank[trace.tid[on_rank] == tid]
    others = on_rank[trace.tid[on_rank] != tid]
    cause = _host_causes(trace, mine, costs)
    # another thread's collective while the main thread runs no op: it waits for it (gloo, DDP's reducer)
    elsewhere = others[trace.kind[others] == Kind.COMM_OP]
    ops = mine[(cause >= HOST_CAUSES.index("one_time")) & (cause <= HOST_CAUSES.index("compute"))]
    waits = intervals.difference(intervals.union(trace.ts[elsewhere], trace.ts[elsewhere] + trace.dur[elsewhere]),
                   intervals.union(trace.ts[ops], trace.ts[ops] + trace.dur[ops]))  # fmt: skip
    # nothing on the main thread while another thread runs ops: it waits for that thread (autograd's backward)
    busy = others[isin_few(trace.kind[others], [Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER])]
    gaps = _between_ops(trace, mine)
    begin, finish, cause = _closure_out_of_optimizer(trace, mine, cause)
    begin = np.concatenate([begin, waits[0], trace.ts[busy], gaps[0]])
    finish = np.concatenate([finish, waits[1], trace.ts[busy] + trace.dur[busy], gaps[1]])
    code = np.concatenate([cause, np.full(len(waits[0]), HOST_CAUSES.index("collective_wait")),
                           np.full(len(busy), HOST_CAUSES.index("other_thread")),
                           np.full(len(gaps[0]), HOST_CAUSES.index("between_ops"))])  # fmt: skip
    charged = _charged(begin, finish, code, len(HOST_CAUSES), starts, ends, HOST_CAUSES.index("unrecorded"))
    rows = tuple(LedgerUnit(step.number, step.start_us, step.end_us,
                            {name: float(charged[i, code]) for code, name in enumerate(HOST_CAUSES)})
                 for i, step in enumerate(units))  # fmt: skip
    return Lane("host", f"main thread {tid}", rows)


def _closure_out_of_optimizer(trace: Trace, mine: np.ndarray, cause: np.ndarray):
    """The intervals of the main thread's events and their causes, the optimizer's cut around the closure's work: an
    LBFGS step (its range, its frames) holds the forward and backward its closure runs, and the first cause open
    wins, so the step would take them all. Its own update (the rest of the step) stays the optimizer's."""
    begin, finish = trace.ts[mine], trace.ts[mine] + trace.dur[mine]
    optimizer = cause == HOST_CAUSES.index("optimizer")
    closure = isin_few(trace.phase[mine], [Phase.FORWARD, Phase.BACKWARD]) | (trace.role[mine] == Role.BACKWARD_NODE)
    if not (optimizer.any() and closure.any()):
        return begin, finish, cause
    inside = _closure_calls(trace, mine, intervals.union(begin[closure], finish[closure]))
    own = intervals.difference(intervals.union(begin[optimizer], finish[optimizer]), inside)
    keep = ~optimizer
    return (np.concatenate([begin[keep], own[0]]), np.concatenate([finish[keep], own[1]]),
            np.concatenate([cause[keep], np.full(len(own[0]), HOST_CAUSES.index("optimizer"))]))  # fmt: skip


def _closure_calls(trace: Trace, mine: np.ndarray, work: tuple[np.ndarray, np.ndarray]):
    """The closure's work with the gaps inside one optimizer step in which the optimizer starts no op of its own
    (the autograd engine between backward nodes, the closure's Python between modules) filled in."""
    lows, highs = work[1][:-1], work[0][1:]
    steps = mine[trace.role[mine] == Role.OPTIMIZER_STEP]
    if len(lows) == 0 or len(steps) == 0:
        return work
    ranges = intervals.union(trace.ts[steps], trace.ts[steps] + trace.dur[steps])
    around = np.searchsorted(ranges[0], lows, side="right") - 1
    within = (around >= 0) & (highs <= ranges[1][np.maximum(around, 0)])
    own = mine[(trace.phase[mine] == Phase.OPTIMIZER) & (trace.kind[mine] == Kind.CPU_OP)]
    starts = np.sort(trace.ts[own])
    idle = np.searchsorted(starts, highs, side="left") == np.searchsorted(starts, lows, side="left")
    fill = within & idle
    return intervals.union(np.concatenate([work[0], lows[fill]]), np.concatenate([work[1], highs[fill]]))


def _between_ops(trace: Trace, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The short gaps between back-to-back outermost ops of the main thread in which no other event (a Python call,
    a range) starts: the dispatch of the next op and the profiler's bookkeeping of the last."""
    ops = mine[trace.kind[mine] == Kind.CPU_OP]
    if len(ops) < 2:
        return np.zeros(0), np.zeros(0)
    ends = trace.ts[ops] + trace.dur[ops]
    ops = ops[intervals.outermost(trace.ts[ops], ends, np.zeros(len(ops), dtype=np.int64))]
    ops = ops[np.argsort(trace.ts[ops], kind="stable")]
    lows, highs = (trace.ts[ops] + trace.dur[ops])[:-1], trace.ts[ops][1:]
    short = (highs > lows) & (highs - lows < BETWEEN_OPS_US)
    others = np.sort(trace.ts[mine[trace.kind[mine] != Kind.CPU_OP]])
    started = np.searchsorted(others, highs, side="left") - np.searchsorted(others, lows, side="right")
    keep = short & (started == 0)
    return lows[keep], highs[keep]


def _host_causes(trace: Trace, events: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The ledger cause of each host event of the main thread, by its role, phase and kind."""
    code = HOST_CAUSES.index
    role, kind, phase = trace.role[events], trace.kind[events], trace.phase[events]
    cause = np.full(len(events), code("python"), dtype=np.int64)  # annotations and frames: the user's code
    ops = isin_few(kind, [Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER])
    cause[ops] = code("compute")
    cause[ops & (phase == Phase.BACKWARD)] = code("backward")
    cause[(role == Role.BACKWARD_NODE)] = code("backward")
    cause[(phase == Phase.OPTIMIZER) | isin_few(role, [Role.OPTIMIZER_STEP, Role.ZERO_GRAD])] = code("optimizer")
    cause[isin_few(role, [Role.LAUNCH, Role.GRAPH_LAUNCH])] = code("launch")
    cause[role == Role.ALLOCATOR] = code("allocator")
    syncs = [*SYNC_ROLES, *([Role.ITEM] if trace.has_device else [])]  # .item() waits only for a device
    cause[isin_few(role, syncs)] = code("sync_wait")
    cause[role == Role.COLLECTIVE] = code("collective_wait")
    cause[isin_few(role, [Role.DATA_WAIT, Role.DATA_OTHER])] = code("data_wait")  # a batch, or the loader's start
    cause[role == Role.COMPILE] = code("compile")
    cause[(role == Role.PROFILER) | (role == Role.INTERNAL_SYNC) | (kind == Kind.OVERHEAD)] = code("profiler")
    cause[np.isin(events, costs)] = code("one_time")
    return cause


# -- charging time to the first cause open at each instant -----------------------------------------


def _charged(begin, finish, cause, count: int, starts, ends, rest: int | None) -> np.ndarray:
    """(unit, cause) -> ms: each instant of each unit charged to the lowest cause code among the intervals open
    then; instants no interval covers go to ``rest`` (None: left uncharged)."""
    cuts = [starts, ends]
    unions = []
    for code in range(count):
        picked = cause == code
        merged = intervals.union(begin[picked], finish[picked]) if picked.any() else (np.zeros(0), np.zeros(0))
        unions.append(merged)
        cuts += list(merged)
    cuts = numeric.unique(np.concatenate(cuts))
    result = np.zeros((len(starts), count))
    if len(cuts) < 2:
        return result
    lows, highs = cuts[:-1], cuts[1:]
    unit = intervals.containing(starts, ends, (lows + highs) / 2)
    assigned = np.full(len(lows), -1, dtype=np.int64)
    for code, (first, last) in enumerate(unions):
        if len(first) == 0:
            continue
        open_ = np.cumsum(np.bincount(np.searchsorted(cuts, first), minlength=len(cuts))
                          - np.bincount(np.searchsorted(cuts, last), minlength=len(cuts)))[:-1] > 0  # fmt: skip
        assigned[open_ & (assigned < 0)] = code
    if rest is not None:
        assigned[assigned < 0] = rest
    keep = (unit >= 0) & (assigned >= 0)
    flat = np.bincount(unit[keep] * count + assigned[keep], weights=(highs - lows)[keep], minlength=len(starts) * count)
    return flat.reshape(len(starts), count) / 1000.0
