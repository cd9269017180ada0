"""Step segmentation: where each training step starts and ends, per rank.

A step is a ``ProfilerStep#N`` range on the host, extended to the end of the device
work launched inside it: a step is not over until its kernels are. Without step
markers (the legacy autograd profiler, an inference trace, a hand-made capture) the
whole trace of a rank is one step, and ``StepSegmentation.marked`` is False so that
reports can say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind, step_number
from ..trace.model import Trace


@dataclass(frozen=True)
class Step:
    rank: int
    number: int  # N of ProfilerStep#N; 0 for the whole-trace pseudo-step
    start_us: float
    host_end_us: float  # end of the ProfilerStep range on the host
    end_us: float  # extended to the end of the device work launched within the step

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def duration_ms(self) -> float:
        return self.duration_us / 1000.0


@dataclass(frozen=True)
class StepSegmentation:
    steps: tuple[Step, ...]
    marked: bool  # False: no ProfilerStep markers, each rank's whole trace is one step

    def for_rank(self, rank: int) -> list[Step]:
        return [step for step in self.steps if step.rank == rank]

    @property
    def durations_ms(self) -> np.ndarray:
        return np.array([step.duration_ms for step in self.steps], dtype=np.float64)


def segment_steps(trace: Trace) -> StepSegmentation:
    """Split every rank's timeline into steps."""
    step_events = np.flatnonzero(trace.kind == Kind.STEP)
    if len(step_events) == 0:
        return StepSegmentation(tuple(_whole_trace_step(trace, rank) for rank in trace.rank_ids), marked=False)
    steps: list[Step] = []
    device_end = _device_end_by_launch(trace)
    for rank in trace.rank_ids:
        on_rank = step_events[trace.rank[step_events] == rank]
        if len(on_rank) == 0:
            steps.append(_whole_trace_step(trace, rank))
            continue
        on_rank = on_rank[np.argsort(trace.ts[on_rank], kind="stable")]
        starts = trace.ts[on_rank]
        host_ends = starts + trace.dur[on_rank]
        ends = _extend_to_device_work(trace, rank, starts, host_ends, device_end)
        for index, start, host_end, end in zip(on_rank, starts, host_ends, ends):
            number = step_number(trace.name_of(index))
            steps.append(Step(rank, number if number is not None else 0, float(start), float(host_end), float(end)))
    return StepSegmentation(tuple(steps), marked=True)


def _whole_trace_step(trace: Trace, rank: int) -> Step:
    on_rank = (trace.rank == rank) & (trace.kind != Kind.PYTHON)
    if not on_rank.any():
        on_rank = trace.rank == rank
    start = float(trace.ts[on_rank].min())
    end = float((trace.ts[on_rank] + trace.dur[on_rank]).max())
    return Step(rank, 0, start, end, end)


def _device_end_by_launch(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, launch time, device end) for every device event with a known launcher."""
    launcher = trace.launcher
    device = np.flatnonzero(launcher >= 0)
    launch_ts = trace.ts[launcher[device]]
    device_end = trace.ts[device] + trace.dur[device]
    return trace.rank[device], launch_ts, device_end


def _extend_to_device_work(
    trace: Trace,
    rank: int,
    starts: np.ndarray,
    host_ends: np.ndarray,
    device_end: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> np.ndarray:
    """Each step ends at the later of its host end and the end of the device work it launched."""
    ranks, launch_ts, ends_of_work = device_end
    mine = ranks == rank
    launch_ts, ends_of_work = launch_ts[mine], ends_of_work[mine]
    ends = host_ends.copy()
    if len(launch_ts):
        order = np.argsort(launch_ts, kind="stable")
        launch_ts, ends_of_work = launch_ts[order], ends_of_work[order]
        for position, (start, host_end) in enumerate(zip(starts, host_ends)):
            first = np.searchsorted(launch_ts, start, side="left")
            last = np.searchsorted(launch_ts, host_end, side="right")
            if last > first:
                ends[position] = max(host_end, float(ends_of_work[first:last].max()))
    return ends
