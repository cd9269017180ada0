"""One-time work: costs a process pays once (CUDA context, cuDNN autotuning, lazy kernel loading).

An event is one-time work when it is the first call of its name and far slower than the
later calls of that name (``first_call_ratio`` times their median and at least ``min_event_ms``), or
a runtime call that sets up the device (context creation, device queries) and runs long
the one time it is called. Called once, without a later call to compare with, it is one-time
work too when it can only be: a launch call of ``min_launch_ms`` or more (a kernel launches in
microseconds; a millisecond is its module loading), an op whose first call sets up a library
(cuDNN's algorithm search, cuBLAS's handle) and that ran far longer than its own kernels, or
any slow call of a window in which no op runs twice (a first pass: ``with profile(): model(x)``). Host ops and runtime/driver calls are considered; annotations
and steps are not (they wrap the user's own work). Nested one-time events (the first
``aten::conv2d`` around the first ``aten::cudnn_convolution``) are counted once, as the
union of their time ranges, so the total is wall time. Works on traces without steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from ..trace.roles import Role, sets_up_on_first_use
from . import intervals, numeric
from .options import FIRST_CALL_MIN_MS, FIRST_CALL_RATIO, FIRST_LAUNCH_MIN_MS
from .timeline import device_mask

_CONSIDERED = np.array([Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER], dtype=np.int8)


@dataclass(frozen=True)
class OneTimeOptions:
    """When a first call counts as one-time work."""

    first_call_ratio: float = FIRST_CALL_RATIO  # the first call is this many times slower than the later calls' median
    min_event_ms: float = FIRST_CALL_MIN_MS  # ... and at least this long
    min_launch_ms: float = FIRST_LAUNCH_MIN_MS  # a kernel's first launch this long loaded its module


@dataclass(frozen=True)
class OneTimeCost:
    """One piece of one-time work: a slow first call or a setup call."""

    name: str
    what: str  # "CUDA context creation", "first cuDNN call (autotuning, lazy loading)", ...
    ms: float
    later_median_us: float | None  # None: called once
    event: int


@dataclass(frozen=True)
class RankOneTime:
    """The one-time work of one rank and its share of the window."""

    rank: int
    window_ms: float  # first to last event of the rank
    total_ms: float  # union of the one-time events
    costs: tuple[OneTimeCost, ...]  # outermost first-calls and setup calls, longest first

    @property
    def share_pct(self) -> float:
        return 100.0 * self.total_ms / self.window_ms if self.window_ms > 0 else 0.0

    def holds(self, trace: Trace, events: np.ndarray, *, same_thread: bool = True) -> np.ndarray:
        """Mask of ``events`` that lie inside this rank's one-time work (on its thread, unless ``same_thread`` is
        False: a runtime call the first call made may sit on another)."""
        inside = np.zeros(len(events), dtype=bool)
        starts, ends, threads = trace.ts[events], trace.end[events], trace.tid[events]
        for cost in self.costs:  # a few slow first calls
            event = cost.event
            around = (starts >= trace.ts[event]) & (ends <= trace.end[event])
            inside |= around & (threads == trace.tid[event]) if same_thread else around
        return inside


@dataclass(frozen=True)
class OneTimeResult:
    """One-time work per rank."""

    ranks: dict[int, RankOneTime]

    def for_rank(self, rank: int) -> RankOneTime | None:
        return self.ranks.get(rank)


def one_time_work(trace: Trace, *, options: OneTimeOptions = OneTimeOptions()) -> OneTimeResult:
    return OneTimeResult({rank: _rank_one_time(trace, rank, options) for rank in trace.rank_ids})


def _rank_one_time(trace: Trace, rank: int, options: OneTimeOptions) -> RankOneTime:
    on_rank = np.flatnonzero(trace.rank == rank)
    timed = on_rank[trace.kind[on_rank] != Kind.PYTHON]
    window_ms = float(trace.end[timed].max() - trace.ts[timed].min()) / 1000.0 if len(timed) else 0.0
    flagged = _flagged(trace, on_rank[isin_few(trace.kind[on_rank], _CONSIDERED)], options)
    device = on_rank[device_mask(trace)[on_rank]]
    runtime = on_rank[isin_few(trace.kind[on_rank], [Kind.RUNTIME, Kind.DRIVER])]
    flagged = [
        (event, later) for event, later in flagged
        if not _waits_for_device(trace, event, device) and not _inside_a_wait(trace, event, runtime)
    ]  # fmt: skip
    if not flagged:
        return RankOneTime(rank, window_ms, 0.0, ())
    events = np.array([event for event, _ in flagged])
    starts, ends = trace.ts[events], trace.end[events]
    total_ms = intervals.length(starts, ends) / 1000.0
    outer = intervals.outermost(starts, ends, trace.tid[events])
    costs = [
        OneTimeCost(trace.name_of(event), _what(trace, event, runtime), float(trace.dur[event]) / 1000.0, later, int(event))
        for (event, later), keep in zip(flagged, outer)
        if keep
    ]
    costs.sort(key=lambda cost: -cost.ms)
    return RankOneTime(rank, window_ms, total_ms, tuple(costs))


def _flagged(trace: Trace, events: np.ndarray, options: OneTimeOptions) -> list[tuple[int, float | None]]:
    """(event, median us of the later calls) of every one-time event among ``events``."""
    result = [(call, None) for call in _first_slow_launches(trace, events, options)]
    launch = isin_few(trace.role[events], [Role.LAUNCH, Role.GRAPH_LAUNCH])
    ops = events[trace.kind[events] == Kind.CPU_OP]
    first_pass = len(ops) > 0 and len(numeric.unique(trace.name[ops])) == len(ops)  # no op runs twice
    min_us = options.min_event_ms * 1000.0
    long_events = events[~launch & (trace.dur[events] >= min_us)]
    waiting = set(opnames.names_where(trace, opnames.is_waiting_call, long_events))
    setup_names = set(opnames.names_where(trace, opnames.is_setup_call, long_events))
    library_names = set(opnames.names_where(trace, sets_up_on_first_use, long_events))
    for name_id in numeric.unique(trace.name[long_events]).tolist():
        if name_id in waiting:
            continue
        calls = events[trace.name[events] == name_id]
        calls = calls[np.argsort(trace.ts[calls], kind="stable")]
        first = int(calls[0])
        if trace.dur[first] < min_us:
            continue
        if len(calls) == 1:
            setup = trace.kind[first] != Kind.CPU_OP and name_id in setup_names
            library = trace.kind[first] == Kind.CPU_OP and name_id in library_names and _host_bound(trace, first)
            if setup or library or (first_pass and trace.kind[first] == Kind.CPU_OP):
                result.append((first, None))
            continue
        later = numeric.median(trace.dur[calls[1:]])
        if trace.dur[first] >= options.first_call_ratio * max(later, 1.0):
            result.append((first, later))
    return result


def _first_slow_launches(trace: Trace, events: np.ndarray, options: OneTimeOptions) -> list[int]:
    """Launch calls of ``min_launch_ms`` or more that are the first launch of their kernel: its module loaded then
    (lazy loading, a JIT compile). A launch returns in microseconds; one that waited for the device (a full launch
    queue) is left to the caller's checks."""
    launches = events[isin_few(trace.role[events], [Role.LAUNCH, Role.GRAPH_LAUNCH])]
    slow = launches[trace.dur[launches] >= options.min_launch_ms * 1000.0]
    copies = opnames.names_where(trace, opnames.is_waiting_call, slow)
    slow = slow[~numeric.isin(trace.name[slow], copies)]  # a copy waits for its data: not set-up
    if len(slow) == 0:
        return []
    # each launch's kernel by name (a launch of no recorded work: its own name, kept apart by the sign)
    key = np.full(len(trace), -1, dtype=np.int64)
    key[launches] = -1 - trace.name[launches].astype(np.int64)
    work = np.flatnonzero(trace.launcher >= 0)  # device work and the call that launched it
    key[trace.launcher[work]] = trace.name[work]
    keys, starts = key[launches], trace.ts[launches]
    earliest = {kernel: float(starts[keys == kernel].min()) for kernel in set(key[slow].tolist())}  # a few kernels
    return [int(call) for call in slow if trace.ts[call] <= earliest[int(key[call])]]  # the first launch of its kernel


