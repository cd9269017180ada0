"""Join the rank summaries of a job into its Report: cross-rank analyses and findings on summaries.

The driver never holds a trace. It moves each rank's times onto the job's origin (the
earliest first event of any rank, as the whole-trace loader does), joins the per-rank
results, compares the ranks (clock alignment, waits, the straggler) on their collectives
and time profiles, merges each per-rank rule's outcomes, judges the job-level rules, and
concludes (``diagnose.conclude``). Every report comes this way (``job.report_of``), a single
file's too; ``tests/test_jobreport.py`` checks that however the ranks are reduced (this process,
workers as summaries arrive in any order, Ray) the report is the same, byte for byte.

Notes on repaired step markers and torch.compile figures (``extra['compile']``, the compile
findings) are each rank's own; the same job-wide finding raised alike by several ranks is kept once.

Shifting is exact: a time in a summary is (absolute - rank origin), rank origin less job
origin is exact too (differences of doubles within a factor two of each other, as epoch
timestamps are), so their sum is the double the whole-trace loader computes as (absolute -
job origin). Sums of times are exact too, on the loader's grid (``trace/assemble.py``): an end
(ts + dur) counted from the rank's origin, moved, is the one counted from the job's. Times are
therefore moved before anything rounds them (the report does, once).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ..analysis.blame import PeerSplit
from ..analysis.breakdown import StepBreakdown
from ..analysis.bundle import Analyses, JobFacts
from ..analysis.comm import CommAnalysis, RankComm
from ..analysis.gpu_time import GpuTimeResult
from ..analysis.ledger import Ledger, RankLedger
from ..analysis.ops import OpTable
from ..analysis.ranks import IndexedRanks, compare_ranks, index_calls
from ..analysis.rankwork import RankWork, rank_work, slower_rank_work
from ..analysis.recorded import HostSigns, RecordingResult
from ..analysis.step_device import StepDeviceResult
from ..analysis.steps import Step, StepSegmentation
from ..diagnose import conclude, judge, unmet_need
from ..diagnose.device import with_late_peer
from ..diagnose.registry import JOB_RULES, judged_rules
from ..diagnose.rule import JobContext, NotJudged
from ..errors import TraceError
from ..result.report import CaptureInfo, Finding, Report
from ..result.sections import DistributedSummary, PeerWaits
from ..trace.loader import collector_paused, drop_duplicate_ranks, skipped_notes
from .build import assemble_report, memory_summary
from .peers import SplitRequest, Splitter, split_here
from .rank import RankFailure, RankSummary
from .transfer import shifted_collectives

EVENT_INDEX_KEYS = ("events",)
"""Evidence keys whose values are event indices: a rank's own indices move by the events of the ranks before it."""


def join_summaries(
    results: list[RankSummary | RankFailure], *, capture: CaptureInfo | None = None, split: Splitter = split_here,
    notes: Sequence[str] = (),
) -> tuple[Report, list[RankSummary]]:
    """The job's Report from its ranks' summaries (failed ranks are named in its warnings).

    ``split`` splits each rank's collective wait by late peer once the ranks are compared (``job.peers``): here,
    by default; ``pool.split_all`` or ``pool.split_on_ray`` in the workers.

    Also returns the summaries kept (one per rank, in rank order). Raises TraceError when no rank could be read.
    The pool joins as the summaries arrive (``Joining``); this is the same join of summaries all in hand.
    """
    joining = Joining()
    with collector_paused():
        for index, result in enumerate(results):
            joining.add(index, result)
    return joining.finish(capture=capture, split=split, notes=notes)


