"""Launch delays and launch-bound signals, per rank.

*Launch delay* is the time from the start of the runtime call that launched a piece of
device work (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...) to the start of that work on
the device: how long it waited in the stream's queue. Host and device clocks are aligned
by the profiler; small negative delays happen and are counted, not hidden.

For a later ``launch_bound`` rule it also counts *tiny kernels* (kernels that run for a
shorter time than the runtime call that launched them took on the host: the host cannot
keep the device fed with them), and kernels and host ops per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from . import numeric
from .steps import StepSegmentation
from .timeline import device_mask

_KERNELS = np.array([Kind.KERNEL, Kind.COMM_KERNEL], dtype=np.int8)


@dataclass(frozen=True)
class LaunchOptions:
    """When a kernel counts as tiny."""

    tiny_kernel_us: float | None = None  # None: a kernel is tiny when shorter than its own launch call


@dataclass(frozen=True)
class RankLaunches:
    """Launch delays, tiny kernels and kernels and ops per step of one rank."""

    rank: int
    launched: int  # device events with a known launch call
    delay_median_us: float
    delay_p90_us: float
    delay_p99_us: float
    delay_max_us: float
    negative_delays: int  # device start before the launch call started (clock skew)
    kernels: int
    kernel_median_us: float
    launch_call_median_us: float  # host time of the launch calls of kernels
    tiny_kernels: int
    steps: int  # steps the per-step counts are averaged over
    kernels_per_step: float
    ops_per_step: float  # host operators (aten ops and the like) started inside steps

    @property
    def tiny_kernel_pct(self) -> float:
        return 100.0 * self.tiny_kernels / self.kernels if self.kernels else 0.0

    def to_dict(self) -> dict[str, float]:
        values = {key: value for key, value in self.__dict__.items() if key != "rank"}
        values["tiny_kernel_pct"] = self.tiny_kernel_pct
        return values


@dataclass(frozen=True)
class LaunchResult:
    """Launch figures of every rank."""

    ranks: dict[int, RankLaunches | None]  # None: no device work with a known launch on that rank
    options: LaunchOptions

    def for_rank(self, rank: int) -> RankLaunches | None:
        return self.ranks.get(rank)


def launches(trace: Trace, steps: StepSegmentation, *, options: LaunchOptions = LaunchOptions()) -> LaunchResult | None:
    """Launch delays and tiny-kernel counts per rank; None when the trace has no device work."""
    if not trace.has_device:
        return None
    launcher = trace.launcher
    device = np.flatnonzero(device_mask(trace) & (launcher >= 0))
    ranks = {
        rank: _rank_launches(trace, rank, device[trace.rank[device] == rank], steps, options) for rank in trace.rank_ids
    }
    return LaunchResult(ranks=ranks, options=options)


def _rank_launches(
    trace: Trace, rank: int, device: np.ndarray, steps: StepSegmentation, options: LaunchOptions
) -> RankLaunches | None:
    if len(device) == 0:
        return None
    launcher = trace.launcher[device]
    delays = trace.ts[device] - trace.ts[launcher]
    p50, p90, p99 = numeric.percentiles(delays, (50, 90, 99))
    kernels = device[isin_few(trace.kind[device], _KERNELS)]
    kernel_dur = trace.dur[kernels]
    launch_dur = trace.dur[trace.launcher[kernels]]
    threshold = launch_dur if options.tiny_kernel_us is None else options.tiny_kernel_us
    step_count, kernels_in_steps, ops_in_steps = _per_step_counts(trace, rank, steps)
    return RankLaunches(
        rank=rank,
        launched=len(device),
        delay_median_us=float(p50),
        delay_p90_us=float(p90),
        delay_p99_us=float(p99),
        delay_max_us=float(delays.max()),
        negative_delays=int((delays < 0).sum()),
        kernels=len(kernels),
        kernel_median_us=numeric.median(kernel_dur) if len(kernels) else 0.0,
        launch_call_median_us=numeric.median(launch_dur) if len(kernels) else 0.0,
        tiny_kernels=int((kernel_dur < threshold).sum()),
        steps=step_count,
        kernels_per_step=kernels_in_steps / step_count if step_count else 0.0,
        ops_per_step=ops_in_steps / step_count if step_count else 0.0,
    )


def _per_step_counts(trace: Trace, rank: int, steps: StepSegmentation) -> tuple[int, int, int]:
    """(steps, kernels launched inside them, host ops started inside them)."""
    rank_steps = steps.for_rank(rank)
    if not rank_steps:
        return 0, 0, 0
    bounds = np.array([(step.host_begin_us, step.host_end_us) for step in rank_steps])
    bounds = bounds[np.argsort(bounds[:, 0])]
    on_rank = trace.rank == rank
    kernels = np.flatnonzero(on_rank & isin_few(trace.kind, _KERNELS) & (trace.launcher >= 0))
    ops = np.flatnonzero(on_rank & (trace.kind == Kind.CPU_OP))
    launched_inside = _count_inside(trace.ts[trace.launcher[kernels]], bounds)
    return len(rank_steps), launched_inside, _count_inside(trace.ts[ops], bounds)


def _count_inside(times: np.ndarray, bounds: np.ndarray) -> int:
    """How many times fall inside one of the sorted, non-overlapping [start, end] ranges."""
    position = np.searchsorted(bounds[:, 0], times, side="right") - 1
    valid = position >= 0
    return int((times[valid] <= bounds[position[valid], 1]).sum())
