"""Cross-rank analyses of a job of 1,000 ranks built in memory: the planted straggler and slow pair are named.

The job (``tests/rankjob.py``) has 125 hosts of 8 ranks, each host's clock off by its own
amount; one rank reaches every all_reduce late (its compute runs long), and one pair of
ranks exchanges its send/recv ten times slower than every other pair. The comparison must
align the clocks, name the straggler and where its time goes, and single out the slow pair
by its transfer bandwidth, with every other rank quiet. ``benchmarks/many_ranks.py --cross-rank``
times the same comparison from 125 to 1,000 ranks (it grows linearly).
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from skalpel.analysis.rankcheck import consistency_warnings
from skalpel.analysis.ranks import compare_ranks

from .rankjob import Plan, build_job

RANKS = 1000
STRAGGLER = 333
SLOW_PAIR = (500, 501)


@pytest.fixture(scope="module")
def planted():
    job = build_job(Plan(RANKS, straggler=STRAGGLER, slow_pair=SLOW_PAIR))
    return job, compare_ranks(job.trace.ranks, job.steps, job.comm, profiles=job.profiles)


def test_clocks_of_125_hosts_are_aligned(planted) -> None:
    job, comparison = planted
    assert comparison.aligned and comparison.warnings == ()
    assert [timing.rank for timing in comparison.ranks] == list(range(RANKS))
    clocks = {timing.rank: timing.clock for timing in comparison.ranks}
    assert clocks[0] == "reference" and all(clocks[rank] == "same host" for rank in range(1, 8))
    assert all(clocks[rank] == "aligned" for rank in range(8, RANKS))
    for timing in comparison.ranks:  # the planted offsets, within the jitter of the collective ends
        assert timing.clock_offset_us == pytest.approx(job.host_offsets_us[timing.rank], abs=25)
    assert all(timing.matched_collectives == 12 for timing in comparison.ranks)  # 4 steps x 3 collectives


def test_the_straggler_is_named_with_where_its_time_goes(planted) -> None:
    _, comparison = planted
    straggler = comparison.straggler
    assert straggler.rank == STRAGGLER
    assert straggler.last_arrival_pct == 100.0 * 8 / 12  # last at each all_reduce, not at the send/recv
    assert straggler.imposed_wait_ms_per_step == pytest.approx(2 * 6.0, abs=0.5)  # 6 ms late at 2 all_reduces a step
    assert straggler.excess[0].category == "compute kernels"
    assert straggler.excess[0].extra_ms_per_step == pytest.approx(6.0)
    summaries = {rank: comparison.summary_of(rank) for rank in range(RANKS)}
    assert [rank for rank, summary in summaries.items() if summary["straggler_candidate"]] == [STRAGGLER]
    waits = sorted(timing.wait_ms_per_step for timing in comparison.ranks)
    assert waits[0] < 0.5 < 11.0 < waits[1]  # it waits for nobody; every other rank waits for it


def test_the_slow_pair_is_singled_out_by_its_transfer_bandwidth(planted) -> None:
    _, comparison = planted
    send = {timing.rank: timing.transfer_busbw_gbps["send_recv"] for timing in comparison.ranks}
    typical = statistics.median(send.values())
    assert sorted(rank for rank, value in send.items() if value < typical / 2) == list(SLOW_PAIR)
    assert all(send[rank] < typical / 8 for rank in SLOW_PAIR)
    reduce = {timing.rank: timing.transfer_busbw_gbps["all_reduce"] for timing in comparison.ranks}
    typical_reduce = statistics.median(reduce.values())
    assert all(value > typical_reduce / 2 for value in reduce.values())  # the all_reduces of the pair are not slow


def test_a_job_without_plants_has_no_outlier() -> None:
    job = build_job(Plan(RANKS))
    comparison = compare_ranks(job.trace.ranks, job.steps, job.comm, profiles=job.profiles)
    waits = [timing.wait_ms_per_step for timing in comparison.ranks]
    assert max(waits) < 0.5  # ranks arrive within jitter of each other: nobody waits for anybody
    send = [timing.transfer_busbw_gbps["send_recv"] for timing in comparison.ranks]
    assert min(send) > statistics.median(send) / 2


def test_missing_ranks_are_one_warning_in_ranges() -> None:
    job = build_job(Plan(RANKS))
    kept = [info for info in job.trace.ranks if not 100 <= info.rank < 200 and info.rank != 999]
    job.trace.ranks = tuple(kept)
    warnings = consistency_warnings(job.trace.ranks, job.steps)
    assert len(warnings) == 1 and "missing: 100-199, 999" in warnings[0]


def test_ranks_that_disagree_are_one_warning_per_kind_in_ranges() -> None:
    job = build_job(Plan(RANKS))
    late = {step for step in job.steps.steps if step.rank >= 500 and step.number == 4}  # ranks 500-999 recorded 3 steps
    job.steps = type(job.steps)(tuple(step for step in job.steps.steps if step not in late), marked=True)
    job.trace.ranks = tuple(
        dataclasses.replace(info, world_size=2000, job="run-b") if info.rank in (7, 8, 9, 640)
        else dataclasses.replace(info, job="run-a") for info in job.trace.ranks
    )
    warnings = consistency_warnings(job.trace.ranks, job.steps)
    assert len(warnings) == 4, warnings
    world, runs, missing, steps = (next(w for w in warnings if key in w) for key in ("world size", "different runs", "missing", "steps"))
    assert "(ranks 7-9, 640: 2000; ranks 0-6, 10-639, 641-999: 1000)" in world  # the odd ones first
    assert "(ranks 7-9, 640: run-b; ranks 0-6, 10-639, 641-999: run-a)" in runs
    assert "missing: 1000-1999" in missing
    assert "(ranks 0-499: 4; ranks 500-999: 3)" in steps
    assert max(len(w) for w in warnings) < 400


def test_long_runs_of_equal_sizes_match_and_a_rank_that_missed_some_matches_the_rest() -> None:
    job = build_job(Plan(16, steps=400))  # 1,200 collectives a rank, all_reduces all of one size
    comm = {rank.rank: rank for rank in job.comm.ranks}
    gap = comm[5].collectives
    gap = gap[:600] + gap[606:]  # rank 5 missed two steps' collectives in the middle
    job.comm = type(job.comm)(tuple(dataclasses.replace(item, collectives=gap) if item.rank == 5 else item
                                    for item in job.comm.ranks))  # fmt: skip
    comparison = compare_ranks(job.trace.ranks, job.steps, job.comm, profiles=job.profiles)
    matched = {timing.rank: timing.matched_collectives for timing in comparison.ranks}
    assert matched[5] == 1194 and all(matched[rank] == 1200 for rank in matched if rank != 5)
    assert comparison.warnings == ()