class Joining:
    """The join of a job whose summaries arrive one by one (``pool.summarize_all``'s ``on_result``): each rank's
    own part is done as it arrives, beside the workers still reducing the others, and ``finish`` does the rest.

    A rank's own part needs no other rank: its collectives indexed by type and paired with the reference
    rank's (the lowest rank so far; ranks paired with another are paired again in ``finish``), and its ops a step
    for the work comparison. What moves a rank onto the job's clock, or into its event numbering, waits for every
    rank (the job's origin is the earliest of theirs). The cyclic garbage collector waits in ``finish``: each of
    its passes would walk every summary's objects (half the join's time on 8 ranks, more with more); the
    pools pause it while results arrive.
    """

    def __init__(self) -> None:
        self.results: dict[int, RankSummary | RankFailure] = {}
        self.indexed = IndexedRanks()
        self.works: dict[int, RankWork] = {}
        self.work_kinds: list[dict] = []  # one of each kind of rank's work, shared by the ranks of that kind
        self.repeated = False  # two files of one rank: the first in file order is kept, so what was done is dropped
        self.analyses: Analyses | None = None  # the job's, once finished: what its report was made of

    def add(self, index: int, result: RankSummary | RankFailure) -> None:
        """The result of the job's ``index``-th rank file, in any order."""
        self.results[index] = result
        if not isinstance(result, RankSummary) or self.repeated:
            return
        rank = result.info.rank
        if rank in self.works or rank in self.indexed.indices:
            self.repeated = True
            return
        comm = result.comm.for_rank(rank) if result.comm is not None else None
        if comm is not None:
            self.indexed.add(rank, index_calls(comm.collectives))
        if result.ops is not None:
            for item in result.ops.ranks:
                self.works[item.rank] = rank_work(item.rows, len(result.steps.for_rank(item.rank)), self.work_kinds)

    def finish(self, *, capture: CaptureInfo | None = None, split: Splitter = split_here,
               notes: Sequence[str] = ()) -> tuple[Report, list[RankSummary]]:  # fmt: skip
        """The job's Report, once every rank's result is in (``join_summaries``); ``notes`` (the capture's: a rank
        that wrote no trace) follow the ranks' own warnings."""
        results = [self.results[index] for index in sorted(self.results)]
        done = (IndexedRanks(), {}) if self.repeated else (self.indexed, self.works)
        with collector_paused():
            report, summaries, self.analyses = _join(results, capture, split, tuple(notes), *done)
        return report, summaries


def _join(results: list[RankSummary | RankFailure], capture: CaptureInfo | None, split: Splitter,
          notes: tuple[str, ...], indexed: IndexedRanks, works: dict[int, RankWork]
          ) -> tuple[Report, list[RankSummary], Analyses]:  # fmt: skip
    failures = [item for item in results if isinstance(item, RankFailure)]
    summaries = [item for item in results if isinstance(item, RankSummary)]
    if not summaries:  # the whole-trace loader's words
        if len(failures) == 1:
            raise TraceError(failures[0].reason)
        raise TraceError(f"none of the {len(failures)} files loads; the first: {failures[0].reason}")
    summaries = drop_duplicate_ranks(summaries)
    summaries[0].warnings.extend(skipped_notes([failure.reason for failure in failures]))  # as the whole-trace loader says
    origin = min(summary.origin_us for summary in summaries)
    shifts = {summary.info.rank: summary.origin_us - origin for summary in summaries}
    offsets = _event_offsets(summaries)
    job = JobFacts(
        ranks=tuple(summary.info for summary in summaries),
        has_device=any(summary.has_device for summary in summaries),
        warnings=[text for summary in summaries for text in summary.warnings] + list(notes),
        host_signs=_host_signs(summaries),
    )
    steps = _steps(summaries, shifts)
    analyses = Analyses(trace=None, steps=steps, has_device=job.has_device, job=job)  # the join holds no events
    analyses.breakdown = _breakdown(summaries)
    analyses.ops = _ops(summaries)
    analyses.gpu_time = _gpu_time(summaries)
    analyses.step_device = _step_device(summaries)
    analyses.recording = _recording(summaries)
    analyses.ledger = Ledger({s.info.rank: _shifted_ledger(s.ledger, shifts[s.info.rank]) for s in summaries
                              if s.ledger is not None})  # fmt: skip
    analyses.compile_log = next((s.compile_log for s in summaries if s.compile_log is not None), None)  # for its stacks-off note
    analyses.comm = CommAnalysis(tuple(_shifted_comm(s, shifts, offsets) for s in summaries if s.comm is not None))
    if len(summaries) > 1:
        profiles = {summary.info.rank: summary.profile for summary in summaries if summary.profile is not None}
        analyses.rank_comparison = compare_ranks(job.ranks, steps, analyses.comm, profiles=profiles, indexed=indexed)
        analyses.rank_work = slower_rank_work(analyses.rank_comparison, analyses.ops, steps, works=works)
    analyses.rank_locations = {s.info.rank: s.locations for s in summaries if s.locations is not None}
    ctx = JobContext(analyses, capture)
    peers = analyses.late_peers = _late_peers(summaries, analyses, shifts, offsets, split)
    findings = conclude(ctx, [(rule, _outcome(rule, ctx, summaries, offsets, peers)) for rule in judged_rules()])
    works.clear()  # read for rank_work only: the driver holds no more than it did when the join made them at the end
    ranks = tuple(_rank_report(summary, analyses, shifts[summary.info.rank], peers.get(summary.info.rank))
                  for summary in summaries)  # fmt: skip
    return assemble_report(analyses, findings, ranks, capture), summaries, analyses


