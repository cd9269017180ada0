"""All analysis results for one trace, computed once and handed to the findings and the report."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..forking import Child
from ..trace.model import RankInfo, Trace
from .allocator import AllocatorResult, allocator_calls
from .blame import BlameResult, PeerSplit, blame
from .breakdown import StepBreakdown, step_breakdown
from .attention import Attention, attention
from .broadcast import LargestAlloc, largest_allocs
from .comm import CommAnalysis, analyze_comm, c10d_issuers
from .compile import (
    CompileInSteps,
    CompileLog,
    CompileResult,
    GraphBreaks,
    compile_events,
    compile_in_steps,
    compile_log,
    graph_breaks,
)
from .cpu_ops import CpuOps, cpu_ops
from .gpu_time import GpuTimeResult, gpu_time
from .held_ops import HeldOps, held_ops
from .idle_gaps import IdleGaps, idle_gaps
from .kept_memory import KeptMemory
from .kernel_launchers import KernelLaunchers, kernel_launchers
from .kernels import KernelTable, kernel_table
from .launches import LaunchResult, launches
from .ledger import Ledger, ledger
from .loader_ranges import LoaderRanges, loader_ranges
from .memory import MemoryResult, memory
from .mfu import Mfu, mfu
from .modules import ModuleTree, module_tree
from .onetime import OneTimeResult, one_time_work
from .precision import Precision, precision
from .ops import OpTable, op_table
from .rankprofile import RankLocations
from .ranks import RankComparison
from .roofline import Roofline, roofline
from .rankwork import WorkComparison
from .recorded import HostSigns, RecordingResult, device_recording
from .step_device import StepDeviceResult, device_in_steps
from .steps import StepSegmentation, segment_steps
from .sync_causes import SyncCauses, sync_causes
from .syncs import SyncResult, syncs


@dataclass
class JobFacts:
    """What the join knows of a job's ranks without their events: what the report and the job-level rules read."""

    ranks: tuple[RankInfo, ...]
    has_device: bool
    warnings: list[str] = field(default_factory=list)
    host_signs: HostSigns = HostSigns(False, "")  # its ranks' host sides on the GPU, merged

    @property
    def rank_ids(self) -> list[int]:
        return [info.rank for info in self.ranks]


