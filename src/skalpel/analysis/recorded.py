"""Was the device activity of a GPU run recorded? Launch calls on the host against device work linked to them.

A run that launched kernels shows ``cudaLaunchKernel`` (``hipLaunchKernel``, ``cuLaunchKernel``,
copies through ``cudaMemcpyAsync``) calls on the host whatever was recorded; the kernels
themselves appear only when CUPTI (roctracer) recorded them. Launch calls whose device work
is missing therefore mean a GPU run whose device side the trace does not have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from ..trace.roles import Role
from . import numeric
from .timeline import device_mask



@dataclass(frozen=True)
class RankRecording:
    """Launch calls of one rank against the device work recorded for them."""

    rank: int
    launch_calls: int
    launch_calls_with_work: int  # with device work linked to them (by correlation id)
    device_events: int
    # a file cut off (a killed process, a copy cut short) before its device events ended: Kineto writes a trace's
    # host ops before its launch calls and device events, so those go first. The ms from the rank's first event to
    # the end of its last device event or launch call, and to the end of its last op
    device_cut_ms: float | None = None
    host_end_ms: float = 0.0

    @property
    def linking_works(self) -> bool:
        """No device event at all, or some linked to their launch: the missing links mean missing work.

        Device events that no launch links to (a CUPTI range-profiler trace) say nothing either way.
        """
        return self.device_events == 0 or self.launch_calls_with_work > 0

    @property
    def missing_pct(self) -> float:
        missing = self.launch_calls - self.launch_calls_with_work
        return 100.0 * missing / self.launch_calls if self.launch_calls else 0.0


@dataclass(frozen=True)
class RecordingResult:
    """Launch calls against recorded device work, per rank."""

    ranks: dict[int, RankRecording]

    def for_rank(self, rank: int) -> RankRecording | None:
        return self.ranks.get(rank)

    @property
    def device_cut(self) -> RankRecording | None:
        """The first rank whose file was cut off before its device events ended (``RankRecording.device_cut_ms``)."""
        return next((rank for rank in self.ranks.values() if rank.device_cut_ms is not None), None)

    @property
    def launches_without_work(self) -> bool:
        """Some rank launched work none of which was recorded."""
        return any(rank.launch_calls > 0 and rank.device_events == 0 for rank in self.ranks.values())


def _during_graph_capture(trace: Trace, runtime: np.ndarray, launches: np.ndarray) -> np.ndarray:
    """Launches between a stream's BeginCapture and EndCapture are recorded into a graph, not run."""
    inside = np.zeros(len(launches), dtype=bool)
    begins = runtime[numeric.isin(trace.name[runtime], opnames.names_where(trace, opnames.is_capture_begin, runtime))]
    ends = runtime[numeric.isin(trace.name[runtime], opnames.names_where(trace, opnames.is_capture_end, runtime))]
    for begin in begins:
        later = ends[(trace.ts[ends] > trace.ts[begin]) & (trace.rank[ends] == trace.rank[begin])]
        stop = float(trace.ts[later].min()) if len(later) else np.inf
        inside |= (trace.rank[launches] == trace.rank[begin]) & (trace.ts[launches] > trace.ts[begin]) & (trace.ts[launches] < stop)
    return inside


def device_recording(trace: Trace) -> RecordingResult:
    runtime = np.flatnonzero(isin_few(trace.kind, [Kind.RUNTIME, Kind.DRIVER]))
    launches = runtime[isin_few(trace.role[runtime], (Role.LAUNCH, Role.GRAPH_LAUNCH))]
    device = np.flatnonzero(device_mask(trace))
    linked = np.zeros(len(trace), dtype=bool)
    if len(device):
        launcher = trace.launcher[device]
        linked[launcher[launcher >= 0]] = True
    launches = launches[~_during_graph_capture(trace, runtime, launches)]
    ranks = {}
    cut = {info.rank for info in trace.ranks if info.truncated}
    for rank in trace.rank_ids:
        own = launches[trace.rank[launches] == rank]
        ranks[rank] = RankRecording(
            rank=rank,
            launch_calls=len(own),
            launch_calls_with_work=int(linked[own].sum()),
            device_events=int((trace.rank[device] == rank).sum()),
            **(_device_cut(trace, rank, np.concatenate([own, device[trace.rank[device] == rank]]))
               if rank in cut else {}),  # fmt: skip
        )
    return RecordingResult(ranks)


