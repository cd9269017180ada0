"""GPU temporal breakdown, idle-time breakdown and compute/communication overlap, as HTA defines them.

Definitions follow Holistic Trace Analysis (traceinsight 0.6.1; see tests/golden/hta/README.md):

* **Temporal breakdown** (per rank, all streams merged into one timeline): the span runs
  from the first device event's start to the last one's end; *idle* is the time in the
  span when no device event runs, *compute* the union of compute kernels, *non-compute*
  the rest (copies, memsets, collectives, syncs).
* **Idle-time breakdown** (per stream, HTA's own definition): each gap between consecutive
  events on a stream is *host wait* when the runtime call that launched the next event
  started after the previous event ended, else *kernel wait* when the gap is shorter than
  ``kernel_wait_us``, else *other*. The rank-level split applies the same rule
  to the gaps of the merged timeline, so that it divides exactly the rank's idle time.
* **Overlap**: the share of the communication union during which compute also runs.

Where we follow HTA although it is debatable, or deliberately differ, it says so here:

* HTA counts every row with a stream, so ``cuda_sync`` rows that carry one (Stream Sync,
  Context Sync, Stream Wait Event) enter the span and the non-compute time. We do the same
  by default (``count_syncs``) so the numbers can be checked against HTA.
* HTA decides "compute" by name: a kernel is compute unless its name matches
  ``_HTA_NON_COMPUTE`` below. We apply that rule to kernels, but a kernel our loader
  classified as a collective (``Kind.COMM_KERNEL``) is never compute and always
  communication. HTA only knows NCCL/HCCL names, so it counts newer collectives
  (symmetric-memory ``multimem_all_reduce``, ``cross_device_reduce``) as compute.
* HTA counts any ``hip*`` kernel as communication (its pattern ``^hip``); we do not.
* HTA also counts a ``cpu_op`` that happens to carry ``args.stream`` (the Triton launch op
  in triton_example) as a GPU kernel; we count device events only. Likewise newer traces
  give ``gpu_user_annotation`` rows a stream (``args.stream: 0``); HTA would count those
  annotation spans as compute kernels, we never count annotations.
* HTA's last step starts at the latest row named ``ProfilerStep#N`` that it does not take
  for a GPU row, which on newer traces is the ``gpu_user_annotation`` copy of the last step,
  placed where the device ran it, after the host step ended: HTA then keeps the last step
  after all. We take the host ``ProfilerStep`` start, which is what HTA means to do.
  (HTA 0.6.1 cannot load the one such multi-step trace in the corpus, TraceLens'
  mi300/resnet_act_checkpoint: an int16 overflow in its correlation index.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace
from . import intervals, numeric
from .options import KERNEL_WAIT_US
from .timeline import device_mask

IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


@dataclass(frozen=True)
class GpuTimeOptions:
    """Where HTA's definitions leave a choice: the window, syncs, the kernel-wait threshold."""

    exclude_last_step: bool = False  # True: HTA's default window (device work launched before the last step starts)
    count_syncs: bool = True  # cuda_sync rows with a stream count as non-compute busy time, as in HTA
    kernel_wait_us: float = KERNEL_WAIT_US  # HTA's consecutive_kernel_delay


@dataclass(frozen=True)
class StreamIdle:
    """HTA's idle-time breakdown of one stream (gaps between consecutive events on it)."""

    stream: int
    events: int
    span_us: float
    busy_us: float
    idle_us: float  # sum of the gaps, HTA style (gaps from the previous event's end; can be < span - busy)
    idle_breakdown_us: dict[str, float]  # host_wait, kernel_wait, other