@dataclass
class Analyses:
    """The results of every analysis; a field stays None when its analysis does not apply.

    Each analysis module adds its result as one field here and computes it in ``run_analyses``.
    Rules and renderers read these results, never the raw JSON.
    """

    trace: Trace | None  # a rank's events, for user-code locations (Python stacks) only; None in the join
    steps: StepSegmentation
    breakdown: StepBreakdown | None = None  # step time in the TensorBoard plugin's categories
    ops: OpTable | None = None  # per rank and op name: calls, self/total host time, self device time
    kernels: KernelTable | None = None  # per rank and kernel name, typed COMP / COMM / MEMORY
    gpu_time: GpuTimeResult | None = None  # HTA temporal/idle breakdown and comm overlap; None without device
    recording: RecordingResult | None = None  # launch calls against the device work recorded for them
    step_device: StepDeviceResult | None = None  # the device's busy share of each marked step; None without device
    launches: LaunchResult | None = None  # launch delays, tiny kernels, kernels and ops per step
    syncs: SyncResult | None = None  # host-device synchronisations and pageable copies
    blame: BlameResult | None = None  # every idle interval of a step charged to its cause
    ledger: Ledger | None = None  # every millisecond of every unit, on the device and the main thread, by cause
    memory: MemoryResult | None = None  # allocated-memory curves; None without [memory] events
    compile: CompileResult | None = None  # torch.compile regions, compilations, Triton kernels
    compile_log: CompileLog | None = None  # causes from skalpel run's compile log: guards, graph breaks, limits
    modules: ModuleTree | None = None  # time and FLOPs by nn.Module; None without module frames
    precision: Precision | None = None  # the matmuls' dtypes, fp32 GEMMs on CUDA cores, this CPU's bf16 speed
    roofline: Roofline | None = None  # the heavy ops under the roofs: compute-, memory- or overhead-bound
    mfu: tuple[Mfu, ...] = ()  # achieved FLOP/s and MFU per rank; empty without flop counts (with_flops)
    comm: CommAnalysis | None = None  # collectives per rank: by type, bandwidth, share, overlap
    rank_comparison: RankComparison | None = None  # aligned clocks, waits, straggler: the join's (job.join), 2+ ranks
    has_device: bool | None = None  # any device activity (None: not asked, as on a job's driver)
    has_stacks: bool | None = None  # Python stacks or frames recorded (user-code lines can be named)
    loader_ranges: LoaderRanges | None = None  # DataLoader ranges per rank and the iterator types they name
    idle_gaps: IdleGaps | None = None  # the device work ending the longest gaps, idle time inside DataLoader ranges
    kernel_launchers: KernelLaunchers | None = None  # kernels launched by graph launches, their ops by source
    cpu_ops: CpuOps | None = None  # CPU-only runs: host ops in the steps, self times, sources, collectives' time
    held_ops: HeldOps | None = None  # per rank, the op names holding the steps and the reference kernels (hot_op)
    attention: Attention | None = None  # SDPA's backends and their device time, eager bmm + softmax attention
    sync_causes: SyncCauses | None = None  # the syncs that blocked on device work inside the steps, by cause
    one_time: OneTimeResult | None = None  # one-time work per rank: cold_start's, and blame's and the allocator's
    allocator: AllocatorResult | None = None  # steady-state cudaMalloc/cudaFree calls per rank
    compile_in_steps: CompileInSteps | None = None  # compile time inside the steps; None without torch.compile
    graph_breaks: GraphBreaks | None = None  # the graph breaks and their time; None without one
    largest_allocs: dict[tuple[int, str], LargestAlloc] = field(default_factory=dict)  # (rank, device) -> its op
    kept_memory: KeptMemory | None = None  # what a device keeps through the steps (read per device)
    c10d_issuers: dict[int, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # host-timed ranks' c10d ops
    rank_work: WorkComparison | None = None  # the slower rank's work against the others': the join's, 2+ ranks
    job: JobFacts | None = None  # the join's: the job's ranks, warnings, device, host signs (no events)
    # what each rank's worker located for the job-level rules (set by the join)
    rank_locations: dict[int, RankLocations] | None = None
    # rank -> its collective wait split by the peer that arrived last, and its steps' numbers (set by the join, 2+ ranks)
    late_peers: dict[int, tuple[PeerSplit, tuple[int, ...]]] = field(default_factory=dict)


# From this many events, with a second idle core, the op table and the step breakdown are computed in a forked
# process while this one computes the rest. Measured in the whole `analyze` process on 2 idle cores: a 200 MB trace
# (617k events) 400 -> 270 ms; df_index_resolver (51 MB, 123k events) no gain (68 vs 70 ms): what the fork costs,
# copying pages both processes then write, is as much as it saves on a trace that size.
FORK_FROM_EVENTS = 250_000


def run_analyses(trace: Trace, *, processes: int = 1) -> Analyses:
    steps = segment_steps(trace)
    analyses = Analyses(trace=trace, steps=steps)
    elsewhere = None
    if processes > 1 and len(trace) >= FORK_FROM_EVENTS and hasattr(os, "fork"):
        trace.launcher, trace.op_of_event, trace.role  # noqa: B018 - derived once here, before the fork: both read them
        # the trace and steps the results refer to come back as this process's own objects, not copies
        elsewhere = Child(lambda: (op_table(trace), step_breakdown(trace, steps)), shared=(trace, steps))
    try:
        _run_the_rest(trace, steps, analyses)
    except BaseException:
        if elsewhere is not None:
            elsewhere.end()
        raise
    done = elsewhere.result() if elsewhere is not None else None
    # the child's results, or computed here (no second core, or the child died: killed for memory?)
    analyses.ops, analyses.breakdown = done if done is not None else (op_table(trace), step_breakdown(trace, steps))
    analyses.attention = attention(trace, analyses.ops, analyses.kernels)
    analyses.held_ops = held_ops(trace, analyses.cpu_ops, analyses.one_time, analyses.ops, analyses.ledger)
    return analyses


def _run_the_rest(trace: Trace, steps: StepSegmentation, analyses: Analyses) -> None:
    analyses.has_device, analyses.has_stacks = trace.has_device, trace.has_stacks
    analyses.one_time = one_time_work(trace)
    analyses.loader_ranges = loader_ranges(trace)
    analyses.idle_gaps = idle_gaps(trace, analyses.loader_ranges)
    analyses.kernel_launchers = kernel_launchers(trace, analyses.loader_ranges)
    analyses.cpu_ops = cpu_ops(trace, steps, analyses.loader_ranges) if not analyses.has_device else None
    analyses.kernels = kernel_table(trace)
    analyses.gpu_time = gpu_time(trace)
    analyses.step_device = device_in_steps(trace, steps)
    analyses.recording = device_recording(trace)
    analyses.launches = launches(trace, steps)
    analyses.syncs = syncs(trace, steps)
    analyses.blame = blame(trace, steps, one_time=analyses.one_time)
    analyses.allocator = allocator_calls(trace, steps, one_time=analyses.one_time)
    analyses.memory = memory(trace, steps)
    analyses.largest_allocs = largest_allocs(trace, analyses.memory)
    analyses.kept_memory = KeptMemory(trace, steps) if analyses.memory is not None else None
    analyses.compile = compile_events(trace, steps)
    analyses.compile_log = compile_log(trace, steps)
    if analyses.compile.used or analyses.compile_log is not None:
        analyses.compile_in_steps = compile_in_steps(trace, steps)
    analyses.graph_breaks = graph_breaks(trace, steps, analyses.compile, analyses.compile_log)
    analyses.mfu = mfu(trace, steps)
    analyses.modules = module_tree(trace, steps)
    analyses.precision = precision(trace, steps)
    analyses.roofline = roofline(trace, steps)
    analyses.comm = analyze_comm(trace, steps)
    analyses.c10d_issuers = c10d_issuers(trace, analyses.comm)
    analyses.ledger = ledger(trace, steps, analyses.blame, analyses.one_time)
    analyses.sync_causes = sync_causes(trace, steps, analyses.blame)