def _host_signs(summaries: list[RankSummary]) -> HostSigns:
    merged = HostSigns(False, "")
    for summary in summaries:
        merged = merged.merged(summary.host_signs) if summary.host_signs is not None else merged
    return merged


def _event_offsets(summaries: list[RankSummary]) -> dict[int, int]:
    """Index of each rank's first event in the whole trace (ranks are concatenated in rank order)."""
    offsets, total = {}, 0
    for summary in summaries:
        offsets[summary.info.rank] = total
        total += summary.info.event_count
    return offsets


def _steps(summaries: list[RankSummary], shifts: dict[int, float]) -> StepSegmentation:
    steps = tuple(_shifted_step(step, shifts[step.rank]) for summary in summaries for step in summary.steps.steps)
    return StepSegmentation(
        steps,
        marked=any(summary.steps.marked for summary in summaries),
        dropped_tail=sum(summary.steps.dropped_tail for summary in summaries),
        defective=sum(summary.steps.defective for summary in summaries),
        unequal=tuple(
            dataclasses.replace(unequal, step=_shifted_step(unequal.step, shifts[unequal.step.rank]))
            for summary in summaries for unequal in summary.steps.unequal
        ),
        # Each rank's own notes: the whole trace counts repaired markers over the job in one note.
        notes=tuple(dict.fromkeys(note for summary in summaries for note in summary.steps.notes)),
    )


def _shifted_step(step: Step, shift: float) -> Step:
    host_start = step.host_start_us + shift if step.host_start_us is not None else None
    return dataclasses.replace(
        step, start_us=step.start_us + shift, host_end_us=step.host_end_us + shift, end_us=step.end_us + shift,
        host_start_us=host_start,
    )  # fmt: skip


def _shifted_ledger(ledger: RankLedger, shift: float) -> RankLedger:
    if not shift:
        return ledger
    lanes = tuple(dataclasses.replace(lane, units=tuple(
        dataclasses.replace(unit, start_us=unit.start_us + shift, end_us=unit.end_us + shift) for unit in lane.units
    )) for lane in ledger.lanes)  # fmt: skip
    return dataclasses.replace(ledger, lanes=lanes)


def _breakdown(summaries: list[RankSummary]) -> StepBreakdown | None:
    parts = [summary.breakdown for summary in summaries if summary.breakdown is not None]
    return StepBreakdown(tuple(rank for part in parts for rank in part.ranks)) if parts else None


def _ops(summaries: list[RankSummary]) -> OpTable | None:
    parts = [summary.ops for summary in summaries if summary.ops is not None]
    return OpTable(tuple(rank for part in parts for rank in part.ranks)) if parts else None


def _per_rank(summaries: list[RankSummary], field: str) -> dict | None:
    """rank -> that rank's item of a per-rank result (None where it has none); None when no rank has the result."""
    if all(getattr(summary, field) is None for summary in summaries):
        return None
    return {s.info.rank: getattr(s, field).for_rank(s.info.rank) if getattr(s, field) else None for s in summaries}


def _gpu_time(summaries: list[RankSummary]) -> GpuTimeResult | None:
    ranks = _per_rank(summaries, "gpu_time")
    options = next((s.gpu_time.options for s in summaries if s.gpu_time is not None), None)
    return GpuTimeResult(ranks=ranks, options=options) if ranks is not None else None


def _step_device(summaries: list[RankSummary]) -> StepDeviceResult | None:
    ranks = _per_rank(summaries, "step_device")
    marked = any(s.step_device.marked for s in summaries if s.step_device is not None)
    return StepDeviceResult(ranks=ranks, marked=marked) if ranks is not None else None


