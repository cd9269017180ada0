"""straggler_rank tells extra work from the same work run slower: the ranks' calls a step and inputs decide.

Two gloo ranks on one host, 6 steps of 40 ms: each runs its aten::mm calls back to back, then
all_reduces 4 MB on gloo's thread, the collective ending 2 ms after the last rank arrives. A
loaded machine shows as steps where the other rank's calls run slower (descheduled) and it
arrives last instead. Each case is judged on the whole trace and rank by rank (the job path,
where the op tables reach the rule in the ranks' summaries): both must give the same report.
"""

from __future__ import annotations

from pathlib import Path

from skalpel.api import analyze
from skalpel.diagnose import thresholds
from tests.tracebuilder import cpu_rank

STEP = 40_000.0
SMALL = [[64, 64], [64, 64]]  # aten::mm's Input Dims
LARGE = [[192, 64], [64, 64]]


def _job(tmp_path: Path, calls_of, *, dims_of=lambda rank: SMALL) -> Path:
    """``calls_of(rank, step)``: the durations (us) of that rank's aten::mm calls in that step."""
    folder = tmp_path / "job"
    folder.mkdir()
    arrivals = {(rank, number): 10 + sum(calls_of(rank, number)) for rank in (0, 1) for number in range(6)}
    for rank in (0, 1):
        builder = cpu_rank(rank)
        for number in range(6):
            start = number * STEP
            builder.step(number + 1, start, STEP - 1)
            at = start + 10
            for dur in calls_of(rank, number):
                builder.host("aten::mm", at, dur, **{"Input Dims": dims_of(rank)})
                at += dur
            last = max(arrivals[(0, number)], arrivals[(1, number)])
            builder.gloo_all_reduce(at, start + last + 2_000 - at)
        builder.write(folder / f"trace-rank{rank}.json")
    return folder


def _straggler_findings(folder: Path) -> list:
    whole = analyze(folder)
    assert analyze(folder, workers=2).to_json() == whole.to_json()  # rank by rank: the same verdict
    return [finding for finding in whole.findings if finding.id == "straggler_rank"]


def _loaded(rank: int, number: int) -> bool:
    """Steps 1 and 4: the load falls on rank 0, whose 8 ms of calls take 30 ms (it arrives last)."""
    return rank == 0 and number in (1, 4)


def test_a_rank_with_three_times_the_calls_is_the_straggler_on_a_loaded_machine(tmp_path):
    # rank 1: 96 calls of 250 us a step, rank 0: 32 (72 of 937.5 us in its two loaded steps)
    def calls(rank, number):
        return [937.5] * 32 if _loaded(rank, number) else [250.0] * (96 if rank == 1 else 32)

    (finding,) = _straggler_findings(_job(tmp_path, calls))
    assert finding.severity != "info" and finding.rank == 1
    assert "rank 1 runs 3.0x the aten::mm calls a step: 96 vs 32" in finding.title, finding.title
    assert finding.fix.startswith("balance the work: rank 1 runs 3.0x the aten::mm calls a step: 96 vs 32"), finding.fix
    evidence = finding.evidence
    assert (evidence["extra_work_op"], evidence["calls_per_step"], evidence["others_calls_per_step"]) == ("aten::mm", 96, 32)
    assert evidence["call_ratio"] == 3.0 and evidence["extra_work_ms_per_step"] == 16.0
    # arrived last at 4 of 6: under min_last_arrival_pct, over the bar for a rank shown to do more work
    assert evidence["last_arrival_pct"] < thresholds.STRAGGLER_RANK.param("min_last_arrival_pct")
    assert evidence["last_arrival_pct"] >= thresholds.STRAGGLER_RANK.param("min_last_arrival_pct_extra_work")


def test_the_same_calls_on_larger_inputs_are_extra_work_not_load(tmp_path):
    def calls(rank, number):
        return [750.0 if rank == 1 else 250.0] * 32

    (finding,) = _straggler_findings(_job(tmp_path, calls, dims_of=lambda rank: LARGE if rank == 1 else SMALL))
    assert finding.severity != "info" and finding.rank == 1
    assert "rank 1 runs aten::mm on inputs [[192,64],[64,64]], the other ranks on [[64,64],[64,64]] (32 vs 32 calls" \
        in finding.title, finding.title  # fmt: skip
    assert finding.evidence["extra_work_ms_per_step"] == 16.0


def test_the_same_calls_run_slower_under_load_get_the_load_note(tmp_path):
    # equal work: 32 calls on the same inputs a step on both ranks; rank 1's run 3x slower (the load falls on it)
    def calls(rank, number):
        return [750.0 if rank == 1 else 250.0] * 32

    (note,) = _straggler_findings(_job(tmp_path, calls))
    assert note.severity == "info" and note.title.startswith("No straggler") and "identical work" in note.title
    assert note.evidence["slowest_rank"] == 1 and "extra_work_op" not in note.evidence
    assert note.evidence["last_arrivals_by_rank"] == {"0": 0, "1": 6}


def test_a_few_more_calls_do_not_make_extra_work(tmp_path):
    # rank 1 runs 33 calls to rank 0's 32, each slower: under min_call_ratio, and not the same work, so no load note
    # either: today's verdict, the straggler by its time (no count evidence)
    def calls(rank, number):
        return [700.0] * 33 if rank == 1 else [250.0] * 32

    (finding,) = _straggler_findings(_job(tmp_path, calls))
    assert finding.severity != "info" and finding.rank == 1 and "extra_work_op" not in finding.evidence
    assert finding.title.startswith("Rank 1 is the straggler: the other ranks wait"), finding.title
