"""A rank's summary on its way to the driver (``job.transfer``): its collectives and wait spans travel as columns
and arrive equal to what the worker had, field by field and type by type."""

from __future__ import annotations

import pickle

from skalpel.analysis.blame import WaitSpans
from skalpel.analysis.blame_peers import CollectiveWaits
from skalpel.job.rank import RankSummary, SummaryRequest, summarize_rank
from skalpel.job.transfer import PackedCollectives

from .conftest import corpus

DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"


def _summary_of_a_real_rank() -> RankSummary:
    path = sorted(corpus(DLRM).glob("*.json*"))[3]
    summary = summarize_rank(SummaryRequest(path, job_ranks=8))
    assert isinstance(summary, RankSummary)
    return summary


def test_a_real_ranks_collectives_and_waits_arrive_equal_and_of_the_same_types():
    summary = _summary_of_a_real_rank()
    rank = summary.info.rank
    calls = summary.comm.for_rank(rank).collectives
    assert len(calls) >= 8 and summary.collective_waits is not None and len(summary.collective_waits.spans) >= 8
    sent = summary.__getstate__()
    assert isinstance(sent["comm"].for_rank(rank).collectives, PackedCollectives)  # columns, not objects
    assert sent["collective_waits"] is summary.collective_waits  # columns already: they travel as they are
    arrived = pickle.loads(pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL))
    assert arrived.comm == summary.comm and arrived.comm.for_rank(rank).collectives == calls
    assert [tuple(map(type, vars_of(call))) for call in arrived.comm.for_rank(rank).collectives] == [
        tuple(map(type, vars_of(call))) for call in calls]  # fmt: skip
    assert arrived.collective_waits == summary.collective_waits  # the driver splits them as columns, or sends them on
    assert arrived.collective_waits.spans.steps.dtype == summary.collective_waits.spans.steps.dtype  # int32 between
    assert arrived.collective_waits.pieces == summary.collective_waits.pieces
    again = pickle.loads(pickle.dumps(arrived))  # sent on from the driver: as it arrived
    assert again.collective_waits == summary.collective_waits
    assert arrived.report == summary.report and arrived.steps == summary.steps and arrived.info == summary.info


def vars_of(call) -> tuple:
    return tuple(getattr(call, name) for name in call.__slots__)


def test_a_rank_without_collectives_or_waits_arrives_as_it_was():
    summary = _summary_of_a_real_rank()
    summary.collective_waits = CollectiveWaits(WaitSpans.of([]), (), {})
    arrived = pickle.loads(pickle.dumps(summary))
    assert arrived.collective_waits == summary.collective_waits
    summary.comm, summary.collective_waits = None, None
    arrived = pickle.loads(pickle.dumps(summary))
    assert arrived.comm is None and arrived.collective_waits is None


def test_collectives_moved_onto_the_jobs_clock_equal_those_a_constructor_makes():
    import dataclasses

    from skalpel.job.transfer import shifted_collectives

    summary = _summary_of_a_real_rank()
    calls = summary.comm.for_rank(summary.info.rank).collectives
    moved = shifted_collectives(calls, 1234.5678, 10**6)
    expected = tuple(dataclasses.replace(call, event=call.event + 10**6, start_us=call.start_us + 1234.5678,
                                         end_us=call.end_us + 1234.5678) for call in calls)  # fmt: skip
    assert moved == expected and moved != calls
    assert [tuple(map(type, vars_of(call))) for call in moved] == [tuple(map(type, vars_of(call))) for call in expected]
    packed = PackedCollectives.of(calls)  # as the driver holds them: moved as columns, to the same doubles
    moved_packed = shifted_collectives(packed, 1234.5678, 10**6)
    assert isinstance(moved_packed, PackedCollectives) and moved_packed == expected and len(moved_packed) == len(calls)
    assert [tuple(map(type, vars_of(call))) for call in moved_packed] == [tuple(map(type, vars_of(call))) for call in expected]


def test_the_rank_comparison_reads_packed_collectives_as_it_reads_the_objects():
    from skalpel.analysis.ranks import _Calls

    summary = _summary_of_a_real_rank()
    calls = summary.comm.for_rank(summary.info.rank).collectives
    arrived = pickle.loads(pickle.dumps(summary)).comm.for_rank(summary.info.rank).collectives
    assert isinstance(arrived, PackedCollectives)  # the driver keeps the columns
    from_objects, from_columns = _Calls(calls), _Calls(arrived)
    for name in ("start", "end", "nbytes", "group_size", "rank", "event", "type_codes"):
        left, right = getattr(from_objects, name), getattr(from_columns, name)
        assert left.dtype == right.dtype and left.tolist() == right.tolist()
    assert from_objects.types == from_columns.types and len(from_objects.types) >= 1
    assert {kind: rows.tolist() for kind, rows in from_objects.of_type.items()} == {
        kind: rows.tolist() for kind, rows in from_columns.of_type.items()}  # fmt: skip


def test_a_memory_curve_arrives_as_columns_and_gives_the_same_report_memory():
    from skalpel.job.build import memory_summary
    from skalpel.job.transfer import PackedCurve

    path = corpus("hta/df_index_resolver")  # one GPU rank with [memory] events
    summary = summarize_rank(SummaryRequest(sorted(path.glob("*.json*"))[0] if path.is_dir() else path, job_ranks=2))
    assert isinstance(summary, RankSummary) and summary.memory is not None and len(summary.memory.curve) >= 100
    arrived = pickle.loads(pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL))
    assert isinstance(arrived.memory.curve, PackedCurve) and arrived.memory.curve == summary.memory.curve
    assert [tuple(map(type, point)) for point in arrived.memory.curve] == [(float, int)] * len(summary.memory.curve)
    for shift in (0.0, 1234.25):
        assert memory_summary(arrived.memory, shift_us=shift) == memory_summary(summary.memory, shift_us=shift)