@dataclass(frozen=True)
class RankGpuTime:
    """The HTA temporal and idle-time breakdown of one rank's device."""

    rank: int
    events: int  # device events counted
    window_start_us: float
    span_us: float  # first start to last end of the counted events
    idle_us: float
    compute_us: float
    non_compute_us: float
    comm_us: float  # union of communication kernels
    comm_overlap_us: float  # time when communication and compute both run
    idle_breakdown_us: dict[str, float]  # host_wait, kernel_wait, other; sums to idle_us
    streams: tuple[StreamIdle, ...]

    def _pct(self, value_us: float) -> float:
        return 100.0 * value_us / self.span_us if self.span_us > 0 else 0.0

    @property
    def idle_pct(self) -> float:
        return self._pct(self.idle_us)

    @property
    def compute_pct(self) -> float:
        return self._pct(self.compute_us)

    @property
    def non_compute_pct(self) -> float:
        return self._pct(self.non_compute_us)

    @property
    def comm_overlap_pct(self) -> float | None:
        """Share of communication time overlapped by compute; None without communication."""
        return 100.0 * self.comm_overlap_us / self.comm_us if self.comm_us > 0 else None

    @property
    def idle_breakdown_pct(self) -> dict[str, float]:
        total = sum(self.idle_breakdown_us.values())
        return {key: (100.0 * value / total if total > 0 else 0.0) for key, value in self.idle_breakdown_us.items()}


@dataclass(frozen=True)
class GpuTimeResult:
    """The device time breakdown of every rank."""

    ranks: dict[int, RankGpuTime | None]  # None: no device activity on that rank
    options: GpuTimeOptions

    def for_rank(self, rank: int) -> RankGpuTime | None:
        return self.ranks.get(rank)


def gpu_time(trace: Trace, *, options: GpuTimeOptions = GpuTimeOptions()) -> GpuTimeResult | None:
    """Temporal breakdown, idle breakdown and overlap for every rank; None when the trace has no device work."""
    if not trace.has_device:
        return None
    counted = _counted_events(trace, options)
    compute_names = _compute_name_mask(trace, counted)
    ranks: dict[int, RankGpuTime | None] = {}
    for rank in trace.rank_ids:
        on_rank = counted[trace.rank[counted] == rank]
        if options.exclude_last_step:
            on_rank = _launched_before_last_step(trace, on_rank, rank)
        ranks[rank] = _rank_gpu_time(trace, rank, on_rank, compute_names, options) if len(on_rank) else None
    return GpuTimeResult(ranks=ranks, options=options)


def _counted_events(trace: Trace, options: GpuTimeOptions) -> np.ndarray:
    mask = device_mask(trace)
    if options.count_syncs:
        # HTA keeps any row whose stream is not -1; a Context Sync's stream is 2**32-1, which counts.
        mask = mask | ((trace.kind == Kind.DEVICE_SYNC) & (trace.stream != -1))
    return np.flatnonzero(mask)


def _compute_name_mask(trace: Trace, events: np.ndarray) -> np.ndarray:
    """Boolean per name id: a kernel of that name is compute by HTA's name rule."""
    is_compute = np.zeros(len(trace.names), dtype=bool)
    is_compute[opnames.names_where(trace, opnames.is_hta_compute, events[trace.kind[events] == Kind.KERNEL])] = True
    return is_compute


def _launched_before_last_step(trace: Trace, events: np.ndarray, rank: int) -> np.ndarray:
    """HTA's window: with two or more steps, keep device work whose launch call starts before the last step.

    HTA (common/trace.py:801-891) keeps a GPU row when its correlation id matches a CPU row
    that starts before the last ProfilerStep; rows with no such launch are dropped. The
    markers are read from the trace itself (not from step segmentation, which may trim
    or move steps), so the window is exactly HTA's.
    """
    markers = np.flatnonzero((trace.kind == Kind.STEP) & (trace.rank == rank))
    if len(numeric.unique(trace.name[markers])) < 2:
        return events
    last_start = float(trace.ts[markers].max())
    launcher = trace.launcher[events]
    launched = launcher >= 0
    keep = np.zeros(len(events), dtype=bool)
    keep[launched] = trace.ts[launcher[launched]] < last_start
    return events[keep]