def _device_cut(trace: Trace, rank: int, device_side: np.ndarray) -> dict:
    """Where a cut file's device side (launch calls, device events) ends, when its ops run on past it: in a whole
    trace the last ops enclose the last launch calls (a step's annotation may outlast its kernels; an op seldom
    outlasts the launches by a millisecond, and only a cut file is asked)."""
    host = np.flatnonzero((trace.rank == rank) & (trace.kind == Kind.CPU_OP))  # ops, which enclose their launches
    if len(host) == 0 or len(device_side) == 0:
        return {}  # nothing to compare: no device side at all is device_activity_missing's case
    first = float(trace.ts[trace.rank == rank].min())
    device_end = float((trace.ts[device_side] + trace.dur[device_side]).max())
    host_end = float((trace.ts[host] + trace.dur[host]).max())
    if host_end - device_end < _CUT_MARGIN_US:
        return {}  # the cut fell past the device side (in the trailing metadata): the device's record is whole
    return {"device_cut_ms": (device_end - first) / 1000.0, "host_end_ms": (host_end - first) / 1000.0}


_CUT_MARGIN_US = 1000.0  # a whole trace's last op outlasts its last launch call by less


@dataclass(frozen=True)
class HostSigns:
    """What the host side of a trace says about the GPU, whatever device events were recorded."""

    gpu_work: bool  # device memory allocated, runtime calls, CUDA/cuDNN ops or NCCL collectives
    runtime: str  # "CUDA" or "ROCm" from the runtime calls' names; "" when they say neither

    def merged(self, other: HostSigns) -> HostSigns:
        return HostSigns(self.gpu_work or other.gpu_work, self.runtime or other.runtime)


def host_signs(trace: Trace) -> HostSigns:
    memory = trace.memory
    gpu_work = bool(len(memory)) and bool((memory.device_type != 0).any())
    host = isin_few(trace.kind, [Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER, Kind.COMM_OP])
    gpu_work = gpu_work or bool(opnames.names_where(trace, opnames.is_gpu_op, np.flatnonzero(host)))
    calls = np.flatnonzero(isin_few(trace.kind, [Kind.RUNTIME, Kind.DRIVER]))
    runtime = "ROCm" if opnames.names_where(trace, opnames.is_hip_call, calls) else (
        "CUDA" if opnames.names_where(trace, opnames.is_cuda_call, calls) else "")  # fmt: skip
    return HostSigns(gpu_work, runtime)


def device_label(names: list[str], has_device: bool, launches_without_work: bool, signs: HostSigns) -> str:
    """The device the run used, named from the whole trace: device properties, device events, runtime calls, ops.

    * device work recorded: the GPU ``deviceProperties`` names, else "gpu (CUDA)" / "gpu (ROCm)" from its runtime;
    * kernels launched, CUDA/cuDNN ops run or device memory allocated, but no device event: the GPU, with
      "(device activity not recorded)";
    * a GPU in the header and none of that: "cpu" and the GPU left unused;
    * else "cpu".
    """
    gpu = names[0] if names else "gpu" + (f" ({signs.runtime})" if signs.runtime else "")
    if has_device:
        return gpu
    if launches_without_work or signs.gpu_work:
        return gpu + " (device activity not recorded)"
    if names:
        return f"cpu ({names[0]} present but unused: all work ran on the CPU)"
    return "cpu"