def _recording(summaries: list[RankSummary]) -> RecordingResult | None:
    ranks = _per_rank(summaries, "recording")
    return RecordingResult({rank: item for rank, item in ranks.items() if item is not None}) if ranks is not None else None


def _shifted_comm(summary: RankSummary, shifts: dict[int, float], offsets: dict[int, int]) -> RankComm:
    rank = summary.info.rank
    comm = summary.comm.for_rank(rank)
    shift, offset = shifts[rank], offsets[rank]
    if not shift and not offset:  # the job's first rank, often: its collectives stay as they are
        return comm
    # Field by field, not a constructor per collective (twice the cost): this runs for every collective of every rank.
    return dataclasses.replace(comm, collectives=shifted_collectives(comm.collectives, shift, offset))


def _late_peers(summaries: list[RankSummary], analyses: Analyses, shifts: dict[int, float], offsets: dict[int, int],
                split: Splitter) -> dict[int, tuple[PeerSplit, tuple[int, ...]]]:  # fmt: skip
    """rank -> its collective wait split by the late peer (and its steps' numbers), once the ranks are compared:
    the per-rank part of the join, handed to ``split`` (the workers, on a large job)."""
    comparison = analyses.rank_comparison
    if comparison is None:
        return {}
    requests = [SplitRequest(s.info.rank, s.collective_waits, comparison.arrivals(s.info.rank), shifts[s.info.rank],
                             offsets[s.info.rank])  # moved onto the job's clock as they are split
                for s in summaries if s.collective_waits is not None and s.report.blame is not None]  # fmt: skip
    return {request.rank: (peers, request.waits.step_numbers) for request, peers in zip(requests, split(requests))}


def _outcome(rule, ctx: JobContext, summaries: list[RankSummary], offsets: dict[int, int],
             peers: dict[int, tuple[PeerSplit, tuple[int, ...]]]) -> list[Finding] | NotJudged:  # fmt: skip
    """A job-level rule judged here; a per-rank rule's outcomes of every rank merged, as one run would give them."""
    if rule.id in JOB_RULES:
        return judge(rule, ctx)
    unmet = unmet_need(rule, ctx)  # the job has no device, or no marked steps
    if unmet is not None:
        return unmet
    outcomes = [(summary, summary.outcomes[rule.id]) for summary in summaries if rule.id in summary.outcomes]
    judged = [(summary, outcome) for summary, outcome in outcomes if not isinstance(outcome, NotJudged)]
    if not judged:
        return outcomes[0][1] if outcomes else []
    findings = [with_late_peer(_moved(finding, offsets[summary.info.rank]), peers.get(summary.info.rank, (None,))[0])
                for summary, outcome in judged for finding in outcome]  # fmt: skip
    return _without_repeats(findings)


def _moved(finding: Finding, offset: int) -> Finding:
    """A finding of one rank's trace with its event indices moved into the whole job's numbering."""
    if not offset or not any(key in finding.evidence for key in EVENT_INDEX_KEYS):
        return finding
    evidence: dict[str, Any] = dict(finding.evidence)
    for key in EVENT_INDEX_KEYS:
        if isinstance(evidence.get(key), list):
            evidence[key] = [index + offset for index in evidence[key]]
    return dataclasses.replace(finding, evidence=evidence)


def _without_repeats(findings: list[Finding]) -> list[Finding]:
    """Job-wide findings (no rank) that several ranks raised alike are one finding, as on a whole trace."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for finding in findings:
        if finding.rank is None:
            if (finding.id, finding.title) in seen:
                continue
            seen.add((finding.id, finding.title))
        kept.append(finding)
    return kept


def _rank_report(summary: RankSummary, analyses: Analyses, shift: float,
                 peers: tuple[PeerSplit, tuple[int, ...]] | None):  # fmt: skip
    report = dataclasses.replace(summary.report, memory=memory_summary(summary.memory, shift_us=shift))
    comparison = analyses.rank_comparison
    if comparison is not None:
        figures = comparison.summary_of(summary.info.rank)
        report = dataclasses.replace(report, distributed=DistributedSummary.from_dict(figures, check=False))
    if peers is not None and report.blame is not None:  # the collective wait by late peer
        split = PeerWaits.from_dict(peers[0].to_dict(peers[1]), check=False)
        report = dataclasses.replace(report, blame=dataclasses.replace(report.blame, collective_wait_by_peer=split))
    return report