def _rank_gpu_time(
    trace: Trace, rank: int, events: np.ndarray, compute_names: np.ndarray, options: GpuTimeOptions
) -> RankGpuTime:
    starts = trace.ts[events]
    ends = starts + trace.dur[events]
    merged = intervals.union(starts, ends)
    window_start = float(merged[0][0])
    span = float(merged[1][-1] - window_start)
    busy = float((merged[1] - merged[0]).sum())
    kinds = trace.kind[events]
    is_compute = (kinds == Kind.KERNEL) & compute_names[trace.name[events]]
    compute = intervals.union(starts[is_compute], ends[is_compute])
    is_comm = kinds == Kind.COMM_KERNEL
    comm = intervals.union(starts[is_comm], ends[is_comm])
    compute_us = float((compute[1] - compute[0]).sum())
    return RankGpuTime(
        rank=rank,
        events=len(events),
        window_start_us=window_start,
        span_us=span,
        idle_us=span - busy,
        compute_us=compute_us,
        non_compute_us=busy - compute_us,
        comm_us=float((comm[1] - comm[0]).sum()),
        comm_overlap_us=intervals.intersection_length(comm, compute),
        idle_breakdown_us=_merged_idle_breakdown(trace, events, options.kernel_wait_us),
        streams=_stream_idle(trace, events[device_mask(trace)[events]], options.kernel_wait_us),
    )


def _launch_ts(trace: Trace, events: np.ndarray) -> np.ndarray:
    """Start of the runtime call that launched each event; NaN where unknown."""
    launcher = trace.launcher[events]
    result = np.full(len(events), np.nan)
    known = launcher >= 0
    result[known] = trace.ts[launcher[known]]
    return result


def _classify_gaps(
    gaps: np.ndarray, prev_end: np.ndarray, launch_ts: np.ndarray, threshold_us: float
) -> dict[str, float]:
    with np.errstate(invalid="ignore"):
        host_wait = launch_ts > prev_end  # NaN compares False: no known launch, not host wait
    kernel_wait = ~host_wait & (gaps < threshold_us)
    other = ~host_wait & ~kernel_wait
    return {
        "host_wait": float(gaps[host_wait].sum()),
        "kernel_wait": float(gaps[kernel_wait].sum()),
        "other": float(gaps[other].sum()),
    }


def _merged_idle_breakdown(trace: Trace, events: np.ndarray, threshold_us: float) -> dict[str, float]:
    """HTA's gap rule applied to the gaps of the rank's merged timeline; the parts add up to idle_us."""
    order = np.argsort(trace.ts[events], kind="stable")
    events = events[order]
    starts = trace.ts[events]
    running_end = np.maximum.accumulate(starts + trace.dur[events])
    opens_group = np.flatnonzero(starts[1:] > running_end[:-1]) + 1  # first event after each gap
    prev_end = running_end[opens_group - 1]
    gaps = starts[opens_group] - prev_end
    return _classify_gaps(gaps, prev_end, _launch_ts(trace, events[opens_group]), threshold_us)


def _stream_idle(trace: Trace, events: np.ndarray, threshold_us: float) -> tuple[StreamIdle, ...]:
    """HTA's per-stream idle breakdown (kernels, copies and memsets; syncs are left out, as in HTA)."""
    result = []
    streams = trace.stream[events]
    for stream in numeric.unique(streams):
        on_stream = events[streams == stream]
        on_stream = on_stream[np.argsort(trace.ts[on_stream], kind="stable")]
        starts = trace.ts[on_stream]
        ends = starts + trace.dur[on_stream]
        prev_end = ends[:-1]
        gaps = starts[1:] - prev_end
        breakdown = _classify_gaps(gaps, prev_end, _launch_ts(trace, on_stream[1:]), threshold_us)
        busy = intervals.length(starts, ends)
        result.append(
            StreamIdle(
                stream=int(stream),
                events=len(on_stream),
                span_us=float(ends.max() - starts[0]),
                busy_us=busy,
                idle_us=float(gaps.sum()),
                idle_breakdown_us=breakdown,
            )
        )
    return tuple(result)
