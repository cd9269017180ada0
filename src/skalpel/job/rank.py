"""One rank of a job reduced to a compact summary, in the worker that loaded it.

A job is analysed rank by rank (``skalpel.job.pool`` runs ``summarize_rank`` in worker
processes or Ray tasks): each worker loads one rank file, runs every analysis on it and
the findings that need only that rank, and hands back a ``RankSummary`` of a few hundred
kilobytes: its steps, breakdown, GPU time, collectives with their timestamps (for clock
alignment and waits), time profile (for the straggler), decimated memory curve, the
rank's part of the report, and the locations the cross-rank findings may cite. The trace
itself stays in the worker. ``skalpel.job.join`` joins the summaries into the report
the whole trace would give.

Times in a summary are microseconds from the rank's own first event (``origin_us``);
the job's origin is the earliest of them, and the join moves each rank's times onto it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..analysis.blame_peers import CollectiveWaits, collective_waits
from ..analysis.breakdown import StepBreakdown
from ..analysis.bundle import run_analyses
from ..analysis.comm import CommAnalysis
from ..analysis.gpu_time import GpuTimeResult
from ..analysis.ledger import RankLedger
from ..analysis.memory import DeviceMemory
from ..analysis.ops import OpTable
from ..analysis.rankprofile import Profile, RankLocations, time_profile
from ..analysis.recorded import HostSigns, RecordingResult, host_signs
from ..analysis.step_device import StepDeviceResult
from ..analysis.steps import StepSegmentation
from ..diagnose import judge
from ..diagnose.distributed import rank_locations
from ..diagnose.registry import JOB_RULES, judged_rules
from ..diagnose.rule import Context, NotJudged
from ..errors import TraceError
from ..result.report import CaptureInfo, Finding, RankReport
from ..trace.loader import collector_paused, load_one
from ..trace.model import RankInfo, Trace
from .build import rank_report
from .transfer import packed_comm, packed_memory


@dataclass
class RankSummary:
    path: Path
    info: RankInfo
    warnings: list[str]
    origin_us: float  # absolute time of this rank's first event: the summary's times count from it
    has_device: bool
    steps: StepSegmentation
    breakdown: StepBreakdown | None
    ops: OpTable | None
    gpu_time: GpuTimeResult | None
    step_device: StepDeviceResult | None
    recording: RecordingResult | None
    comm: CommAnalysis | None
    compile_log: Any  # analysis.compile_log's CompileLog from the rank's header (skalpel run), or None
    memory: DeviceMemory | None  # the main device's, curve decimated
    ledger: RankLedger | None  # every millisecond of its units by cause
    report: RankReport  # this rank's part of the report (memory and cross-rank figures are set on the join)
    outcomes: dict[str, list[Finding] | NotJudged]  # rule id -> outcome, for the rules judged per rank
    profile: Profile | None = None  # where its step time goes (jobs of several ranks)
    locations: RankLocations | None = None  # what the job-level findings may cite for it
    flame: FlameGraphs | None = None  # its flame graphs, when asked for
    host_signs: HostSigns | None = None  # what its host side says of a GPU (to name the job's device)
    # Its blame's collective wait, for the join to split by peer (columns: they travel as they are).
    collective_waits: CollectiveWaits | None = None

    def __getstate__(self) -> dict:
        """To the driver with the collectives and memory curve as columns (``transfer``): they unpickle faster, and
        stay columns there (the join moves and compares them so). The wait spans are columns already, and the
        driver sends them on to a worker to split."""
        return {**self.__dict__, "comm": packed_comm(self.comm), "memory": packed_memory(self.memory)}


@dataclass(frozen=True)
class RankFailure:
    """A rank file that could not be reduced, and why (one line)."""

    path: Path
    reason: str
    attempts: int = 1


@dataclass(frozen=True)
class SummaryRequest:
    path: Path
    job_ranks: int  # rank files in the job
    flame: bool = False  # the rank's flame graph for the HTML report
    flame_files: bool = False  # and the run folder's flamegraph.svg and speedscope profile
    capture: CaptureInfo | None = None  # the run's capture facts: rank rules read them as in one process


def summarize_rank(
    request: SummaryRequest, on_fraction: Callable[[float], None] | None = None
) -> RankSummary | RankFailure:
    """Load one rank file and reduce it; a file that cannot be read becomes a ``RankFailure``.

    The cyclic garbage collector waits meanwhile: the analyses of a large rank make 100,000s of objects (its
    collectives, its wait spans) and no cycles, and each of its passes walks them all (some 9% of a rank's time)."""
    with collector_paused():
        return _summarize(request, on_fraction)


def _summarize(request: SummaryRequest, on_fraction: Callable[[float], None] | None) -> RankSummary | RankFailure:
    try:
        trace = load_one(request.path, on_fraction=on_fraction, job_ranks=request.job_ranks)
    except TraceError as error:
        return RankFailure(request.path, str(error))
    return summarize_loaded(trace, request)


def summarize_loaded(trace: Trace, request: SummaryRequest, *, processes: int = 1) -> RankSummary:
    """The summary of one rank's trace already loaded (a job's single file is loaded in the caller's process, by
    forked decoders when large); with ``processes`` > 1 some analyses of a large trace run in a forked process."""
    rank = trace.rank_ids[0]
    analyses = run_analyses(trace, processes=processes)
    ctx = Context(analyses, request.capture)
    outcomes = {rule.id: judge(rule, ctx) for rule in judged_rules() if rule.id not in JOB_RULES}
    profile = time_profile(trace, analyses.steps, analyses.comm, rank) if request.job_ranks > 1 else None
    locations = rank_locations(ctx, rank, profile)
    flame = flame_graphs(trace, rank, files=request.flame_files) if request.flame or request.flame_files else None
    return RankSummary(
        path=Path(request.path),
        info=trace.ranks[0],
        warnings=list(trace.warnings),
        origin_us=trace.origin_us,
        has_device=trace.has_device,
        steps=analyses.steps,
        breakdown=analyses.breakdown,
        ops=analyses.ops,
        gpu_time=analyses.gpu_time,
        step_device=analyses.step_device,
        recording=analyses.recording,
        comm=analyses.comm,
        compile_log=analyses.compile_log,
        memory=analyses.memory.main_device(rank) if analyses.memory else None,
        ledger=analyses.ledger.for_rank(rank) if analyses.ledger is not None else None,
        report=rank_report(analyses, rank),
        outcomes=outcomes,
        profile=profile,
        locations=locations,
        flame=flame,
        host_signs=host_signs(trace),
        collective_waits=_collective_waits(trace, analyses, rank) if request.job_ranks > 1 else None,
    )


@dataclass(frozen=True)
class FlameGraphs:
    """A rank's recorded steps as flame graphs: the HTML report's tree, and the run folder's files (an SVG and a
    speedscope profile) where asked for. Drawn from the trace itself, so in the process that holds it."""

    tree: dict | None
    svg: str | None = None
    speedscope: str | None = None


def flame_graphs(trace: Trace, rank: int, *, files: bool) -> FlameGraphs:
    from ..analysis.call_tree import flame_tree, thread_stacks
    from ..report import flamegraph

    threads = thread_stacks(trace, rank)  # once for the three: on a big trace, two thirds of their time
    tree = flame_tree(trace, rank=rank, threads=threads)
    if not files:
        return FlameGraphs(tree)
    return FlameGraphs(tree, flamegraph.render_svg(trace, rank=rank, threads=threads),
                       flamegraph.render_speedscope(trace, rank=rank, threads=threads))  # fmt: skip


def _collective_waits(trace, analyses, rank: int) -> CollectiveWaits | None:
    blamed = analyses.blame.for_rank(rank) if analyses.blame is not None else None
    comm = analyses.comm.for_rank(rank) if analyses.comm is not None else None
    if blamed is None or not blamed.collective_spans:
        return None
    return collective_waits(trace, blamed, comm.collectives if comm is not None else ())