def _host_bound(trace: Trace, op: int) -> bool:
    """The op ran at least ten times longer on the host than its own kernels ran on the device."""
    own = np.flatnonzero(trace.op_of_event == op)
    device = own[device_mask(trace)[own]]
    return float(trace.dur[device].sum()) * 10.0 <= float(trace.dur[op])


def _waits_for_device(trace: Trace, event: int, device: np.ndarray) -> bool:
    """The call spends most of its time while device work launched before it runs: a sync, not set-up.

    A first ``.to("cpu")`` or ``.item()`` waits for everything queued before it; a context
    creation or an algorithm search does not (the device has no earlier work, or runs the
    search's own kernels, launched inside the call).
    """
    start, end = float(trace.ts[event]), float(trace.end[event])
    launcher = trace.launcher[device]
    earlier = np.zeros(len(device), dtype=bool)  # work of unknown launch (a CUPTI range profiler's) says nothing
    known = launcher >= 0
    earlier[known] = trace.ts[launcher[known]] < start
    overlapping = device[earlier & (trace.ts[device] < end) & (trace.end[device] > start)]
    if len(overlapping) == 0:
        return False
    busy = intervals.length(np.maximum(trace.ts[overlapping], start), np.minimum(trace.end[overlapping], end))
    return busy >= 0.5 * (end - start)


def _longest_call_inside(trace: Trace, event: int, runtime: np.ndarray) -> int | None:
    inside = runtime[(trace.ts[runtime] >= trace.ts[event]) & (trace.end[runtime] <= trace.end[event]) & (runtime != event)]
    return int(inside[np.argmax(trace.dur[inside])]) if len(inside) else None


def _inside_a_wait(trace: Trace, event: int, runtime: np.ndarray) -> bool:
    """Most of the call is a synchronous copy or a synchronize nested in it (waiting, not setting up)."""
    longest = _longest_call_inside(trace, event, runtime)
    return longest is not None and opnames.is_waiting_call(trace.name_of(longest)) and (
        trace.dur[longest] >= 0.5 * trace.dur[event]
    )


def _what(trace: Trace, event: int, runtime: np.ndarray) -> str:
    """What a one-time event is, from its name, the runtime call that takes most of it, and when it ran."""
    name = trace.name_of(event)
    longest = _longest_call_inside(trace, event, runtime)
    inner = trace.name_of(longest) if longest is not None and trace.dur[longest] >= 0.5 * trace.dur[event] else ""
    if (trace.kind[event] != Kind.CPU_OP and opnames.is_setup_call(name)) or opnames.is_setup_call(inner):
        return "CUDA context creation and device set-up"
    if opnames.is_cudnn_like(name):
        return "first cuDNN/MIOpen call (algorithm search or autotuning, lazy loading of its kernels)"
    if opnames.is_kernel_load_call(name) or opnames.is_kernel_load_call(inner):
        return "first launch of a kernel (lazy loading or JIT compilation of its module)"
    if len(runtime) and trace.ts[event] <= trace.ts[runtime].min() and trace.kind[event] == Kind.CPU_OP:
        return "lazy CUDA initialisation (context creation) in the first op that uses the GPU"
    return "first call, far slower than the later ones"
